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

from pydantic import Field, field_validator

from pofe.config import PofeConfig

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
        from pofe.evaluation.calibrate import apply_calibration

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
    from pofe.evaluation.calibrate import load_calibration_map

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
