"""Kill-and-resume through the CLI, shared by the rm and rl fault tests: a reference run, a run
SIGKILLed after a few metrics rows, ``--resume`` of it, then metrics and final weights compared.
Every run is a fresh process with one thread, so the arithmetic of the runs is the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def metrics_rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in open(run_dir / "metrics.jsonl")]


def kill_resume_compare(argv, tmp_path: Path, *, kill_after_rows: int, total_steps: int) -> dict:
    """``argv(name)`` is the command line of a run named ``name`` under ``tmp_path``. Returns the
    resumed run's JSON summary after asserting it matches the uninterrupted run."""
    env = _env()
    subprocess.run([sys.executable, "-m", "pofe", *argv("ref")], env=env, check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "pofe", *argv("killed")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    while proc.poll() is None and not (metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after_rows):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # a few of many steps logged: it is still running
    assert proc.wait() == -signal.SIGKILL
    res = subprocess.run([sys.executable, "-m", "pofe", argv("x")[0], "--resume", str(tmp_path / "killed"), "--json"],
                         env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads(res.stdout[res.stdout.index("{"):])
    assert s["resumed_from"] < total_steps, s["resumed_from"]
    assert [r["step"] for r in metrics_rows(tmp_path / "killed")] == list(range(1, total_steps + 1))  # no step twice
    assert metrics_rows(tmp_path / "killed") == metrics_rows(tmp_path / "ref")
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "killed" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return s
