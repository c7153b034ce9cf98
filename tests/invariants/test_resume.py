"""Invariant (a), every training command: SIGKILL at a random fault point, then ``--resume
RUN_DIR`` alone, ends exactly as an uninterrupted run: every metrics.jsonl row (and ledger /
labels / revisions / candidates row) once, in order, with equal values (floats exactly equal:
every command claims exact resume on CPU fp32 in its docstring), ``final/`` weights
bit-identical, and summary.json with the same step count.

The kill point is drawn from the command's fault points (``configs.COMMANDS[...].faults``) by
``random.Random(f"{POFE_FAULT_SEED}/{command}")`` (seed 0 unless set); it is in the test id, and
CI can vary the seed to walk other points.

Besides equality, the final weights must differ from the initial model's (else "bit-identical"
would hold for a run that never trained), and rows the resume moved aside
(``<output>.after-crash-<time>.jsonl``: written after the last checkpoint) must be rows the
uninterrupted run wrote too, in one piece (they are recomputed, never lost or invented).
"""

from __future__ import annotations

import os
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from configs import COMMANDS, TIMING, Command, Output
from harness import (_drop, assert_same_rows, assert_steps_once_in_order, final_weights, first_difference, is_slice,
                     rows, run_pofe, same_weights, summary)

SEED = os.environ.get("POFE_FAULT_SEED", "0")
# summary.json fields that name the run (its folder, its files) or its resume, or measure time
SUMMARY_RUN_FIELDS = (*TIMING, "run_dir", "final_model", "resumed_from", "resumed_after*", "steps_run", "*seconds*",
                      "*_per_second", "time_split", "files", "*path*", "*_dir")


CASES = [(cmd, random.Random(f"{SEED}/{cmd.name}").choice(cmd.faults)) for cmd in COMMANDS.values()]


def _id(case) -> str:
    cmd, point = case
    return f"{cmd.name.replace(' ', '-')}@{point}"


def _compare(out: Output, got: Path, want: Path, where: str) -> None:
    a, b = got / out.path, want / out.path
    assert b.exists(), f"{where}: the uninterrupted run wrote no {out.path}"
    if out.kind == "rows":
        assert_same_rows(rows(a, out.drop), rows(b, out.drop), f"{where}: {out.path}")
    else:
        assert a.read_text() == b.read_text(), f"{where}: {out.path} differs"


def _aside_rows_are_recomputed(run: Path, ref: Path, cmd: Command, where: str) -> None:
    drops = {o.path: o.drop for o in cmd.outputs}
    for aside in sorted(run.glob("**/*.after-crash-*.jsonl")):
        base = aside.relative_to(run).with_name(aside.name.split(".after-crash-")[0] + ".jsonl")
        drop = drops.get(str(base), Output("").drop)
        assert (ref / base).exists(), (where, aside)
        assert is_slice(rows(aside, drop), rows(ref / base, drop)), f"{where}: {aside.name} is not a run of {base}"


def _online_ledger_aside(run: Path, point: str) -> None:
    """Ledger rows written after the last checkpoint (labelled, not yet trained on) are moved
    aside on resume, never lost: a kill after step s's annotations with the checkpoint at
    c < s leaves exactly steps c+1..s there."""
    aside = sorted(run.glob("ledger.after-crash-*.jsonl"))
    step, phase = point.split(":")
    s = int(step)
    if phase == "after_checkpoint":
        assert aside == [], point
        return
    c = (s - 1) // 2 * 2  # checkpoint.every = 2
    assert len(aside) == 1, (point, aside)
    assert {r["step"] for r in rows(aside[0])} == set(range(c + 1, s + 1)), point


EXTRA = {"online": _online_ledger_aside}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_sigkill_then_resume_equals_the_uninterrupted_run(case, tmp_path, tiny_model_dir):
    cmd, point = case
    where = f"{_id(case)} (POFE_FAULT_SEED={SEED})"
    with ThreadPoolExecutor(2) as pool:  # two independent one-thread processes
        f_full = pool.submit(run_pofe, cmd.argv, config=cmd.config(tmp_path, tiny_model_dir, "full"))
        f_crash = pool.submit(run_pofe, cmd.argv, config=cmd.config(tmp_path, tiny_model_dir, "crash"), fault=point)
        full, crash = f_full.result(), f_crash.result()
    assert full.rc == 0, (where, full.stderr[-3000:])
    assert crash.rc == -9, (where, crash.rc, crash.stderr[-3000:])
    run, ref = crash.run_dir, full.run_dir
    assert not (run / "summary.json").exists(), where  # killed before the end
    # the crashed run's config is the uninterrupted one's but for its name
    assert (run / "config.yaml").read_text() == re.sub(r"\bfull\b", "crash", (ref / "config.yaml").read_text()), where
    saved = (run / "config.yaml").read_text()

    resumed = run_pofe(cmd.argv, resume=run)
    assert resumed.rc == 0, (where, resumed.stderr[-3000:])
    assert (run / "config.yaml").read_text() == saved, where  # the run's own config is the truth on resume

    metrics, want = rows(run / "metrics.jsonl", cmd.metrics_drop), rows(ref / "metrics.jsonl", cmd.metrics_drop)
    assert_steps_once_in_order(want, cmd.steps, f"{where}: uninterrupted metrics.jsonl")
    assert_steps_once_in_order(metrics, cmd.steps, f"{where}: resumed metrics.jsonl")
    assert_same_rows(metrics, want, f"{where}: metrics.jsonl")
    for out in cmd.outputs:
        _compare(out, run, ref, where)
    if cmd.trains_weights:
        ident, diff = same_weights(final_weights(run), final_weights(ref))
        assert ident, f"{where}: final/ weights differ (max |diff| {diff:.3g})"
        _, moved = same_weights(final_weights(ref), Path(tiny_model_dir) / "model.safetensors")
        assert moved > 1e-4, f"{where}: the weights never moved ({moved:.3g}): the comparison proves nothing"
    s, s_ref = summary(run), summary(ref)
    assert s["steps"] == s_ref["steps"] == len(cmd.steps), (where, s["steps"], s_ref["steps"])
    # the summary's results too (its before/after evaluation, counts, label statistics): what
    # differs is only where and when the run happened, and what the resume itself records
    assert 0 <= s["resumed_from"] <= len(cmd.steps) and s["steps_run"] == len(cmd.steps) - s["resumed_from"], where
    assert s_ref["resumed_from"] is None, where
    same = _drop(s, SUMMARY_RUN_FIELDS + cmd.summary_drop)
    want_s = _drop(s_ref, SUMMARY_RUN_FIELDS + cmd.summary_drop)
    assert same == want_s, f"{where}: summary.json {first_difference([same], [want_s])}"
    _aside_rows_are_recomputed(run, ref, cmd, where)
    if cmd.name in EXTRA:
        EXTRA[cmd.name](run, point)

