"""Plots of a ``pofe online`` run (also the generic curves of a command without plots of its
own, such as ``sft`` and ``judge``).

* ``metrics.jsonl`` (one row per step): loss; win rate against the initial policy on eval steps;
  mean response length over steps (OAIF Fig. 6a tracks the average length over training to show
  the annotator steering it); position consistency; KL; the per-step time split (generate /
  judge / train / other);
* ``ledger.jsonl``: the histogram of the judge's p over every annotation (a pile at 0 and 1 is
  the "overconfident labels" failure mode of rlaif-constitutional-ai);
* with ``diagnostics.offpolicy``: the policy's mean per-token log-prob of its own fresh samples and of
  the fixed offline responses over steps (OAIF Appendix B, Fig. 8: the off-policy gap);
* with ``audit.every``: the live judge's re-audits (:mod:`pofe.evaluation.report.drift`).
"""

from __future__ import annotations

import math

from pofe.evaluation.report.drift import drift_plots
from pofe.evaluation.report.figures import _figure, _line, _png, _rate_points, _step_axis
from pofe.evaluation.report.run import RunData, _num


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
    _step_axis(ax)
    ax.set_ylabel("seconds")
    ax.set_title("Time per step")
    ax.legend(fontsize=8)
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


def _loss_name(run: RunData) -> str | None:
    """The DAP loss of an ``online`` run (``loss.name``, default dpo); None for other commands."""
    if run.kind != "online":
        return None
    loss = run.config.get("loss")
    name = loss.get("name") if isinstance(loss, dict) else loss
    return str(name) if name is not None else "dpo"


def _length_png(rows, keys: list[tuple[str, str]]) -> bytes | None:
    """One axis per unit, stacked on a shared step axis: characters and tokens differ ~4x, and on
    one axis the tokens curve looked flat next to the characters one."""
    series = []
    for k, lab in keys:
        pts = [(_num(r.get("step")) if _num(r.get("step")) is not None else float(i + 1), _num(r.get(k)))
               for i, r in enumerate(rows)]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            series.append((lab, pts))
    if not series:
        return None
    fig, axes = _figure(len(series))
    axes = axes if isinstance(axes, list) else [axes]
    for i, (ax, (lab, pts)) in enumerate(zip(axes, series)):
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o" if len(pts) <= 30 else None, ms=3, lw=1.2,
                color=f"C{i}")
        ax.set_ylabel(f"mean length ({lab})")
    axes[0].set_title("Mean response length over training")
    _step_axis(axes[-1])
    return _png(fig)


def _online_plots(run: RunData, add) -> None:
    rows = run.metrics
    if _loss_name(run) == "dpo":
        # -log sigmoid(0) = ln 2: the DPO loss (Eq. 7 of the DPO paper) of a policy equal to its
        # reference. Below the line the policy has moved toward the judge's choices.
        add("loss", "Training loss", "DPO loss per step on the judged pairs; the dashed line is ln 2 = 0.693, the loss "
            "of a policy equal to its reference (margin 0).",
            _line(rows, [("loss", "loss")], "Training loss", "loss", hline=math.log(2),
                  hline_label="ln 2 = 0.693 (policy = reference)"))
    else:
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
            f"Mean sampled response length per step ({', '.join(lab for _, lab in keys)}, each on its own axis), as "
            f"in OAIF Fig. 6a. The judge measured length in: {unit}.",
            _length_png(rows, keys))
    ph = _p_histogram(run)
    if ph:
        add("p_hist", "Histogram of p", f"Distribution of the judge's debiased p ({ph[1]}).", ph[0])
    add("consistency", "Position consistency",
        "Share of judged pairs whose two orders prefer the same response, per step.",
        _line(rows, [("consistency_rate", "consistency")], "Position consistency", "rate", ylim=(0, 1.02)))
    add("kl", "KL to the reference", "Per-sequence estimate of KL(policy || initial) on sampled responses.",
        _line(rows, [("objective/kl", "KL"), ("kl", "KL")], "KL to the reference policy", "nats"))  # TRL name first
    add("time", "Time split per step", "Seconds per step spent generating, judging and training.", _time_split(rows))
    _offpolicy_plot(rows, add)
    drift_plots(run, add)


def _offpolicy_plot(rows, add) -> None:
    gap = [_num(r.get("offpolicy/gap")) for r in rows if _num(r.get("offpolicy/gap")) is not None]
    if not gap:
        return
    above = sum(g > 0 for g in gap)
    add("offpolicy", "Off-policy gap (OAIF Appendix B)",
        "The current policy's mean log-probability per response token of its own fresh samples and of a fixed set of "
        "offline responses, at the weights each step trains from. Appendix B (Fig. 8) finds the offline responses "
        f"clearly less likely: the fresh curve above the offline one. Here it is above at {above} of {len(gap)} "
        "measured steps.",
        _line(rows, [("offpolicy/logp_fresh", "fresh samples"), ("offpolicy/logp_offline", "offline responses")],
              "Log-probability per token under the current policy", "mean log-prob per token"))
