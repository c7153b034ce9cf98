"""``pofe report RUN_DIR``: one self-contained HTML page (PNG plots inlined as base64, so it
opens offline and can be mailed as one file) plus the PNGs beside it.

Reads what the loops write and plots whatever is there; a missing key or file means a
missing plot, never an error:

* ``metrics.jsonl`` (``pofe online``, one row per step): loss; win rate against the initial
  policy on eval steps; mean response length over steps (OAIF Fig. 6a tracks the average
  length over training to show the annotator steering it); position consistency; KL; the
  per-step time split (generate / judge / train / other);
* ``ledger.jsonl``: the histogram of the judge's p over every annotation (a pile at 0 and 1
  is the "overconfident labels" failure mode of rlaif-constitutional-ai);
* ``iter_*/metrics.json`` (``pofe self-reward``): one bar chart per numeric metric across
  iterations;
* ``config.yaml`` and ``summary.json``: shown as text.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class RunData:
    run_dir: Path
    config_text: str | None = None
    summary: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    ledger_p: list[float] = field(default_factory=list)
    iterations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Plot:
    name: str
    title: str
    caption: str
    png: bytes


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from pofe.runs import read_jsonl

    try:
        return [r for r in read_jsonl(path) if isinstance(r, dict)]
    except (OSError, ValueError) as e:
        log.warning("report: cannot read %s (%s); skipping it", path, e)
        return []


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def load_run(run_dir: str | Path) -> RunData:
    d = Path(run_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"run folder not found: {d}")
    run = RunData(d)
    if (d / "config.yaml").exists():
        run.config_text = (d / "config.yaml").read_text(encoding="utf-8")
    if (d / "summary.json").exists():
        try:
            run.summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            log.warning("report: %s is not valid JSON; skipping it", d / "summary.json")
    if (d / "metrics.jsonl").exists():
        run.metrics = sorted(_read_jsonl(d / "metrics.jsonl"), key=lambda r: _num(r.get("step")) or 0.0)
    if (d / "ledger.jsonl").exists():
        for r in _read_jsonl(d / "ledger.jsonl"):
            # Annotation rows carry p; other kinds (e.g. per-pair losses) do not.
            p = _num(r.get("p"))
            if p is not None and r.get("kind", "annotation") == "annotation":
                run.ledger_p.append(p)
    iters = [p for p in d.glob("iter_*") if p.is_dir() and re.fullmatch(r"iter_\d+", p.name)]
    for it in sorted(iters, key=lambda p: int(p.name.split("_")[1])):
        f = it / "metrics.json"
        if f.exists():
            try:
                run.iterations.append((it.name, json.loads(f.read_text(encoding="utf-8"))))
            except json.JSONDecodeError:
                log.warning("report: %s is not valid JSON; skipping it", f)
    return run


# ------------------------------------------------------------------------------ plotting


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.grid(alpha=0.3)
    return fig, ax


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, r in enumerate(rows):
        y = _num(r.get(key))
        if y is not None:
            xs.append(_num(r.get("step")) if _num(r.get("step")) is not None else float(i + 1))
            ys.append(y)
    return xs, ys


def _line(rows, keys: list[tuple[str, str]], title: str, ylabel: str, *, ylim=None, hline=None) -> bytes | None:
    present = [(k, label, *_series(rows, k)) for k, label in keys]
    present = [p for p in present if p[2]]
    if not present:
        return None
    fig, ax = _figure()
    for _, label, xs, ys in present:
        marker = "o" if len(xs) <= 30 else None
        ax.plot(xs, ys, marker=marker, ms=3, lw=1.2, label=label, alpha=0.9 if len(xs) <= 30 else 0.5)
        if len(xs) > 30:  # a rolling mean over ~5% of the run shows the trend through step noise
            w = max(3, len(xs) // 20)
            sm = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, sm, lw=2, label=f"{label} (rolling mean, {w})")
    if hline is not None:
        ax.axhline(hline, color="grey", ls="--", lw=1)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(present) > 1 or len(present[0][2]) > 30:
        ax.legend(fontsize=8)
    return _png(fig)


def _p_histogram(run: RunData) -> tuple[bytes, str] | None:
    fig, ax = None, None
    if run.ledger_p:
        fig, ax = _figure()
        ax.hist(run.ledger_p, bins=20, range=(0, 1), color="C0", edgecolor="white")
        note = f"{len(run.ledger_p)} annotations from ledger.jsonl"
    else:
        # No ledger: sum the per-step 5-bin histograms the online loop logs as p_hist.
        total = None
        for r in run.metrics:
            h = r.get("p_hist")
            if isinstance(h, list) and h and all(_num(c) is not None for c in h):
                total = [a + b for a, b in zip(total, h)] if total is not None and len(total) == len(h) else list(h)
        if not total:
            return None
        fig, ax = _figure()
        k = len(total)
        ax.bar([(i + 0.5) / k for i in range(k)], total, width=1 / k, color="C0", edgecolor="white")
        note = f"{int(sum(total))} annotations, per-step p_hist from metrics.jsonl"
    ax.set_xlim(0, 1)
    ax.set_xlabel("p = P(A better), both orders averaged")
    ax.set_ylabel("annotations")
    ax.set_title("Judge preference p")
    return _png(fig), note


_TIME_PARTS = [("time_generate", "generate"), ("time_judge", "judge"), ("time_train", "train")]
_TRAIN_PARTS = [("time_reference", "reference"), ("time_policy", "policy"), ("time_optimizer", "optimizer")]


def _time_split(rows) -> bytes | None:
    parts = _TIME_PARTS if any(_num(r.get("time_train")) is not None for r in rows) else _TIME_PARTS[:2] + _TRAIN_PARTS
    parts = [(k, label) for k, label in parts if any(_num(r.get(k)) is not None for r in rows)]
    # Any other time_* key the loop logs (except the whole-step total) is shown too.
    known = {k for k, _ in _TIME_PARTS + _TRAIN_PARTS} | {"time_step"}
    extra = sorted({k for r in rows for k in r if k.startswith("time_") and k not in known and _num(r.get(k)) is not None})
    parts += [(k, k[5:]) for k in extra]
    if not parts:
        return None
    steps = [(_num(r.get("step")) if _num(r.get("step")) is not None else i + 1) for i, r in enumerate(rows)]
    vals = {k: [(_num(r.get(k)) or 0.0) for r in rows] for k, _ in parts}
    other = []
    for i, r in enumerate(rows):
        total = _num(r.get("time_step"))
        other.append(max(0.0, total - sum(vals[k][i] for k, _ in parts)) if total is not None else 0.0)
    if any(o > 0 for o in other):
        vals["_other"] = other
        parts.append(("_other", "other"))
    fig, ax = _figure()
    bottom = [0.0] * len(rows)
    width = 0.8 * (min(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 and len(set(steps)) == len(steps) else 1.0)
    for k, label in parts:
        ax.bar(steps, vals[k], bottom=bottom, width=width, label=label)
        bottom = [b + v for b, v in zip(bottom, vals[k])]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("Time per step")
    ax.legend(fontsize=8)
    return _png(fig)


def _flatten(d: dict[str, Any], prefix: str = "", depth: int = 2) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth > 0:
            out.update(_flatten(v, key + ".", depth - 1))
        elif _num(v) is not None:
            out[key] = _num(v)
    return out


def _iteration_bars(run: RunData, max_panels: int = 16) -> tuple[bytes, str] | None:
    if not run.iterations:
        return None
    flat = [(name, _flatten(m)) for name, m in run.iterations]
    keys: list[str] = []
    for _, f in flat:
        keys += [k for k in f if k not in keys and k not in ("iteration", "seed")]
    if not keys:
        return None
    shown = keys[:max_panels]
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    ncol = min(4, len(shown))
    nrow = math.ceil(len(shown) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.4 * nrow), dpi=100, squeeze=False)
    names = [n for n, _ in flat]
    for ax, k in zip(axes.flat, shown):
        ys = [f.get(k, float("nan")) for _, f in flat]
        ax.bar(range(len(names)), ys, color=[f"C{i % 10}" for i in range(len(names))])
        ax.set_xticks(range(len(names)), [n.replace("iter_", "M") for n in names], fontsize=8)
        ax.set_title(k, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.suptitle("Per-iteration metrics (iter_t/metrics.json)")
    note = f"{len(shown)} of {len(keys)} numeric metrics" if len(keys) > len(shown) else f"{len(keys)} numeric metrics"
    return _png(fig), note


def make_plots(run: RunData) -> list[Plot]:
    rows = run.metrics
    plots: list[Plot] = []

    def add(name, title, caption, png):
        if png is not None:
            plots.append(Plot(name, title, caption, png))

    add("loss", "Training loss", "DAP loss per step (DPO/IPO/SLiC on the judged pairs).",
        _line(rows, [("loss", "loss")], "Training loss", "loss"))
    add("winrate", "Win rate against the initial policy",
        "Judge win rate of the current policy over the initial one on held-out prompts, at eval steps "
        "(0.5 = no change).",
        _line(rows, [("winrate_vs_init", "win rate vs initial")], "Win rate against the initial policy",
              "win rate", ylim=(0, 1), hline=0.5))
    length_key = "mean_len" if any(_num(r.get("mean_len")) is not None for r in rows) else "mean_chars"
    unit = "tokens" if length_key == "mean_len" else "characters"
    add("length", "Mean response length",
        f"Mean sampled response length ({unit}) per step, as in OAIF Fig. 6a, where the annotator's prompt "
        "steers length over training.",
        _line(rows, [(length_key, f"mean length ({unit})")], "Mean response length over training", unit))
    ph = _p_histogram(run)
    if ph:
        add("p_hist", "Histogram of p", f"Distribution of the judge's debiased p ({ph[1]}).", ph[0])
    add("consistency", "Position consistency",
        "Share of judged pairs whose two orders prefer the same response, per step.",
        _line(rows, [("consistency_rate", "consistency")], "Position consistency", "rate", ylim=(0, 1.02)))
    add("kl", "KL to the reference", "Per-sequence estimate of KL(policy || initial) on sampled responses.",
        _line(rows, [("objective/kl", "KL"), ("kl", "KL")], "KL to the reference policy", "nats"))  # TRL name first
    add("time", "Time split per step", "Seconds per step spent generating, judging and training.", _time_split(rows))
    ib = _iteration_bars(run)
    if ib:
        add("iterations", "Self-reward iterations", f"Per-iteration metrics ({ib[1]}).", ib[0])
    return plots


# ------------------------------------------------------------------------------ HTML


_CSS = """body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}
figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;font-size:.9em}
pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:.8em}"""


def _summary_rows(run: RunData) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("run folder", str(run.run_dir)), ("metrics rows", str(len(run.metrics)))]
    if run.metrics:
        last = run.metrics[-1]
        for k in ("step", "loss", "mean_len", "consistency_rate", "kl"):
            if _num(last.get(k)) is not None:
                rows.append((f"last {k}", f"{_num(last[k]):.4g}"))
        wr = [r for r in run.metrics if _num(r.get("winrate_vs_init")) is not None]
        if wr:
            rows.append(("last win rate vs initial", f"{_num(wr[-1]['winrate_vs_init']):.3f} (step {wr[-1].get('step')})"))
    if run.ledger_p:
        rows.append(("annotations in ledger", str(len(run.ledger_p))))
    if run.iterations:
        rows.append(("self-reward iterations", ", ".join(n for n, _ in run.iterations)))
    return rows


def render_html(run: RunData, plots: list[Plot]) -> str:
    title = f"pofe report: {run.run_dir.name}"
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>", "<table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _summary_rows(run)]
    parts.append("</table>")
    if not plots:
        parts.append("<p><b>Nothing to plot:</b> no metrics.jsonl rows, ledger p values or iter_*/metrics.json found.</p>")
    for p in plots:
        b64 = base64.b64encode(p.png).decode("ascii")
        parts.append(f"<figure id='{p.name}'><h2>{html.escape(p.title)}</h2>"
                     f"<img alt='{html.escape(p.title)}' src='data:image/png;base64,{b64}'>"
                     f"<figcaption>{html.escape(p.caption)} ({p.name}.png)</figcaption></figure>")
    if run.summary is not None:
        parts.append("<h2>summary.json</h2><pre>" + html.escape(json.dumps(run.summary, indent=2, default=str)) + "</pre>")
    if run.config_text is not None:
        parts.append("<details><summary>config.yaml</summary><pre>" + html.escape(run.config_text) + "</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Write ``report.html`` and one PNG per plot into ``out_dir`` (default ``RUN_DIR/report``)."""
    from pofe.runs import atomic_write_text

    run = load_run(run_dir)
    out = Path(out_dir) if out_dir else run.run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(run)
    pngs = []
    for p in plots:
        path = out / f"{p.name}.png"
        path.write_bytes(p.png)
        pngs.append(str(path))
    html_path = out / "report.html"
    atomic_write_text(html_path, render_html(run, plots))
    return {"run_dir": str(run.run_dir), "html": str(html_path), "pngs": pngs, "plots": [p.name for p in plots],
            "metrics_rows": len(run.metrics), "annotations": len(run.ledger_p),
            "iterations": [n for n, _ in run.iterations]}
