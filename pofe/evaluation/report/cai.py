"""Plots of a ``pofe cai revise`` run (``revisions.jsonl``): lengths before and after revision,
refusal and over-refusal rates, critiques per principle."""

from __future__ import annotations

from pofe.evaluation.report.figures import _bars_png, _hist_png, _rate_points
from pofe.evaluation.report.run import RunData, _num


def _cai_plots(run: RunData, add) -> None:
    revs = run.revisions
    orig = [len(r.get("original", "")) for r in revs]
    fin = [len(r.get("final", "")) for r in revs]
    if revs:
        add("lengths", "Response length before and after revision",
            "Characters of the original responses and the final revisions.",
            _hist_png([orig, fin], "Length before / after revision (characters)", "characters", labels=["original", "revised"]))
    ref = (run.summary or {}).get("refusal") or {}
    n_by = {s: sum(r.get("set") == s for r in revs) for s in ("red-team", "benign")}
    pts, labels = [], []
    for stage in ("original", "revised"):
        for key, setname, lab in (("harmful_refusal_rate", "red-team", "harmful"), ("over_refusal_rate", "benign", "benign")):
            v = _num((ref.get(stage) or {}).get(key))
            if v is not None and n_by[setname]:
                pts.append((v * n_by[setname], n_by[setname]))
                labels.append(f"{lab}, {stage}")
    if pts:
        add("refusal", "Refusal rates", "Refusal on red-team prompts (should rise) and over-refusal on benign prompts "
            "(should not), before and after revision, Wilson 95% bars (pattern detector).",
            _rate_points("Refusal rates (Wilson 95%)", list(range(len(pts))), pts, "", "refusal rate", hline=None,
                         bar=True, labels=labels))
    pc = (run.summary or {}).get("principle_counts") or {}
    if pc:
        names = sorted(pc)
        add("principles", "Critiques per principle", "How often each principle was drawn for a critique.",
            _bars_png(names, [pc[k] for k in names], "Principles drawn", "critiques"))
