"""``pofe sft``: supervised fine-tuning on (prompt, response) pairs, loss on response tokens only.

Self-Rewarding LMs Sec. 3.4 ("Seed training data"): the seed model M1 is the base model
fine-tuned on IFT data (instruction -> human response) mixed with EFT data (LLM-as-a-Judge
prompt -> justification + "Score: N"), "loss computed only on target tokens", learning rate
5.5e-6 decaying with a cosine schedule to 1.1e-6, batch size 16. The same loop serves
SL-CAI (revisions as targets) through :func:`run`.

Readable top to bottom: config -> data -> tokenise -> train (resumable at step granularity)
-> save (``<run_dir>/final``). Nothing is truncated silently: examples longer than
``max_length`` tokens are dropped and counted. ``pofe sft --resume RUN_DIR`` continues from
the run's own ``config.yaml`` and latest checkpoint.
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
from pydantic import Field

from pofe.config import PofeConfig
from pofe.data.io import DataError
from pofe.data.sft import RESPONSE_FIELDS, SFTExample, load_examples, to_example  # noqa: F401
from pofe.logprobs import build_batch, token_logprobs
from pofe.models import apply_chat_template
from pofe.runs import RunConfig, atomic_write_text, open_run, read_jsonl, write_config
from pofe.training.allocator import keep_freed_memory
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
from pofe.training.metrics import truncate_metrics
from pofe.training.precision import Precision, autocast
from pofe.training.settings import CheckpointSettings
from pofe.training.tracking import LogConfig, MetricsSink, Progress

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
    eft_max_ratio: float | None = Field(None, ge=0)
    """Cap EFT examples at this multiple of the IFT count (null = use all; paper: 1630 EFT
    with 3200 IFT, i.e. about 0.5)."""
    limit: int | None = Field(None, ge=1)
    """Use at most this many examples per file (for smoke runs)."""
    max_length: int = Field(1024, ge=1)
    """Drop (and count) examples whose prompt + response exceed this many tokens."""


class SFTTrainSettings(PofeConfig):
    """Steps and batch sizes. Examples per optimiser step = batch_size x grad_accum (paper: 16);
    the loss is the token mean over the whole optimiser batch whatever the split."""

    steps: int | None = Field(None, ge=1)
    """Optimiser steps; None = ``epochs`` passes over the data."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data when ``steps`` is None."""
    batch_size: int = Field(4, ge=1)
    """Examples per forward pass."""
    grad_accum: int = Field(4, ge=1)
    """Forward passes per optimiser step."""
    precision: Precision = "fp32"
    """bf16: forward and backward under bf16 autocast, fp32 master weights and optimiser state
    (AMX CPUs, GPUs; ``pofe.training.precision``)."""


