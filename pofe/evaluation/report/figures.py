"""Matplotlib helpers every command's plots share: one figure size, PNG bytes out, line plots
with a rolling mean on long runs, histograms, bar charts, and rates drawn with their n and a
Wilson 95% interval (:func:`pofe.stats.wilson_interval`), so a rate is never a bare dot."""

from __future__ import annotations

import io
from typing import Any

from pofe.evaluation.report.run import _num


def _figure(nrows: int = 1):
    """A figure of the shared size (taller with ``nrows`` stacked axes sharing x); ``ax`` is one
    Axes for one row, else the list of them."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(nrows, 1, figsize=(6.4, 3.6 if nrows == 1 else 2.4 * nrows), dpi=100, sharex=True)
    for a in [ax] if nrows == 1 else list(ax):
        a.grid(alpha=0.3)
    return fig, ax if nrows == 1 else list(ax)


def _step_axis(ax, label: str = "step") -> None:
    """Steps are whole numbers: ticks at integers only (matplotlib's default put ticks at 2.5 on a 6-step run)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


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


def _line(rows, keys: list[tuple[str, str]], title: str, ylabel: str, *, ylim=None, hline=None,
          hline_label: str | None = None) -> bytes | None:
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
        ax.axhline(hline, color="grey", ls="--", lw=1, label=hline_label)
    if ylim:
        ax.set_ylim(*ylim)
    _step_axis(ax)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(present) > 1 or len(present[0][2]) > 30 or hline_label:
        ax.legend(fontsize=8)
    return _png(fig)


def _rate_points(title: str, xs: list, counts: list[tuple[float, int]], xlabel: str, ylabel: str, *,
                 hline: float | None = 0.5, bar: bool = False, labels: list[str] | None = None) -> bytes | None:
    """Rates with Wilson 95% bars and their n written beside each point (never a bare dot)."""
    from pofe.stats import wilson_interval

    # a rate with n = 0 is left out, and so is its label (a bar chart once got 3 labels for 2 bars)
    keep = [i for i, (_, n) in enumerate(counts) if n]
    pts = [(xs[i], *counts[i]) for i in keep]
    if labels is not None:
        labels = [labels[i] for i in keep]
    if not pts:
        return None
    fig, ax = _figure()
    ys = [k / n for _, k, n in pts]
    cis = [wilson_interval(k, n) for _, k, n in pts]
    # clipped at 0: matplotlib refuses a negative error bar, and float noise can make one
    err = [[max(0.0, y - c[0]) for y, c in zip(ys, cis)], [max(0.0, c[1] - y) for y, c in zip(ys, cis)]]
    px = list(range(len(pts))) if bar else [x for x, _, _ in pts]
    if bar:
        ax.bar(px, ys, yerr=err, capsize=4, color=[f"C{i % 10}" for i in range(len(pts))], alpha=0.85)
        ax.set_xticks(px, labels or [str(x) for x, _, _ in pts], fontsize=8)
    else:
        ax.errorbar(px, ys, yerr=err, fmt="o-", capsize=4, lw=1.2)
    for x, y, (_, _, n) in zip(px, ys, pts):
        ax.annotate(f"n={n}", (x, y), textcoords="offset points", xytext=(5, 6), fontsize=7)
    if hline is not None:
        ax.axhline(hline, color="grey", ls="--", lw=1)
    if not bar and len(pts) == 1:
        ax.set_xlim(px[0] - 1, px[0] + 1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel(xlabel)
    if xlabel == "step" and not bar:
        _step_axis(ax)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _png(fig)


def _hist_png(values: list[float], title: str, xlabel: str, bins: int = 20, rng=(0, 1), labels=None) -> bytes | None:
    if not values:
        return None
    fig, ax = _figure()
    if isinstance(values[0], list):
        for v, lab in zip(values, labels or []):
            ax.hist(v, bins=bins, alpha=0.6, label=f"{lab} (n={len(v)})")
        ax.legend(fontsize=8)
    else:
        ax.hist(values, bins=bins, range=rng, color="C0", edgecolor="white")
        ax.set_xlim(*rng)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.set_title(title)
    return _png(fig)


def _bars_png(names: list[str], values: list[float], title: str, ylabel: str,
              cis: list[tuple[float, float] | None] | None = None) -> bytes | None:
    """Bars, with 95% error bars where ``cis`` gives an interval (a None entry: no bar for that one)."""
    if not names:
        return None
    fig, ax = _figure()
    yerr = None
    if cis is not None and any(c is not None for c in cis):
        yerr = _yerr(values, [c if c is not None else (None, None) for c in cis])
    ax.bar(range(len(names)), values, yerr=yerr, capsize=6 if yerr else 0,
           color=[f"C{i % 10}" for i in range(len(names))])
    ax.set_xticks(range(len(names)), names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _png(fig)


def _yerr(vals, cis):
    lo = [max(0.0, v - c[0]) if v is not None and c[0] is not None else 0.0 for v, c in zip(vals, cis)]
    hi = [max(0.0, c[1] - v) if v is not None and c[1] is not None else 0.0 for v, c in zip(vals, cis)]
    return [lo, hi]
