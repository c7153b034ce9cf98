"""Reward-modelling metrics of a judge against human rankings (Self-Rewarding LMs, Sec. 3.2.2
and Table 4: pairwise accuracy, exact match, Spearman, Kendall tau, 5-best percentage).

Input: one :class:`RankedGroup` per prompt -- the human ranks of its responses (0 = best,
lower is better, ties allowed) and the judge's scores (``None`` = the judge could not score
that response; it is never replaced by a guess).

Definitions (chosen so that a judge that says nothing useful gets no credit):

* **pairwise accuracy** -- over pairs of responses to the same prompt with *different* human
  ranks and both scored: the share where the judge's score is strictly higher for the
  human-preferred one. A judge tie is not agreement (it counts as a miss and is reported
  as ``pairwise_ties``), otherwise a judge that gives every response a 4 would score 50 %.
* **exact match** -- over prompts with all responses scored: the share where the judge's
  ordering (mid-ranks of the scores) equals the human ordering exactly.
* **Spearman rho / Kendall tau-b** -- computed per prompt between the scores and the
  negated human ranks, then averaged over prompts (the rankings are per instruction).
  A prompt whose human ranks are all equal carries no ranking and is skipped; a prompt whose
  judge scores are all equal (human ranks not) gets 0: the judge expressed no order, and
  skipping it would let a judge that mostly ties look perfectly correlated on the rest.
* **5-best share** -- of the responses the judge gave a perfect score (``max_score``, 5 on
  the additive rubric), the share that humans ranked top for their prompt
  ("how often responses the model scores a perfect 5/5 were rated highest by humans").
  ``None`` when the judge gave no perfect score (reported with ``n_perfect``).
* **top-1 agreement** -- the share of prompts whose (unique) highest-scored response is
  human-top (the explainer's alternative reading of 5-best).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Sequence

import numpy as np

from pofe.stats import kendall_tau_b


@dataclass(frozen=True)
class RankedGroup:
    """Human ranks (0 = best) and judge scores of the responses to one prompt."""

    ranks: tuple[float, ...]
    scores: tuple[float | None, ...]

    def __post_init__(self) -> None:
        if len(self.ranks) != len(self.scores):
            raise ValueError(f"RankedGroup: {len(self.ranks)} ranks but {len(self.scores)} scores")


def _midranks(values: Sequence[float]) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(np.asarray(values, dtype=float), method="average")


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = _midranks(x), _midranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / math.sqrt((rx**2).sum() * (ry**2).sum()))


def rm_metrics(groups: Sequence[RankedGroup], *, max_score: float = 5.0) -> dict[str, Any]:
    """All Table-4 metrics plus the counts behind them (see the module docstring)."""
    pairs = correct = judge_ties = pairs_unscored = 0
    exact_n = exact_hit = 0
    rhos: list[float] = []
    taus: list[float] = []
    corr_constant_judge = corr_skipped = 0
    n_perfect = perfect_top = 0
    top1_n = top1_hit = 0
    unscored = sum(s is None for g in groups for s in g.scores)
    for g in groups:
        ranks = [float(r) for r in g.ranks]
        best = min(ranks) if ranks else None
        for i, j in combinations(range(len(ranks)), 2):
            if ranks[i] == ranks[j]:
                continue
            si, sj = g.scores[i], g.scores[j]
            if si is None or sj is None:
                pairs_unscored += 1
                continue
            pairs += 1
            better, worse = (si, sj) if ranks[i] < ranks[j] else (sj, si)
            if better > worse:
                correct += 1
            elif better == worse:
                judge_ties += 1
        for r, s in zip(ranks, g.scores):
            if s is not None and s >= max_score:
                n_perfect += 1
                perfect_top += int(r == best)
        if len(ranks) < 2 or any(s is None for s in g.scores):
            continue
        scores = [float(s) for s in g.scores]  # type: ignore[arg-type]
        exact_n += 1
        # Higher score = better; lower rank = better. Compare orderings on mid-ranks.
        exact_hit += int(np.array_equal(_midranks([-s for s in scores]), _midranks(ranks)))
        if len(set(ranks)) == 1:
            corr_skipped += 1
        elif len(set(scores)) == 1:
            corr_constant_judge += 1
            rhos.append(0.0)
            taus.append(0.0)
        else:
            neg = [-r for r in ranks]
            rhos.append(_spearman(scores, neg))
            tau = kendall_tau_b(scores, neg)
            taus.append(0.0 if tau is None else tau)  # one list all ties: no ranking information
        top = max(scores)
        if scores.count(top) == 1 and len(set(ranks)) > 1:
            top1_n += 1
            top1_hit += int(ranks[scores.index(top)] == best)
    return {
        "pairwise_accuracy": correct / pairs if pairs else None,
        "pairwise_ties": judge_ties / pairs if pairs else None,
        "exact_match": exact_hit / exact_n if exact_n else None,
        "spearman": float(np.mean(rhos)) if rhos else None,
        "kendall_tau": float(np.mean(taus)) if taus else None,
        "five_best_share": perfect_top / n_perfect if n_perfect else None,
        "top1_agreement": top1_hit / top1_n if top1_n else None,
        "n_groups": len(groups),
        "n_pairs": pairs,
        "n_pairs_unscored": pairs_unscored,
        "n_unscored_responses": unscored,
        "n_exact_groups": exact_n,
        "n_corr_groups": len(rhos),
        "n_corr_constant_judge": corr_constant_judge,
        "n_corr_skipped_human_ties": corr_skipped,
        "n_perfect": n_perfect,
    }


# ----------------------------------------------------------------------------- pairwise reward margins

def logit(p: float, eps: float = 1e-6) -> float:
    """log(p / (1 − p)), with p clipped to [eps, 1 − eps]."""
    p = min(max(p, eps), 1 - eps)
    return math.log(p / (1 - p))


def margin_metrics(margins: Sequence[float], p: Sequence[float], *, bins: int = 10) -> dict[str, Any]:
    """Held-out metrics of a reward model's margins Δr = r(chosen) − r(rejected) against labels p
    (``pofe rm``; rlaif-constitutional-ai, "Overconfident labels").

    * accuracy: over pairs with p ≠ ½, the share where sign(Δr) = sign(p − ½); Δr = 0 is a miss;
      ``accuracy_ci95`` its 95% Wilson interval.
    * calibration: the predicted q = σ(Δr) against the label p in ``bins`` equal bins of q.
      Each pair enters twice, as (q, p) and (1 − q, 1 − p): the orientation of a pair is
      arbitrary, and without the mirror every point of a chosen-first dataset would sit in
      the upper half. ECE = Σ_b (n_b / N) |mean q_b − mean p_b|.
    * loss: the soft Bradley-Terry loss (:func:`pofe.losses.soft_bt_loss`) averaged over pairs.
    * margins: mean, std, quantiles, mean |Δr|, and the margin the labels imply,
      mean logit(p) over soft labels (p strictly inside (0, 1)): a well-fit soft RM has
      mean Δr close to it; hard labels have no finite target.
    """
    import torch

    from pofe.losses import soft_bt_loss

    m = torch.as_tensor(list(margins), dtype=torch.float64)
    y = torch.as_tensor(list(p), dtype=torch.float64)
    n = len(m)
    if n == 0:
        return {"n": 0}
    decided = y != 0.5
    correct = ((m > 0) & (y > 0.5)) | ((m < 0) & (y < 0.5))
    acc = float(correct[decided].double().mean()) if decided.any() else None
    from pofe.stats import wilson_interval

    # the Wilson interval of the accuracy (the win-rate rule's): what the model card shows next to it
    ci = list(wilson_interval(int(correct[decided].sum()), int(decided.sum()))) if decided.any() else None
    q = torch.sigmoid(m)
    qs, ys = torch.cat([q, 1 - q]), torch.cat([y, 1 - y])
    idx = torch.clamp((qs * bins).long(), max=bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        sel = idx == b
        k = int(sel.sum())
        if k == 0:
            table.append({"bin": [b / bins, (b + 1) / bins], "n": 0, "mean_pred": None, "mean_label": None})
            continue
        mq, my = float(qs[sel].mean()), float(ys[sel].mean())
        ece += k / (2 * n) * abs(mq - my)
        table.append({"bin": [b / bins, (b + 1) / bins], "n": k, "mean_pred": mq, "mean_label": my})
    soft = (y > 0) & (y < 1)
    target = float(torch.tensor([logit(float(v)) for v in y[soft]]).mean()) if soft.any() else None
    return {
        "n": n, "accuracy": acc, "accuracy_ci95": ci, "n_decided": int(decided.sum()),
        "loss": float(soft_bt_loss(m, y).mean()),
        "ece": ece, "reliability": table,
        "margin": {
            "mean": float(m.mean()), "std": float(m.std()) if n > 1 else 0.0, "mean_abs": float(m.abs().mean()),
            "p10": float(torch.quantile(m, 0.1)), "median": float(m.median()), "p90": float(torch.quantile(m, 0.9)),
            "max_abs": float(m.abs().max()), "label_implied_mean": target,
        },
    }
