"""Plots of a ``pofe rm`` run: loss, accuracy, held-out accuracy before and after, and the
calibration of sigmoid(margin)."""

from __future__ import annotations

from typing import Any

from pofe.evaluation.report.figures import _figure, _line, _png, _rate_points
from pofe.evaluation.report.run import RunData, _num


def _reliability_rm(table: list[dict[str, Any]], title: str) -> bytes | None:
    rows = [r for r in table or [] if r.get("n")]
    if not rows:
        return None
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1)
    ax.plot([r["mean_pred"] for r in rows], [r["mean_label"] for r in rows], "o-", label="reward model")
    ax.legend(fontsize=8, loc="upper left")
    for r in rows:
        ax.annotate(f"n={r['n']}", (r["mean_pred"], r["mean_label"]), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted sigmoid(margin)")
    ax.set_ylabel("mean label p")
    ax.set_title(title)
    return _png(fig)


def _rm_plots(run: RunData, add) -> None:
    rows = run.metrics
    add("loss", "Training loss", "Soft Bradley-Terry loss per step.", _line(rows, [("loss", "loss")], "RM training loss", "loss"))
    add("accuracy", "Accuracy", "Batch accuracy of sign(margin) against the label, and held-out accuracy at eval steps.",
        _line(rows, [("rewards/accuracies", "train batch"), ("eval_accuracy", "held out")], "RM accuracy", "accuracy",
              ylim=(0, 1.02), hline=0.5))
    sm = run.summary or {}
    ev, before = sm.get("eval") or {}, sm.get("eval_before") or {}
    # Accuracy counts pairs with p != 1/2 (n_decided), so that is its n.
    n = int(ev.get("n_decided") or ev.get("n") or 0)
    if n and _num(ev.get("accuracy")) is not None:
        pts = [("before", before), ("after", ev)]
        pts = [(lab, e) for lab, e in pts if _num(e.get("accuracy")) is not None]
        add("eval_accuracy", "Held-out accuracy before and after",
            f"Accuracy on {n} held-out pairs with a decided label (Wilson 95%), before training and after.",
            _rate_points("Held-out accuracy (Wilson 95%)", list(range(len(pts))),
                         [(e["accuracy"] * int(e.get("n_decided") or n), int(e.get("n_decided") or n)) for _, e in pts],
                         "", "accuracy", bar=True, labels=[lab for lab, _ in pts]))
    table = ev.get("reliability")
    if isinstance(table, list):
        add("calibration", "Calibration of sigmoid(margin)",
            f"Reliability of the reward model's predicted preference on held-out pairs (ECE {ev.get('ece')}).",
            _reliability_rm(table, "RM calibration (held out)"))
