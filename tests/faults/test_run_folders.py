"""Run folders under concurrency: atomic creation, the PID lock, stale locks, no escape from
``run.output_dir`` (``run.name=../..`` included)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import error_lines, invoke, pofe
from pofe.runs import RunConfig, RunError, new_run_dir, open_run, write_config

pytestmark = pytest.mark.faults


def _claim(out: str, barrier, q) -> None:
    barrier.wait()  # all processes race for the same name at once
    d = new_run_dir(RunConfig(output_dir=out, name="same"), "online")
    q.put(d.name)


def test_concurrent_starts_never_share_a_folder(tmp_path):
    """Regression (defect 8): two runs started together with one run.name shared a folder (1
    of 3 tries on main: exists-and-nonempty check, then mkdir(exist_ok=True)). Eight processes
    released by one barrier must get eight distinct folders."""
    ctx = mp.get_context("fork")
    n = 8
    barrier, q = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), barrier, q)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    names = sorted(q.get(timeout=5) for _ in range(n))
    assert len(set(names)) == n
    assert set(names) == {"same"} | {f"same-{k}" for k in range(2, n + 1)}


def test_empty_existing_folder_is_not_reused(tmp_path):
    (tmp_path / "r").mkdir()
    d = new_run_dir(RunConfig(output_dir=str(tmp_path), name="r"), "x")
    assert d.name == "r-2"


_HOLDER = r"""
import sys, time
from pofe.loops.online import OnlineConfig
from pofe.runs import RunConfig, new_run_dir, write_config
d = new_run_dir(RunConfig(output_dir=sys.argv[1], name="held"), "online")
write_config(d, OnlineConfig(judge={"kind": "length"}))
print(d, flush=True)
time.sleep(120)
"""


def _start_holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    from _cli import env

    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env())
    line = p.stdout.readline().strip()
    assert line, "holder did not start"
    return p, Path(line)


@pytest.mark.slow
def test_resume_of_a_running_run_is_refused_naming_the_pid_then_stale_lock_taken_over(tmp_path):
    """Regression (defect 8): ``--resume`` of a still-running run appended 40 duplicate ledger
    rows on main. While the owner lives the resume is refused naming its PID; after SIGKILL
    (the kernel drops the flock) the stale lock is taken over."""
    holder, run_dir = _start_holder(tmp_path)
    try:
        with pytest.raises(RunError, match=rf"in use by a running pofe process \(PID {holder.pid}\)"):
            open_run(RunConfig(), "online", resume=run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert (run_dir / ".lock").read_text().strip() == str(holder.pid)  # left behind by the dead process
    from pofe.runs import release_run

    assert open_run(RunConfig(), "online", resume=run_dir) == run_dir
    assert (run_dir / ".lock").read_text().strip() == str(os.getpid())
    release_run(run_dir)


@pytest.mark.slow
def test_cli_resume_of_a_running_run_exits_2_with_one_line(tmp_path):
    holder, run_dir = _start_holder(tmp_path)
    try:
        res = pofe("online", "--resume", str(run_dir))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = error_lines(res)
    assert len(lines) == 1 and f"PID {holder.pid}" in lines[0], res.stderr[-2000:]


def test_lock_is_reentrant_in_one_process_and_released(tmp_path):
    from pofe.runs import lock_run, release_run

    d = new_run_dir(RunConfig(output_dir=str(tmp_path), name="r"), "x")
    write_config(d, RunConfig())
    lock_run(d)  # the same process resuming its own run (in-process resume) is fine
    assert open_run(RunConfig(), "x", resume=d) == d
    release_run(d)


def test_resume_of_a_missing_or_foreign_folder(tmp_path):
    with pytest.raises(RunError, match="no such run folder"):
        open_run(RunConfig(), "rl", resume=tmp_path / "typo")
    (tmp_path / "other").mkdir()
    with pytest.raises(RunError, match="no config.yaml"):
        open_run(RunConfig(), "rl", resume=tmp_path / "other")


@pytest.mark.parametrize("name", ["../..", "..", "a/../../b", "/etc"])
def test_run_name_cannot_escape_the_output_dir(tmp_path, name):
    """Probe: ``run.name=../..`` wrote outside the output folder on main. Exit 2, one line naming
    run.name, nothing created outside."""
    out = tmp_path / "out"
    res = invoke("online", "--set", f"run.output_dir={out}", "--set", f"run.name={name}", "--print-config")
    assert res.returncode == 2, res.stdout[-500:] + res.stderr[-1500:]
    lines = error_lines(res)
    assert len(lines) == 1 and "run.name" in lines[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
