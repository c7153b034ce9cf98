"""One ``pofe sft`` step and what it needs: examples tokenised with the chat template, the
example indices of a step, and the response-only negative log-likelihood.

Self-Rewarding LMs Sec. 3.4: "loss computed only on target tokens" -- the prompt and the
padding are masked (``build_batch``'s completion mask), and the loss is the token mean over
the whole optimiser batch, whatever its split into micro-batches.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pofe.logprobs import build_batch, completion_token_logprobs
from pofe.models import apply_chat_template
from pofe.records import SFTExample
from pofe.runtime.activations import lean_activations
from pofe.runtime.parallel import DataParallel
from pofe.runtime.precision import Precision, autocast
from pofe.runtime.step import optimizer_step


@dataclass(frozen=True)
class Tokenized:
    prompt_ids: list[int]
    response_ids: list[int]
    source: str


def tokenize_examples(tokenizer, examples: Sequence[SFTExample], max_length: int) -> tuple[list[Tokenized], dict[str, int]]:
    """Render prompts with the chat template (exactly as generation does) and append EOS to
    the response: the end-of-turn token is part of the target, otherwise the model never
    learns to stop. Nothing is truncated silently: too-long and empty examples are dropped and
    counted."""
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
    """Example indices of optimiser step ``step`` (0-based): position s = step * batch_size + i
    walks epoch after epoch, each epoch a permutation seeded by (seed, epoch). A pure function
    of the step, so a resumed run sees exactly the batches an uninterrupted one would."""
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
    ``build_batch``'s completion mask) and the number of response tokens. Left-padded, with logits
    only over the responses (:func:`pofe.logprobs.completion_token_logprobs`): the prompt's
    positions are never scored, so their vocabulary projection is skipped."""
    batch = build_batch([t.prompt_ids for t in items], [t.response_ids for t in items], pad_token_id=pad_token_id,
                        padding_side="left")
    dev = next(model.parameters()).device
    batch = type(batch)(*(x.to(dev) for x in (batch.input_ids, batch.attention_mask, batch.completion_mask)))
    width = max(1, max(len(t.response_ids) for t in items))
    lp = completion_token_logprobs(model, batch, width)
    mask = batch.completion_mask[:, -width:].to(lp.dtype)
    return -(lp * mask).sum(), int(mask.sum().item())


def sft_step(model, items: Sequence[Tokenized], optimizer, scheduler, *, micro_batch: int, pad_token_id: int,
             precision: Precision = "fp32", grad_clip: float | None = None, step: int, detail: str = "",
             dp: DataParallel = DataParallel()) -> dict[str, Any]:
    """One optimiser step on ``items`` (this process's shard of the step; forward/backward in
    chunks of ``micro_batch``); returns the step's metrics row, over all processes. ``step``
    (1-based) and ``detail`` name the step in a non-finite-loss error."""
    n_tok = dp.sum(sum(len(x.response_ids) for x in items))  # the whole step's response tokens
    optimizer.zero_grad(set_to_none=True)
    total_nll = 0.0
    dp.lockstep(model, -(-len(items) // micro_batch), pad_token_id=pad_token_id)  # sharded: as many passes as any process
    for k in range(0, len(items), micro_batch):
        with autocast(precision, next(model.parameters()).device), lean_activations(model):
            nll, _ = response_nll(model, items[k : k + micro_batch], pad_token_id)
        # Token-mean over the whole optimiser batch, whatever the micro-batching and the processes.
        (nll / n_tok).backward()
        total_nll += float(nll.detach())
    total_nll = dp.sum(total_nll)
    done = optimizer_step(optimizer, scheduler, model.parameters(), losses={detail: total_nll}, step=step,
                          grad_clip=grad_clip, dp=dp)
    lr, grad_norm = done.lr, done.grad_norm
    return {"loss": total_nll / n_tok, "learning_rate": lr, "grad_norm": grad_norm, "num_tokens": int(n_tok),
            "eft_share": dp.sum(sum(x.source == "eft" for x in items)) / dp.sum(len(items))}
