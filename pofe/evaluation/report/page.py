"""The run report page: summary table, flags, every plot inlined as base64 (so it opens offline
and can be mailed as one file), sample generations, the audit's page for an audit folder,
``summary.json`` and ``config.yaml`` as text; :func:`write_report` writes it with one PNG per
plot beside it."""

from __future__ import annotations

import base64
import html
import json
import logging
import re
from pathlib import Path
from typing import Any

from pofe.evaluation.report.audit_page import _CSS, audit_html
from pofe.evaluation.report.figures import _series
from pofe.evaluation.report.plots import MALFORMED, make_plots
from pofe.evaluation.report.run import Plot, RunData, _num, load_run

log = logging.getLogger(__name__)


def _kl_flags(rows, key: str = "kl") -> list[str]:
    """Steps where the KL estimate jumps: above 3x the median of the previous 10 steps (and > 0.05)."""
    xs, ys = _series(rows, key)
    flags = []
    jumping = False
    for i in range(3, len(ys)):
        prev = sorted(ys[max(0, i - 10):i])
        med = prev[len(prev) // 2]
        jump = ys[i] > 0.05 and ys[i] > 3 * max(med, 1e-6)
        if jump and not jumping:  # one flag per jump, not one per step that stays high
            flags.append(f"KL jump at step {xs[i]:g}: {ys[i]:.3g} vs a recent median of {med:.3g}")
        jumping = jump
    return flags


def flags(run: RunData) -> list[str]:
    """Reward-hacking signs (rlaif-constitutional-ai "Failure modes"): KL jumps, judge scores
    piled at the top of the scale, overconfident labels."""
    # TRL's name (rl, rm) or pofe's older one
    out = _kl_flags(run.metrics, "objective/kl" if any("objective/kl" in r for r in run.metrics) else "kl")
    tops = [(r.get("step"), (r.get("judge") or {}).get("top_of_scale_share")) for r in run.metrics]
    tops = [(s, v) for s, v in tops if _num(v) is not None]
    if tops and tops[-1][1] >= 0.5:
        out.append(f"judge scores at the top of the scale: {tops[-1][1]:.0%} of samples at step {tops[-1][0]}")
    for n, rows in run.candidates:
        sc = [float(x) for r in rows for x in (r.get("scores") or []) if _num(x) is not None]
        if len(sc) >= 4:
            top = sum(x >= max(sc) for x in sc) / len(sc) if max(sc) >= 5 else 0.0
            if top >= 0.5:
                out.append(f"{n}: {top:.0%} of self-judged candidates got the top score ({max(sc):g}): judge collapse")
    from pofe.evaluation.report.drift import drift_flags

    out += drift_flags(run)
    ps = run.ledger_p
    if len(ps) >= 10 and hard_judge(run) is None:  # a hard judge's 0/1 is its design, not overconfidence
        extreme = sum(p <= 0.05 or p >= 0.95 for p in ps) / len(ps)
        if extreme >= 0.5:
            out.append(f"{extreme:.0%} of judge labels are at p <= 0.05 or >= 0.95 (overconfident labels; calibrate or clamp)")
    return out


def hard_judge(run: RunData) -> str | None:
    """The kind of the run's judge when it gives hard 0/1 labels by construction (a programmatic
    value judge, ``length``, ``keyword``, ..., at its default ``temperature: 0``), else None."""
    from pofe.judges.config import _ValueSettings

    judge = run.config.get("judge") if isinstance(run.config.get("judge"), dict) else {}
    # every programmatic value judge (its config class derives from _ValueSettings), read from the
    # classes so a new one is covered
    kinds = {c.model_fields["kind"].default for c in _ValueSettings.__subclasses__()}
    temp = _num(judge.get("temperature", 0.0))
    return str(judge["kind"]) if judge.get("kind") in kinds and temp == 0.0 else None


def hard_label_note(run: RunData) -> str | None:
    """Why a pile of labels at 0 and 1 is not flagged: the judge is hard by construction."""
    kind = hard_judge(run)
    if kind is None or not run.ledger_p:
        return None
    extreme = sum(p <= 0.05 or p >= 0.95 for p in run.ledger_p) / len(run.ledger_p)
    return (f"{extreme:.0%} of judge labels are at p <= 0.05 or >= 0.95: hard labels by construction (the {kind} "
            "judge with temperature 0 gives p = 0, 1/2 or 1), not an overconfident judge; no flag raised.")


def _cell(text: str, limit: int = 600) -> str:
    """A generation as a table cell, escaped; an empty or whitespace-only one says so (an empty
    cell read as a rendering gap, not as what the model wrote)."""
    if text == "":
        return "<i>(empty)</i>"
    if not text.strip():
        return f"<i>(whitespace only: {len(text)} chars)</i>"
    return html.escape(text[:limit])


def samples(run: RunData, k: int = 3) -> list[dict[str, str]]:
    """A few generations before/after, from what the command wrote."""
    out = []
    if run.eval_rows:  # online: current policy vs the initial one on the last eval step
        for r in run.eval_rows[:k]:
            out.append({"prompt": str(r.get("prompt", "")), "before": str(r.get("initial", "")),
                        "after": str(r.get("current", "")), "note": f"eval step {run.eval_step}"})
    elif run.revisions:
        for r in run.revisions[:k]:
            out.append({"prompt": str(r.get("prompt", "")), "before": str(r.get("original", "")),
                        "after": str(r.get("final", "")), "note": f"critique-revision ({r.get('set', '')})"})
    elif run.candidates:  # self-reward: the best and worst self-judged candidate of a few prompts, last iteration
        name, rows = run.candidates[-1]
        for r in rows[:k]:
            sc = [(x, y) for x, y in zip(r.get("scores") or [], r.get("responses") or []) if _num(x) is not None]
            if len(sc) >= 2:
                hi, lo = max(sc, key=lambda t: t[0]), min(sc, key=lambda t: t[0])
                out.append({"prompt": str(r.get("prompt", "")), "before": str(lo[1]), "after": str(hi[1]),
                            "note": f"{name}: lowest-scored ({lo[0]:g}) vs highest-scored ({hi[0]:g}) candidate"})
    elif run.labels:
        for r in run.labels[:k]:
            p = _num(r.get("p"))
            out.append({"prompt": str(r.get("prompt", "")), "before": str(r.get("response_a", "")),
                        "after": str(r.get("response_b", "")),
                        "note": f"A vs B, p(A better) = {'unparsed' if p is None else f'{p:.3f}'}"})
    return out


def _summary_rows(run: RunData) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("run folder", str(run.run_dir)), ("command", run.kind),
                                   ("metrics rows", str(len(run.metrics)))]
    if run.metrics:
        last = run.metrics[-1]
        for k in ("step", "loss", "mean_len", "mean_chars", "consistency_rate", "kl", "reward"):
            if _num(last.get(k)) is not None:
                rows.append((f"last {k}", f"{_num(last[k]):.4g}"))
        wr = [r for r in run.metrics if _num(r.get("winrate_vs_init")) is not None]
        if wr:
            rows.append(("last win rate vs initial", f"{_num(wr[-1]['winrate_vs_init']):.3f} (step {wr[-1].get('step')})"))
    if run.ledger_p:
        rows.append(("annotations in ledger" if run.kind != "label" else "labelled pairs", str(len(run.ledger_p))))
    if run.iterations:
        rows.append(("self-reward iterations", ", ".join(n for n, _ in run.iterations)))
    return rows


