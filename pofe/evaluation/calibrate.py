"""Calibration of a judge's p against human labels: ECE, Brier score, a reliability diagram,
and a fitted map (temperature or isotonic) that labelling commands apply to every label.

rlaif-constitutional-ai ("Choices that matter"): soft labels are only worth training on if
p means what it says; a CoT judge's p piles at 0 and 1, which the seed answers with a clamp
to [0.4, 0.6]. A temperature fitted on the human calibration set is the measured
alternative (Guo et al. 2017, "On Calibration of Modern Neural Networks", temperature
scaling): ``p_cal = sigmoid(logit(p) / T)``, one parameter, order-preserving, fitted by
maximum likelihood. T > 1 softens an overconfident judge, T < 1 sharpens a timid one.
Isotonic regression (Zadrozny & Elkan 2002) is the non-parametric alternative.

The map is stored in the audit report under ``calibration.map`` and applied with
:func:`apply_calibration` (the ledger keeps the raw p next to the calibrated one).

* ECE: ``sum_b n_b / N * |mean(y_b) - mean(p_b)|`` over 10 equal-width bins of p, with y the
  human label (1 = A better; human ties left out).
* Brier: ``mean((p - y)^2)``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy.optimize import isotonic_regression, minimize_scalar
from scipy.special import expit, logit

from pofe.labels import _EPS, T_MAX, apply_calibration, no_information, no_information_reason
from pofe.stats import wilson_interval

def _arrays(p, y) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=float)
    y = np.asarray(y, dtype=float)
    if p.shape != y.shape:
        raise ValueError(f"calibration: {p.size} probabilities but {y.size} labels")
    return p, y


def ece(p: Sequence[float], y: Sequence[float], bins: int = 10) -> float | None:
    """Expected calibration error over ``bins`` equal-width bins (None with no rows)."""
    p, y = _arrays(p, y)
    if p.size == 0:
        return None
    idx = np.clip((p * bins).astype(int), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum() / p.size * abs(float(y[m].mean()) - float(p[m].mean()))
    return float(total)


def brier(p: Sequence[float], y: Sequence[float]) -> float | None:
    p, y = _arrays(p, y)
    return float(np.mean((p - y) ** 2)) if p.size else None


def reliability(p: Sequence[float], y: Sequence[float], bins: int = 10) -> list[dict[str, Any]]:
    """Reliability-diagram rows: per bin of p, n, mean p and the share of human A labels."""
    p, y = _arrays(p, y)
    idx = np.clip((p * bins).astype(int), 0, bins - 1)
    rows = []
    for b in range(bins):
        m = idx == b
        n = int(m.sum())
        lo, hi = wilson_interval(float(y[m].sum()) if n else 0.0, n)
        rows.append({"lo": b / bins, "hi": (b + 1) / bins, "n": n,
                     "mean_p": float(p[m].mean()) if n else None,
                     "frac_human_a": float(y[m].mean()) if n else None,
                     "frac_human_a_ci95": [lo, hi] if n else [None, None]})
    return rows


def fit_temperature(p: Sequence[float], y: Sequence[float]) -> float:
    """T minimising the NLL of ``sigmoid(logit(p) / T)`` against y (searched on log T in
    [1/100, 100]; a result at 100 means "no information", :func:`no_information`). p is clipped
    to [1e-6, 1 - 1e-6], so a hard 0/1 judge gets a finite logit."""
    p, y = _arrays(p, y)
    if p.size == 0:
        return 1.0
    z = logit(np.clip(p, _EPS, 1 - _EPS))

    def nll(log_t):
        q = np.clip(expit(z / np.exp(log_t)), 1e-12, 1 - 1e-12)
        return -float(np.sum(y * np.log(q) + (1 - y) * np.log(1 - q)))

    res = minimize_scalar(nll, bounds=(-np.log(T_MAX), np.log(T_MAX)), method="bounded", options={"xatol": 1e-6})
    return float(np.exp(res.x))


def fit_isotonic(p: Sequence[float], y: Sequence[float]) -> dict[str, list[float]]:
    """Isotonic (non-decreasing) map from p to P(human A), as knots for linear interpolation."""
    p, y = _arrays(p, y)
    if p.size == 0:
        return {"x": [0.0, 1.0], "y": [0.0, 1.0]}
    order = np.argsort(p, kind="stable")
    fitted = isotonic_regression(y[order], increasing=True).x
    xs, ys = [], []
    for x, f in zip(p[order], fitted):  # one knot per distinct p (the mean fitted value there)
        if xs and x == xs[-1]:
            continue
        xs.append(float(x))
        ys.append(float(f))
    return {"x": xs, "y": ys}


def calibration_report(p: Sequence[float], y: Sequence[float], *, method: str = "temperature", bins: int = 10,
                       seed: int = 0) -> dict[str, Any]:
    """ECE/Brier before and after calibration, the map fitted on every row, and honest
    held-out numbers: 2-fold cross-fitting (fit on one half, measure on the other, both ways)."""
    p, y = _arrays(p, y)
    n = p.size
    out: dict[str, Any] = {"n": int(n), "bins": bins, "ece": ece(p, y, bins), "brier": brier(p, y),
                           "reliability": reliability(p, y, bins)}
    if n < 4:
        out["map"] = {"method": "none", "reason": f"only {n} human-labelled pairs"}
        return out
    t = fit_temperature(p, y)
    iso = fit_isotonic(p, y)
    maps = {"temperature": {"method": "temperature", "temperature": t}, "isotonic": {"method": "isotonic", **iso}}
    out["map"] = maps[method]
    out["temperature"] = t
    if no_information(t):
        # No map to apply: the saved one says so (labels.calibration refuses it, see load_calibration_map).
        out["no_information"] = True
        out["map"] = {"method": "none", "no_information": True, "fitted_temperature": t,
                      "reason": no_information_reason(t)}
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    halves = (perm[: n // 2], perm[n // 2:])
    held: dict[str, list[float]] = {"raw": [], "temperature": [], "isotonic": []}
    ys: list[float] = []
    for fit_idx, test_idx in (halves, halves[::-1]):
        tt = fit_temperature(p[fit_idx], y[fit_idx])
        ii = fit_isotonic(p[fit_idx], y[fit_idx])
        held["raw"] += list(p[test_idx])
        held["temperature"] += [apply_calibration(float(v), {"method": "temperature", "temperature": tt}) for v in p[test_idx]]
        held["isotonic"] += [apply_calibration(float(v), {"method": "isotonic", **ii}) for v in p[test_idx]]
        ys += list(y[test_idx])
    out["held_out"] = {k: {"ece": ece(v, ys, bins), "brier": brier(v, ys)} for k, v in held.items()}
    if out.get("no_information"):
        return out  # nothing "calibrated" to plot: the page says why instead
    out["calibrated_reliability"] = reliability([apply_calibration(float(v), out["map"]) for v in p], y, bins)
    return out
