"""Honest run-report plots and page, inspected in-process (the figures before they become PNG
bytes): integer step ticks, the ln 2 line on a DPO loss, one axis per length unit, visible
whitespace-only generations, no overconfidence flag for a hard-by-construction judge, and 95%
intervals on the RL before/after bars."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import pofe.evaluation.report.figures as figures
import pofe.evaluation.report.online as online
from pofe.evaluation.report.page import flags, render_html
from pofe.evaluation.report.plots import make_plots
from pofe.evaluation.report.run import RunData


@pytest.fixture
def figs(monkeypatch):
    """Every figure a plot function draws, kept open instead of saved as PNG bytes."""
    kept = []

    def grab(fig):
        fig.canvas.draw()
        kept.append(fig)
        return b"png"

    for mod in (figures, online):
        monkeypatch.setattr(mod, "_png", grab)
    return kept


def _online(kind="online", config=None, steps=3, **rows_extra) -> RunData:
    rows = [{"step": s, "loss": 0.7 - 0.01 * s, "mean_chars": 100.0 + 10 * s, "mean_len": 25.0 + s,
             "time_generate": 0.5, "time_judge": 0.1, "time_train": 0.3, "time_step": 1.0} for s in range(1, steps + 1)]
    return RunData(run_dir=Path("/nonexistent/run"), config=config if config is not None else {"loss": {"name": "dpo"}},
                   metrics=rows, kind=kind, **rows_extra)


def _by_title(figs, title):
    return [ax for f in figs for ax in f.axes if ax.get_title() == title]


def test_step_axes_have_integer_ticks(figs):
    # A 3-step run: matplotlib's default locator put ticks at 1.25, 1.5, ...
    make_plots(_online())
    for title in ("Training loss", "Time per step"):
        (ax,) = _by_title(figs, title)
        lo, hi = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert shown == [1.0, 2.0, 3.0], title
    length = [f for f in figs if f.axes[0].get_title() == "Mean response length over training"][0]
    lo, hi = length.axes[-1].get_xlim()
    assert [t for t in length.axes[-1].get_xticks() if lo <= t <= hi] == [1.0, 2.0, 3.0]


def test_dpo_loss_plot_draws_ln2_line_labelled(figs):
    make_plots(_online())
    (ax,) = _by_title(figs, "Training loss")
    ref = [ln for ln in ax.get_lines() if ln.get_label() == "ln 2 = 0.693 (policy = reference)"]
    assert len(ref) == 1 and list(ref[0].get_ydata()) == [math.log(2), math.log(2)]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["loss", "ln 2 = 0.693 (policy = reference)"]


@pytest.mark.parametrize("kind,config", [("online", {"loss": {"name": "ipo"}}), ("sft", {})])
def test_no_ln2_line_for_other_losses(figs, kind, config):
    make_plots(_online(kind=kind, config=config))
    (ax,) = _by_title(figs, "Training loss")
    assert [ln.get_label() for ln in ax.get_lines()] == ["loss"]


def test_characters_and_tokens_get_one_axis_each(figs):
    make_plots(_online())
    (fig,) = [f for f in figs if f.axes[0].get_title() == "Mean response length over training"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["mean length (characters)", "mean length (tokens)"]
    assert [list(ax.get_lines()[0].get_ydata()) for ax in fig.axes] == [[110.0, 120.0, 130.0], [26.0, 27.0, 28.0]]


def test_whitespace_only_and_empty_generations_are_visible():
    run = _online(eval_rows=[{"prompt": "Say <hi>.", "initial": " \n\t ", "current": ""}], eval_step=4)
    page = render_html(run, [])
    assert ("<tr><td>Say &lt;hi&gt;.</td><td><i>(whitespace only: 4 chars)</i></td><td><i>(empty)</i></td></tr>"
            in page)


def test_a_hard_programmatic_judge_is_not_flagged_overconfident():
    ps = [0.0, 1.0] * 5
    hard = RunData(run_dir=Path("/x"), config={"judge": {"kind": "length"}}, ledger_p=ps, kind="online")
    assert flags(hard) == []
    assert ("<p><i>100% of judge labels are at p &lt;= 0.05 or &gt;= 0.95: hard labels by construction (the length "
            "judge with temperature 0 gives p = 0, 1/2 or 1), not an overconfident judge; no flag raised.</i></p>"
            in render_html(hard, []))
    model = RunData(run_dir=Path("/x"), config={"judge": {"kind": "llm"}}, ledger_p=ps, kind="online")
    assert flags(model) == ["100% of judge labels are at p <= 0.05 or >= 0.95 (overconfident labels; calibrate or clamp)"]
    soft = RunData(run_dir=Path("/x"), config={"judge": {"kind": "length", "temperature": 2.0}}, ledger_p=ps,
                   kind="online")
    assert len(flags(soft)) == 1 and "hard labels by construction" not in render_html(soft, [])


def _error_segments(ax):
    from matplotlib.container import ErrorbarContainer

    (err,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    # each segment is [(x, low), (x, high)]: flattened to [x, low, x, high]
    return [[float(v) for pt in seg for v in pt] for seg in err.lines[2][0].get_segments()]


def test_rl_before_after_bars_have_95_intervals(figs):
    # before: 3 of 4 samples rewarded 1 -> Wilson (the project's interval for a rate; bootstrap_ci
    # hands a [0, 1] mean to it): (0.75 + z^2/8) / (1 + z^2/4) -/+ z sqrt(3/64 + z^2/64) / (1 + z^2/4)
    # = [0.3006, 0.9544]; after: the recorded reward_ci95 as given.
    run = RunData(run_dir=Path("/x"), kind="rl", metrics=[{"step": 1, "objective/scores": 0.1}],
                  summary={"eval_before": {"reward": 0.75, "n": 4, "rewards": [0.0, 1.0, 1.0, 1.0]},
                           "eval_after": {"reward": 0.9, "n": 4, "reward_ci95": [0.8, 0.95]}})
    plots = make_plots(run)
    (ax,) = _by_title(figs, "Held-out reward (95% intervals)")
    (seg_b, seg_a) = _error_segments(ax)
    assert seg_b == pytest.approx([0.0, 0.30064, 0.0, 0.95441], abs=1e-5)
    assert seg_a == pytest.approx([1.0, 0.8, 1.0, 0.95])
    (ev,) = [p for p in plots if p.name == "eval"]
    assert "95% intervals: percentile bootstrap of the per-sample rewards" in ev.caption


def test_rl_bars_without_recorded_samples_say_so(figs):
    run = RunData(run_dir=Path("/x"), kind="rl", summary={"eval_before": {"reward": 0.1, "n": 8},
                                                          "eval_after": {"reward": 0.5, "n": 8}})
    (ev,) = [p for p in make_plots(run) if p.name == "eval"]
    assert ev.caption == ("Mean reward on held-out prompts (n = 8 before, 8 after samples); no interval: the run's "
                          "summary records the means only, not per-sample rewards.")
    (ax,) = _by_title(figs, "Held-out reward (means only)")
    from matplotlib.container import BarContainer

    assert [type(c) for c in ax.containers] == [BarContainer]  # bars, no error bars