def _tolerant(section: str, fn, run: RunData, default):
    """``fn(run)``, or ``default`` with a warning when the folder's values are not the types pofe
    writes (a received folder: any value may be anything)."""
    try:
        return fn(run)
    except MALFORMED as e:
        log.warning("report: %s: the %s left out: malformed values in the folder (%s: %s)", run.run_dir, section,
                    type(e).__name__, " ".join(str(e).split())[:200])
        return default


def render_html(run: RunData, plots: list[Plot], fl: list[str] | None = None) -> str:
    title = f"pofe report: {run.run_dir.name} ({run.kind})"
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>", "<table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
              for k, v in _tolerant("summary table", _summary_rows, run, [])]
    parts.append("</table>")
    fl = _tolerant("flags", flags, run, []) if fl is None else fl
    if fl:
        parts.append("<h2>Flags</h2>" + "".join(f"<div class='flag'>{html.escape(f)}</div>" for f in fl))
    note = _tolerant("hard-label note", hard_label_note, run, None)
    if note:
        parts.append(f"<p><i>{html.escape(note)}</i></p>")
    if not plots:
        parts.append("<p><b>Nothing to plot:</b> no metrics.jsonl rows, ledger p values or iter_*/metrics.json found.</p>")
    for p in plots:
        b64 = base64.b64encode(p.png).decode("ascii")
        parts.append(f"<figure id='{p.name}'><h2>{html.escape(p.title)}</h2>"
                     f"<img alt='{html.escape(p.title)}' src='data:image/png;base64,{b64}'>"
                     f"<figcaption>{html.escape(p.caption)} ({p.name}.png)</figcaption></figure>")
    smp = _tolerant("sample generations", samples, run, [])
    if smp:
        heads = {"label": ("response A", "response B"),
                 "self-reward": ("lowest-scored", "highest-scored")}.get(run.kind, ("before", "after"))
        parts.append(f"<h2>Sample generations</h2><table><tr><th>prompt</th><th>{heads[0]}</th><th>{heads[1]}</th></tr>")
        for s_ in smp:
            parts.append("<tr>" + "".join(f"<td>{_cell(s_[k])}</td>" for k in ("prompt", "before", "after"))
                         + f"</tr><tr><td colspan='3'><i>{html.escape(s_['note'])}</i></td></tr>")
        parts.append("</table>")
    elif run.kind in ("rl", "rm"):
        parts.append("<p><i>No sample generations: this command does not write any to its run folder.</i></p>")
    if run.audit is not None:
        body = audit_html(run.audit)
        inner = body[body.index("<h1>"):body.rindex("</body>")]
        inner = re.sub(r"<figure>.*?</figure>", "", inner, flags=re.S)  # its plots are above, once
        inner = inner.replace("<h2>", "<h3>").replace("</h2>", "</h3>").replace("<h1>", "<h3>").replace("</h1>", "</h3>")
        parts.append("<h2>Audit report</h2>" + inner)
    if run.summary is not None:
        parts.append("<h2>summary.json</h2><pre>" + html.escape(json.dumps(run.summary, indent=2, default=str)) + "</pre>")
    if run.config_text is not None:
        parts.append("<details><summary>config.yaml</summary><pre>" + html.escape(run.config_text) + "</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Write ``report.html`` and one PNG per plot into ``out_dir`` (default ``RUN_DIR/report``)."""
    from pofe.runs import atomic_write_bytes, atomic_write_text, check_run_path, guard_run_dir

    run = load_run(run_dir)
    # A run folder may come from anyone: a planted report/ or report/<plot>.png link must not
    # make the report write outside it. Every file is a rename in the folder (replacing a link,
    # never writing through it), and report/ itself must not be a link out of the run.
    guard_run_dir(run.run_dir)
    out = Path(out_dir) if out_dir else run.run_dir / "report"
    check_run_path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(run)
    pngs = []
    for p in plots:
        path = out / f"{p.name}.png"
        atomic_write_bytes(path, p.png)
        pngs.append(str(path))
    html_path = out / "report.html"
    fl = _tolerant("flags", flags, run, [])
    atomic_write_text(html_path, render_html(run, plots, fl))
    return {"run_dir": str(run.run_dir), "kind": run.kind, "html": str(html_path), "pngs": pngs,
            "plots": [p.name for p in plots], "flags": fl, "metrics_rows": len(run.metrics),
            "annotations": len(run.ledger_p), "iterations": [n for n, _ in run.iterations]}
