"""Checkpoints verify themselves (issue 45, point 1): ``manifest.json`` is written last into every
checkpoint (each file's size and sha256, the step, the process count, the pofe version, the run's
append-only outputs); ``--resume`` checks it, falls back to the previous intact checkpoint with
one warning line, or refuses with one line naming the damaged file; an output cut short or deleted
after the checkpoint is refused, never resumed over.

Most cases run on the real driver (:func:`pofe.recipe.drive`) with a toy recipe: a 4x4 linear
layer under AdamW and a scheduler, three rows of ``rows.jsonl`` per step, four steps with a
checkpoint every two (well under a second a run), so every damage case is cheap and the resumed
run can be compared with an uninterrupted one, row for row and weight for weight."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from pofe.config import PofeConfig
from pofe.recipe import CheckpointConfig, Recipe, drive
from pofe.runs import RunConfig, read_jsonl
from pofe.runtime.tracking import LogConfig

pytestmark = pytest.mark.faults


class ToyConfig(PofeConfig):
    steps: int = 4
    checkpoint: CheckpointConfig = CheckpointConfig(every=2)
    log: LogConfig = LogConfig(progress=False, tensorboard=False)
    run: RunConfig = RunConfig()
    seed: int = 0


class ToyRecipe(Recipe):
    """Four steps of least squares on data drawn from ``(seed, step)``; three output rows a step."""

    command = "toy"
    outputs = ("rows.jsonl",)

    def setup(self, run):
        torch.manual_seed(0)
        self.run = run
        self.model = torch.nn.Linear(4, 4)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0 / (1 + s))
        self.total_steps = self.cfg.steps

    def step(self, step):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
        loss = (self.model(x) - y).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        if self.run.main:
            with open(self.run.dir / "rows.jsonl", "a") as f:
                for i in range(3):
                    f.write(json.dumps({"step": step, "i": i, "noise": torch.rand(1).item()}) + "\n")
        return {"loss": loss.item()}

    def save_final(self, out):
        return None  # the weights are compared through the last checkpoint


def _cfg(tmp_path: Path, name: str, keep_last: int = 2) -> ToyConfig:
    return ToyConfig(run=RunConfig(output_dir=str(tmp_path), name=name),
                     checkpoint=CheckpointConfig(every=2, keep_last=keep_last))


def _toy(tmp_path: Path, name: str, keep_last: int = 2, resume: Path | None = None) -> dict:
    return drive(ToyRecipe(_cfg(tmp_path, name, keep_last)), resume=resume)


def _weights(run: Path, step: int = 4) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step-{step}" / "model.safetensors"))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("pofe.")]


# ----------------------------------------------------------------------------- the manifest


def test_every_checkpoint_gets_a_manifest_written_last_with_every_file_and_the_outputs(tmp_path):
    from pofe import __version__

    _toy(tmp_path, "r")
    ckpt = tmp_path / "r" / "checkpoints" / "step-2"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    names = sorted(p.name for p in ckpt.iterdir() if p.name != "manifest.json")
    assert names == ["meta.json", "model.safetensors", "trainer_state.json", "trainer_state.safetensors"]
    assert manifest["files"] == {n: {"bytes": (ckpt / n).stat().st_size,
                                     "sha256": hashlib.sha256((ckpt / n).read_bytes()).hexdigest()} for n in names}
    assert (manifest["step"], manifest["processes"], manifest["pofe_version"]) == (2, 1, __version__)
    # rows.jsonl at step 2: steps 1 and 2, three rows each; its bytes then are its first six lines now
    lines = (tmp_path / "r" / "rows.jsonl").read_bytes().splitlines(keepends=True)
    head = b"".join(lines[:6])
    assert manifest["outputs"] == {"rows.jsonl": {"bytes": len(head), "rows": 6,
                                                  "sha256": hashlib.sha256(head).hexdigest()}}
    # step 4's record hashes only what was appended since step 2 (one hash carried along): still the whole file's
    whole = (tmp_path / "r" / "rows.jsonl").read_bytes()
    assert json.loads((tmp_path / "r" / "checkpoints" / "step-4" / "manifest.json").read_text())["outputs"] == {
        "rows.jsonl": {"bytes": len(whole), "rows": 12, "sha256": hashlib.sha256(whole).hexdigest()}}


# ----------------------------------------------------------------------------- damaged checkpoints


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _half(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _bit_rot(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[-3] ^= 0x10  # one bit of the last tensor's data: same size, valid header
    p.write_bytes(bytes(data))


def _edit_json(fn):
    def damage(p: Path) -> None:
        state = json.loads(p.read_text())
        fn(state)
        p.write_text(json.dumps(state))
    return damage


DAMAGE = {
    "model-emptied": ("model.safetensors", _empty),
    "model-partial": ("model.safetensors", _half),
    "model-bit-rot": ("model.safetensors", _bit_rot),
    "step-4-edited-to-99": ("trainer_state.json", _edit_json(lambda s: s.update(step=99))),
    "optimizer-section-removed": ("trainer_state.json", _edit_json(lambda s: s.pop("optimizer"))),
    "rng-section-removed": ("trainer_state.json", _edit_json(lambda s: s.pop("rng"))),
    "tensors-truncated": ("trainer_state.safetensors", _half),
}


def _expected_line(path: Path, size_before: int) -> str:
    size = path.stat().st_size
    if size != size_before:
        return (f"{path}: {size} bytes where manifest.json records {size_before} (changed after it was written: cut "
                f"short, emptied, edited or replaced); the checkpoint is damaged")
    return f"{path}: its sha256 differs from manifest.json (bit rot or an edit after it was written); the checkpoint is damaged"


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_intact_one_saying_so(tmp_path, case, caplog):
    """keep_last 2: step-2 and step-4 on disk. The damaged step-4 is passed over with one warning
    line naming the file; the run resumes from step 2 and ends exactly as the uninterrupted run."""
    _toy(tmp_path, "ref")
    _toy(tmp_path, "r")
    name, damage = DAMAGE[case]
    path = tmp_path / "r" / "checkpoints" / "step-4" / name
    before = path.stat().st_size
    damage(path)
    line = _expected_line(path, before)
    with caplog.at_level(logging.WARNING):
        summary = _toy(tmp_path, "r", resume=tmp_path / "r")
    assert _warnings(caplog) == [f"{line}; resuming from step-2 instead, the newest intact checkpoint"]
    assert summary["resumed_from"] == 2 and summary["steps_run"] == 2
    # nothing lost, nothing doubled: every row and the weights as in the uninterrupted run (the rows
    # of steps 3-4 the first run wrote were moved aside, kept)
    assert read_jsonl(tmp_path / "r" / "rows.jsonl") == read_jsonl(tmp_path / "ref" / "rows.jsonl")
    assert read_jsonl(tmp_path / "r" / "metrics.jsonl") == read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    aside = list((tmp_path / "r").glob("rows.after-crash-*.jsonl"))
    assert len(aside) == 1 and read_jsonl(aside[0]) == read_jsonl(tmp_path / "ref" / "rows.jsonl")[6:]
    want, got = _weights(tmp_path / "ref"), _weights(tmp_path / "r")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_only_checkpoint_is_refused_with_one_line_and_nothing_is_touched(tmp_path, case):
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r", keep_last=1)
    run = tmp_path / "r"
    name, damage = DAMAGE[case]
    path = run / "checkpoints" / "step-4" / name
    before = path.stat().st_size
    damage(path)
    kept = {p.name: p.read_bytes() for p in (run / "rows.jsonl", run / "metrics.jsonl", path)}
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", keep_last=1, resume=run)
    assert str(e.value) == _expected_line(path, before)
    assert e.value.exit_code == 2
    assert {p: (run / p if p != name else path).read_bytes() for p in kept} == kept  # nothing rewound or rewritten
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4"]


def test_every_checkpoint_damaged_is_refused_naming_the_newest(tmp_path):
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r")
    run = tmp_path / "r"
    for step in (2, 4):
        _empty(run / "checkpoints" / f"step-{step}" / "model.safetensors")
    path = run / "checkpoints" / "step-4" / "model.safetensors"
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", resume=run)
    size = json.loads((path.parent / "manifest.json").read_text())["files"]["model.safetensors"]["bytes"]
    assert str(e.value) == (f"{path}: 0 bytes where manifest.json records {size} (changed after it was written: cut "
                            f"short, emptied, edited or replaced); the checkpoint is damaged; no earlier checkpoint is "
                            f"intact either (start a new run)")


def test_a_checkpoint_without_its_manifest_is_refused_unless_an_older_pofe_wrote_it(tmp_path, caplog):
    """Format 3 checkpoints are written with a manifest (last, inside the atomic write): one without
    it is damaged. A format-2 checkpoint (pofe before manifests) resumes with a warning: refusing it
    would strand every run started before; its structure is still checked."""
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r", keep_last=1)
    run = tmp_path / "r"
    ckpt = run / "checkpoints" / "step-4"
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", keep_last=1, resume=run)
    assert str(e.value) == (f"{ckpt / 'manifest.json'}: missing (every checkpoint of this pofe is written with one, "
                            f"last); the checkpoint is incomplete or damaged")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["format"] = 2
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING):
        summary = _toy(tmp_path, "r", keep_last=1, resume=run)
    assert summary["resumed_from"] == 4 and summary["steps_run"] == 0
    assert _warnings(caplog) == [f"{ckpt}: no manifest.json (written by an older pofe): its files cannot be checked "
                                 f"against recorded hashes; resuming from it as it is"]


def test_an_old_checkpoint_with_a_missing_section_is_still_refused(tmp_path):
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r", keep_last=1)
    ckpt = tmp_path / "r" / "checkpoints" / "step-4"
    (ckpt / "manifest.json").unlink()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["format"] = 2
    del state["optimizer"]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", keep_last=1, resume=tmp_path / "r")
    assert str(e.value) == (f"{ckpt / 'trainer_state.json'}: no optimizer section (the run restores one: resuming "
                            f"without it would not continue the run that was checkpointed); the checkpoint is damaged")


def test_load_checkpoint_refuses_weights_the_checkpoint_lacks(tmp_path):
    """``strict=False`` used to refuse only tensors the model lacks: a checkpoint without ``bias``
    loaded and the bias kept whatever the fresh model had."""
    from pofe.runtime import CheckpointError, load_checkpoint, save_checkpoint

    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    save_checkpoint(tmp_path / "step-1", model=a, step=1, model_state={"weight": a.weight.detach()})
    bias = b.bias.detach().clone()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "step-1", model=b)
    assert str(e.value) == (f"{tmp_path / 'step-1' / 'model.safetensors'}: lacks 1 of the model's trained parameters, "
                            f"e.g. ['bias'] (they would keep their initial values)")
    assert torch.equal(b.bias, bias)  # refused before anything was loaded


# ----------------------------------------------------------------------------- append-only outputs


def test_an_output_cut_short_after_the_checkpoint_is_refused_not_resumed_over(tmp_path):
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r")
    run = tmp_path / "r"
    lines = (run / "rows.jsonl").read_bytes().splitlines(keepends=True)
    cut = b"".join(lines[:7])  # 7 of the 12 rows step-4 counted
    (run / "rows.jsonl").write_bytes(cut)
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", resume=run)
    full = len(b"".join(lines))
    assert str(e.value) == (f"{run / 'rows.jsonl'}: 7 rows, {len(cut)} bytes where checkpoint step-4 counted 12 rows, "
                            f"{full} bytes: cut short after it, and a resume would never redo the lost rows: put the "
                            f"whole file back or start a new run")
    assert (run / "rows.jsonl").read_bytes() == cut and not list(run.glob("rows.after-crash-*"))


def test_a_deleted_output_is_refused(tmp_path):
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r")
    run = tmp_path / "r"
    size = (run / "rows.jsonl").stat().st_size
    (run / "rows.jsonl").unlink()
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", resume=run)
    assert str(e.value) == (f"{run / 'rows.jsonl'}: deleted after checkpoint step-4, which counted 12 rows, {size} "
                            f"bytes in it; a resume would never redo them: put the file back or start a new run")
    assert not (run / "rows.jsonl").exists() and len(read_jsonl(run / "metrics.jsonl")) == 4


def test_an_output_rewritten_in_place_is_refused(tmp_path):
    from pofe.runtime import CheckpointError

    _toy(tmp_path, "r")
    run = tmp_path / "r"
    data = (run / "rows.jsonl").read_bytes()
    (run / "rows.jsonl").write_bytes(data.replace(b'"i": 0', b'"i": 9', 1))  # same size, one row changed
    with pytest.raises(CheckpointError) as e:
        _toy(tmp_path, "r", resume=run)
    assert str(e.value) == (f"{run / 'rows.jsonl'}: its first 12 rows, {len(data)} bytes changed after checkpoint "
                            f"step-4 (sha256 differs): put the file back or start a new run")


def test_an_output_that_only_grew_after_the_checkpoint_is_rewound_and_redone(tmp_path):
    """The ordinary crash: rows of steps 3-4 written, the step-4 checkpoint not. Not refused."""
    _toy(tmp_path, "ref")
    _toy(tmp_path, "r")
    run = tmp_path / "r"
    shutil.rmtree(run / "checkpoints" / "step-4")
    summary = _toy(tmp_path, "r", resume=run)
    assert summary["resumed_from"] == 2
    assert read_jsonl(run / "rows.jsonl") == read_jsonl(tmp_path / "ref" / "rows.jsonl")


def test_label_resume_refuses_labels_cut_short(tmp_path):
    """The tester's case: ``labels.jsonl`` cut to 7 of 12 rows after a run; ``--resume`` exited 0
    with the 5 rows never redone. Now one line naming the file; the 7 rows are left as they are."""
    from _cli import invoke

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response_a": "x" * (i + 1), "response_b": "y" * (2 * i + 3)})
                             + "\n" for i in range(12)))
    args = ["label", "--pairs", str(pairs), "--set", "judge.kind=length", "--set", "train.batch_size=2",
            "--set", "log.progress=false", "--set", "log.tensorboard=false", "--set", f"run.output_dir={tmp_path}",
            "--set", "run.name=r"]
    assert invoke(*args).returncode == 0
    labels = tmp_path / "r" / "labels.jsonl"
    full = labels.read_bytes()
    cut = b"".join(full.splitlines(keepends=True)[:7])
    labels.write_bytes(cut)
    res = invoke("label", "--resume", str(tmp_path / "r"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {labels}: 7 rows, {len(cut)} bytes where checkpoint step-6 counted 12 rows, {len(full)} bytes: cut "
        f"short after it, and a resume would never redo the lost rows: put the whole file back or start a new run")
    assert labels.read_bytes() == cut


@pytest.mark.slow
def test_online_resume_refuses_a_deleted_ledger(tmp_path, tiny_model_dir):
    """``ledger.jsonl`` deleted after a crash was resumed over (8 of 24 rows). Now refused."""
    from _online_utils import tiny_cfg

    from pofe.loops.online import run as online
    from pofe.runtime import CheckpointError

    cfg = tiny_cfg(tmp_path, tiny_model_dir, "run.name=r", "eval.enabled=false")
    online(cfg)
    ledger = tmp_path / "r" / "ledger.jsonl"
    rows = len(read_jsonl(ledger))
    size = ledger.stat().st_size
    assert rows == 8  # 2 steps x 2 pairs, each an annotation row and a loss row
    ledger.unlink()
    with pytest.raises(CheckpointError) as e:
        online(cfg, resume=tmp_path / "r")
    assert str(e.value) == (f"{ledger}: deleted after checkpoint step-2, which counted {rows} rows, {size} bytes in "
                            f"it; a resume would never redo them: put the file back or start a new run")
    assert not ledger.exists() and os.path.exists(tmp_path / "r" / "final" / "model.safetensors")


@pytest.mark.slow
def test_label_resume_past_a_damaged_checkpoint_says_so_and_loses_nothing(tmp_path):
    """On the command line: the fallback is one warning line on stderr, the run exits 0, and every
    label is there once, as in the first run (the rows after step 5 redone, the old ones kept aside)."""
    from _cli import pofe

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response_a": "x" * (i + 1), "response_b": "y" * (2 * i + 3)})
                             + "\n" for i in range(12)))
    args = ["label", "--pairs", str(pairs), "--set", "judge.kind=length", "--set", "train.batch_size=2",
            "--set", "log.progress=false", "--set", "log.tensorboard=false", "--set", f"run.output_dir={tmp_path}",
            "--set", "run.name=r"]
    assert pofe(*args).returncode == 0
    run = tmp_path / "r"
    labels = read_jsonl(run / "labels.jsonl")
    assert len(labels) == 12 and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-5", "step-6"]
    state = run / "checkpoints" / "step-6" / "trainer_state.json"
    size = state.stat().st_size
    state.write_text(state.read_text().replace('"step": 6', '"step": 99'))
    res = pofe("label", "--resume", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    warned = [ln for ln in res.stderr.splitlines() if "WARNING" in ln and "checkpoint" in ln]
    assert len(warned) == 1 and warned[0].endswith(
        f"{state}: {size + 1} bytes where manifest.json records {size} (changed after it was written: cut short, "
        f"emptied, edited or replaced); the checkpoint is damaged; resuming from step-5 instead, the newest intact "
        f"checkpoint")
    assert read_jsonl(run / "labels.jsonl") == labels
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == 5
