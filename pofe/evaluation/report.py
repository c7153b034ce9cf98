"""``pofe report RUN_DIR``: one self-contained HTML page (PNG plots inlined as base64, so it
opens offline and can be mailed as one file) plus the PNGs beside it, for every command's
run folder: ``online``, ``self-reward``, ``label``, ``rm``, ``rl``, ``audit`` (a folder with
``audit.json``, or the report file itself) and ``cai revise``. The command is recognised by
the files it writes (:func:`detect_kind`).

Every rate is drawn with its n and a Wilson 95% interval (a win-rate chart is never a bare
dot); length plots say which unit the judge measured; a "Flags" box lists reward-hacking
signs (rlaif-constitutional-ai, "Failure modes"): KL jumps, judge scores piled at the top of
the scale, overconfident labels; sample generations before/after are shown where the
command wrote them (online eval rows, CAI revisions, labelled pairs).

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

from pofe.errors import PofeError

log = logging.getLogger(__name__)


@dataclass
class RunData:
    run_dir: Path
    config_text: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    ledger_p: list[float] = field(default_factory=list)
    iterations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)  # pofe label: labels.jsonl
    revisions: list[dict[str, Any]] = field(default_factory=list)  # pofe cai revise: revisions.jsonl
    eval_rows: list[dict[str, Any]] = field(default_factory=list)  # pofe online: the last eval/step-N.jsonl
    eval_step: int | None = None
    audit: dict[str, Any] | None = None  # pofe audit: audit.json
    candidates: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)  # self-reward iter_t/data/candidates.jsonl
    kind: str = "unknown"


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


def _read_json(path: Path) -> Any:
    from pofe.runs import read_run_text

    try:
        return json.loads(read_run_text(path))
    except (OSError, json.JSONDecodeError):
        log.warning("report: %s is not valid JSON; skipping it", path)
        return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def recorded_command(run_dir: Path) -> str | None:
    """The command ``run.json`` says wrote the folder (pofe.runs.write_manifest), or None when the
    folder has no readable ``run.json`` (an older pofe)."""
    from pofe.runs import read_run_text

    try:
        command = json.loads(read_run_text(Path(run_dir) / "run.json")).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) and command else None


def detect_kind(run: "RunData") -> str:
    """Which command wrote the folder: the one ``run.json`` names; for a folder from an older pofe
    (no ``run.json``), guessed from the files it writes (each loop's own set)."""
    d = run.run_dir
    if run.audit is not None:
        return "audit"
    recorded = recorded_command(d)
    if recorded is not None:
        return recorded
    if (d / "revisions.jsonl").exists():
        return "cai-revise"
    if (d / "labels.jsonl").exists():
        return "label"
    if run.iterations:
        return "self-reward"
    sm = run.summary or {}
    if "train_pairs" in sm or (d / "final" / "pofe_reward_model.json").exists():
        return "rm"
    if "algo" in sm or any("objective/kl_k3" in r for r in run.metrics):
        return "rl"
    if run.metrics or run.ledger_p:
        return "online"
    return "unknown"


class RunFolderNotFound(PofeError, FileNotFoundError):
    """The folder given to ``pofe report`` does not exist (bad input: exit 2). Also a
    ``FileNotFoundError`` for callers of :func:`write_report` that catch that."""

    exit_code = 2


def load_run(run_dir: str | Path) -> RunData:
    d = Path(run_dir)
    if d.is_file() and d.suffix == ".json":  # an audit report given directly
        run = RunData(d.parent)
        run.audit = _read_json(d)
        run.kind = "audit"
        return run
    if not d.is_dir():
        raise RunFolderNotFound(f"run folder not found: {d}")
    from pofe.runs import guard_run_dir, read_run_text

    guard_run_dir(d)  # its files are read never through links (a planted one would leak a file into the report)
    run = RunData(d)
    if (d / "config.yaml").exists():
        import yaml

        from pofe.config import safe_yaml_load

        run.config_text = read_run_text(d / "config.yaml")
        try:
            run.config = safe_yaml_load(run.config_text, str(d / "config.yaml")) or {}  # bounded, strict
        except yaml.YAMLError:
            run.config = {}
    if (d / "summary.json").exists():
        run.summary = _read_json(d / "summary.json")
    if (d / "metrics.jsonl").exists():
        run.metrics = sorted(_read_jsonl(d / "metrics.jsonl"), key=lambda r: _num(r.get("step")) or 0.0)
    if (d / "ledger.jsonl").exists():
        for r in _read_jsonl(d / "ledger.jsonl"):
            # Annotation rows carry p; other kinds (e.g. per-pair losses) do not.
            p = _num(r.get("p"))
            if p is not None and r.get("kind", "annotation") == "annotation":
                run.ledger_p.append(p)
    if (d / "labels.jsonl").exists():
        run.labels = _read_jsonl(d / "labels.jsonl")
        run.ledger_p += [p for p in (_num(r.get("p")) for r in run.labels) if p is not None]
    if (d / "revisions.jsonl").exists():
        run.revisions = _read_jsonl(d / "revisions.jsonl")
    evals = [(int(m.group(1)), p) for p in (d / "eval").glob("step-*.jsonl")
             if (m := re.fullmatch(r"step-(\d+)\.jsonl", p.name))] if (d / "eval").is_dir() else []
    if evals:
        run.eval_step, path = max(evals)
        run.eval_rows = _read_jsonl(path)
    for name in ("audit.json", "report.json"):
        if (d / name).exists():
            rep = _read_json(d / name)
            if isinstance(rep, dict) and "checks" in rep and "metrics" in rep:
                run.audit = rep
                break
    iters = [p for p in d.glob("iter_*") if p.is_dir() and re.fullmatch(r"iter_\d+", p.name)]
    for it in sorted(iters, key=lambda p: int(p.name.split("_")[1])):
        f = it / "metrics.json"
        if f.exists():
            m = _read_json(f)
            if m is not None:
                run.iterations.append((it.name, m))
        if (it / "data" / "candidates.jsonl").exists():
            run.candidates.append((it.name, _read_jsonl(it / "data" / "candidates.jsonl")))
    run.kind = detect_kind(run)
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


def _wilson(k: float, n: int) -> tuple[float, float]:
    from pofe.evaluation.stats import wilson_interval

    return wilson_interval(k, n)


def _rate_points(title: str, xs: list, counts: list[tuple[float, int]], xlabel: str, ylabel: str, *,
                 hline: float | None = 0.5, bar: bool = False, labels: list[str] | None = None) -> bytes | None:
    """Rates with Wilson 95% bars and their n written beside each point (never a bare dot)."""
    # a rate with n = 0 is left out, and so is its label (a bar chart once got 3 labels for 2 bars)
    keep = [i for i, (_, n) in enumerate(counts) if n]
    pts = [(xs[i], *counts[i]) for i in keep]
    if labels is not None:
        labels = [labels[i] for i in keep]
    if not pts:
        return None
    fig, ax = _figure()
    ys = [k / n for _, k, n in pts]
    cis = [_wilson(k, n) for _, k, n in pts]
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
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _png(fig)


def _winrate_points(rows) -> tuple[bytes, str] | None:
    """Online in-training eval: (W + T/2)/N per eval step with its Wilson interval and n."""
    xs, counts = [], []
    for r in rows:
        w, t, l_ = (_num(r.get(k)) for k in ("eval_wins", "eval_ties", "eval_losses"))
        if w is None or t is None or l_ is None:
            continue
        n = int(w + t + l_)
        xs.append(_num(r.get("step")))
        counts.append((w + 0.5 * t, n))
    if not counts:
        return None
    png = _rate_points("Win rate against the initial policy (Wilson 95%)", xs, counts, "step",
                       "(W + T/2) / N", hline=0.5)
    return png, f"{len(counts)} eval steps, n = {', '.join(str(n) for _, n in counts[-5:])} (last shown)"


def _length_unit_of_judge(run: RunData) -> str:
    """The unit the judge measured length in: a programmatic length judge says so in its config
    (``judge.unit``); a model judge reads text, so characters are what it saw."""
    j = run.config.get("judge") if isinstance(run.config.get("judge"), dict) else {}
    if j.get("kind") in ("length",):
        return str(j.get("unit", "chars"))
    return "chars (text the judge read)"


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


def _bars_png(names: list[str], values: list[float], title: str, ylabel: str) -> bytes | None:
    if not names:
        return None
    fig, ax = _figure()
    ax.bar(range(len(names)), values, color=[f"C{i % 10}" for i in range(len(names))])
    ax.set_xticks(range(len(names)), names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _png(fig)


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


def _online_plots(run: RunData, add) -> None:
    rows = run.metrics
    add("loss", "Training loss", "DAP loss per step (DPO/IPO/SLiC on the judged pairs).",
        _line(rows, [("loss", "loss")], "Training loss", "loss"))
    wr = _winrate_points(rows)
    if wr:
        add("winrate", "Win rate against the initial policy",
            "Tie-adjusted win rate (W + T/2)/N of the current policy over the initial one on held-out prompts, "
            f"both orders, Wilson 95% bars ({wr[1]}); 0.5 = no change.", wr[0])
    else:
        add("winrate", "Win rate against the initial policy",
            "Judge win rate of the current policy over the initial one at eval steps (no W/T/L counts logged, so no "
            "interval; 0.5 = no change).",
            _line(rows, [("winrate_vs_init", "win rate vs initial")], "Win rate against the initial policy",
                  "win rate", ylim=(0, 1), hline=0.5))
    keys = [(k, lab) for k, lab in (("mean_chars", "characters"), ("mean_len", "tokens"))
            if any(_num(r.get(k)) is not None for r in rows)]
    if keys:
        unit = _length_unit_of_judge(run)
        add("length", "Mean response length",
            f"Mean sampled response length per step ({', '.join(lab for _, lab in keys)}), as in OAIF Fig. 6a. "
            f"The judge measured length in: {unit}.",
            _line(rows, [(k, f"mean length ({lab})") for k, lab in keys], "Mean response length over training",
                  " / ".join(lab for _, lab in keys)))
    ph = _p_histogram(run)
    if ph:
        add("p_hist", "Histogram of p", f"Distribution of the judge's debiased p ({ph[1]}).", ph[0])
    add("consistency", "Position consistency",
        "Share of judged pairs whose two orders prefer the same response, per step.",
        _line(rows, [("consistency_rate", "consistency")], "Position consistency", "rate", ylim=(0, 1.02)))
    add("kl", "KL to the reference", "Per-sequence estimate of KL(policy || initial) on sampled responses.",
        _line(rows, [("objective/kl", "KL"), ("kl", "KL")], "KL to the reference policy", "nats"))  # TRL name first
    add("time", "Time split per step", "Seconds per step spent generating, judging and training.", _time_split(rows))


def _self_reward_plots(run: RunData, add) -> None:
    names = [n for n, _ in run.iterations]
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
    del names


def _label_plots(run: RunData, add) -> None:
    rows = [r for r in run.labels if _num(r.get("p")) is not None]
    add("p_hist", "Histogram of p", f"The judge's debiased p over {len(rows)} labelled pairs (labels.jsonl); a pile "
        "at 0 and 1 is the overconfident-labels failure mode.", _hist_png([float(r["p"]) for r in rows],
                                                                     "Judge preference p", "p = P(A better)"))
    both = [r for r in rows if _num(r.get("p_ab")) is not None and _num(r.get("p_ba")) is not None]
    if both:
        cons = sum(((r["p_ab"] > 0.5) == (r["p_ba"] > 0.5)) for r in both)
        first = sum(0.5 * ((r["p_ab"] > 0.5) + (r["p_ba"] < 0.5)) for r in both)
        longer = [r for r in rows if len(r.get("response_a", "")) != len(r.get("response_b", "")) and r["p"] != 0.5]
        k_long = sum((len(r["response_a"]) > len(r["response_b"])) == (r["p"] > 0.5) for r in longer)
        add("judge_fitness", "Judge fitness on these labels",
            "Position consistency, P(first shown wins) over both orders, and P(picks the longer response, in "
            "characters), each with its Wilson 95% interval and n.",
            _rate_points("Judge fitness (Wilson 95%)", [0, 1, 2], [(cons, len(both)), (first, len(both)), (k_long, len(longer))],
                         "", "rate", bar=True, labels=["position consistency", "P(first wins)", "P(picks longer)"]))
    pr: dict[str, list[float]] = {}
    for r in rows:
        if r.get("principle_id"):
            pr.setdefault(r["principle_id"], []).append(abs(float(r["p"]) - 0.5))
    if pr:
        names = sorted(pr)
        add("principles", "Labels per principle", "Mean confidence |p - 1/2| of the labels under each sampled principle "
            f"(n per principle: {', '.join(f'{k} {len(pr[k])}' for k in names)}).",
            _bars_png(names, [sum(pr[k]) / len(pr[k]) for k in names], "Mean |p - 1/2| by principle", "|p - 1/2|"))


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


def _rl_plots(run: RunData, add) -> None:
    rows = run.metrics
    add("reward", "Reward", "Mean reward of the sampled responses per step (and the monitor reward, never optimised).",
        _line(rows, [("objective/scores", "reward"), ("monitor", "monitor")], "Reward per step", "reward"))
    add("kl", "KL to the reference", "k1 and k3 estimates of KL(policy || reference) per step; jumps are flagged above.",
        _line(rows, [("objective/kl", "KL (k1)"), ("objective/kl_k3", "KL (k3)")], "KL to the reference", "nats"))
    rw = run.config.get("reward") if isinstance(run.config.get("reward"), dict) else {}
    unit = (rw.get("unit", "tokens") if rw.get("kind", "programmatic") == "programmatic"
            else "characters of text (the judge / reward model reads the response)") if run.config else "not recorded"
    add("length", "Response length", "Mean sampled response length per step in tokens (the policy's own unit; the "
        f"reward measured length in: {unit}).",
        _line(rows, [("length", "tokens")], "Mean response length", "tokens"))
    sm = run.summary or {}
    b, a = sm.get("eval_before") or {}, sm.get("eval_after") or {}
    if _num(b.get("reward")) is not None and _num(a.get("reward")) is not None:
        add("eval", "Held-out reward before and after",
            f"Mean reward on held-out prompts (n = {b.get('n')} before, {a.get('n')} after samples).",
            _bars_png([f"before (n={b.get('n')})", f"after (n={a.get('n')})"], [b["reward"], a["reward"]],
                      "Held-out reward", "reward"))


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


def _audit_plots(run: RunData, add) -> None:
    m = (run.audit or {}).get("metrics") or {}
    unit = ((run.audit or {}).get("calibration") or {}).get("length_unit", "chars")
    add("reliability", "Reliability diagram", "Share of human 'A' labels per bin of the judge's p (Wilson 95%), raw and "
        "after the fitted calibration map.", reliability_png(m.get("calibration") or {}))
    add("length_curve", "Length preference", f"How often the judge and the humans chose A by length difference ({unit}).",
        length_curve_png(m.get("length_curve") or [], unit))


def make_plots(run: RunData) -> list[Plot]:
    plots: list[Plot] = []

    def add(name, title, caption, png):
        if png is not None:
            plots.append(Plot(name, title, caption, png))

    # a command without plots of its own (sft, judge) gets the generic metrics curves
    {"self-reward": _self_reward_plots, "label": _label_plots, "rm": _rm_plots, "rl": _rl_plots,
     "cai-revise": _cai_plots, "audit": _audit_plots}.get(run.kind, _online_plots)(run, add)
    return plots


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
    ps = run.ledger_p
    if len(ps) >= 10:
        extreme = sum(p <= 0.05 or p >= 0.95 for p in ps) / len(ps)
        if extreme >= 0.5:
            out.append(f"{extreme:.0%} of judge labels are at p <= 0.05 or >= 0.95 (overconfident labels; calibrate or clamp)")
    return out


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


# ------------------------------------------------------------------------------ HTML


_CSS = """body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}
figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;font-size:.9em;vertical-align:top}
pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:.8em;white-space:pre-wrap}
.flag{background:#fff3cd;border:1px solid #e0c060;padding:.4em .8em;margin:.3em 0}"""


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


def render_html(run: RunData, plots: list[Plot]) -> str:
    title = f"pofe report: {run.run_dir.name} ({run.kind})"
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>", "<table>"]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _summary_rows(run)]
    parts.append("</table>")
    fl = flags(run)
    if fl:
        parts.append("<h2>Flags</h2>" + "".join(f"<div class='flag'>{html.escape(f)}</div>" for f in fl))
    if not plots:
        parts.append("<p><b>Nothing to plot:</b> no metrics.jsonl rows, ledger p values or iter_*/metrics.json found.</p>")
    for p in plots:
        b64 = base64.b64encode(p.png).decode("ascii")
        parts.append(f"<figure id='{p.name}'><h2>{html.escape(p.title)}</h2>"
                     f"<img alt='{html.escape(p.title)}' src='data:image/png;base64,{b64}'>"
                     f"<figcaption>{html.escape(p.caption)} ({p.name}.png)</figcaption></figure>")
    smp = samples(run)
    if smp:
        heads = {"label": ("response A", "response B"),
                 "self-reward": ("lowest-scored", "highest-scored")}.get(run.kind, ("before", "after"))
        parts.append(f"<h2>Sample generations</h2><table><tr><th>prompt</th><th>{heads[0]}</th><th>{heads[1]}</th></tr>")
        for s_ in smp:
            parts.append("<tr>" + "".join(f"<td>{html.escape(s_[k][:600])}</td>" for k in ("prompt", "before", "after"))
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
    atomic_write_text(html_path, render_html(run, plots))
    return {"run_dir": str(run.run_dir), "kind": run.kind, "html": str(html_path), "pngs": pngs,
            "plots": [p.name for p in plots], "flags": flags(run), "metrics_rows": len(run.metrics),
            "annotations": len(run.ledger_p), "iterations": [n for n, _ in run.iterations]}


# ------------------------------------------------------------------------------ audit page


def _yerr(vals, cis):
    lo = [max(0.0, v - c[0]) if v is not None and c[0] is not None else 0.0 for v, c in zip(vals, cis)]
    hi = [max(0.0, c[1] - v) if v is not None and c[1] is not None else 0.0 for v, c in zip(vals, cis)]
    return [lo, hi]


def reliability_png(cal: dict[str, Any]) -> bytes | None:
    """Reliability diagram: per bin of the judge's p, the share of human "A" labels (Wilson
    95% bars), raw and after the fitted calibration map; the diagonal is perfect calibration."""
    rows = [r for r in cal.get("reliability") or [] if r["n"]]
    if not rows:
        return None
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="perfectly calibrated")
    xs = [r["mean_p"] for r in rows]
    ys = [r["frac_human_a"] for r in rows]
    ax.errorbar(xs, ys, yerr=_yerr(ys, [r["frac_human_a_ci95"] for r in rows]), fmt="o-", capsize=3,
                label=f"judge p (ECE {cal['ece']:.3f})")
    after = [r for r in cal.get("calibrated_reliability") or [] if r["n"]]
    if after:
        m = cal.get("map") or {}
        what = f"T = {m['temperature']:.2f}" if m.get("method") == "temperature" else m.get("method", "")
        held = ((cal.get("held_out") or {}).get(m.get("method", "")) or {}).get("ece")
        ax.errorbar([r["mean_p"] for r in after], [r["frac_human_a"] for r in after],
                    yerr=_yerr([r["frac_human_a"] for r in after], [r["frac_human_a_ci95"] for r in after]),
                    fmt="s-", capsize=3, alpha=0.8,
                    label=f"calibrated ({what}; held-out ECE {held:.3f})" if held is not None else f"calibrated ({what})")
    for x, y, r in zip(xs, ys, rows):
        ax.annotate(f"n={r['n']}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("judge p = P(A better), binned")
    ax.set_ylabel("share of human labels 'A'")
    ax.set_title(f"Reliability diagram ({cal['n']} human-labelled pairs)")
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def length_curve_png(curve: list[dict[str, Any]], unit: str) -> bytes | None:
    if not curve:
        return None
    fig, ax = _figure()
    xs = [c["dlen_mean"] for c in curve]
    for key, label in (("judge_a", "judge chose A"), ("human_a", "humans chose A")):
        ys = [c[key] for c in curve]
        ax.errorbar(xs, ys, yerr=_yerr(ys, [c[key + "_ci95"] for c in curve]), fmt="o-", capsize=3, label=label)
    for x, c in zip(xs, curve):
        ax.annotate(f"n={c['n']}", (x, 0.02), fontsize=7, ha="center")
    ax.axhline(0.5, color="grey", ls="--", lw=1)
    ax.axvline(0, color="grey", ls=":", lw=1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"len(A) - len(B) ({unit}), mean of each quantile bin")
    ax.set_ylabel("share choosing A (Wilson 95%)")
    ax.set_title("Length preference: judge vs humans")
    ax.legend(fontsize=8)
    return _png(fig)


def _fmt_ci(v, ci) -> str:
    if v is None:
        return "-"
    if not ci or ci[0] is None:
        return f"{v:.3f}"
    return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


_AUDIT_ROWS = [
    ("agreement with humans", "agreement"), ("bias (1 - modal agreement)", "bias"), ("variance across seeds", "variance"),
    ("P(prefers longer)", "p_prefers_longer"), ("P(prefers lists)", "p_prefers_lists"),
    ("P(prefers first)", "p_prefers_first"), ("position consistency", "position_consistency"),
    ("accuracy, order A-B", "accuracy_order_ab"), ("accuracy, order B-A", "accuracy_order_ba"),
    ("both orders correct", "both_orders_correct"), ("Cohen's kappa", "cohen_kappa"),
    ("parse failure rate", "parse_failure_rate"),
]


def audit_html(report: dict[str, Any]) -> str:
    """One offline page for an audit report: metrics with intervals, checks, per-source and
    per-principle agreement, contrast probes, the reliability diagram and the length plot."""
    m = report.get("metrics") or {}
    ci = m.get("ci95") or {}
    cal = m.get("calibration") or {}
    unit = (report.get("calibration") or {}).get("length_unit", "chars")
    title = f"pofe audit: {report.get('judge')}"
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f"<p><b>{'PASSED' if report.get('passed') else 'FAILED'}</b> on {m.get('n')} calibration pairs "
             f"({m.get('n_parsed')} parsed, {m.get('n_labelled')} with a human A/B label); calibration set sha256 "
             f"<code>{html.escape(str((report.get('calibration') or {}).get('sha256', '?'))[:16])}</code>; "
             f"lengths in {html.escape(unit)}.</p>"]
    parts.append("<h2>Metrics (95% intervals: Wilson for rates, bootstrap for kappa)</h2><table>"
                 "<tr><th>metric</th><th>value [95% CI]</th></tr>")
    for label, key in _AUDIT_ROWS:
        parts.append(f"<tr><td>{html.escape(label)}</td><td>{_fmt_ci(m.get(key), ci.get(key))}</td></tr>")
    hh = m.get("human_human") or {}
    if hh.get("n_label_pairs"):
        parts.append(f"<tr><td>human-human agreement ({hh['n_pairs_multi']} pairs)</td>"
                     f"<td>{_fmt_ci(hh['agreement'], hh['ci95'])}</td></tr>")
    if cal.get("ece") is not None:
        held = cal.get("held_out") or {}
        parts.append(f"<tr><td>ECE / Brier (raw)</td><td>{cal['ece']:.3f} / {cal['brier']:.3f}</td></tr>")
        for k, v in held.items():
            parts.append(f"<tr><td>held-out ECE / Brier ({html.escape(k)})</td><td>{v['ece']:.3f} / {v['brier']:.3f}</td></tr>")
    parts.append("</table>")
    parts.append("<h2>Checks</h2><table><tr><th>check</th><th>value</th><th>threshold</th><th></th></tr>")
    for name, c in (report.get("checks") or {}).items():
        v = c.get("value")
        parts.append(f"<tr><td>{html.escape(name)}</td><td>{'-' if v is None else f'{v:.3f}'}</td>"
                     f"<td>{c.get('op')} {c.get('threshold')}</td><td>{'pass' if c.get('passed') else '<b>FAIL</b>'}</td></tr>")
    parts.append("</table>")
    for title_, png in (("Reliability diagram", reliability_png(cal)), ("Length preference", length_curve_png(m.get("length_curve") or [], unit))):
        if png is not None:
            b64 = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><h2>{title_}</h2><img alt='{title_}' src='data:image/png;base64,{b64}'></figure>")
    if m.get("by_source"):
        parts.append("<h2>By source</h2><table><tr><th>source</th><th>n</th><th>agreement [95% CI]</th>"
                     "<th>position consistency</th></tr>")
        for src, r in m["by_source"].items():
            pc = r.get("position_consistency")
            parts.append(f"<tr><td>{html.escape(src)}</td><td>{r['n']}</td><td>{_fmt_ci(r.get('agreement'), r.get('agreement_ci95'))}</td>"
                         f"<td>{'-' if pc is None else f'{pc:.3f}'}</td></tr>")
        parts.append("</table>")
    if m.get("by_principle"):
        parts.append("<h2>By constitution principle</h2><table><tr><th>principle</th><th>n</th>"
                     "<th>agreement [95% CI]</th><th>other principles</th><th>flag</th></tr>")
        for pid, r in m["by_principle"].items():
            oa = r["others_agreement"]
            parts.append(f"<tr><td>{html.escape(pid)}</td><td>{r['n']}</td><td>{_fmt_ci(r['agreement'], r['ci95'])}</td>"
                         f"<td>{'-' if oa is None else f'{oa:.3f}'}</td>"
                         f"<td>{'<b>disagrees more than the others</b>' if r['flagged'] else ''}</td></tr>")
        parts.append("</table>")
    if m.get("contrasts"):
        parts.append("<h2>Contrast probes</h2><table><tr><th>probe</th><th>n</th><th>mean P(variant better)</th>"
                     "<th>variant win rate [95% CI]</th></tr>")
        for kind, c in m["contrasts"].items():
            mp = c.get("mean_p_variant")
            parts.append(f"<tr><td>{html.escape(kind)}</td><td>{c['n']}</td><td>{'-' if mp is None else f'{mp:.3f}'}</td>"
                         f"<td>{_fmt_ci(c.get('variant_win_rate'), c.get('variant_win_rate_ci95'))}</td></tr>")
        parts.append("</table>")
    ident = report.get("judge_identity") or {}
    parts.append("<h2>Judge identity</h2><pre>" + html.escape(json.dumps(ident, indent=2, default=str)) + "</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
