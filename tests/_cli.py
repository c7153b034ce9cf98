"""Running ``pofe`` as a real subprocess (the installed entry point's behaviour: exit status,
stderr lines, SIGKILL) with one CPU thread and no hub: the one such helper of the test suite
(the fault suite, the invariant harness and the plugin tests use it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "POFE_FAULT"}
    e.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
              "PYTHONPATH": str(REPO) + os.pathsep + e.get("PYTHONPATH", "")})
    e.update(extra)
    return e


def pofe(*args: str, timeout: float = 300, prefix: tuple[str, ...] = (), cwd: Path = REPO,
         **extra: str) -> subprocess.CompletedProcess:
    """``python -m pofe *args`` (after ``prefix``, e.g. a torchrun launcher); ``extra``: more
    environment variables (``POFE_FAULT=...``, ``PYTHONPATH=...`` replaces the default)."""
    return subprocess.run([*prefix, sys.executable, "-m", "pofe", *args], cwd=cwd, env=env(**extra),
                          capture_output=True, text=True, timeout=timeout)


def torchrun(*args: str, nproc: int = 2, launcher: tuple[str, ...] = ("--standalone",), timeout: float = 600,
             **extra: str) -> subprocess.CompletedProcess:
    """``torchrun <launcher> --nproc_per_node N -m pofe *args`` (CPU processes on gloo); ``launcher``:
    e.g. ``--nnodes 2 --node_rank 1 --master_addr ...`` for one "node" of a multi-node run."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *launcher, "--nproc_per_node", str(nproc),
                           "-m", "pofe", *args], cwd=REPO, env=env(**extra), capture_output=True, text=True,
                          timeout=timeout)


def error_lines(res: subprocess.CompletedProcess) -> list[str]:
    """Non-empty stderr lines that are not log lines (``HH:MM:SS LEVEL name: ...``) or progress bars."""
    import re

    return [ln for ln in res.stderr.splitlines()
            if ln.strip() and not re.match(r"^\d\d:\d\d:\d\d \w+ ", ln) and not re.search(r"\d+%\|", ln)]


def invoke(*args: str) -> subprocess.CompletedProcess:
    """``pofe`` in-process (same top-level handler as the entry point, without a subprocess's
    start-up cost); returns a CompletedProcess-like result."""
    from typer.testing import CliRunner

    from pofe.cli.main import app

    res = CliRunner().invoke(app, list(args))
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)
