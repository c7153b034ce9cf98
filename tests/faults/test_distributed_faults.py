"""Distributed faults end in bounded time, with one line (issue 45, point 4):

* a process of a 2-process CPU run (torchrun, gloo) stopped with SIGSTOP mid-run: the other
  one waits ``run.collective_timeout_s`` (not gloo's 30 minutes) in its next collective, then
  prints the one timeout line naming both ranks; the launcher ends, and the metrics rows and the
  checkpoint written before the stall are kept;
* ``--resume`` with another number of processes than the checkpoint was written by (2 -> 1) is
  refused in one line naming both counts, and goes on when ``run.allow_world_change=true``;
* (fast, no process) the config field's bounds and the timeout line's wording.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "invariants"))

STALL_TIMEOUT_S = 15
# torchrun stops the other workers of a failed run with SIGTERM, then SIGKILL after 30 s; a
# stopped process never handles the SIGTERM, so the launcher ends up to 30 s after the line
TORCHRUN_GRACE_S = 30


def _children(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.add(int(entry))
    return out


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _pofe_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


# ----------------------------------------------------------------------------- fast: no process

def test_collective_timeout_bounds_and_default():
    from pydantic import ValidationError

    from pofe.runs import RunConfig

    assert RunConfig().collective_timeout_s == 600 and RunConfig().allow_world_change is False
    assert RunConfig(collective_timeout_s=10).collective_timeout_s == 10
    assert RunConfig(collective_timeout_s=86400).collective_timeout_s == 86400
    for bad in (0, -1, 9, 86401, 10**12):
        with pytest.raises(ValidationError):
            RunConfig(collective_timeout_s=bad)


def test_collective_timeout_line():
    from pofe.runtime.parallel import collective_timeout_line

    assert collective_timeout_line(20, 0, 2) == (
        "collective timed out after 20 s on rank 0 of 2: rank 1 stopped answering (stopped, hung or swapped out); "
        "checkpoints and metrics written so far are kept, --resume RUN_DIR continues (run.collective_timeout_s)")
    assert "on rank 2 of 4: one of ranks 0, 1, 3 stopped answering" in collective_timeout_line(600, 2, 4)


def test_gloo_timeout_error_becomes_the_line(monkeypatch):
    """describe_error turns gloo's timeout text into the line (exit 1), not "internal error"."""
    import torch.distributed as dist

    from pofe.cli.main import describe_error
    from pofe.runtime import parallel

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setitem(parallel._TIMEOUT, "s", 20)
    err = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms "
                       "for recv operation to complete")
    assert describe_error(err) == (1, parallel.collective_timeout_line(20, 1, 2))
    assert describe_error(err)[1].startswith("collective timed out after 20 s on rank 1 of 2: rank 0 stopped answering")


def test_resume_refuses_another_process_count(tmp_path):
    from pofe.runtime.checkpoints import CheckpointError, check_processes

    ckpt = tmp_path / "step-2"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text(json.dumps({"format": 1, "step": 2, "processes": 2, "files": {}}))
    check_processes(ckpt, 2)
    with pytest.raises(CheckpointError) as e:
        check_processes(ckpt, 1)
    assert str(e.value) == ("checkpoint step-2 was written by 2 processes, this resume runs 1: the global batch and "
                            "each process's data and seeds would change; resume with 2 processes, or --set "
                            "run.allow_world_change=true to go on anyway")
    check_processes(ckpt, 1, allow=True)


# ----------------------------------------------------------------------------- processes (slow)

@pytest.mark.slow
def test_a_stopped_rank_ends_the_run_within_the_timeout(tmp_path, tiny_model_dir):
    import configs

    cfg = configs.sft(tmp_path, tiny_model_dir, "stall", {"run.collective_timeout_s": STALL_TIMEOUT_S})
    run_dir = tmp_path / "stall"
    path = tmp_path / "stall.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    from _cli import env

    # rank 1 stops itself after step 3's metrics row (after checkpoint step-2); rank 0 then waits in step 4
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                 "-m", "pofe", "sft", "--config", str(path)], cwd=Path(__file__).resolve().parents[2],
                                env=env(POFE_FAULT="3:after_step:stop", POFE_FAULT_RANK="1"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    stopped_at = None
    try:
        deadline = time.monotonic() + 400
        while launcher.poll() is None and time.monotonic() < deadline:
            seen |= _children(launcher.pid)
            if stopped_at is None and any(_state(p) == "T" for p in seen):
                stopped_at = time.monotonic()
            if stopped_at is not None and time.monotonic() - stopped_at > STALL_TIMEOUT_S + TORCHRUN_GRACE_S + 60:
                break
            time.sleep(0.2)
        assert stopped_at is not None, "no worker stopped itself (the fault point did not fire)"
        ended = launcher.poll() is not None
        took = time.monotonic() - stopped_at
        assert ended, f"the launcher still runs {took:.0f} s after rank 1 stopped (collective timeout {STALL_TIMEOUT_S} s)"
        _, stderr = launcher.communicate(timeout=30)
    finally:
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode != 0
    assert took <= STALL_TIMEOUT_S + TORCHRUN_GRACE_S + 15, f"ended {took:.0f} s after the stall"
    assert _pofe_errors(stderr) == [
        f"error: collective timed out after {STALL_TIMEOUT_S} s on rank 0 of 2: rank 1 stopped answering (stopped, "
        "hung or swapped out); checkpoints and metrics written so far are kept, --resume RUN_DIR continues "
        "(run.collective_timeout_s)"], stderr[-3000:]
    assert "traceback : error: collective timed out" in stderr, stderr[-3000:]  # the launcher's summary names it
    # nothing written before the stall is lost
    steps = [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert steps == [1, 2, 3], steps
    assert (run_dir / "checkpoints" / "step-2" / "manifest.json").is_file()
    assert not (run_dir / "summary.json").exists()


@pytest.mark.slow
def test_resume_with_another_process_count_is_refused_unless_asked(tmp_path, tiny_model_dir):
    import configs
    from _cli import pofe as run_cli
    from harness import run_pofe

    cmd = configs.COMMANDS["sft"]
    crash = run_pofe(cmd.argv, config=cmd.config(tmp_path, tiny_model_dir, "crash", {}), processes=2,
                     fault="3:after_step")
    assert crash.rc != 0 and (crash.run_dir / "checkpoints" / "step-2").is_dir(), crash.stderr[-3000:]
    metrics = (crash.run_dir / "metrics.jsonl").read_bytes()

    refused = run_cli("sft", "--resume", str(crash.run_dir))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert _pofe_errors(refused.stderr) == [
        "error: checkpoint step-2 was written by 2 processes, this resume runs 1: the global batch and each "
        "process's data and seeds would change; resume with 2 processes, or --set run.allow_world_change=true to "
        "go on anyway"], refused.stderr[-3000:]
    assert (crash.run_dir / "metrics.jsonl").read_bytes() == metrics  # nothing rewound or written
    assert not (crash.run_dir / "summary.json").exists()

    allowed = run_cli("sft", "--resume", str(crash.run_dir), "--set", "run.allow_world_change=true")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "checkpoint step-2 was written by 2 processes, this resume runs 1" in allowed.stderr
    s = json.loads((crash.run_dir / "summary.json").read_text())
    assert s["resumed_from"] == 2 and s["processes"] == 1, s
