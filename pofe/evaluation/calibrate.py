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

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.optimize import isotonic_regression, minimize_scalar
from scipy.special import expit, logit

from pofe.data.io import DataError
from pofe.evaluation.stats import wilson_interval

_EPS = 1e-6

T_MAX = 100.0
"""The upper bound of the temperature search (the lower one is 1 / T_MAX)."""
NO_INFO_T = 99.0
"""A fitted T at or above this (within 1% of :data:`T_MAX`) has hit the bound: the likelihood
kept rising as T grew, i.e. the best temperature map sends every p to 1/2. The judge's p then
carries no information about the human label (its agreement is at or below chance), and a
"calibrated" T = 100 would turn every training label into a coin flip."""


def no_information(t: float | None) -> bool:
    """Whether a fitted temperature sits at the search's upper bound (see :data:`NO_INFO_T`)."""
    return t is not None and float(t) >= NO_INFO_T


def no_information_reason(t: float) -> str:
    return (f"the fitted temperature T = {float(t):.2f} is at its bound ({T_MAX:.0f}): the judge's p carries no "
            "information about the human labels (every calibrated p would be about 0.5)")


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


def apply_calibration(p: float | None, calib: dict[str, Any] | None) -> float | None:
    """The calibrated p of one label under ``calib`` (an audit report's ``calibration.map``):
    ``{"method": "temperature", "temperature": T}`` or ``{"method": "isotonic", "x": [...],
    "y": [...]}``; ``None``/``{"method": "none"}`` is the identity. ``p = None`` (unparsed)
    stays None: calibration never invents a label."""
    if p is None or not calib or calib.get("method") in (None, "none"):
        return p
    method = calib["method"]
    if method == "temperature":
        t = float(calib["temperature"])
        return float(expit(logit(min(1 - _EPS, max(_EPS, p))) / t))
    if method == "isotonic":
        return float(np.interp(p, calib["x"], calib["y"]))
    raise ValueError(f"calibration map: unknown method {method!r} (temperature, isotonic, none)")


def load_calibration_map(report_path: str | Path) -> dict[str, Any]:
    """The fitted map saved in an audit report (``metrics.calibration.map``), for
    :func:`apply_calibration`, with its provenance (``source``, ``judge``,
    ``calibration_sha256``) for the ledger and the judge's ``agreement`` there (a jury's
    ``weights: agreement``)."""
    path = Path(report_path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"calibration: audit report not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"calibration: {path} is not valid JSON ({e.msg})") from None
    cal = (report.get("metrics") or {}).get("calibration") or {}
    if "map" not in cal:
        raise ValueError(f"calibration: {path} has no metrics.calibration.map (re-run `pofe audit` to fit one)")
    cmap = cal["map"] if isinstance(cal["map"], dict) else {}
    # Refused, not applied: a map fitted at the bound would flatten every training label to ~0.5.
    # A report written before the "no_information" marker is caught by its temperature.
    t = cmap.get("temperature") if cmap.get("method") == "temperature" else cmap.get("fitted_temperature")
    if cmap.get("no_information") or (isinstance(t, (int, float)) and no_information(t)):
        why = no_information_reason(t) if isinstance(t, (int, float)) else "its map is marked no_information"
        raise DataError(f"calibration: {path}: {why}; refused: applied to labels it would make every one a coin flip")
    # Provenance rides along (apply_calibration ignores it); the ledger records it with p_raw.
    return {**cal["map"], "source": str(path), "judge": report.get("judge"),
            "calibration_sha256": (report.get("calibration") or {}).get("sha256"),
            "agreement": (report.get("metrics") or {}).get("agreement")}


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
