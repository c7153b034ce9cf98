"""Programmatic judges: known preferences behind the same protocol as LLM judges.

They are the oracles that let tests check a learning loop optimises what the annotator
prefers (a model judge at chance, like SmolLM2-135M, cannot show that).
Each compares a scalar ``value(prompt, response)``; P(A better) is 1, 0 or 0.5 on ties
(``temperature = 0``) or ``sigmoid((v_A - v_B) / temperature)``. Both orders are by
construction consistent.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

from pofe.judges.base import check_batch
from pofe.records import Judgment, Score


def _pref(va: float, vb: float, temperature: float) -> float:
    if temperature and temperature > 0:
        z = (va - vb) / temperature
        return 1.0 / (1.0 + math.exp(-max(min(z, 60.0), -60.0)))
    if va > vb:
        return 1.0
    if va < vb:
        return 0.0
    return 0.5


class ValueJudge:
    """Pairwise judge from a scalar value function (higher is better)."""

    def __init__(self, value: Callable[[str, str, str | None], float], judge_id: str, temperature: float = 0.0):
        self.value = value
        self.id = judge_id
        self.temperature = temperature

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        check_batch(prompts, responses_a, responses_b)
        refs = references or [None] * len(prompts)
        out = []
        for x, a, b, r in zip(prompts, responses_a, responses_b, refs):
            t0 = time.perf_counter()
            p = _pref(self.value(x, a, r), self.value(x, b, r), self.temperature)
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=True, parse_ok=True, judge_id=self.id,
                                latency_s=time.perf_counter() - t0))
        return out

    def score(self, prompts, responses, *, references=None) -> list[Score]:
        check_batch(prompts, responses)
        refs = references or [None] * len(prompts)
        return [Score(score=float(self.value(x, y, r)), parse_ok=True, judge_id=self.id)
                for x, y, r in zip(prompts, responses, refs)]


def length_value(unit: str = "chars", prefer: str = "shorter") -> Callable[[str, str, str | None], float]:
    """Value = -length (prefer shorter) or +length (prefer longer), in chars, words or tokens-ish."""
    if prefer not in ("shorter", "longer"):
        raise ValueError(f"length judge: prefer must be 'shorter' or 'longer', got {prefer!r}")
    sign = -1.0 if prefer == "shorter" else 1.0

    def value(prompt: str, response: str, reference: str | None = None) -> float:
        n = len(response.split()) if unit == "words" else len(response)
        return sign * n

    return value


def length_judge(prefer: str = "shorter", unit: str = "chars", temperature: float = 0.0) -> ValueJudge:
    return ValueJudge(length_value(unit, prefer), f"length:{prefer}:{unit}", temperature)
