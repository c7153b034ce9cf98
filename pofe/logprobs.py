"""Summed sequence log-probabilities of completions given prompts.

Every direct-alignment loss (OAIF Eq. 1-3) needs log pi(y|x) = sum_t log pi(y_t | x, y_<t)
for the policy and the reference. This module builds the padded batch once and returns
(B,) sums with the prompt and padding masked out. It never materialises more than one
(B, T, V) logits tensor and reduces it immediately to (B, T) token log-probs.
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


def token_logprobs(model, batch: SequenceBatch) -> torch.Tensor:
    """(B, T) log-prob of each token given its prefix; position 0 (no prefix) is 0.

    Position ids are derived from the attention mask so that left padding gives the same
    numbers as right padding.
    """
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids
    ).logits  # (B, T, V)
    logits = logits[:, :-1].float()
    targets = batch.input_ids[:, 1:]
    # log_softmax + gather, then drop the (B, T, V) tensor right away.
    lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
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
