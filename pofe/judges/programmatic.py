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
from typing import Callable

from pofe.judges.base import Capability, JudgeConfigError, JudgeError, check_batch
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


def finite_value(v) -> float | None:
    """``v`` as a float when it is a finite number; None for None, NaN, +-inf, strings, lists,
    arrays: a value function's output that is not a number is no value (counted unreadable),
    never compared (every comparison with NaN is False, which made a NaN pair a 0.5 tie)."""
    if v is None or isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):  # e.g. a tensor with more than one element
        return None
    return f if math.isfinite(f) else None


class ValueJudge:
    """Pairwise judge from a scalar value function (higher is better); also pointwise
    (``score`` is the value itself)."""

    capabilities = frozenset({Capability.PAIRWISE, Capability.POINTWISE})

    def __init__(self, value: Callable[[str, str, str | None], float], judge_id: str, temperature: float = 0.0):
        self.value = value
        self.id = judge_id
        self.temperature = temperature

    def _read(self, x, y, r) -> tuple[float | None, str | None]:
        """(finite value or None, why None)."""
        try:
            v = self.value(x, y, r)
        except JudgeError:
            raise
        except Exception as e:  # a user's value function: one line naming it, not a traceback
            raise JudgeError(f"judge {self.id} raised {type(e).__name__}: {e}") from e
        if v is None:
            return None, "value unavailable"  # e.g. reference-overlap without a reference
        f = finite_value(v)
        return f, None if f is not None else f"value {str(v)[:40]!r} is not a finite number"

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        check_batch(prompts, responses_a, responses_b)
        refs = references or [None] * len(prompts)
        out = []
        for x, a, b, r in zip(prompts, responses_a, responses_b, refs):
            t0 = time.perf_counter()
            (va, ea), (vb, eb) = self._read(x, a, r), self._read(x, b, r)
            if va is None or vb is None:
                # no value, so no verdict (never a 0.5 tie)
                out.append(Judgment(p=None, p_ab=None, p_ba=None, consistent=None, parse_ok=False, judge_id=self.id,
                                    latency_s=time.perf_counter() - t0, extra={"error": ea or eb}))
                continue
            p = _pref(va, vb, self.temperature)
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=True, parse_ok=True, judge_id=self.id,
                                latency_s=time.perf_counter() - t0))
        return out

    def score(self, prompts, responses, *, references=None) -> list[Score]:
        check_batch(prompts, responses)
        refs = references or [None] * len(prompts)
        out = []
        for x, y, r in zip(prompts, responses, refs):
            v, err = self._read(x, y, r)
            out.append(Score(score=v, parse_ok=v is not None, judge_id=self.id, extra={"error": err} if err else {}))
        return out


def length_value(unit: str = "chars", prefer: str = "shorter") -> Callable[[str, str, str | None], float]:
    """Value = -length (prefer shorter) or +length (prefer longer), in chars, words or tokens-ish."""
    if prefer not in ("shorter", "longer"):
        raise JudgeConfigError(f"length judge: prefer must be 'shorter' or 'longer', got {prefer!r}")
    sign = -1.0 if prefer == "shorter" else 1.0

    def value(prompt: str, response: str, reference: str | None = None) -> float:
        n = len(response.split()) if unit == "words" else len(response)
        return sign * n

    return value


def length_judge(prefer: str = "shorter", unit: str = "chars", temperature: float = 0.0) -> ValueJudge:
    return ValueJudge(length_value(unit, prefer), f"length:{prefer}:{unit}", temperature)


def keyword_value(keywords, *, mode: str = "include", case_sensitive: bool = False):
    """Value = number of ``keywords`` present (``include``) or minus that number
    (``exclude``): an oracle for "mentions X" / "avoids X" preferences."""
    if mode not in ("include", "exclude"):
        raise JudgeConfigError(f"keyword judge: mode must be 'include' or 'exclude', got {mode!r}")
    kws = [k if case_sensitive else k.lower() for k in keywords]
    if not kws:
        raise JudgeConfigError("keyword judge: give at least one keyword (judge.keywords)")
    sign = 1.0 if mode == "include" else -1.0

    def value(prompt: str, response: str, reference: str | None = None) -> float:
        text = response if case_sensitive else response.lower()
        return sign * sum(1 for k in kws if k in text)

    return value


def keyword_judge(keywords, *, mode: str = "include", case_sensitive: bool = False, temperature: float = 0.0) -> ValueJudge:
    return ValueJudge(keyword_value(keywords, mode=mode, case_sensitive=case_sensitive),
                      f"keyword:{mode}:{','.join(keywords)}", temperature)


def rouge_l_value():
    """Value = ROUGE-L F1 of the response against the item's reference (rouge-score,
    stemmed); ``None`` without a reference, so the verdict is marked unreadable."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)

    def value(prompt: str, response: str, reference: str | None = None) -> float | None:
        if reference is None:
            return None
        return scorer.score(reference, response)["rougeL"].fmeasure

    return value


def reference_overlap_judge(temperature: float = 0.0) -> ValueJudge:
    return ValueJudge(rouge_l_value(), "reference-overlap:rougeL", temperature)


def import_callable(spec: str):
    """``package.module:function`` -> the function (the only import-string judge kind)."""
    import importlib

    if ":" not in spec:
        raise JudgeConfigError(f"callable judge: expected 'module:function', got {spec!r}")
    mod_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(mod_name)
    except ImportError as e:
        raise JudgeConfigError(f"callable judge: cannot import module {mod_name!r} ({e})") from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise JudgeConfigError(f"callable judge: {mod_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise JudgeConfigError(f"callable judge: {spec!r} is not callable")
    return obj


def callable_judge(spec: str, temperature: float = 0.0) -> ValueJudge:
    """A judge from ``value(prompt, response, reference) -> float | None`` named ``module:function``."""
    fn = import_callable(spec)
    return ValueJudge(lambda x, y, r: fn(x, y, r), f"callable:{spec}", temperature)
