"""Two variants of ``pofe self-reward``'s AIFT pairs, each off by default.

* **CREAM** (Consistency Regularized Self-Rewarding LMs, Wang et al. 2024, arXiv 2410.12735,
  Sec. 4): a small model judging itself drifts and its judgments get noisier; CREAM scores the
  same candidates a second time with the *previous* iteration's model as judge, measures how
  much the two rankings agree (Kendall tau per prompt), and trains on the mean consistency
  ``C = (tau_bar + 1) / 2`` as a soft label: chosen / rejected stay as the current judge ranks
  them and DPO's target is ``p = C`` instead of 1 (``p * DPO(y+, y-) + (1 - p) * DPO(y-, y+)``,
  the soft-label DPO of :mod:`pofe.losses`). In pofe's numbering iteration t samples and judges
  with M_{t-1}, so the previous judge is M_{t-2}: from iteration 3 on. Iteration 2 (the first
  DPO round: M1 has no earlier self-rewarding judge) trains on hard labels and its record says
  so (``cream.applied: false`` with the reason).
* **Temporal Self-Rewarding** (arXiv 2508.06026), two halves. *Anchored rejection*
  (``temporal.anchor: m1``): the rejected response of each pair is the worst-scored of the seed
  model M1's candidates for the prompt, the chosen the best of the current model's, both scored
  by the current judge. M1 rather than the base model M0: M1 is the first model of pofe's chain
  that answers instructions (the paper's anchor is the initial *instruction-tuned* policy; with
  ``seed_sft.enabled: false`` M1 is ``model.name`` itself, so the two coincide). In iteration 2
  M_{t-1} is M1, so the anchor set is the candidate set itself. A prompt whose anchored
  rejected scores at least as high as the chosen gives no pair (counted).
  *Future-guided chosen* (``temporal.future: true``, needs the anchor): a one-step-ahead model
  M_t' is DPO-trained from M_{t-1} on the anchored pairs (its own folder ``iter_t/future/``),
  samples N candidates for each pair's prompt (``data/future_candidates.jsonl``), the current
  judge scores them, and a pair's chosen is replaced by the best of them when it scores higher
  than the chosen (never by the rejected's text); the iteration's DPO then trains M_t from
  M_{t-1} on these pairs. The record counts the replaced chosen (``temporal.future``).
* **Meta-Rewarding** (``meta_judge.enabled``): :mod:`pofe.loops.self_reward.meta_rewarding`.

Every new computation keeps the stage structure of :mod:`pofe.loops.self_reward.self_reward_stages`:
its output is a file under ``iter_t/data/`` (``cream_scores.jsonl``, ``anchor_candidates.jsonl``,
``future_candidates.jsonl``; M_t' is the DPO run ``iter_t/future/``) skipped when present, scoring and generation are split by prompt block (``dp``) and only rank
0 writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from pydantic import model_validator

from pofe.config import PofeConfig
from pofe.stats import kendall_tau_b
from pofe.data.aift import build_pairs
from pofe.runs import read_jsonl
from pofe.loops.self_reward.meta_rewarding import meta_rewarding_pairs
from pofe.runtime.parallel import DataParallel
from pofe.loops.self_reward.stages import write_jsonl


class CreamSettings(PofeConfig):
    """CREAM (Wang et al. 2024): consistency between the current and previous judge as a soft label."""

    enabled: bool = False
    """Score the candidates also with the previous iteration's model as judge (from iteration 3;
    iteration 2 keeps hard labels) and train DPO towards p = C = (mean Kendall tau + 1) / 2."""


class TemporalSettings(PofeConfig):
    """Temporal Self-Rewarding (arXiv 2508.06026): anchored rejection and future-guided chosen."""

    anchor: Literal["m1", "none"] = "none"
    """m1: every pair's rejected is the worst-scored of the seed model M1's candidates for the
    prompt (scored by the current judge); none: best vs worst of the current model's (Self-Rewarding LMs)."""
    future: bool = False
    """Future-guided chosen (needs ``anchor: m1``): a model M_t' DPO-trained one step ahead on the anchored
    pairs samples N candidates per prompt; a pair's chosen becomes the best of them when the current judge
    scores it higher. Costs a second DPO run and N more candidates per pair in every iteration."""

    @model_validator(mode="after")
    def _future_needs_anchor(self):
        if self.future and self.anchor != "m1":
            raise ValueError("temporal.future: the future-guided chosen replaces the chosen of anchored pairs; "
                             "set temporal.anchor: m1 too")
        return self


