"""AIFT pairs of Self-Rewarding LMs (Sec. 3.4, "Self-Instruction creation", Step 4): for each
prompt, the highest- vs the lowest-scored of its N candidates; prompts whose candidates tie
(or have fewer than two scores) are dropped and counted, never given an invented preference.
"""

from __future__ import annotations

from typing import Sequence


def build_pair(prompt: str, responses: Sequence[str], scores: Sequence[float | None]) -> tuple[dict | None, str]:
    """The (highest, lowest) mean-score pair of one prompt, or why there is none.

    Reasons: ``fewer_than_2_scored`` (unscored candidates are excluded, never given a value),
    ``tie`` (highest == lowest: "discard the prompt entirely"), ``identical_text`` (the best
    and worst are the same string sampled twice and scored differently: no preference
    between them, which llm-swarm's script would still train on). Among equal scores the
    first candidate wins (deterministic; the paper does not say).
    """
    scored = [(i, s) for i, s in enumerate(scores) if s is not None]
    if len(scored) < 2:
        return None, "fewer_than_2_scored"
    hi = max(s for _, s in scored)
    lo = min(s for _, s in scored)
    if hi == lo:
        return None, "tie"
    c = next(i for i, s in scored if s == hi)
    r = next(i for i, s in scored if s == lo)
    if responses[c] == responses[r]:
        return None, "identical_text"
    return {"prompt": prompt, "chosen": responses[c], "rejected": responses[r], "p": 1.0,
            "chosen_score": hi, "rejected_score": lo, "chosen_index": c, "rejected_index": r}, "kept"


def build_pairs(rows: Sequence[dict]) -> tuple[list[dict], dict[str, int]]:
    """AIFT pairs from candidate rows ``{prompt, responses, scores}`` and the drop counts."""
    counts = {"prompts": len(rows), "kept": 0, "tie": 0, "fewer_than_2_scored": 0, "identical_text": 0}
    pairs = []
    for row in rows:
        pair, why = build_pair(row["prompt"], row["responses"], row["scores"])
        counts[why] += 1
        if pair is not None:
            pair["provenance"] = {"judge_id": row.get("judge_id"), "prompt_index": row.get("index")}
            pairs.append(pair)
    return pairs, counts


def score_stats(rows: Sequence[dict], pairs: Sequence[dict]) -> dict:
    """Candidates scored / unscored, their mean score, and the mean chosen-rejected margin."""
    scores = [s for r in rows for s in r["scores"]]
    scored = [s for s in scores if s is not None]
    return {"candidates": len(scores), "unscored_candidates": len(scores) - len(scored),
            "mean_score": sum(scored) / len(scored) if scored else None,
            "pair_margin_mean": (sum(p["chosen_score"] - p["rejected_score"] for p in pairs) / len(pairs)
                                 if pairs else None)}
