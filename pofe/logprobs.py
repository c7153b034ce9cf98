"""Summed sequence log-probabilities of completions given prompts.

Every direct-alignment loss (OAIF Eq. 1-3) needs log pi(y|x) = sum_t log pi(y_t | x, y_<t)
for the policy and the reference. This module builds the padded batch once and returns
(B,) sums with the prompt and padding masked out. It never materialises more than one
(B, T, V) logits tensor and reduces it immediately to (B, T) token log-probs.

The reduction from logits to the log-prob of the target token is :func:`selective_logprobs`:
``logit[target] - logsumexp(logits)`` computed in fp32 over chunks of positions, with a
hand-written backward, so neither a full (B, T, V) ``log_softmax`` nor an fp32 copy of bf16
logits is ever kept for the backward pass (the largest activations of a DPO step on a
49k-vocabulary model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class SequenceBatch:
    """A padded batch of prompt+completion token ids.

    ``input_ids``/``attention_mask``: (B, T). ``completion_mask``: (B, T), 1 where the token
    at that position belongs to the completion (so its log-prob counts).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor


def build_batch(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    padding_side: str = "right",
) -> SequenceBatch:
    """Concatenate prompt and completion ids per row and pad to one length."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    T = max(len(r) for r in rows)
    B = len(rows)
    ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    cmask = torch.zeros((B, T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        n = len(p) + len(c)
        off = 0 if padding_side == "right" else T - n
        ids[i, off : off + n] = torch.tensor(rows[i], dtype=torch.long)
        attn[i, off : off + n] = 1
        cmask[i, off + len(p) : off + n] = 1
    return SequenceBatch(ids, attn, cmask)


class _SelectiveLogprobs(torch.autograd.Function):
    """log p(target) = logit[target] - logsumexp(logits), fp32 maths, chunked.

    Forward keeps only the (N,) fp32 log-normaliser; backward rebuilds the softmax one chunk
    at a time: d/dlogits = g * (onehot(target) - softmax(logits)).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, chunk: int):  # logits (N, V), targets (N,)
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32  # at least fp32
        lse = torch.empty(logits.shape[0], dtype=acc, device=logits.device)
        for s in range(0, logits.shape[0], chunk):
            lse[s : s + chunk] = torch.logsumexp(logits[s : s + chunk].to(acc), dim=-1)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).to(acc)
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk = chunk
        return picked - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        for s in range(0, logits.shape[0], ctx.chunk):
            e = s + ctx.chunk
            g = grad[s:e].to(lse.dtype).unsqueeze(-1)
            # -g * softmax in one chunk-sized buffer, in place (same values as out-of-place ops: the
            # bar policy pass's backward here took 23 -> 10 ms on 2 CPU cores)
            d = logits[s:e].to(lse.dtype, copy=True).sub_(lse[s:e].unsqueeze(-1)).exp_().mul_(-g)
            d.scatter_add_(-1, targets[s:e].unsqueeze(-1), g)
            out[s:e] = d
        return out, None, None


def selective_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, chunk: int = 256) -> torch.Tensor:
    """Log-probability of ``targets`` under ``logits`` (..., V) -> (...), in fp32 (fp64 for fp64).

    Numerically ``log_softmax(logits.float()).gather(targets)``, but the memory of the
    backward is the logits themselves plus one (N,) vector: no (..., V) fp32 tensor survives
    the call, whatever the dtype of ``logits`` (bf16 under autocast)."""
    shape = targets.shape
    flat = logits.reshape(-1, logits.shape[-1])
    return _SelectiveLogprobs.apply(flat, targets.reshape(-1), chunk).reshape(shape)


def completion_token_logprobs(model, batch: SequenceBatch, width: int) -> torch.Tensor:
    """(B, width) log-probs of the last ``width`` tokens of a *left-padded* batch (every completion
    ends at position T-1, so all completion tokens lie there), computing the (B, T, V) vocabulary
    projection only for the last ``width + 1`` positions (``logits_to_keep``). Why: prompts never
    need their logits, and with long prompts (multi-turn HH-RLHF dialogues run to several hundred
    tokens) the full (B, T, V) logits and their gradient were most of a step's time and memory.
    Positions come from the mask, so the numbers are :func:`token_logprobs`'s."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids,
                   logits_to_keep=width + 1).logits  # (B, width+1, V): position t predicts token t+1
    lp = selective_logprobs(logits[:, :-1], batch.input_ids[:, -width:])  # fp32 logsumexp - gather
    del logits
    return lp


def token_logprobs(model, batch: SequenceBatch) -> torch.Tensor:
    """(B, T) log-prob of each token given its prefix; position 0 (no prefix) is 0.

    Position ids are derived from the attention mask so that left padding gives the same
    numbers as right padding.
    """
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids
    ).logits  # (B, T, V)
    lp = selective_logprobs(logits[:, :-1], batch.input_ids[:, 1:])
    del logits
    return torch.nn.functional.pad(lp, (1, 0), value=0.0)


def sequence_logprobs(model, batch: SequenceBatch, *, return_tokens: bool = False):
    """Summed completion log-probs (B,), prompt and padding masked.

    With ``return_tokens`` also returns the masked (B, T) per-token log-probs (for KL
    estimates and per-token statistics).
    """
    lp = token_logprobs(model, batch)
    mask = batch.completion_mask.to(lp.dtype)
    tok = lp * mask
    sums = tok.sum(-1)
    return (sums, tok) if return_tokens else sums


def completion_logprobs(
    model,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    padding_side: str = "right",
) -> torch.Tensor:
    """Convenience: build the batch and return summed completion log-probs (B,)."""
    batch = build_batch(prompt_ids, completion_ids, pad_token_id=pad_token_id, padding_side=padding_side)
    batch = SequenceBatch(*(t.to(_device(model)) for t in (batch.input_ids, batch.attention_mask, batch.completion_mask)))
    return sequence_logprobs(model, batch)


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")
