"""The one win-rate module: every command that compares two policies with a judge (``pofe
eval``, ``self-reward``'s checkpoint selection, ``online``'s in-training eval) counts with
these functions, so their numbers are comparable.

* **Tie rule** (FastChat MT-Bench pairwise, ``fastchat/llm_judge/show_result.py``;
  shared/docs/anchor-selfreward-cai-judges.md section 3): every pair is judged in both
  orders; a *win* for A needs both orders to prefer A, a *loss* both to prefer B; the orders
  disagreeing, or a verdict of exactly 0.5, is a *tie*. Identical responses are ties without
  a judge call. A pair with an unparsed order is dropped and counted, never guessed.
* **Rate**: ``(W + T/2) / N`` (FastChat's ``win_rate_adjusted``, its sort key), next to
  ``W / N``.
* **Interval**: the Wilson score interval (Wilson 1927), which is right at small n where a
  percentile bootstrap collapses: 12 wins of 12 gives [0.757, 1.0], not [1.0, 1.0]. With
  ties the outcome is not Bernoulli; Wilson on the tie-adjusted rate uses the variance
  ``p(1-p)``, the largest a [0, 1] outcome with mean p can have, so it is conservative.
* **Length-controlled win rate** in two versions: :func:`length_controlled_win_rate` is
  AlpacaEval 2's GLM (Dubois et al. 2024, ``glm_winrate.py``) with the instruction-difficulty
  term fitted on the evaluated set; :func:`length_controlled_win_rate_simple` is pofe's
  earlier intercept + length model, kept under that name.
* **Bradley-Terry ratings** of 3+ policies from their pairwise outcomes
  (:func:`bradley_terry`), with bootstrap intervals over prompts (OAIF's 4-way comparison).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import numpy as np

from pofe.stats import fit_logistic, wilson_interval

WIN, TIE, LOSS = 1, 0, -1


# --------------------------------------------------------------------------- tie rule


def verdict(p: float | None) -> int | None:
    """WIN / LOSS / TIE of one order's P(A better); None when unparsed."""
    if p is None:
        return None
    return WIN if p > 0.5 else LOSS if p < 0.5 else TIE


def pair_outcome(p_ab: float | None, p_ba: float | None) -> int | None:
    """Outcome for A from its two per-order verdicts (both expressed as P(A better)).

    Win only if both orders prefer A, loss only if both prefer B, otherwise a tie
    ("an inconsistent pair is a tie"). ``None`` when an order failed to parse.
    """
    a, b = verdict(p_ab), verdict(p_ba)
    if a is None or b is None:
        return None
    return a if a == b and a != TIE else TIE


def outcome_value(o: int) -> float:
    """1, 1/2, 0 for WIN, TIE, LOSS: the y of the tie-adjusted rate and of the LC fit."""
    return 1.0 if o == WIN else 0.5 if o == TIE else 0.0


# --------------------------------------------------------------------------- intervals

# wilson_interval lives in pofe.stats (below calibration, report and audit, which use
# it too) and is imported above, so it stays importable from here.


# --------------------------------------------------------------------------- counting


def count_outcomes(outcomes: Sequence[int | None]) -> dict[str, Any]:
    """W/T/L, rates and the Wilson interval of the tie-adjusted rate. Pure."""
    w = sum(o == WIN for o in outcomes)
    t = sum(o == TIE for o in outcomes)
    l_ = sum(o == LOSS for o in outcomes)
    n = w + t + l_
    lo, hi = wilson_interval(w + 0.5 * t, n)
    return {
        "wins": w, "ties": t, "losses": l_, "n": n, "dropped_unparsed": len(outcomes) - n,
        "win_rate": w / n if n else None,
        "win_rate_adjusted": (w + 0.5 * t) / n if n else None,
        "win_rate_adjusted_ci95": [lo, hi] if n else [None, None],
    }


def judge_pairs(judge, prompts: Sequence[str], resp_a: Sequence[str], resp_b: Sequence[str], *,
                      references: Sequence[str | None] | None = None) -> list[tuple[float | None, float | None]]:
    """(p_ab, p_ba) per pair, both as P(A better).

    A judge's :class:`~pofe.records.Judgment` already carries both orders; a judge that
    answered only one (``p_ba is None`` with ``p_ab`` set) is asked again with the order
    swapped, so every pair is judged both ways. Pointwise judges are wrapped (equal scores
    = 0.5).
    """
    from pofe.judges.base import as_pairwise

    judge = as_pairwise(judge)
    kw = {"references": list(references)} if references is not None else {}
    js = judge.judge(list(prompts), list(resp_a), list(resp_b), **kw)
    pairs = [(j.p_ab, j.p_ba) for j in js]
    redo = [i for i, (ab, ba) in enumerate(pairs) if ab is not None and ba is None]
    if redo:
        kw2 = {"references": [references[i] for i in redo]} if references is not None else {}
        back = judge.judge([prompts[i] for i in redo], [resp_b[i] for i in redo], [resp_a[i] for i in redo], **kw2)
        for i, j in zip(redo, back):
            pairs[i] = (pairs[i][0], None if j.p_ab is None else 1.0 - j.p_ab)
    return pairs


