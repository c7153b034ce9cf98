"""Label policy: which judge labels are trained on (``labels:`` in ``pofe online`` and ``pofe
label``), and the two rules every consumer of a soft label applies.

* **Orientation.** A pair is stored with ``chosen`` = the response the label prefers and
  ``p = max(p, 1 − p)``. The soft losses do not care (BCE(Δ, p) = BCE(−Δ, 1 − p), OAIF Eq. 1–3
  with a soft target), while hard-label consumers (DPO with p = 1, accuracy, TRL's formats)
  read the verdict directly.
* **Hardening.** A hard label is ``p = 1`` for the oriented pair; an exact tie (p = ½) carries
  no preference and is dropped, never broken by position.

The drop reasons, in the order they are checked: ``unlabelled`` (p unreadable: a judge never
invents one), ``inconsistent`` (the two orders disagree, with ``drop_inconsistent``),
``low_margin`` (|p − ½| < ``min_margin``), ``ties`` (hard labels only).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pofe.config import PofeConfig
from pofe.errors import DataError

DROP_REASONS = ("unlabelled", "inconsistent", "low_margin", "ties")


class LabelPolicy(PofeConfig):
    """Which judge labels are trained on. The defaults keep every readable label (OAIF
    Algorithm 1); dropped pairs are counted in metrics and the summary, and marked in the
    ledger / labels file with their reason."""

    drop_inconsistent: bool = False
    """Drop pairs whose two judge orders prefer different responses (a position-biased read:
    as a hard label it would be trained at full confidence)."""
    min_margin: float = Field(0.0, ge=0.0, le=0.5)
    """Drop pairs with |p − ½| below this (near-coin-flip labels); 0 keeps all; 0.1 keeps p ≤ 0.4 or p ≥ 0.6."""
    calibration: str | None = None
    """An audit report (``pofe audit`` output) whose fitted calibration map is applied to every
    label before the filters (``p`` calibrated, ``p_raw`` the judge's own); checked when the
    config is parsed."""

    @field_validator("calibration")
    @classmethod
    def _readable_map(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                calibration_map(v)
            except (OSError, ValueError) as e:
                raise ValueError(str(e)) from None
        return v

    def calibrated(self, p: float | None) -> float | None:
        """``p`` through the calibration map when one is set (None stays None: never invented)."""
        if p is None or self.calibration is None:
            return p

        return apply_calibration(p, calibration_map(self.calibration))

    def drop_reason(self, p: float | None, consistent: bool | None, *, hard: bool = False) -> str | None:
        """Why a label (already calibrated) is not trained on, or None to keep it."""
        if p is None:
            return "unlabelled"
        if self.drop_inconsistent and consistent is False:
            return "inconsistent"
        if below_margin(p, self.min_margin):
            return "low_margin"
        if hard and float(p) == 0.5:
            return "ties"
        return None


@functools.lru_cache(maxsize=8)
def calibration_map(report: str) -> dict:

    return load_calibration_map(report)


def below_margin(p: float, min_margin: float) -> bool:
    """|p − ½| < min_margin, with a margin of exactly min_margin kept (0.6 − 0.5 is 0.0999… in floats)."""
    return abs(float(p) - 0.5) + 1e-9 < min_margin


def orient(a, b, p: float):
    """(preferred, other, max(p, 1 − p)) for ``p`` = P(a better)."""
    p = float(p)
    return (a, b, p) if p >= 0.5 else (b, a, 1.0 - p)


def harden(p: float) -> float | None:
    """The hard label of an oriented ``p`` (≥ ½): 1, or None for an exact tie (dropped)."""
    return None if float(p) == 0.5 else 1.0


# ----------------------------------------------------------------------------- calibration maps
# A saved map (``labels.calibration``: an audit report) is applied to every label before the rules
# above; fitted by :mod:`pofe.evaluation.calibrate`, applied and refused here, below the judges.

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


def apply_calibration(p: float | None, calib: dict[str, Any] | None) -> float | None:
    """The calibrated p of one label under ``calib`` (an audit report's ``calibration.map``):
    ``{"method": "temperature", "temperature": T}`` or ``{"method": "isotonic", "x": [...],
    "y": [...]}``; ``None``/``{"method": "none"}`` is the identity. ``p = None`` (unparsed)
    stays None: calibration never invents a label."""
    if p is None or not calib or calib.get("method") in (None, "none"):
        return p
    from scipy.special import expit, logit  # here, not at import: labels is a leaf every command loads

    method = calib["method"]
    if method == "temperature":
        t = float(calib["temperature"])
        return float(expit(logit(min(1 - _EPS, max(_EPS, p))) / t))
    if method == "isotonic":
        import numpy as np

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
