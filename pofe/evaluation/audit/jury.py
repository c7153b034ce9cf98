"""The audit of a jury: each member's rows next to the pooled jury's.

The jury's verdicts carry every member's own reads (``extra.members``: p and both per-order
p, before its calibration map), so each member is measured from the same calls, without
judging the calibration set again: the same calibration-set metrics and checks as an audit of
that member alone (its contrast probes excepted, which only the pooled jury answers). The
``rows`` are the side-by-side summary the text table and the HTML page show, the pooled jury
last.
"""

from __future__ import annotations

from typing import Any, Sequence

from pofe.data.calibration import CalibrationItem
from pofe.evaluation.audit.checks import evaluate_checks
from pofe.evaluation.audit.config import AuditConfig
from pofe.evaluation.audit.metrics import calibration_metrics
from pofe.records import Judgment

ROW_KEYS = ("agreement", "position_consistency", "first_position_win_rate", "position_bias", "length_correlation",
            "cohen_kappa", "parse_failure_rate", "ece")
"""The columns of one jury row (``position_bias`` = |first-position win rate - 0.5|)."""


def _member_judgments(js: Sequence[Judgment], i: int) -> list[Judgment]:
    out = []
    for j in js:
        r = j.extra["members"][i]
        out.append(Judgment(p=r["p"], p_ab=r["p_ab"], p_ba=r["p_ba"], consistent=r["consistent"],
                            parse_ok=r["p"] is not None, judge_id=r["judge_id"], principle_id=r["principle_id"]))
    return out


def _row(judge_id: str, metrics: dict[str, Any], passed: bool, **more) -> dict[str, Any]:
    fp = metrics.get("first_position_win_rate")
    values = {**metrics, "position_bias": None if fp is None else abs(fp - 0.5),
              "ece": (metrics.get("calibration") or {}).get("ece")}
    return {"judge": judge_id, **more, **{k: values.get(k) for k in ROW_KEYS}, "passed": passed}


def jury_report(judge, items: Sequence[CalibrationItem], js: Sequence[Judgment], more: Sequence[Sequence[Judgment]],
                cfg: AuditConfig, metrics: dict[str, Any], checks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"members": [...], "rows": [...], "dropped_member_verdicts", "unreadable_verdicts"}``
    for a :class:`~pofe.judges.jury.JuryJudge` audited on ``items`` (``js`` its verdicts,
    ``more`` its further seed passes; ``metrics``/``checks`` the pooled jury's)."""
    members, rows = [], []
    for i, (mid, w, cmap) in enumerate(zip(judge.member_ids, judge.weights, judge.calibrations)):
        m = calibration_metrics(items, _member_judgments(js, i), cfg.length_unit,
                                seed_judgments=[_member_judgments(p, i) for p in more],
                                calibration_method=cfg.calibration_method, seed=cfg.seed)
        mc = evaluate_checks(m, cfg.thresholds)
        passed = all(c["passed"] for c in mc.values())
        cal = None if cmap is None else cmap.get("source")
        members.append({"judge": mid, "weight": w, "calibration": cal, "metrics": m, "checks": mc, "passed": passed})
        rows.append(_row(mid, m, passed, role="member", weight=w, calibrated=cmap is not None))
    rows.append(_row(judge.id, metrics, all(c["passed"] for c in checks.values()), role="jury", weight=1.0,
                     calibrated=False))
    return {"members": members, "rows": rows,
            "dropped_member_verdicts": sum(j.extra["dropped"] for j in js),
            "unreadable_verdicts": sum(j.p is None for j in js)}
