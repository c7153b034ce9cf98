"""Pairwise tournament rewards: a prompt's k samples compared by a pairwise judge, turned into
one reward per sample (``reward.kind: pairwise`` of ``pofe rl``).

A pairwise judge answers "is A better than B?", which is what LLM judges are best at, but a
policy-gradient step needs a number per sample. Each prompt's group of k samples plays a
small tournament:

* **matchups** (:func:`matchups`): ``all-pairs`` (k(k−1)/2 pairs), ``circular`` (i against
  i+1 mod k: k pairs) or ``chunked`` (the samples split into chunks of m, all pairs inside a
  chunk: about k(m−1)/2 pairs, linear in k; a leftover single sample meets the first sample
  of the chunk before it, so every sample plays);
* **both orders**: each matchup is read as (a, b) and (b, a) and combined,
  p(a > b) = ½(p₁₂ + 1 − p₂₁) (:func:`pofe.judges.probability.combine_orders`, both orders
  required, as the judges' own ``require_both_orders``). A judge that already reads both
  orders in one verdict (LLM judges with ``judge.both_orders``) is asked once per matchup; a
  programmatic or pointwise-derived judge has no position to be biased by. One order keeps
  the judge's position bias, which tilts every all-pairs score toward the lower index;
* **soft p**, mapped by an audit's fitted calibration map when one is given
  (:func:`pofe.labels.apply_calibration`, applied to each verdict the judge
  returns, before the two orders are combined, since that is the p the audit fitted);
* **score** (:func:`group_scores`): sample i's reward is the mean over its matchups of its
  soft win score (p when it is A, 1 − p when it is B), or its Bradley–Terry strength θ_i of
  a per-group fit P(i > j) = σ(θ_i − θ_j) on the soft outcomes (:func:`bradley_terry`,
  ridge-regularised so hard 0/1 verdicts stay finite; strengths sum to 0 per connected
  chunk). The RL estimator then subtracts its own group baseline.

An unreadable comparison (``p`` None, not a number, outside [0, 1], or one order of two
unreadable) is masked: it contributes nothing to either sample, is never scored 0 or 0.5,
and is counted. A sample left with no readable comparison gets the mean reward of its
group's scored samples (so its advantage is 0) and is counted; a group with no readable
comparison at all is unscored (None). Two identical responses are the same answer: p = ½
without asking the judge.

Metrics (``reward/...`` in metrics.jsonl): ``judge_calls_per_group`` (ordered comparisons:
a matchup read in both orders counts 2, also when one verdict of the judge holds both),
``unreadable`` (masked comparisons), ``no_comparison`` (samples given their group's mean),
``tie_rate`` (readable comparisons with p = ½) and ``bt_spread`` (mean over groups of
max θ − min θ of the Bradley–Terry fit: how decisively the judge separates the samples).

Pure numpy apart from the judge call, so every number can be checked by hand
(tests/loops/test_rl_tournament.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PATTERNS = ("all-pairs", "circular", "chunked")
SCORES = ("mean", "bt")
_TIE_TOL = 1e-9


# ----------------------------------------------------------------------------- matchups

def matchups(k: int, pattern: str, group_size: int = 3) -> list[tuple[int, int]]:
    """The (a, b) index pairs of one group of ``k`` samples, a < b except for circular's
    wrap-around pair (k−1, 0). ``group_size`` is the chunk size m of ``chunked``."""
    if k < 2:
        return []
    if pattern == "all-pairs":
        return [(i, j) for i in range(k) for j in range(i + 1, k)]
    if pattern == "circular":
        if k == 2:  # (0, 1) and (1, 0) would be the same matchup twice
            return [(0, 1)]
        return [(i, (i + 1) % k) for i in range(k)]
    if pattern == "chunked":
        if group_size < 2:
            raise ValueError(f"chunked matchups need chunks of at least 2 samples, got group_size={group_size}")
        out: list[tuple[int, int]] = []
        starts = list(range(0, k, group_size))
        for s in starts:
            chunk = list(range(s, min(s + group_size, k)))
            if len(chunk) == 1:  # a lone leftover sample: one match against the chunk before it
                out.append((starts[-2], chunk[0]))
                continue
            out += [(a, b) for n, a in enumerate(chunk) for b in chunk[n + 1:]]
        return out
    raise ValueError(f"unknown tournament pattern {pattern!r}; choose one of {list(PATTERNS)}")


def groups_of(prompts: Sequence[str]) -> list[range]:
    """Index ranges of runs of consecutive equal prompts: ``pofe rl`` lays out each prompt's
    samples next to each other, so a run is one prompt's group (training or evaluation,
    whatever the number of samples per prompt)."""
    out, start = [], 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or prompts[i] != prompts[start]:
            out.append(range(start, i))
            start = i
    return out


# ----------------------------------------------------------------------------- scoring

def bradley_terry(k: int, games: Sequence[tuple[int, int, float]], *, l2: float = 0.1,
                  iters: int = 100, tol: float = 1e-10) -> np.ndarray:
    """Strengths θ (k,) maximising Σ_g [y log σ(θ_a − θ_b) + (1 − y) log σ(θ_b − θ_a)] − l2/2 ‖θ‖²
    for games (a, b, y) with y ∈ [0, 1] a's soft outcome. Newton's method with a halving line
    search (the objective is strictly concave for l2 > 0). The ridge keeps θ finite when a
    sample wins every game and makes Σθ = 0 over each connected set of samples (a sample with
    no game gets 0)."""
    theta = np.zeros(k)
    if not games or k == 0:
        return theta
    a = np.array([g[0] for g in games])
    b = np.array([g[1] for g in games])
    y = np.array([g[2] for g in games], dtype=float)

    def loss(t):
        d = t[a] - t[b]
        return float(np.sum(np.logaddexp(0.0, -d) * y + np.logaddexp(0.0, d) * (1 - y)) + 0.5 * l2 * t @ t)

    cur = loss(theta)
    for _ in range(iters):
        d = theta[a] - theta[b]
        s = 1.0 / (1.0 + np.exp(-d))
        r = s - y
        grad = np.bincount(a, weights=r, minlength=k) - np.bincount(b, weights=r, minlength=k) + l2 * theta
        w = s * (1 - s)
        hess = l2 * np.eye(k)
        np.add.at(hess, (a, a), w)
        np.add.at(hess, (b, b), w)
        np.add.at(hess, (a, b), -w)
        np.add.at(hess, (b, a), -w)
        step = np.linalg.solve(hess, grad)
        t_new, scale = theta - step, 1.0
        new = loss(t_new)
        while new > cur + 1e-15 and scale > 1e-6:
            scale *= 0.5
            t_new = theta - scale * step
            new = loss(t_new)
        theta, done = t_new, float(np.max(np.abs(scale * step))) < tol
        cur = new
        if done:
            break
    return theta


@dataclass
class GroupResult:
    """One group's rewards (None: unscored) and its counts."""

    rewards: list[float | None]
    bt: np.ndarray
    readable: int = 0
    unreadable: int = 0
    ties: int = 0
    no_comparison: int = 0
    bt_spread: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def group_scores(k: int, pairs: Sequence[tuple[int, int]], ps: Sequence[float | None], *, score: str = "mean",
                 l2: float = 0.1) -> GroupResult:
    """Rewards of one group from its matchups ``pairs`` and p(a > b) per matchup (None:
    unreadable, masked). ``score``: ``mean`` (mean soft win score) or ``bt`` (Bradley–Terry
    strength). A sample with no readable matchup gets the mean reward of the scored samples."""
    if score not in SCORES:
        raise ValueError(f"unknown tournament score {score!r}; choose one of {list(SCORES)}")
    wins = [[] for _ in range(k)]
    games = []
    res = GroupResult(rewards=[None] * k, bt=np.zeros(k))
    for (a, b), p in zip(pairs, ps):
        if p is None:
            res.unreadable += 1
            continue
        res.readable += 1
        res.ties += abs(p - 0.5) <= _TIE_TOL
        wins[a].append(p)
        wins[b].append(1.0 - p)
        games.append((a, b, p))
    played = [i for i in range(k) if wins[i]]
    if not played:
        res.no_comparison = k if pairs else 0
        return res
    res.bt = bradley_terry(k, games, l2=l2)
    res.bt_spread = float(res.bt[played].max() - res.bt[played].min())
    vals = {i: (sum(wins[i]) / len(wins[i]) if score == "mean" else float(res.bt[i])) for i in played}
    fill = sum(vals.values()) / len(vals)
    res.rewards = [vals.get(i, fill) for i in range(k)]
    res.no_comparison = k - len(played)
    return res


