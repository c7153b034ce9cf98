"""Plots of a ``pofe audit`` report (``audit.json``): the reliability diagram and the length
preference of judge and humans, as on the audit's own page."""

from __future__ import annotations

from pofe.evaluation.report.audit_page import length_curve_png, reliability_png
from pofe.evaluation.report.run import RunData


def _audit_plots(run: RunData, add) -> None:
    m = (run.audit or {}).get("metrics") or {}
    unit = ((run.audit or {}).get("calibration") or {}).get("length_unit", "chars")
    add("reliability", "Reliability diagram", "Share of human 'A' labels per bin of the judge's p (Wilson 95%), raw and "
        "after the fitted calibration map.", reliability_png(m.get("calibration") or {}))
    add("length_curve", "Length preference", f"How often the judge and the humans chose A by length difference ({unit}).",
        length_curve_png(m.get("length_curve") or [], unit))
