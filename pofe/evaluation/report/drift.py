"""Plots every training command with an ``audit:`` section shares: the live judge re-audited
during training (``drift/*`` rows of ``metrics.jsonl``, :mod:`pofe.evaluation.drift`), and the
flag naming the step where a check first crossed its threshold (and where the run stopped)."""

from __future__ import annotations

from pofe.evaluation.report.figures import _figure, _png, _step_axis
from pofe.evaluation.report.run import RunData, _num

_SHOWN = (("drift/agreement", "agreement"), ("drift/position_consistency", "position consistency"),
          ("drift/position_bias", "position bias |first win - 0.5|"),
          ("drift/length_correlation", "|length correlation|"))


def first_crossing(run: RunData) -> tuple[float, list[str]] | None:
    """The first re-audit step with a check past its threshold, and those checks."""
    for r in run.metrics:
        failed = r.get("drift/failed")
        if isinstance(failed, list) and failed and _num(r.get("step")) is not None:
            return _num(r["step"]), [str(f) for f in failed]
    return None


def drift_flags(run: RunData) -> list[str]:
    out = []
    first = first_crossing(run)
    if first is not None:
        out.append(f"judge drift: audit checks past their threshold at step {first[0]:g} ({', '.join(first[1])})")
    stopped = (run.summary or {}).get("stopped")
    if isinstance(stopped, dict):
        out.append(f"run stopped after step {stopped.get('step')}: {stopped.get('error')}")
    return out


def _drift_png(run: RunData) -> bytes | None:
    rows = [r for r in run.metrics if "drift/failed" in r and _num(r.get("step")) is not None]
    series = [(k, label, [(_num(r["step"]), _num(r.get(k))) for r in rows if _num(r.get(k)) is not None])
              for k, label in _SHOWN]
    series = [s for s in series if s[2]]
    if not series:
        return None
    fig, ax = _figure()
    for _, label, pts in series:
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, lw=1.2, label=label)
    first = first_crossing(run)
    if first is not None:
        ax.axvline(first[0], color="red", ls="--", lw=1, label=f"first crossing (step {first[0]:g})")
    ax.set_ylim(-0.02, 1.02)
    _step_axis(ax)
    ax.set_ylabel("value")
    ax.set_title("Judge re-audited during training")
    ax.legend(fontsize=7)
    return _png(fig)


def drift_plots(run: RunData, add) -> None:
    png = _drift_png(run)
    if png is None:
        return
    first = first_crossing(run)
    where = (f"First crossing at step {first[0]:g}: {', '.join(first[1])}." if first is not None
             else "No check crossed its threshold.")
    stopped = (run.summary or {}).get("stopped")
    if isinstance(stopped, dict):
        where += f" The run stopped after step {stopped.get('step')} (checkpoint written; --resume continues)."
    add("drift", "Judge drift", "The live judge's audit checks on the calibration set (and contrast probes) every "
        f"audit.every steps, as pofe audit measures them; the gate's thresholds decide a crossing. {where}", png)