# ----------------------------------------------------------------------------- judging

def judge_reads_both_orders(judge) -> bool:
    """True when one verdict of ``judge`` already covers both orders: a judge that says so
    (``both_orders``, as the LLM judges do), or a programmatic / pointwise-derived judge,
    consistent by construction. Anything else is taken as one order per verdict and the
    tournament asks for the swapped order itself (correct either way; at worst twice the cost)."""
    flag = getattr(judge, "both_orders", None)
    if flag is not None:
        return bool(flag)
    from pofe.judges.base import PointwiseAsPairwise
    from pofe.judges.programmatic import ValueJudge

    return isinstance(judge, (ValueJudge, PointwiseAsPairwise))


def verdict_p(j, calibration: dict | None = None) -> float | None:
    """The verdict's p(A > B) as a number in [0, 1], calibrated when a map is given; None when
    it is unreadable (never a made-up 0.5)."""
    p = getattr(j, "p", None) if j is not None and getattr(j, "parse_ok", True) else None
    if p is None or isinstance(p, (bool, str, bytes)) or not hasattr(p, "__float__"):
        return None
    try:
        p = float(p)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        return None
    if calibration:
        from pofe.labels import apply_calibration

        p = apply_calibration(p, calibration)
    return p


class Tournament:
    """Judge every group's matchups in one batched judge call and score them.

    ``__call__(prompts, responses)`` -> (rewards with None for unscored, metrics dict)."""

    def __init__(self, judge, *, pattern: str = "all-pairs", group_size: int = 3, both_orders: bool = True,
                 score: str = "mean", calibration: dict | None = None, l2: float = 0.1):
        from pofe.judges.base import Capability, JudgeConfigError, require_capability

        if pattern not in PATTERNS:
            raise JudgeConfigError(f"reward.pairwise.pattern: unknown pattern {pattern!r}; choose one of {list(PATTERNS)}")
        if score not in SCORES:
            raise JudgeConfigError(f"reward.pairwise.score: unknown score {score!r}; choose one of {list(SCORES)}")
        require_capability(judge, Capability.PAIRWISE, where="reward.judge")
        self.judge = judge
        self.inner_both = judge_reads_both_orders(self.judge)
        if not both_orders and getattr(self.judge, "both_orders", False):
            raise JudgeConfigError("reward.pairwise.both_orders is false but the judge reads both orders itself "
                                   "(judge.both_orders); set judge.both_orders=false too for one order")
        self.pattern, self.group_size, self.both_orders = pattern, group_size, both_orders
        self.score, self.calibration, self.l2 = score, calibration, l2
        self.id = f"pairwise:{pattern}:{score}:{getattr(self.judge, 'id', '?')}"

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> tuple[list[float | None], dict[str, Any]]:
        if len(prompts) != len(responses):
            raise ValueError(f"tournament: {len(prompts)} prompts but {len(responses)} responses")
        swap = self.both_orders and not self.inner_both  # the tournament reads the second order itself
        plan = []  # (group, pairs, per pair: indices of its verdicts in items, or None for identical responses)
        items: list[tuple[str, str, str]] = []
        calls = 0
        for g in groups_of(prompts):
            pairs = matchups(len(g), self.pattern, self.group_size)
            slots = []
            for a, b in pairs:
                ra, rb = responses[g[a]], responses[g[b]]
                if ra == rb:  # the same answer twice: no preference to read
                    slots.append(None)
                    continue
                idx = [len(items)]
                items.append((prompts[g[a]], ra, rb))
                if swap:
                    idx.append(len(items))
                    items.append((prompts[g[a]], rb, ra))
                calls += 2 if self.both_orders else 1
                slots.append(idx)
            plan.append((g, pairs, slots))
        verdicts = self.judge.judge([x for x, _, _ in items], [a for _, a, _ in items], [b for _, _, b in items]) \
            if items else []
        if len(verdicts) != len(items):
            from pofe.judges.base import JudgeError

            raise JudgeError(f"judge {getattr(self.judge, 'id', '?')} returned {len(verdicts)} verdicts for "
                             f"{len(items)} comparisons")
        from pofe.judges.probability import combine_orders

        rewards: list[float | None] = [None] * len(prompts)
        tot = {"readable": 0, "unreadable": 0, "ties": 0, "no_comparison": 0}
        spreads, n_groups = [], 0
        for g, pairs, slots in plan:
            ps = []
            for idx in slots:
                if idx is None:
                    ps.append(0.5)
                    continue
                p_ab = verdict_p(verdicts[idx[0]], self.calibration)
                if len(idx) == 2:
                    q = verdict_p(verdicts[idx[1]], self.calibration)  # P(B > A) with B shown first
                    ps.append(combine_orders(p_ab, None if q is None else 1.0 - q, require_both=True))
                else:
                    ps.append(p_ab)
            res = group_scores(len(g), pairs, ps, score=self.score, l2=self.l2)
            for i, r in zip(g, res.rewards):
                rewards[i] = r
            if pairs:
                n_groups += 1
            for key in tot:
                tot[key] += getattr(res, key)
            if res.bt_spread is not None:
                spreads.append(res.bt_spread)
        metrics = {
            "reward/judge_calls_per_group": calls / n_groups if n_groups else 0.0,
            "reward/unreadable": tot["unreadable"],
            "reward/no_comparison": tot["no_comparison"],
            "reward/tie_rate": tot["ties"] / tot["readable"] if tot["readable"] else None,
            "reward/bt_spread": sum(spreads) / len(spreads) if spreads else None,
        }
        return rewards, metrics
