"""Judge-fitness statistics of a ``pofe label`` run (the seed: "Validate the judge before you
validate anything else"), per judged batch (``metrics.jsonl``) and over the whole run
(``summary.json``), computed from ``labels.jsonl`` rows alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pofe.labels import DROP_REASONS
from pofe.records import Judgment

LABEL_DROPS = tuple(r for r in DROP_REASONS if r != "ties")
"""The drop reasons of soft labels (``ties`` applies to hard labels only)."""


def label_stats(rows: Sequence[dict[str, Any]], *, bins: int = 10) -> dict[str, Any]:
    """Judge-fitness statistics over labelled rows.

    * consistency_rate: share of both-order-parsed pairs whose two orders agree;
    * first_position_win_rate: mean over pairs of ½(p_ab + 1 − p_ba) = P(first-shown wins),
      0.5 for a judge without position bias;
    * length_correlation: Pearson r between p − ½ and len(A) − len(B) in characters
      (positive = longer wins);
    * p_histogram: counts of p in ``bins`` equal bins over [0, 1] (piled at 0 and 1 =
      overconfident labels, seed "Overconfident labels"); mean |p − ½| as one number.
    """
    from pofe.stats import pearson

    parsed = [r for r in rows if r["p"] is not None]
    both = [r for r in parsed if r["p_ab"] is not None and r["p_ba"] is not None]
    hist = [0] * bins
    for r in parsed:
        hist[min(int(r["p"] * bins), bins - 1)] += 1
    cons = [r["consistent"] for r in both if r["consistent"] is not None]
    principles: dict[str, int] = {}
    for r in parsed:
        k = str(r.get("principle_id"))
        principles[k] = principles.get(k, 0) + 1
    return {
        "pairs": len(rows),
        "parsed": len(parsed),
        "parse_failures": len(rows) - len(parsed),
        "consistency_rate": sum(cons) / len(cons) if cons else None,
        "first_position_win_rate": (sum(0.5 * (r["p_ab"] + 1 - r["p_ba"]) for r in both) / len(both)) if both else None,
        "length_correlation": pearson([r["p"] - 0.5 for r in parsed],
                                      [len(r["response_a"]) - len(r["response_b"]) for r in parsed]) if len(parsed) > 2 else None,
        "mean_p": sum(r["p"] for r in parsed) / len(parsed) if parsed else None,
        "mean_confidence": sum(abs(r["p"] - 0.5) for r in parsed) / len(parsed) if parsed else None,
        "p_histogram": {"edges": [round(i / bins, 3) for i in range(bins + 1)], "counts": hist},
        "principle_counts": principles,
    }


def batch_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One judged batch's metrics.jsonl row (without ``step``, which the driver adds)."""
    st = label_stats(rows)
    return {"pairs": len(rows), "parsed": st["parsed"], "mean_p": st["mean_p"], "consistency_rate": st["consistency_rate"],
            "dropped": sum(r["dropped"] is not None for r in rows), "text_fallback": sum(bool(r["text_fallback"]) for r in rows)}


def drop_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Pairs kept out of preferences.jsonl, per :class:`~pofe.labels.LabelPolicy` reason."""
    return {k: sum(r.get("dropped") == k for r in rows) for k in LABEL_DROPS}


def cache_counts(judgments: Sequence[Judgment], judge_summary: dict[str, Any]) -> dict[str, Any]:
    """Cache hits/misses of this run: ordered reads (from the shared Judgment summary, which
    reads each judgment's per-order counts) and whole judgments served from the cache."""
    return {"judgments": len(judgments), "judgments_cached": sum(bool(j.cached) for j in judgments),
            "hits": judge_summary.get("cache_hits", 0), "misses": judge_summary.get("cache_misses", 0),
            "hit_rate": judge_summary.get("cache_hit_rate")}
