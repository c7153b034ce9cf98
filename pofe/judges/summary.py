"""One summary of a batch of verdicts, shared by ``pofe judge``, ``pofe label``,
``pofe audit`` and the online loop's metrics.

The position-bias numbers follow rlaif-constitutional-ai.txt ("Validate the judge"):
*consistency rate* = fraction of pairs whose two orders prefer the same response;
*first-position win rate* = fraction of single-order reads in which the first-shown
response was preferred (50% for an unbiased judge on any pair set, because every pair is
shown in both orders). Exact ties count one half.
"""

from __future__ import annotations

from typing import Any, Iterable

from pofe.records import Judgment, Score
from pofe.stats import mean


def _win(p: float, first_is_a: bool) -> float:
    """1 if the first-shown response was preferred in this read, 0 if not, ½ on a tie."""
    q = p if first_is_a else 1.0 - p  # P(first-shown better)
    return 1.0 if q > 0.5 else 0.0 if q < 0.5 else 0.5


def summarize_judgments(judgments: Iterable[Judgment], *, seconds: float | None = None,
                        model_calls: int | None = None) -> dict[str, Any]:
    """n, mean_p, consistency_rate, first_position_win_rate, parse_failures, cache hits and
    misses, judge tokens, seconds (wall time if given, else summed latencies)."""
    js = list(judgments)
    ps = [j.p for j in js if j.p is not None]
    both = [j for j in js if j.p_ab is not None and j.p_ba is not None]
    cons = [j.consistent for j in js if j.consistent is not None]
    wins = [_win(j.p_ab, True) for j in js if j.p_ab is not None]
    # p_ba is P(A better) with B shown first, so the first-shown response (B) won when p_ba < ½.
    wins += [_win(j.p_ba, False) for j in js if j.p_ba is not None]
    ex = [j.extra or {} for j in js]
    hits = sum(int(e.get("cache_hits", int(j.cached))) for j, e in zip(js, ex))
    misses = sum(int(e.get("cache_misses", 0)) for e in ex)
    out: dict[str, Any] = {
        "n": len(js),
        "n_labelled": len(ps),
        "mean_p": mean(ps),
        "consistency_rate": mean([1.0 if c else 0.0 for c in cons]),
        "first_position_win_rate": mean(wins) if both else None,
        "parse_failures": sum(1 for j in js if j.p is None),
        "order_parse_failures": sum(int(e.get("orders_failed", 0)) for e in ex),
        "hard_label_fallbacks": sum(int(e.get("hard_label_orders", int(j.hard_label_fallback))) for j, e in zip(js, ex)),
        "truncated_reads": sum(int(e.get("truncated_orders", 0)) for e in ex),
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_rate": hits / (hits + misses) if hits + misses else None,
        "judge_tokens": sum(j.tokens for j in js),
        "seconds": seconds if seconds is not None else sum(j.latency_s for j in js),
    }
    if model_calls is not None:
        out["model_calls"] = model_calls
    return out


def summarize_scores(scores: Iterable[Score], *, seconds: float | None = None,
                     model_calls: int | None = None) -> dict[str, Any]:
    ss = list(scores)
    vals = [s.score for s in ss if s.score is not None]
    ex = [s.extra or {} for s in ss]
    out: dict[str, Any] = {
        "n": len(ss),
        "n_scored": len(vals),
        "mean_score": mean(vals),
        "parse_failures": sum(1 for s in ss if s.score is None),
        "failed_samples": sum(int(e.get("failed_samples", 0)) for e in ex),
        "cache_hits": sum(int(e.get("cache_hits", int(s.cached))) for s, e in zip(ss, ex)),
        "cache_misses": sum(int(e.get("cache_misses", 0)) for e in ex),
        "judge_tokens": sum(s.tokens for s in ss),
        "seconds": seconds if seconds is not None else sum(s.latency_s for s in ss),
    }
    if model_calls is not None:
        out["model_calls"] = model_calls
    return out
