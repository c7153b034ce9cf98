"""Small statistics, one home for every layer (a leaf: imports nothing of pofe): the mean every
summary, audit and metrics row uses; and, for audit, eval and sim, a soft-target logistic
regression, rank correlation, the Wilson score interval and a percentile bootstrap. Win rates,
calibration, reports and the audit all build on it.

Why not scikit-learn: these fits have 2 to 14 parameters and need soft targets (a judge's
p as the label, rlaif-constitutional-ai "soft BT loss"), which is one ``scipy.optimize``
call with an analytic gradient.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


def mean(xs: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None (a judge's unreadable verdicts and a step's missing
    metrics are counted elsewhere, never averaged in as a number); None when there are none.
    ``math.fsum``: the correctly rounded sum, so the order of the values never changes the result."""
    vals = [float(x) for x in xs if x is not None]
    return math.fsum(vals) / len(vals) if vals else None


def sigmoid(z):
    from scipy.special import expit  # scipy on use: the mean alone (judges' summaries) imports no scipy

    return expit(z)


@dataclass(frozen=True)
class LogisticFit:
    """Weights of ``P(y=1 | x) = sigmoid(intercept + x @ coef)``."""

    intercept: float
    coef: np.ndarray
    converged: bool

    def predict(self, x: np.ndarray) -> np.ndarray:
        return sigmoid(self.intercept + np.asarray(x, dtype=float) @ self.coef)


def fit_logistic(
    x: np.ndarray,
    y: np.ndarray,
    *,
    intercept: bool = True,
    l2: float = 0.0,
    sample_weight: np.ndarray | None = None,
) -> LogisticFit:
    """Maximum-likelihood logistic regression with targets ``y`` in [0, 1] (soft labels allowed).

    The loss is the summed binary cross-entropy ``-sum w (y log s + (1-y) log(1-s))`` plus
    ``l2/2 * ||coef||^2`` (the intercept is never penalised). With ``l2 = 0`` and separable
    hard labels the MLE does not exist; callers that can meet separable data pass a small
    ``l2`` so the slope stays finite (and large, which is the point).
    """
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    y = np.asarray(y, dtype=float)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"fit_logistic: {x.shape[0]} rows of x but {y.shape[0]} targets")
    if np.any((y < 0) | (y > 1)):
        raise ValueError("fit_logistic: targets must lie in [0, 1]")
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    w = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, dtype=float)
    n = x.shape[0]
    design = np.hstack([np.ones((n, 1)), x]) if intercept else x
    penal = np.full(design.shape[1], l2)
    if intercept:
        penal[0] = 0.0

    def f(theta):
        z = design @ theta
        # -[y log s(z) + (1-y) log s(-z)], computed stably
        nll = -np.sum(w * (y * log_expit(z) + (1 - y) * log_expit(-z)))
        grad = design.T @ (w * (expit(z) - y))
        return nll + 0.5 * np.sum(penal * theta**2), grad + penal * theta

    res = minimize(f, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B",
                   options={"maxiter": 2000, "gtol": 1e-9, "ftol": 1e-14})
    theta = res.x
    if intercept:
        return LogisticFit(float(theta[0]), theta[1:].copy(), bool(res.success))
    return LogisticFit(0.0, theta.copy(), bool(res.success))


def rankdata(a: np.ndarray) -> np.ndarray:
    """Mid-ranks (ties share the average rank)."""
    from scipy.stats import rankdata as _rd

    return _rd(a, method="average")


def pearson(a, b) -> float | None:
    """Pearson correlation; None when either side is constant (correlation undefined)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def spearman(a, b) -> float | None:
    """Spearman rank correlation (Pearson on mid-ranks); None when a side is constant."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.size < 2:
        return None
    return pearson(rankdata(a), rankdata(b))


_Z95 = 1.959963984540054  # scipy.stats.norm.ppf(0.975)


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (``successes`` may be a
    half-integer: ties count one half).

    ``n = 0`` gives (0, 1): no data rules nothing out. Hand values: 12 of 12 -> (0.7575, 1);
    1 of 1 -> (0.2065, 1); 0 of 1 -> (0, 0.7935).
    """
    if n <= 0:
        return (0.0, 1.0)
    if level == 0.95:
        z = _Z95
    else:
        from scipy.stats import norm

        z = float(norm.ppf(0.5 + level / 2))
    p = min(1.0, max(0.0, successes / n))
    z2 = z * z
    den = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / den
    # The interval always holds its own point: at 0 or n successes the bound is exactly 0 or 1
    # (in floats centre + half can land at 1 - 1e-16, and a plot's error bar went negative).
    return (min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)))


def bootstrap_ci(
    values: np.ndarray, statistic=np.mean, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over resampled rows of ``values``.

    The mean of values in [0, 1] (a rate; ties as 1/2) gets the Wilson score interval
    instead: a percentile bootstrap of 12 wins in 12 resamples nothing but wins and prints
    [1.000, 1.000], while Wilson gives [0.757, 1.0] (:func:`wilson_interval`). With no
    rows the interval is (0, 1).
    """
    values = np.asarray(values)
    n = len(values)
    if statistic is np.mean and (n == 0 or (np.issubdtype(values.dtype, np.number) and values.ndim == 1
                                            and np.all((values >= 0) & (values <= 1)))):
        return wilson_interval(float(values.sum()) if n else 0.0, n, level)
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    if statistic is np.mean:
        stats = values[idx].mean(axis=1)
    else:
        stats = np.array([statistic(values[i]) for i in idx])
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def somers_d(x, y) -> float | None:
    """Somers' D of ``y`` given ``x``: ``sum sign(dx) sign(dy) / #{pairs with dx != 0}``.

    The rank correlation to use when ``x`` is a judge's preference, which is often piled at
    0 and 1: pairs the judge ranks equally are left out instead of diluting the statistic, so
    a judge whose every preference follows length scores exactly 1 (a hard one too, whose
    Spearman correlation with a continuous length difference tops out near 0.87). For a hard
    0/1 ``x`` it equals 2 AUC - 1. None when every ``x`` is equal. O(n^2) in row chunks.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = x.size
    num = 0.0
    den = 0
    for s in range(0, n, 512):
        sx = np.sign(x[s : s + 512, None] - x[None, :])
        sy = np.sign(y[s : s + 512, None] - y[None, :])
        num += float(np.sum(sx * sy))
        den += int(np.count_nonzero(sx))
    if den == 0:
        return None
    return num / den  # both sums count each unordered pair twice


def kendall_tau_b(x, y) -> float | None:
    """Kendall's tau-b of two score lists over the same items, (C - D) / sqrt((C + D + Tx)(C + D + Ty)):
    C / D concordant / discordant pairs, Tx / Ty pairs tied in x only / y only, a pair tied in both
    counted nowhere (scipy's ``kendalltau(variant="b")``). None when undefined (fewer than two
    items, or every pair tied in one list): callers decide what an undefined rank correlation means."""
    c = d = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            sx, sy = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
            if sx == 0 and sy == 0:
                continue
            if sx == 0:
                tx += 1
            elif sy == 0:
                ty += 1
            elif sx == sy:
                c += 1
            else:
                d += 1
    denom = math.sqrt((c + d + tx) * (c + d + ty))
    return (c - d) / denom if denom else None
