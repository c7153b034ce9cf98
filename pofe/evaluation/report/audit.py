"""Plots of a ``pofe audit`` report (``audit.json``): the reliability diagram and the length
preference of judge and humans, as on the audit's own page."""

from __future__ import annotations

from pofe.evaluation.report.audit_page import _get, _safe_png, length_curve_png, reliability_png
from pofe.evaluation.report.run import RunData


def _audit_plots(run: RunData, add) -> None:
    # a received audit.json may hold anything: _get / _safe_png give a missing plot, never an error
    m = _get(run.audit, "metrics") or {}
    unit = str(_get(_get(run.audit, "calibration"), "length_unit") or "chars")
    add("reliability", "Reliability diagram", "Share of human 'A' labels per bin of the judge's p (Wilson 95%), raw and "
        "after the fitted calibration map.", _safe_png(reliability_png, _get(m, "calibration") or {}))
    add("length_curve", "Length preference", f"How often the judge and the humans chose A by length difference ({unit}).",
        _safe_png(length_curve_png, _get(m, "length_curve") or [], unit))
