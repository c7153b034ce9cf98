"""From choice-token log-probabilities to a debiased pairwise preference.

OAIF Appendix E: the judge's preference is the softmax of the log-probabilities of the
tokens "1" vs "2", and position bias is removed by averaging the distribution over both
orders. With both per-order numbers expressed as P(A better),

    p_ab = P("first") in order (A, B)
    p_ba = P("second") in order (B, A)          # the second-shown response is A
    p    = (p_ab + p_ba) / 2 = ½(p₁₂ + 1 − p₂₁)

(rlaif-constitutional-ai.txt, "From judge log-probabilities to a label" and the worked
example: (−0.4, −1.3) → 0.711, swapped (−0.7, −0.9) → 0.450, averaged 0.581).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence


def logsumexp(values: Iterable[float]) -> float:
    """log(sum(exp(v))), skipping None and -inf; NaN in gives NaN out (callers reject it)."""
    vals = [v for v in values if v is not None and v != -math.inf]
    if any(math.isnan(v) for v in vals):
        return math.nan
    if not vals:
        return -math.inf
    m = max(vals)
    return m + math.log(sum(math.exp(v - m) for v in vals))


def first_choice_probability(lp_first: float | None, lp_second: float | None) -> float | None:
    """P(first-shown response better), renormalised over the two choices.

    ``None`` when the judge put no readable mass on either choice (never a made-up 0.5),
    and when either number is NaN or +inf (a broken read, not a probability).
    A choice absent from the judge's output (``-inf``) gets probability 0.
    """
    if lp_first is None or lp_second is None:
        return None
    if math.isnan(lp_first) or math.isnan(lp_second) or lp_first == math.inf or lp_second == math.inf:
        return None
    if lp_first == -math.inf and lp_second == -math.inf:
        return None
    if lp_second == -math.inf:
        return 1.0
    if lp_first == -math.inf:
        return 0.0
    # softmax over {first, second} = sigmoid(lp_first - lp_second), computed stably
    d = lp_first - lp_second
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


def sum_variants(logprobs: dict[str, float] | dict[int, float], variants: Sequence) -> float:
    """Log of the summed probability of every tokenizer variant of one choice.

    "1" and " 1" are the same answer written two ways; counting only one of them would
    under-read the choice whenever the judge prefers the other spelling. Variants missing
    from ``logprobs`` contribute nothing (-inf).
    """
    return logsumexp(logprobs[v] for v in dict.fromkeys(variants) if v in logprobs)


def is_consistent(p_ab: float | None, p_ba: float | None) -> bool | None:
    """Both orders prefer the same response (both > ½, both < ½, or both exactly ½)."""
    if p_ab is None or p_ba is None:
        return None
    return _sign(p_ab - 0.5) == _sign(p_ba - 0.5)


def _sign(x: float) -> int:
    return (x > 1e-12) - (x < -1e-12)


@dataclass(frozen=True)
class PairwiseProbability:
    """Per-order and debiased P(A better). Supports ``obj.p`` and ``obj["p"]``."""

    p_ab: float | None
    p_ba: float | None
    p: float | None
    consistent: bool | None

    def __getitem__(self, key: str):
        return getattr(self, key)

    def to_dict(self) -> dict:
        return asdict(self)


def combine_orders(p_ab: float | None, p_ba: float | None, *, require_both: bool = True) -> float | None:
    """Average the two per-order P(A better). With one order missing: ``None`` when
    ``require_both`` (a single order keeps its position bias), else the order we have."""
    if p_ab is not None and p_ba is not None:
        return 0.5 * (p_ab + p_ba)
    if require_both:
        return None
    return p_ab if p_ab is not None else p_ba


def pairwise_probability(
    order_ab: tuple[float | None, float | None] | None = None,
    order_ba: tuple[float | None, float | None] | None = None,
    *,
    require_both: bool = True,
) -> PairwiseProbability:
    """Turn two ordered ``(logprob of choice 1, logprob of choice 2)`` pairs into P(A better).

    ``order_ab`` is read from the prompt showing A first, ``order_ba`` from the prompt
    showing B first; in both the tuple is (first-shown choice, second-shown choice), as the
    judge saw them. ``pairwise_probability((-0.4, -1.3), (-0.7, -0.9))`` gives
    p_ab=0.711, p_ba=0.450, p=0.581, consistent=False.
    """
    p_ab = first_choice_probability(*order_ab) if order_ab is not None else None
    p_first_ba = first_choice_probability(*order_ba) if order_ba is not None else None
    p_ba = None if p_first_ba is None else 1.0 - p_first_ba  # A was shown second
    return PairwiseProbability(p_ab=p_ab, p_ba=p_ba, p=combine_orders(p_ab, p_ba, require_both=require_both),
                               consistent=is_consistent(p_ab, p_ba))


def clamp(p: float | None, bounds: Sequence[float] | None) -> float | None:
    """Clamp a label to [lo, hi]. CAI (Bai et al. 2022) clamps chain-of-thought labels to
    [0.4, 0.6] because reasoning pushes probabilities toward 0/1 and an overconfident label
    inflates reward-model margins (rlaif-constitutional-ai.txt, Stage 2)."""
    if p is None or not bounds:
        return p
    lo, hi = bounds
    return min(max(p, lo), hi)
