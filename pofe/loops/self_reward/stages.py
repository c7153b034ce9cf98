"""Helpers for multi-stage loops (``pofe self-reward`` runs SFT, generation, judging, DPO and
evaluation as stages whose outputs are files): a seed per stage, atomic JSON writes (a stage
whose output file exists is finished), freeing a model between stages, and a stage clock."""

from __future__ import annotations

import gc
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Sequence

from pofe.runs import atomic_write_text
from pofe.jsonl import json_line


def stage_seed(seed: int, *parts: Any) -> int:
    """A seed for one stage, derived from the run's seed and the stage's name/index: stages
    do not share random streams, and a resumed stage draws what it would have."""
    return random.Random("/".join(map(str, (seed, *parts)))).randrange(2**31)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str))


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    atomic_write_text(path, "".join(json_line(r) + "\n" for r in rows))


def free(*objs) -> None:
    """Collect after the caller dropped its references (models are large)."""
    del objs
    gc.collect()


class StageClock:
    """Seconds per stage (reported per iteration: where the time goes)."""

    def __init__(self):
        self.t = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.t, 2)
        self.t = now


def link_final(final: Path, model: str, load) -> Path:
    """``final`` (``<run_dir>/final``) = the last stage's model: a relative symlink when it is a
    folder of this run, else a copy saved from ``load()`` (e.g. M1 given as a hub or embedded name)."""
    final = Path(final)
    if final.exists() or final.is_symlink():
        return final
    run_dir, src = final.parent, Path(model)
    if src.is_dir() and Path(os.path.abspath(src)).is_relative_to(os.path.abspath(run_dir)):
        os.symlink(os.path.relpath(os.path.abspath(src), os.path.abspath(run_dir)), final)
    else:
        from pofe.runtime.checkpoints import save_final

        save_final(*load(), final)
    return final
