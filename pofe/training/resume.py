"""Making a run folder agree with the checkpoint it resumes from.

A crash between two checkpoints leaves rows in ``metrics.jsonl`` (and append-only outputs)
for steps the resumed run will compute again; appending them a second time would give two
rows per step and plots that double back. The rows after the checkpoint are dropped: a
resumed run recomputes them identically (every step reseeds from ``(seed, step)``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from pofe.config import PofeConfig
from pofe.runs import atomic_write_text, open_run_file, read_jsonl, read_run_bytes
from pofe.data.io import json_lines


def rewind_metrics(path: str | Path, step: int) -> int:
    """Keep only the rows of ``path`` whose ``step`` is ≤ ``step``; returns how many were dropped."""
    path = Path(path)
    if not os.path.lexists(path):  # a planted link is refused by read_jsonl, never skipped or followed
        return 0
    rows = read_jsonl(path)
    keep = [r for r in rows if int(r.get("step", 0)) <= step]
    if len(keep) != len(rows) or read_run_bytes(path)[-1:] not in (b"\n", b""):
        atomic_write_text(path, json_lines(keep))
    return len(rows) - len(keep)


def rewind_to_offset(path: str | Path, offset: int) -> int:
    """Truncate an append-only file to ``offset`` bytes (its size at the checkpoint); returns
    the number of bytes dropped."""
    path = Path(path)
    if not os.path.lexists(path):
        return 0
    fd = open_run_file(path, os.O_RDWR)  # never through a link: its target is not the run's
    with os.fdopen(fd, "rb+") as f:
        size = os.fstat(f.fileno()).st_size
        if size > offset:
            f.truncate(offset)
            f.flush()
            os.fsync(f.fileno())
    return max(0, size - offset)


def file_offset(path: str | Path) -> int:
    """The size of ``path`` in bytes (0 when it does not exist): what a checkpoint records."""
    path = Path(path)
    return path.stat().st_size if path.exists() else 0


class CheckpointConfig(PofeConfig):
    """When to write ``checkpoints/step-N`` (everything an exact ``--resume`` needs)."""

    every: int = Field(0, ge=0)
    """Checkpoint every N optimiser steps (0 = only at the end)."""
    keep_last: int = Field(2, ge=0)
    """Checkpoints kept on disk (0 keeps all)."""


def resume_from_checkpoint(run_dir: Path, *, model, optimizer, scheduler) -> tuple[int, dict]:
    """(step, saved state) of a resumed run: its latest checkpoint loaded into ``model``/
    ``optimizer``/``scheduler`` ((0, {}) when it has none), and ``metrics.jsonl`` rewound to
    that step so the resumed run never writes a step twice."""
    from pofe.training import latest_checkpoint, load_checkpoint

    start, state = 0, {}
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        info = load_checkpoint(ckpt, model=model, optimizer=optimizer, scheduler=scheduler)
        start, state = info["step"], info["state"]
    rewind_metrics(Path(run_dir) / "metrics.jsonl", start)
    return start, state


def checkpoint_if_due(run_dir: Path, ckpt: "CheckpointConfig", step: int, total: int, *, model, optimizer, scheduler,
                      state: dict) -> bool:
    """Write ``checkpoints/step-N`` at the last step and every ``ckpt.every`` steps (keeping
    the last ``ckpt.keep_last``): everything an exact resume needs."""
    from pofe.training import prune_checkpoints, save_checkpoint

    if not (step == total or (ckpt.every and step % ckpt.every == 0)):
        return False
    save_checkpoint(Path(run_dir) / "checkpoints" / f"step-{step}", model=model, optimizer=optimizer,
                    scheduler=scheduler, step=step, state=state)
    prune_checkpoints(run_dir, ckpt.keep_last)
    return True
