"""Run folders: ``runs/<name>/`` with the resolved ``config.yaml``, ``metrics.jsonl`` and,
depending on the command, a ledger, checkpoints and a report.

Two runs never write into the same folder by accident: creating a run whose folder
already holds a ``config.yaml`` picks ``<name>-2``, ``<name>-3``, ... unless the caller is
resuming that run.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pofe.config import PofeConfig, dump_config


class RunConfig(PofeConfig):
    """Where a command writes its outputs."""

    output_dir: str = "runs"
    """Parent folder of run folders."""
    name: str | None = None
    """Run folder name; default ``<command>-<YYYYmmdd-HHMMSS>``."""


def new_run_dir(run: RunConfig, command: str) -> Path:
    """Create a fresh run folder (never reusing one that already holds a run)."""
    base = Path(run.output_dir)
    name = run.name or f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate = base / name
    k = 2
    while candidate.exists() and any(candidate.iterdir()):
        candidate = base / f"{name}-{k}"
        k += 1
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


class RunError(Exception):
    """A run folder that cannot be used (missing, not a pofe run, held by another process).
    ``str(e)`` is one line; the CLI exits 2 with it."""


def open_run(run: RunConfig, command: str, *, resume: str | Path | None = None) -> Path:
    """The run folder a command writes into: a fresh one, or ``resume`` (which must already be
    a pofe run folder holding ``config.yaml``). Every command goes through here, so the
    guarantees about run folders (never shared by two runs, never outside ``run.output_dir``,
    never resumed while another process holds it) live in one place."""
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise RunError(f"--resume {run_dir}: no config.yaml there (not a pofe run folder)")
        return run_dir
    return new_run_dir(run, command)


def write_config(run_dir: Path, cfg: BaseModel) -> Path:
    path = Path(run_dir) / "config.yaml"
    atomic_write_text(path, dump_config(cfg))
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file + rename so a crash never leaves a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; run files are meant to be read by others
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item") and callable(v.item):
        try:
            return _clean(v.item())
        except (ValueError, RuntimeError):
            pass
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonlWriter:
    """Append-only JSON Lines file, flushed after each row so a crash loses nothing written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(row), ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read one of a run's OWN append-only JSON Lines files (ledger, metrics, candidates) on
    resume or report: a torn last line is what a crash mid-write leaves, so it is skipped;
    any other bad line is an error. Never use this for inputs -- a user's file with a bad
    last line must be a located error: use :func:`pofe.data.io.read_rows`."""
    rows = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: invalid JSON ({e.msg})") from None
    return rows
