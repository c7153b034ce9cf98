"""The driver owns what a recipe hands it in setup: the checkpoint load and rewind, the append-only
writers, the meters asked after each row, the "before training" measurement, and the closers. A
toy recipe on the real driver, resumed after a planted stop; no model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pofe.config import PofeConfig
from pofe.errors import PofeError
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig, read_jsonl
from pofe.runtime.tracking import LogConfig


class Cfg(PofeConfig):
    steps: int = 5
    stop_at: int = 0
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig(progress=False, tensorboard=False)
    run: RunConfig = RunConfig()
    seed: int = 0


class Stop(PofeError):
    exit_code = 3


class CountMeter:
    """Stops after ``stop_at``; records every step it was asked about."""

    def __init__(self, stop_at: int, asked: list[int]):
        self.stop_at, self.asked = stop_at, asked

    def after_row(self, step: int):
        self.asked.append(step)
        return Stop(f"planted stop after step {step}") if step == self.stop_at else None


class Toy(Recipe):
    command = "toy"
    outputs = ("rows.jsonl",)

    def __init__(self, cfg, events: list[str]):
        super().__init__(cfg)
        self.events, self.asked = events, []

    def setup(self, run: RunContext) -> None:
        self.total_steps = self.cfg.steps
        run.restore_checkpoint()
        self.before = run.measured_before("eval_before", lambda: self.events.append("measured") or 41)
        self.rows = run.writer("rows.jsonl")
        run.on_close(lambda: self.events.append("engine closed"))
        run.meter(CountMeter(self.cfg.stop_at, self.asked))

    def step(self, step: int) -> dict[str, Any]:
        self.rows.write({"step": step})
        return {"before": self.before}


def test_a_stop_then_a_resume_through_the_driver_owned_pieces(tmp_path):
    events: list[str] = []
    cfg = Cfg(stop_at=2, run=RunConfig(output_dir=str(tmp_path), name="t"))
    first = Toy(cfg, events)
    with pytest.raises(Stop):
        drive(first)
    d = tmp_path / "t"
    assert first.asked == [1, 2]  # the meter was asked after each row, and the stop ended the loop
    assert events == ["measured", "engine closed"]
    assert first.rows._f.closed  # the driver closed the writer it opened
    s = json.loads((d / "summary.json").read_text())
    assert s["stopped"]["step"] == 2 and s["final_model"] is None
    # a row the crashed process wrote after the checkpoint is rewound away by the resume
    (d / "rows.jsonl").open("a").write(json.dumps({"step": 3}) + "\n")

    events.clear()
    again = Toy(cfg.model_copy(update={"stop_at": 0}), events)
    s = drive(again, resume=d)
    assert events == ["engine closed"]  # the before-training value came from the checkpoint, not recomputed
    assert again.before == 41 and s["resumed_from"] == 2
    assert again.asked == [3, 4, 5]
    assert [r["step"] for r in read_jsonl(d / "rows.jsonl")] == [1, 2, 3, 4, 5]
    assert [r["before"] for r in read_jsonl(d / "metrics.jsonl")] == [41] * 5


class Retired(Toy):
    def restore(self, run):  # the older interface: would never be called
        pass


def test_a_recipe_with_a_retired_hook_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"Retired\.restore: .*run\.restore_checkpoint"):
        drive(Retired(Cfg(run=RunConfig(output_dir=str(tmp_path), name="t")), []))


class Undeclared(Toy):
    def setup(self, run: RunContext) -> None:
        run.restore_checkpoint()
        run.writer("other.jsonl")


def test_a_writer_for_a_file_that_is_not_an_output_is_refused(tmp_path):
    with pytest.raises(ValueError, match="other.jsonl"):
        drive(Undeclared(Cfg(run=RunConfig(output_dir=str(tmp_path), name="t")), []))


def test_the_closers_run_when_setup_fails(tmp_path):
    events: list[str] = []

    class Fails(Toy):
        def setup(self, run: RunContext) -> None:
            run.on_close(lambda: events.append("closed"))
            raise RuntimeError("planted")

    with pytest.raises(RuntimeError, match="planted"):
        drive(Fails(Cfg(run=RunConfig(output_dir=str(tmp_path), name="t")), events))
    assert events == ["closed"]
    assert not Path(tmp_path / "t" / "summary.json").exists()