class SFTConfig(PofeConfig):
    """``pofe sft``."""

    seed: int = 0
    """Seeds the model init (LoRA) and the per-epoch data order."""
    model: ModelConfig = ModelConfig()
    """The model fine-tuned."""
    data: SFTDataConfig = SFTDataConfig()
    """IFT (and EFT) files."""
    optim: OptimConfig = OptimConfig(lr=5.5e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.2)
    """Paper: 5.5e-6 cosine-decayed to 1.1e-6 (= 0.2 x lr)."""
    train: SFTTrainSettings = SFTTrainSettings()
    """Steps and batch sizes."""
    checkpoint: CheckpointSettings = CheckpointSettings(every=100)
    """Resumable checkpoints; removed once ``final/`` is written."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, TensorBoard / W&B / MLflow, the progress bar."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""


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

def run(cfg: SFTConfig, *, resume: str | Path | None = None, model=None, tokenizer=None,
        examples: Sequence[SFTExample] | None = None, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune and save ``<run_dir>/final``; returns the summary (also ``summary.json``).

    ``resume``: a run folder to continue from its latest checkpoint (the CLI reads its config).
    ``model``/``tokenizer``: an in-memory model to train instead of loading ``cfg.model.name``.
    ``examples``: in-memory examples instead of ``cfg.data`` files (used by self-reward and CAI).
    ``run_dir``: write here (created if needed) instead of a fresh folder under ``cfg.run``;
    an existing checkpoint there is resumed (self-reward's stages).
    """
    t_start = time.time()
    # --- setup
    if examples is None and not cfg.data.ift and not cfg.data.eft:
        raise DataError("sft: no data; set data.ift (and optionally data.eft)")
    run_dir = Path(run_dir) if run_dir is not None else open_run(cfg.run, "sft", resume=resume)
    if (run_dir / "summary.json").exists() and (run_dir / "final" / "config.json").exists():
        log.info("sft: %s already finished; returning its summary", run_dir)
        return {**json.loads((run_dir / "summary.json").read_text()), "already_done": True}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    keep_freed_memory()  # glibc: reuse freed buffers instead of page-faulting them in every step
    seed_everything(cfg.seed)
    if examples is None:
        examples, data_stats = load_sft_data(cfg.data, cfg.seed)
    else:
        examples = list(examples)
        data_stats = {"ift": sum(e.source == "ift" for e in examples), "eft": sum(e.source == "eft" for e in examples),
                      "eft_capped": 0}
    policy, tok = load_policy(cfg.model, model=model, tokenizer=tokenizer)
    data, dropped = tokenize_examples(tok, examples, cfg.data.max_length)
    if not data:
        raise DataError(f"sft: no usable examples (dropped: {dropped})")
    t = cfg.train
    per_step = t.batch_size * t.grad_accum
    bs = min(per_step, len(data)) if t.steps is None else per_step  # an epoch never repeats an example
    total = t.steps if t.steps is not None else max(1, math.ceil(t.epochs * len(data) / bs))
    optimizer = make_optimizer(policy, cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, total)
    start = 0
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        start = load_checkpoint(ckpt, model=policy, optimizer=optimizer, scheduler=scheduler)["step"]
        log.info("sft: resumed from %s at step %d", ckpt, start)
    truncate_metrics(run_dir, start)  # rows logged after the checkpoint are redone, never duplicated
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    # --- train
    policy.train()
    losses: list[float] = []
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json"))
    bar = Progress(cfg.log, total=total, initial=start, desc="pofe sft")
    try:
        for step in range(start, total):
            idx = batch_indices(step, bs, len(data), cfg.seed)
            items = [data[i] for i in idx]
            n_tok = sum(len(x.response_ids) for x in items)
            optimizer.zero_grad(set_to_none=True)
            total_nll = 0.0
            for k in range(0, len(items), t.batch_size):
                with autocast(t.precision, next(policy.parameters()).device):
                    nll, _ = response_nll(policy, items[k : k + t.batch_size], pad)
                # Token-mean over the whole optimiser batch, whatever the micro-batching.
                (nll / n_tok).backward()
                total_nll += float(nll.detach())
            grad_norm = None
            if cfg.optim.grad_clip is not None:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable_parameters(policy), cfg.optim.grad_clip))
            lr = optimizer.param_groups[0]["lr"]
            check_finite(total_nll, step=step + 1, detail=f"examples {idx}")
            optimizer.step()
            scheduler.step()
            loss = total_nll / n_tok
            losses.append(loss)
            done = step + 1
            row = {"step": done, "loss": loss, "learning_rate": lr, "grad_norm": grad_norm, "num_tokens": n_tok,
                   "eft_share": sum(x.source == "eft" for x in items) / len(items)}
            sink.write(row)
            bar.update(row)
            fault_point(f"{done}:after_step")  # crash/resume suite: metrics written, no checkpoint yet
            if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < total:
                save_checkpoint(run_dir / "checkpoints" / f"step-{done}", model=policy, optimizer=optimizer,
                                scheduler=scheduler, step=done)
                prune_checkpoints(run_dir, cfg.checkpoint.keep_last)
                fault_point(f"{done}:after_checkpoint")  # crash/resume suite (POFE_FAULT)
    finally:
        bar.close()
        sink.close()

    # --- save
    policy.eval()
    final = save_final(policy, tok, run_dir / "final")
    losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("loss") is not None]
    summary = {
        "run_dir": str(run_dir), "final_model": str(final), "steps": total, "resumed_from_step": start,
        "examples": len(data), "data": data_stats, "dropped": dropped, "examples_per_step": bs,
        # from metrics.jsonl, so that a resumed run summarises the whole run
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "loss_last_mean": sum(losses[-5:]) / len(losses[-5:]) if losses else None,
        "seconds": round(time.time() - t_start, 2),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the final model supersedes them
    return summary