# ============================================================================ CREAM

def consistency(current: Sequence[Sequence[float | None]], previous: Sequence[Sequence[float | None]]) -> dict[str, Any]:
    """CREAM's consistency of two judges over the same candidates, one score list per prompt:
    Kendall tau per prompt over the candidates both judges scored, ``tau_mean`` over the prompts
    where it is defined, and ``C = (tau_mean + 1) / 2`` (CREAM Sec. 4.2); ``C`` is None when no
    prompt has a defined tau (counted in ``undefined``)."""
    taus, undefined = [], 0
    for a, b in zip(current, previous, strict=True):
        both = [(u, v) for u, v in zip(a, b, strict=True) if u is not None and v is not None]
        tau = kendall_tau_b([u for u, _ in both], [v for _, v in both]) if len(both) >= 2 else None
        if tau is None:
            undefined += 1
        else:
            taus.append(tau)
    tau_mean = sum(taus) / len(taus) if taus else None
    return {"prompts": len(taus), "undefined": undefined, "tau_mean": tau_mean,
            "C": (tau_mean + 1) / 2 if tau_mean is not None else None}


def soft_labelled(pairs: Sequence[dict], c: float) -> list[dict]:
    """The pairs with DPO target ``p = c`` (chosen / rejected as the current judge ranked them)."""
    return [{**p, "p": c} for p in pairs]


def previous_judge_scores(path: Path, rows: Sequence[dict], judge, dp: DataParallel = DataParallel()) -> list[list]:
    """The previous judge's score of every candidate of ``rows`` (one list per row), read back
    from ``path`` when there, else scored (each process its block) and written by rank 0."""
    from pofe.evaluation.self_reward import score_all

    if dp.from_main(path.exists()):
        return dp.from_main([r["scores"] for r in read_jsonl(path)] if dp.main else None)
    flat = [(r["prompt"], y) for r in rows for y in r["responses"]]
    scores = [s.score for s in score_all(judge, [x for x, _ in flat], [y for _, y in flat], dp)]
    out, k = [], 0
    for r in rows:
        out.append(scores[k:k + len(r["responses"])])
        k += len(r["responses"])
    if dp.main:
        write_jsonl(path, [{"index": r.get("index"), "scores": s} for r, s in zip(rows, out)])
    dp.wait()
    return out


# ============================================================================ anchored rejection

def build_anchored_pair(prompt: str, responses: Sequence[str], scores: Sequence[float | None],
                        anchor_responses: Sequence[str], anchor_scores: Sequence[float | None]) -> tuple[dict | None, str]:
    """Chosen = the best-scored current candidate, rejected = the worst-scored anchor (M1)
    candidate, or why there is none: ``unscored`` (no score on one side), ``tie`` (equal
    scores), ``anchor_better`` (the anchor's worst beats the current best), ``identical_text``.
    Among equal scores the first candidate wins (as in :func:`pofe.data.aift.build_pair`)."""
    cur = [(i, s) for i, s in enumerate(scores) if s is not None]
    anc = [(i, s) for i, s in enumerate(anchor_scores) if s is not None]
    if not cur or not anc:
        return None, "unscored"
    hi, lo = max(s for _, s in cur), min(s for _, s in anc)
    if hi == lo:
        return None, "tie"
    if hi < lo:
        return None, "anchor_better"
    c = next(i for i, s in cur if s == hi)
    r = next(i for i, s in anc if s == lo)
    if responses[c] == anchor_responses[r]:
        return None, "identical_text"
    return {"prompt": prompt, "chosen": responses[c], "rejected": anchor_responses[r], "p": 1.0,
            "chosen_score": hi, "rejected_score": lo, "chosen_index": c, "rejected_index": r,
            "rejected_from": "M1"}, "kept"


def build_anchored_pairs(rows: Sequence[dict], anchor_rows: Sequence[dict]) -> tuple[list[dict], dict[str, int]]:
    """Anchored pairs of every prompt (``rows[i]`` and ``anchor_rows[i]`` hold the same prompt)."""
    counts = {"prompts": len(rows), "kept": 0, "tie": 0, "unscored": 0, "anchor_better": 0, "identical_text": 0}
    pairs = []
    for row, anc in zip(rows, anchor_rows, strict=True):
        if row["prompt"] != anc["prompt"]:
            raise ValueError(f"anchor candidates out of step at prompt {row.get('index')}")
        pair, why = build_anchored_pair(row["prompt"], row["responses"], row["scores"], anc["responses"], anc["scores"])
        counts[why] += 1
        if pair is not None:
            pair["provenance"] = {"judge_id": row.get("judge_id"), "prompt_index": row.get("index")}
            pairs.append(pair)
    return pairs, counts