def head_to_head(judge, prompts: Sequence[str], a: Sequence[str], b: Sequence[str], *,
                 references: Sequence[str | None] | None = None,
                 judge_context: Callable[[], Any] = contextlib.nullcontext) -> dict[str, Any]:
    """A against B under the one tie rule: :func:`count_outcomes` plus per-pair ``pairs``
    rows ``{p_ab, p_ba, outcome}``. Identical responses are ties without a judge call;
    ``judge_context`` wraps the judge call (e.g. the online loop's eval-mode switch)."""
    outcomes: list[int | None] = [TIE if x == y else None for x, y in zip(a, b)]
    pairs: list[tuple[float | None, float | None]] = [(None, None)] * len(outcomes)
    todo = [i for i, o in enumerate(outcomes) if o is None]
    if todo:
        refs = None if references is None else [references[i] for i in todo]
        with judge_context():
            got = judge_pairs(judge, [prompts[i] for i in todo], [a[i] for i in todo], [b[i] for i in todo],
                                    references=refs)
        for i, pr in zip(todo, got):
            pairs[i] = pr
            outcomes[i] = pair_outcome(*pr)
    res = count_outcomes(outcomes)
    res["pairs"] = [{"p_ab": ab, "p_ba": ba, "outcome": o, "identical": x == y}
                    for (ab, ba), o, x, y in zip(pairs, outcomes, a, b)]
    return res


# --------------------------------------------------------------------------- length control


def length_controlled_win_rate_simple(y: Sequence[float], dlen: Sequence[float], *, l2: float = 1e-3) -> dict[str, Any]:
    """pofe's earlier, simplified LC: ``y ~ sigmoid(a + b tanh(dlen / sd))``, predict at dlen = 0.

    No instruction-difficulty term; not comparable to AlpacaEval's LC (use
    :func:`length_controlled_win_rate`). ``y`` in {1, 1/2, 0} for A; ``dlen = len(A) - len(B)``.
    """
    from scipy.special import expit  # scipy on use: importing this module stays cheap for the CLI

    y = np.asarray(y, dtype=float)
    dlen = np.asarray(dlen, dtype=float)
    if y.size == 0:
        return {"lc_win_rate_simple": None, "slope": None, "length_sd": None}
    sd = float(np.std(dlen))
    z = np.tanh(dlen / sd) if sd > 0 else np.zeros_like(dlen)
    mean = float(y.mean())
    if mean in (0.0, 1.0):  # all losses / all wins: the intercept MLE is at infinity
        return {"lc_win_rate_simple": mean, "slope": 0.0, "length_sd": sd}
    fit = fit_logistic(z, y, l2=l2)
    return {"lc_win_rate_simple": float(expit(fit.intercept)), "slope": float(fit.coef[0]), "length_sd": sd}


def length_controlled_win_rate(y: Sequence[float], dlen: Sequence[float], instructions: Sequence[Any] | None = None, *,
                               difficulty_l2: float = 1.0, length_l2: float = 1e-3) -> dict[str, Any]:
    """AlpacaEval-2 length-controlled win rate (``glm_winrate.py``), fitted on this set.

    GLM: ``logit P(A wins on x) = theta + phi * tanh(dlen / sd(dlen)) + gamma_x`` with
    ``gamma_x`` the instruction-difficulty term of instruction x, fitted here on the
    evaluated set (AlpacaEval downloads one fitted across its leaderboard models, which
    needs the hub). LC = the mean over rows of the prediction at ``dlen = 0``:
    ``mean sigmoid(theta + gamma_x)``.

    Fitting: soft targets y in [0, 1] (ties 1/2, as AlpacaEval's ``preference - 1``);
    ``gamma`` has an L2 penalty ``difficulty_l2/2 ||gamma||^2`` (a N(0, 1/difficulty_l2)
    prior: with one row per instruction it is only identified through the penalty, and
    AlpacaEval regularises too, with L1) and ``theta`` none. Because ``theta`` is free, the
    fitted probabilities average exactly to the mean outcome; with equal lengths the length
    term is zero, so LC equals the tie-adjusted rate exactly. ``instructions`` groups rows of
    the same instruction (several turns, several opponents); default: one per row.
    """
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    y = np.asarray(y, dtype=float)
    dlen = np.asarray(dlen, dtype=float)
    n = y.size
    if n == 0:
        return {"lc_win_rate": None, "length_coef": None, "length_sd": None, "n_instructions": 0}
    keys = list(range(n)) if instructions is None else list(instructions)
    if len(keys) != n:
        raise ValueError(f"length_controlled_win_rate: {n} outcomes but {len(keys)} instruction keys")
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    g = np.array([index[k] for k in keys])
    m = len(index)
    sd = float(np.std(dlen))
    t = np.tanh(dlen / sd) if sd > 0 else np.zeros(n)
    mean = float(y.mean())
    if mean in (0.0, 1.0):  # all wins / all losses: theta's MLE is at infinity; the limit is the raw rate
        return {"lc_win_rate": mean, "length_coef": 0.0, "length_sd": sd, "n_instructions": m,
                "intercept": None, "converged": True}

    def f(theta_vec):
        a, phi, gam = theta_vec[0], theta_vec[1], theta_vec[2:]
        z = a + phi * t + gam[g]
        nll = -np.sum(y * log_expit(z) + (1 - y) * log_expit(-z))
        r = expit(z) - y
        grad = np.empty_like(theta_vec)
        grad[0] = r.sum()
        grad[1] = (r * t).sum() + length_l2 * phi
        grad[2:] = np.bincount(g, weights=r, minlength=m) + difficulty_l2 * gam
        return nll + 0.5 * length_l2 * phi**2 + 0.5 * difficulty_l2 * np.sum(gam**2), grad

    res = minimize(f, np.zeros(2 + m), jac=True, method="L-BFGS-B",
                   options={"maxiter": 5000, "gtol": 1e-10, "ftol": 1e-15})
    a, phi, gam = res.x[0], res.x[1], res.x[2:]
    lc = float(np.mean(expit(a + gam[g])))
    return {"lc_win_rate": lc, "length_coef": float(phi), "length_sd": sd, "n_instructions": m,
            "intercept": float(a), "converged": bool(res.success)}


