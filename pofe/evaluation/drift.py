"""Judge drift during training (``audit:`` of ``pofe online`` and ``pofe rl``).

``pofe audit`` validates a judge once, before training (rlaif-constitutional-ai, "Choices that
matter": validate the judge before you validate anything else). A judge can change while the
policy trains: a self-judge shares weights with the policy, an endpoint is redeployed, a cache
is cleared under a non-deterministic judge. Every ``audit.every`` steps this module re-runs the
audit itself (:func:`pofe.evaluation.audit.run_audit`: the same measurements, contrast probes and
checks, nothing reimplemented) on a small labelled calibration set with the *live* judge, logs
each check's value per step as ``drift/<check>`` (``drift/agreement``, ``drift/position_bias``,
``drift/position_consistency``, ``drift/length_correlation``, ``drift/contrast_<kind>``, ...) with
``drift/failed`` naming the checks past their threshold, and on a crossing either warns or stops
the run cleanly (``audit.on_drift``): the driver writes that step's checkpoint and ``summary.json``
(``stopped``), then raises :class:`DriftError` (exit status 2: the same run fails the same way).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Literal, Sequence

from pydantic import Field, model_validator

from pofe.config import ConfigError, PofeConfig
from pofe.evaluation.audit import AuditError, AuditThresholds

log = logging.getLogger(__name__)

_ALIASES = {"first_position_bias": "position_bias"}  # |first-position win rate - 0.5|


class DriftSettings(PofeConfig):
    """Re-audit the live judge during training (``pofe.evaluation.drift``)."""

    every: int = Field(0, ge=0)
    """Every N steps, judge the calibration set and the contrast probes with the live judge and log each audit
    check as ``drift/<check>`` (0 = never)."""
    calibration: list[str] = []
    """Labelled pair files, the formats ``pofe audit`` reads (pofe JSONL, HH-RLHF, LLMBar, annotate logs)."""
    limit: int | None = Field(None, ge=1)
    """Seeded random subset of at most this many items in all, split evenly over the files (a small set keeps
    each check cheap)."""
    contrasts: bool = True
    """Also judge the audit's contrast probes (padding, bullets, preamble, one-token attacks, answer-for-judge)."""
    contrast_limit: int = Field(16, ge=1)
    """Calibration items each contrast kind is built from."""
    on_drift: Literal["stop", "warn"] = "stop"
    """A check past its threshold: stop (checkpoint and summary written, then an error naming the step and the
    check; the run resumes with --resume) or warn (a log line; the run goes on)."""
    thresholds: AuditThresholds = AuditThresholds()
    """The gate's thresholds (``pofe audit``'s defaults); null switches a check off."""

    @model_validator(mode="after")
    def _used(self) -> "DriftSettings":
        if self.every and not self.calibration:
            raise ConfigError("bad value for 'audit.calibration': audit.every > 0 needs a labelled calibration set "
                              "(the files pofe audit reads)")
        if not self.every:  # settings that do nothing would look like a check that ran
            fields = type(self).model_fields
            for key in ("calibration", "limit", "contrasts", "contrast_limit", "on_drift", "thresholds"):
                if getattr(self, key) != fields[key].default:
                    raise ConfigError(f"bad value for 'audit.{key}': it applies only with audit.every > 0; remove it "
                                      "or set audit.every")
        return self


class DriftError(AuditError):
    """The live judge crossed an audit threshold during training (``audit.on_drift: stop``)."""

    def __init__(self, message: str, failed: Sequence[str] = (), *, step: int):
        super().__init__(message, failed)
        self.step = step


def drift_row(report: dict[str, Any]) -> dict[str, Any]:
    """``drift/<check>`` per audit check (its value as the gate compares it), the raw agreement and
    first-position win rate, and ``drift/failed`` (the checks past their threshold)."""
    m, checks = report["metrics"], report["checks"]
    row: dict[str, Any] = {f"drift/{_ALIASES.get(k, k)}": c["value"] for k, c in checks.items()}
    row.update({"drift/agreement": m.get("agreement"), "drift/first_position_win_rate": m.get("first_position_win_rate"),
                "drift/n": m.get("n"), "drift/failed": [k for k, c in checks.items() if not c["passed"]]})
    return row


class DriftMonitor:
    """The re-audits of one run: the calibration items (read once, before any model loads), the
    audit settings, and the first crossing."""

    def __init__(self, settings: DriftSettings, items: Sequence[Any], seed: int = 0):
        from pofe.evaluation.audit import AuditConfig

        self.settings, self.items = settings, list(items)
        self.audit = AuditConfig(seed=seed, contrasts=settings.contrasts, contrast_limit=settings.contrast_limit,
                                 thresholds=settings.thresholds)
        self.stop: DriftError | None = None

    @classmethod
    def load(cls, settings: DriftSettings, seed: int = 0) -> "DriftMonitor | None":
        """None when ``audit.every`` is 0; a :class:`pofe.errors.DataError` names an unreadable file."""
        from pofe.data.calibration import load_calibration
        from pofe.errors import DataError

        if not settings.every:
            return None
        items = load_calibration(settings.calibration, limit=settings.limit, seed=seed)
        if not items:
            raise DataError(f"audit.calibration: no labelled pairs in {', '.join(settings.calibration)}")
        return cls(settings, items, seed)

    def due(self, step: int) -> bool:
        return step % self.settings.every == 0

    def check(self, step: int, judge, context: Callable[[], Any] = contextlib.nullcontext, dp=None) -> dict[str, Any]:
        """The step's ``drift/*`` keys (empty when not due). A crossing logs a warning, or (on_drift:
        stop) leaves :attr:`stop` for :meth:`after_row`. ``dp``: the run's processes, which split
        the judging and all get the same report (a collective: every process calls it)."""
        from pofe.evaluation.audit import describe_check, run_audit
        from pofe.runtime.parallel import DataParallel

        if judge is None or not self.due(step):
            return {}
        with context():
            report = run_audit(judge, self.items, self.audit, identity={"judge_id": getattr(judge, "id", None)},
                               dp=dp if dp is not None else DataParallel())
        row = drift_row(report)
        failed = row["drift/failed"]
        if failed and self.stop is None:
            what = "; ".join(describe_check(_ALIASES.get(k, k), report["checks"][k]) for k in failed)
            msg = (f"judge drift at step {step}: {what} on the calibration set ({len(self.items)} pairs, "
                   f"{', '.join(self.settings.calibration)})")
            if self.settings.on_drift == "stop":
                self.stop = DriftError(msg + f"; stopped after step {step}'s checkpoint (audit.on_drift=stop)",
                                       failed, step=step)
            else:
                log.warning("%s (audit.on_drift=warn: training goes on)", msg)
        return row

    def after_row(self, step: int) -> DriftError | None:
        return self.stop if self.stop is not None and self.stop.step == step else None


def drift_summary(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The re-audits of a run from its ``metrics.jsonl`` rows: how many, and the first step where a
    check was past its threshold (with the checks and their values)."""
    rows = [h for h in history if "drift/failed" in h]
    if not rows:
        return None
    first = next((h for h in rows if h["drift/failed"]), None)
    out: dict[str, Any] = {"checks_run": len(rows), "first_crossing": None}
    if first is not None:
        names = [_ALIASES.get(k, k) for k in first["drift/failed"]]
        out["first_crossing"] = {"step": first.get("step"), "checks": names,
                                 "values": {k: first.get(f"drift/{k}") for k in names}}
    return out


__all__ = ["DriftSettings", "DriftMonitor", "DriftError", "drift_row", "drift_summary"]