# ============================================================================ future-guided chosen

def replace_chosen(pairs: Sequence[dict], future_rows: Sequence[dict], source: str) -> tuple[list[dict], dict[str, int]]:
    """Each pair with its chosen replaced by the best-scored of ``future_rows[i]``'s candidates (the
    one-step-ahead model's, same prompt, scored by the same judge as the pair) when that scores
    strictly higher than the chosen and is not the rejected's text; the first among equal best."""
    counts = {"pairs": len(pairs), "replaced": 0, "kept_chosen": 0, "unscored": 0}
    out = []
    for pair, row in zip(pairs, future_rows, strict=True):
        if pair["prompt"] != row["prompt"]:
            raise ValueError(f"future candidates out of step at prompt {row.get('index')}")
        scored = [(i, s) for i, s in enumerate(row["scores"]) if s is not None]
        if not scored:
            counts["unscored"] += 1
            out.append(pair)
            continue
        best = max(s for _, s in scored)
        i = next(i for i, s in scored if s == best)
        if best > pair["chosen_score"] and row["responses"][i] != pair["rejected"]:
            counts["replaced"] += 1
            out.append({**pair, "chosen": row["responses"][i], "chosen_score": best, "chosen_index": i,
                        "chosen_from": source, "replaced_chosen": pair["chosen"], "replaced_score": pair["chosen_score"]})
        else:
            counts["kept_chosen"] += 1
            out.append(pair)
    return out, counts


# ============================================================================ the stage

def variant_pairs(cfg, rows: Sequence[dict], *, t: int, it_dir: Path, anchor_rows, prev_judge,
                  dp: DataParallel = DataParallel(), meta_roles: Callable[[], tuple] | None = None,
                  future: Callable[[list[dict]], tuple[list[dict], dict]] | None = None,
                  ) -> tuple[list[dict], dict[str, int], dict[str, Any]]:
    """Step 4 with the configured variants: the AIFT pairs, their counts and the variants'
    record. ``anchor_rows()`` gives M1's scored candidates for these prompts (called only with
    ``temporal.anchor: m1``), ``prev_judge()`` the previous iteration's judge or None when
    there is none (called only with ``cream.enabled``), ``meta_roles()`` the (judgment writer,
    meta-judge) of M_{t-1} (only with ``meta_judge.enabled``), ``future(pairs)`` the pairs with
    future-guided chosen and their record (only with ``temporal.future``)."""
    info: dict[str, Any] = {}
    meta = getattr(cfg, "meta_judge", None)
    if meta is not None and meta.enabled:
        pairs, counts, info["meta_judge"] = meta_rewarding_pairs(meta, rows, it_dir, meta_roles, t, dp)
    elif cfg.temporal.anchor == "m1":
        pairs, counts = build_anchored_pairs(rows, anchor_rows())
        info["temporal"] = {"anchor": "m1", "future": {"enabled": False}}
        if getattr(cfg.temporal, "future", False):
            pairs, info["temporal"]["future"] = future(pairs)
    else:
        pairs, counts = build_pairs(rows)
    if cfg.cream.enabled:
        info["cream"] = _cream(rows, it_dir, t, prev_judge, dp)
        if info["cream"]["applied"]:  # the consistency of the actor's ranking: judge pairs keep p = 1
            pairs = [p if p.get("role") == "judge" else {**p, "p": info["cream"]["C"]} for p in pairs]
    return pairs, counts, info


def _cream(rows, it_dir: Path, t: int, prev_judge, dp: DataParallel) -> dict[str, Any]:
    judge = prev_judge()
    if judge is None:
        return {"applied": False, "labels": "hard",
                "reason": f"iteration {t}: M{t - 1} has no previous-iteration model to judge with"}
    prev = previous_judge_scores(it_dir / "data" / "cream_scores.jsonl", rows, judge, dp)
    c = consistency([r["scores"] for r in rows], prev)
    if c["C"] is None:
        return {"applied": False, "labels": "hard", **c,
                "reason": "no prompt with a defined Kendall tau (fewer than two candidates scored by both judges, or all tied)"}
    return {"applied": True, "labels": "soft", "judge": f"M{t - 2}", **c}
