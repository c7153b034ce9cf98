"""Plots of a ``pofe self-reward`` run: M_t against M_(t-1) head to head, the scores each model
gave its own candidates (``iter_t/data/candidates.jsonl``), and one bar chart per numeric
metric of ``iter_*/metrics.json`` across iterations."""

from __future__ import annotations

import math
from typing import Any

from pofe.evaluation.report.figures import _hist_png, _png, _rate_points
from pofe.evaluation.report.run import RunData, _num


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


def _self_reward_plots(run: RunData, add) -> None:
    counts, xs = [], []
    for n, m in run.iterations:
        h = m.get("head_to_head_vs_prev") or {}
        w, t, l_ = (_num(h.get(k)) for k in ("wins", "ties", "losses"))
        if w is not None and t is not None and l_ is not None:
            xs.append(n)
            counts.append((w + 0.5 * t, int(w + t + l_)))
    if counts:
        add("head_to_head", "Head-to-head against the previous iteration",
            "Tie-adjusted win rate of M_t over M_(t-1), both orders (a disagreement is a tie), Wilson 95% bars.",
            _rate_points("M_t vs M_(t-1) (Wilson 95%)", xs, counts, "iteration", "(W + T/2) / N", bar=True,
                         labels=[x.replace("iter_", "M") for x in xs]))
    scores = [(n, [float(x) for r in rows for x in (r.get("scores") or []) if _num(x) is not None])
              for n, rows in run.candidates]
    scores = [(n, v) for n, v in scores if v]
    if scores:
        add("scores", "Judge scores per iteration",
            "Distribution of the rubric scores M_(t-1) gave its own candidates (iter_t/data/candidates.jsonl); a pile "
            "at the top score is judge collapse, not quality.",
            _hist_png([v for _, v in scores], "Self-judged candidate scores", "score", bins=10,
                      labels=[n.replace("iter_", "M") + " judging" for n, _ in scores]))
    ib = _iteration_bars(run)
    if ib:
        add("iterations", "Self-reward iterations", f"Per-iteration metrics ({ib[1]}).", ib[0])
