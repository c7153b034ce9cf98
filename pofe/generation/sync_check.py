"""Checking that a weight push took (``sampling.sync_check``): the same fixed tokens scored by
the engine after the push and by a forward pass of the trainer's weights must agree.

Why: a push can succeed at every step it reports and still leave the engine on other weights
(a checkpoint name the loader skips, a reload that copies into a tensor the forward never reads,
a transfer that silently sends nothing); samples would then come from an old policy while every
metric says on-policy. Log-probs of fixed tokens are a cheap end-to-end read of the weights
actually used. Both vLLM engines call :func:`check` after a push; this module imports neither.
"""

from __future__ import annotations

import torch

from pofe.errors import PofeError

CHECK_TEXT = ("The quick brown fox jumps over the lazy dog, and five boxing wizards jump quickly. "
              "Pack my box with five dozen liquor jugs; how vexingly quick daft zebras jump! ")


class SyncCheckError(PofeError, RuntimeError):
    """After a push the engine's log-probs differ from the trainer's: it does not hold the
    trained weights, so the run stops rather than sample from them."""

    exit_code = 1


def check_ids(tokenizer, n: int) -> list[int]:
    """``n`` fixed token ids (the check text, repeated as needed)."""
    ids = tokenizer(CHECK_TEXT, add_special_tokens=False)["input_ids"]
    return (ids * (n // len(ids) + 1))[:n]


@torch.no_grad()
def trainer_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t = 1..n-1 under ``model``'s current weights (eval mode)."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        logits = model(torch.tensor([ids], device=device)).logits[0, :-1].float()
    finally:
        model.train(was)
    target = torch.tensor(ids[1:], device=device)
    return torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1).tolist()


def logp_gap(engine: list[float], trainer: list[float]) -> float:
    """Mean |engine - trainer| per token (nats)."""
    if len(engine) != len(trainer) or not engine:
        raise SyncCheckError(f"sync check: the engine scored {len(engine)} tokens, the trainer {len(trainer)}")
    return sum(abs(a - b) for a, b in zip(engine, trainer)) / len(engine)


def check(gap: float, max_gap: float, where: str) -> float:
    """``gap``, or :class:`SyncCheckError` when it is over ``max_gap``."""
    if gap > max_gap:
        raise SyncCheckError(f"sync check: {where} scores fixed tokens {gap:.4g} nats/token away from the trainer's "
                             f"weights after the push (> sampling.sync_check.max_gap={max_gap:g}): it does not hold "
                             "the trained weights")
    return gap


def mismatch_kl(diff_sum: float, tokens: float) -> float | None:
    """``sync/mismatch_kl``: sum over sampled tokens of log p_sampler - log p_trainer, per token (the
    k1 estimate of KL(sampler || trainer) on the tokens the sampler drew; the sampler's log-probs are
    its raw ones, temperature 1, as vLLM's ``raw_logprobs``). None without tokens. Near 0 when the
    engine samples from the trained weights; it grows with a stale or mis-synced engine, or a
    numerics gap (bf16 engine vs fp32 trainer), the train/inference mismatch that importance
    corrections in RL target."""
    return diff_sum / tokens if tokens else None