# --------------------------------------------------------------------------- several policies


def bradley_terry(names: Sequence[str], games: Sequence[tuple[int, int, float]], *, l2: float = 0.0) -> dict[str, Any]:
    """Bradley-Terry ratings ``r`` with ``P(i beats j) = sigmoid(r_i - r_j)`` from ``games``
    ``(i, j, y)`` where y is i's outcome (1, 1/2, 0). Maximum likelihood with ``r[0] = 0``
    (the first name is the reference); ratings are on the logit scale (x 400/ln 10 for Elo).
    ``l2`` > 0 keeps ratings finite when a policy wins or loses every game.
    """
    k = len(names)
    if k < 2:
        raise ValueError("bradley_terry: need at least two policies")
    if not games:
        return {"names": list(names), "ratings": [0.0] * k, "converged": True}
    i = np.array([gm[0] for gm in games])
    j = np.array([gm[1] for gm in games])
    y = np.array([gm[2] for gm in games], dtype=float)
    x = np.zeros((len(games), k))
    x[np.arange(len(games)), i] += 1.0
    x[np.arange(len(games)), j] -= 1.0
    fit = fit_logistic(x[:, 1:], y, intercept=False, l2=l2)
    return {"names": list(names), "ratings": [0.0] + [float(c) for c in fit.coef], "converged": fit.converged}


def compare_policies(names: Sequence[str], outcomes: dict[tuple[int, int], Sequence[int | None]], *,
                     n_boot: int = 200, seed: int = 0, l2: float = 1e-2) -> dict[str, Any]:
    """Pairwise win matrix and Bradley-Terry ratings with 95% bootstrap intervals.

    ``outcomes[(i, j)]`` holds, per prompt (same prompt order for every pair), i's outcome
    against j under the tie rule. The bootstrap resamples prompts (every pair's outcome on a
    prompt moves together), refitting BT each time. A small ridge ``l2`` keeps a policy that
    wins every game at a finite rating.
    """
    k = len(names)
    matrix: list[list[dict[str, Any] | None]] = [[None] * k for _ in range(k)]
    for (a, b), os_ in outcomes.items():
        c = count_outcomes(os_)
        matrix[a][b] = c
        flipped = [None if o is None else -o for o in os_]
        matrix[b][a] = count_outcomes(flipped)
    n_prompts = max((len(v) for v in outcomes.values()), default=0)

    def games_for(rows: Sequence[int]):
        out = []
        for (a, b), os_ in outcomes.items():
            for r in rows:
                o = os_[r]
                if o is not None:
                    out.append((a, b, outcome_value(o)))
        return out

    point = bradley_terry(names, games_for(range(n_prompts)), l2=l2)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot if n_prompts else 0):
        rows = rng.integers(0, n_prompts, n_prompts)
        boots.append(bradley_terry(names, games_for(rows), l2=l2)["ratings"])
    ci = [[None, None]] * k
    if boots:
        arr = np.array(boots)
        ci = [[float(np.quantile(arr[:, q], 0.025)), float(np.quantile(arr[:, q], 0.975))] for q in range(k)]
    order = sorted(range(k), key=lambda q: -point["ratings"][q])
    return {
        "policies": list(names),
        "win_matrix": [[None if c is None else c["win_rate_adjusted"] for c in row] for row in matrix],
        "pairs": {f"{names[a]} vs {names[b]}": {kk: v for kk, v in c.items()} for a, row in enumerate(matrix)
                  for b, c in enumerate(row) if c is not None and a < b},
        "bradley_terry": {"reference": names[0], "scale": "logit (x 173.7 for Elo points)", "l2": l2,
                          "ratings": dict(zip(names, point["ratings"])),
                          "ci95": dict(zip(names, ci)), "n_boot": len(boots)},
        "ranking": [names[q] for q in order],
    }
