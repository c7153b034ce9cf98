"""``pofe sft``: supervised fine-tuning on (prompt, response) pairs, loss on response tokens only.

Self-Rewarding LMs Sec. 3.4 ("Seed training data"): the seed model M1 is the base model
fine-tuned on IFT data (instruction -> human response) mixed with EFT data (LLM-as-a-Judge
prompt -> justification + "Score: N"), "loss computed only on target tokens", learning rate
5.5e-6 decaying with a cosine schedule to 1.1e-6, batch size 16. The same loop serves
SL-CAI (revisions as targets) through :func:`run`.

Readable top to bottom: config -> data -> tokenise -> train (resumable at step granularity)
-> save. Nothing is truncated silently: examples longer than ``max_length`` tokens are
dropped and counted.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from pofe.config import PofeConfig
from pofe.data.io import DataError
from pofe.data.sft import RESPONSE_FIELDS, SFTExample, load_examples, to_example  # noqa: F401
from pofe.logprobs import build_batch, token_logprobs
from pofe.models import apply_chat_template
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, new_run_dir, read_jsonl, write_config
from pofe.training import (
    ModelConfig,
    OptimConfig,
    check_finite,
    fault_point,
    latest_checkpoint,
    load_checkpoint,
    load_policy,
    make_optimizer,
    make_scheduler,
    prune_checkpoints,
    save_checkpoint,
    save_final,
    seed_everything,
    trainable_parameters,
)

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- config

class SFTDataConfig(PofeConfig):
    """Where the training examples come from."""

    ift: list[str] = []
    """Instruction-following files: rows with prompt/response (also instruction[/input]/output,
    Self-Instruct ``instances``, or chat ``messages`` ending with the assistant's turn)."""
    eft: list[str] = []
    """Evaluation (LLM-as-a-Judge) files in the same shape: judge prompt -> justification +
    "Score: N" (written by ``pofe self-reward``'s EFT builder)."""
    eft_max_ratio: float | None = None
    """Cap EFT examples at this multiple of the IFT count (null = use all; paper: 1630 EFT
    with 3200 IFT, i.e. about 0.5)."""
    limit: int | None = None
    """Use at most this many examples per file (for smoke runs)."""
    max_length: int = 1024
    """Drop (and count) examples whose prompt + response exceed this many tokens."""


class SFTConfig(PofeConfig):
    """``pofe sft``."""

    model: ModelConfig = ModelConfig()
    data: SFTDataConfig = SFTDataConfig()
    optim: OptimConfig = OptimConfig(lr=5.5e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.2)
    """Paper: 5.5e-6 cosine-decayed to 1.1e-6 (= 0.2 x lr)."""
    batch_size: int = 16
    """Examples per optimiser step (paper: 16)."""
    micro_batch_size: int = 4
    """Examples per forward pass; gradients are accumulated up to ``batch_size`` (the loss is
    the token mean over the whole batch either way)."""
    epochs: float = 1.0
    max_steps: int | None = None
    """Overrides ``epochs`` when set."""
    checkpoint_every: int = 100
    """Optimiser steps between resumable checkpoints (0 = only at the end)."""
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    run: RunConfig = RunConfig()
    resume: str | None = None
    """A run folder to continue from its latest checkpoint."""


# ----------------------------------------------------------------------------- data

# The mapping from rows lives in the data layer (pofe.data.sft); the old names stay importable.
example_from_row = to_example


def load_sft_data(cfg: SFTDataConfig, seed: int = 0) -> tuple[list[SFTExample], dict[str, int]]:
    """IFT + EFT examples (EFT optionally capped relative to IFT) and their counts."""
    ift = load_examples(cfg.ift, "ift", cfg.limit)
    eft = load_examples(cfg.eft, "eft", cfg.limit)
    stats = {"ift": len(ift), "eft": len(eft), "eft_capped": 0}
    if cfg.eft_max_ratio is not None and len(eft) > cfg.eft_max_ratio * len(ift):
        keep = int(cfg.eft_max_ratio * len(ift))
        stats["eft_capped"] = len(eft) - keep
        eft = random.Random(seed).sample(eft, keep)
    return ift + eft, stats


@dataclass(frozen=True)
class Tokenized:
    prompt_ids: list[int]
    response_ids: list[int]
    source: str


def tokenize_examples(tokenizer, examples: Sequence[SFTExample], max_length: int) -> tuple[list[Tokenized], dict[str, int]]:
    """Render prompts with the chat template (exactly as generation does) and append EOS to
    the response: the end-of-turn token is part of the target, otherwise the model never
    learns to stop."""
    out, dropped = [], {"too_long": 0, "empty_response": 0}
    eos = tokenizer.eos_token_id
    for ex in examples:
        if not ex.response.strip():
            dropped["empty_response"] += 1
            continue
        text = apply_chat_template(tokenizer, ex.prompt if isinstance(ex.prompt, str) else list(ex.prompt))
        p = tokenizer(text, add_special_tokens=False)["input_ids"]
        r = tokenizer(ex.response, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        if len(p) + len(r) > max_length:
            dropped["too_long"] += 1
            continue
        out.append(Tokenized(p, r, ex.source))
    return out, dropped


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """Example indices of optimiser step ``step``: position s = step * batch_size + i walks
    epoch after epoch, each epoch a permutation seeded by (seed, epoch). A pure function of
    the step, so a resumed run sees exactly the batches an uninterrupted one would."""
    out = []
    perms: dict[int, list[int]] = {}
    for s in range(step * batch_size, (step + 1) * batch_size):
        epoch, k = divmod(s, n)
        if epoch not in perms:
            order = list(range(n))
            random.Random(f"sft-{seed}-{epoch}").shuffle(order)
            perms[epoch] = order
        out.append(perms[epoch][k])
    return out


def response_nll(model, items: Sequence[Tokenized], pad_token_id: int) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of the response tokens (prompt and padding masked via
    ``build_batch``'s completion mask) and the number of response tokens."""
    batch = build_batch([t.prompt_ids for t in items], [t.response_ids for t in items], pad_token_id=pad_token_id)
    dev = next(model.parameters()).device
    batch = type(batch)(*(x.to(dev) for x in (batch.input_ids, batch.attention_mask, batch.completion_mask)))
    lp = token_logprobs(model, batch)
    mask = batch.completion_mask.to(lp.dtype)
    return -(lp * mask).sum(), int(mask.sum().item())


# ----------------------------------------------------------------------------- loop

def run(cfg: SFTConfig, *, model=None, tokenizer=None, examples: Sequence[SFTExample] | None = None,
        run_dir: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune and save ``<run_dir>/model``; returns the summary (also ``summary.json``).

    ``model``/``tokenizer``: an in-memory model to train instead of loading ``cfg.model.name``.
    ``examples``: in-memory examples instead of ``cfg.data`` files (used by self-reward and CAI).
    ``run_dir``: write here (created if needed) instead of a fresh folder under ``cfg.run``;
    an existing checkpoint there is resumed.
    """
    t_start = time.time()
    # --- setup
    if run_dir is None:
        run_dir = Path(cfg.resume) if cfg.resume else new_run_dir(cfg.run, "sft")
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").exists() and (run_dir / "model" / "config.json").exists():
        log.info("sft: %s already finished; returning its summary", run_dir)
        return {**json.loads((run_dir / "summary.json").read_text()), "already_done": True}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    seed_everything(cfg.seed)
    if examples is None:
        if not cfg.data.ift and not cfg.data.eft:
            raise DataError("sft: no data; set data.ift (and optionally data.eft)")
        examples, data_stats = load_sft_data(cfg.data, cfg.seed)
    else:
        examples = list(examples)
        data_stats = {"ift": sum(e.source == "ift" for e in examples), "eft": sum(e.source == "eft" for e in examples),
                      "eft_capped": 0}
    policy, tok = load_policy(cfg.model, model=model, tokenizer=tokenizer)
    data, dropped = tokenize_examples(tok, examples, cfg.data.max_length)
    if not data:
        raise DataError(f"sft: no usable examples (dropped: {dropped})")
    bs = min(cfg.batch_size, len(data)) if cfg.max_steps is None else cfg.batch_size
    total = cfg.max_steps if cfg.max_steps is not None else max(1, math.ceil(cfg.epochs * len(data) / bs))
    optimizer = make_optimizer(policy, cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, total)
    start = 0
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        start = load_checkpoint(ckpt, model=policy, optimizer=optimizer, scheduler=scheduler)["step"]
        log.info("sft: resumed from %s at step %d", ckpt, start)
        if (run_dir / "metrics.jsonl").exists():  # rows logged after the checkpoint are redone
            rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("step", 0) <= start]
            atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    # --- train
    policy.train()
    losses: list[float] = []
    first_loss = None
    with JsonlWriter(run_dir / "metrics.jsonl") as metrics:
        for step in range(start, total):
            idx = batch_indices(step, bs, len(data), cfg.seed)
            items = [data[i] for i in idx]
            n_tok = sum(len(t.response_ids) for t in items)
            optimizer.zero_grad(set_to_none=True)
            total_nll = 0.0
            for k in range(0, len(items), cfg.micro_batch_size):
                nll, _ = response_nll(policy, items[k : k + cfg.micro_batch_size], pad)
                # Token-mean over the whole optimiser batch, whatever the micro-batching.
                (nll / n_tok).backward()
                total_nll += float(nll.detach())
            if cfg.optim.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(trainable_parameters(policy), cfg.optim.grad_clip)
            lr = optimizer.param_groups[0]["lr"]
            check_finite(total_nll, step=step + 1, detail=f"examples {idx}")
            optimizer.step()
            scheduler.step()
            loss = total_nll / n_tok
            first_loss = loss if first_loss is None else first_loss
            losses.append(loss)
            done = step + 1
            if done % cfg.log_every == 0 or done == total or done == start + 1:
                metrics.write({"step": done, "loss": loss, "lr": lr, "tokens": n_tok,
                               "eft_share": sum(t.source == "eft" for t in items) / len(items)})
            fault_point(f"{done}:after_step")  # crash/resume suite: metrics written, no checkpoint yet
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < total:
                save_checkpoint(run_dir / "checkpoints" / f"step-{done}", model=policy, optimizer=optimizer,
                                scheduler=scheduler, step=done)
                prune_checkpoints(run_dir, cfg.keep_checkpoints)
                fault_point(f"{done}:after_checkpoint")  # crash/resume suite (POFE_FAULT)

    # --- save
    policy.eval()
    model_dir = save_final(policy, tok, run_dir / "model")
    summary = {
        "run_dir": str(run_dir), "model_dir": str(model_dir), "steps": total, "resumed_from_step": start,
        "examples": len(data), "data": data_stats, "dropped": dropped, "batch_size": bs,
        "loss_first": first_loss, "loss_last": losses[-1] if losses else None,
        "loss_last_mean": sum(losses[-5:]) / len(losses[-5:]) if losses else None,
        "seconds": round(time.time() - t_start, 2),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the final model supersedes them
    return summary
