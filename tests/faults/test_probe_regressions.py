"""Regression tests for what the probe re-run (``tests/faults/probe_suite.py``) found: one test
per class of fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _cli import error_lines, invoke, pofe
from pofe.runs import read_jsonl

pytestmark = pytest.mark.faults


def _pairs(tmp_path: Path, n: int = 6) -> Path:
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response_a": "x" * (i + 1), "response_b": "y" * (2 * i + 3)})
                         + "\n" for i in range(n)))
    return p


@pytest.mark.slow
def test_label_resume_after_a_batch_cut_short_rejudges_the_whole_batch(tmp_path):
    """A kill after the first row of batch 2 (``POFE_FAULT=2:row_1``) left 3 labels rows and 1
    metrics row. The resume used to continue at row 3, so its batches were (3, 4), (5): a
    metrics row of 1 pair, batch boundaries (and a batched judge's reads) unlike the
    uninterrupted run's. It now keeps whole batches only and judges (2, 3), (4, 5)."""
    args = ["label", "--pairs", str(_pairs(tmp_path)), "--set", "judge.kind=length", "--set", "train.batch_size=2",
            "--set", "log.progress=false", "--set", "log.tensorboard=false", "--set", f"run.output_dir={tmp_path}"]
    full = invoke(*args, "--set", "run.name=full")
    assert full.returncode == 0, full.stderr
    cut = pofe(*args, "--set", "run.name=cut", POFE_FAULT="2:row_1")
    assert cut.returncode == -9, cut.stderr
    run = tmp_path / "cut"
    assert len(read_jsonl(run / "labels.jsonl")) == 3 and len(read_jsonl(run / "metrics.jsonl")) == 1  # what the kill left
    res = invoke("label", "--resume", str(run))
    assert res.returncode == 0, res.stderr
    assert read_jsonl(run / "labels.jsonl") == read_jsonl(tmp_path / "full" / "labels.jsonl")
    assert read_jsonl(run / "preferences.jsonl") == read_jsonl(tmp_path / "full" / "preferences.jsonl")
    assert [(r["step"], r["pairs"]) for r in read_jsonl(run / "metrics.jsonl")] == [(1, 2), (2, 2), (3, 2)]
    assert json.loads((run / "summary.json").read_text())["resumed_after"] == 2


@pytest.mark.parametrize("sets, key", [(["reward.kind=reward-model"], "reward.model"),
                                       (["reward.kind=judge"], "reward.judge")])
def test_rl_reward_without_its_source_is_refused_when_parsed(tmp_path, sets, key):
    """Was raised by ``build_reward`` after the run folder existed and the policy loaded."""
    args = ["rl", "--set", f"run.output_dir={tmp_path}", *[a for s in sets for a in ("--set", s)]]
    res = invoke(*args)
    lines = error_lines(res)
    assert res.returncode == 2 and len(lines) == 1 and key in lines[0], res.stderr
    assert not list(tmp_path.iterdir())  # no run folder left behind


@pytest.mark.parametrize("kv", ["data.max_prompts=-3", "data.max_prompts=0", "n_boot=-1", "n_buckets=0"])
def test_eval_counts_are_checked_when_parsed(kv):
    res = invoke("eval", "--set", kv, "--print-config")
    lines = error_lines(res)
    assert res.returncode == 2 and len(lines) == 1 and kv.split("=")[0] in lines[0], res.stderr


def test_sft_empty_ift_file_is_an_error_naming_the_file(tmp_path, tiny_model_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = invoke("sft", "--ift", str(empty), "--set", f"model.name={tiny_model_dir}", "--set", f"run.output_dir={tmp_path}")
    lines = error_lines(res)
    assert res.returncode == 2 and len(lines) == 1 and "empty.jsonl" in lines[0], res.stderr


def test_nan_weights_are_never_checkpointed(tmp_path, tiny_model):
    """lr 1e30: the loss of step 2 was finite, the update made the weights NaN, and that
    checkpoint was saved before sampling failed in step 3 (a resume then started from NaN)."""
    import torch

    from pofe.runtime import save_checkpoint
    from pofe.runtime.guards import NonFiniteWeights

    save_checkpoint(tmp_path / "checkpoints" / "step-1", model=tiny_model, step=1)
    with torch.no_grad():
        next(tiny_model.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights, match=r"non-finite weights \(.+\) after step 2"):
        save_checkpoint(tmp_path / "checkpoints" / "step-2", model=tiny_model, step=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]  # no torn / temporary folder


def test_diverged_sampling_and_nan_weights_are_one_line_exit_1():
    from pofe.cli.main import describe_error
    from pofe.runtime.guards import NonFiniteWeights

    code, line = describe_error(RuntimeError("probability tensor contains either `inf`, `nan` or element < 0"))
    assert code == 1 and "not finite" in line and "optim.lr" in line
    assert describe_error(NonFiniteWeights("non-finite weights (w) after step 2: ..."))[0] == 1


def test_report_of_a_folder_that_is_not_a_run_is_an_error(tmp_path):
    """Was exit 0 with an empty report.html ("unknown run, 0 plots")."""
    res = invoke("report", str(tmp_path))
    lines = error_lines(res)
    assert res.returncode == 2 and len(lines) == 1 and "not a pofe run folder" in lines[0], res.stderr
    assert not (tmp_path / "report").exists()


def _sr_cfg(tmp_path: Path, tiny_model_dir, **selection):
    from pofe.data.prompts import DEFAULT_PROMPTS
    from pofe.loops.self_reward import SelfRewardConfig

    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS[:8]))
    return SelfRewardConfig.model_validate({
        "model": {"name": str(tiny_model_dir)}, "iterations": 2, "judge": {"kind": "length"},
        "data": {"prompts": str(pool), "per_iteration": 4},
        "candidates": {"n": 2, "chunk": 2, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
        "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 1, "grad_accum": 1, "steps": 2},
        "selection": {"num_checkpoints": 2, "num_prompts": 2, **selection},
        "eval": {"num_prompts": 2, "sampling": {"max_new_tokens": 6}},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path / "runs"), "name": "r"}})


def _undo_after_selection(root: Path) -> None:
    """What a crash right after checkpoint selection of iteration 2 leaves: no evaluation,
    no iteration marker, no final/, no driver checkpoint of iteration 2."""
    for p in ("iter_2/metrics.json", "iter_2/eval_responses.jsonl", "summary.json", "final"):
        (root / p).unlink()
    shutil.rmtree(root / "checkpoints" / "step-2")


@pytest.mark.slow
def test_self_reward_crash_before_the_iteration_row_redoes_only_what_is_missing(tmp_path, tiny_model_dir, monkeypatch):
    """A crash after checkpoint selection of iteration 2, just before its ``metrics.jsonl`` row.

    * ``iter_t/metrics.json`` marks an iteration finished. It used to be written before the
      row, so a crash between the two lost the row for good (the resume skipped the
      "finished" iteration); it is now written after the row.
    * Selection prunes DPO's checkpoints; a resume after it used to find none and train the
      whole DPO stage again (hours on a real model). DPO is now done once."""
    from pofe.loops.self_reward import run
    from pofe.runtime import tracking

    class Crash(RuntimeError):
        pass

    real = tracking.MetricsSink.write

    def crash_on_iteration_2(self, row):
        if row.get("iteration") == 2:
            raise Crash()
        return real(self, row)

    monkeypatch.setattr(tracking.MetricsSink, "write", crash_on_iteration_2)
    with pytest.raises(Crash):
        run(_sr_cfg(tmp_path, tiny_model_dir))
    root = tmp_path / "runs" / "r"
    assert not (root / "iter_2" / "metrics.json").exists()  # not marked finished: its row was never written
    dpo_metrics = root / "iter_2" / "dpo" / "metrics.jsonl"
    before = (dpo_metrics.read_bytes(), dpo_metrics.stat().st_mtime_ns)
    monkeypatch.setattr(tracking.MetricsSink, "write", real)
    s = run(_sr_cfg(tmp_path, tiny_model_dir), resume=root)
    assert [r["step"] for r in read_jsonl(root / "metrics.jsonl")] == [1, 2]
    assert [m["iteration"] for m in s["iterations"]] == [1, 2]
    assert (dpo_metrics.read_bytes(), dpo_metrics.stat().st_mtime_ns) == before  # DPO not run again
    assert s["iterations"][1]["dpo"]["resumed_from"] is None and s["iterations"][1]["dpo"]["steps"] == 2


@pytest.mark.slow
def test_self_reward_model_folder_torn_mid_copy_is_redone(tmp_path, tiny_model_dir):
    """``iter_t/model`` counted as finished once its config.json existed, so a crash while the
    selected weights were being copied left a torn M_t that every later stage trusted."""
    from safetensors.torch import load_file

    from pofe.loops.self_reward import run
    from pofe.runtime import final_complete

    run(_sr_cfg(tmp_path, tiny_model_dir, keep_checkpoints=True))
    root = tmp_path / "runs" / "r"
    weights = root / "iter_2" / "model" / "model.safetensors"
    good = load_file(str(weights))
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # the copy was cut short ...
    (root / "iter_2" / "selection.json").unlink()  # ... before selection.json was written
    _undo_after_selection(root)
    run(_sr_cfg(tmp_path, tiny_model_dir, keep_checkpoints=True), resume=root)
    assert final_complete(root / "iter_2" / "model")
    again = load_file(str(weights))
    assert again.keys() == good.keys() and all((again[k] == good[k]).all() for k in good)


@pytest.mark.parametrize("kv", ["batch_size=0", "data.limit=-1", "seeds=0", "contrast_limit=-1",
                                "thresholds.min_agreement=1.5", "thresholds.max_first_position_bias=-0.1"])
def test_audit_counts_and_thresholds_are_checked_when_parsed(kv):
    """Were accepted: a batch of 0 items, 0 seeds, or a threshold no judge can meet."""
    res = invoke("audit", "--set", kv, "--print-config")
    lines = error_lines(res)
    assert res.returncode == 2 and len(lines) == 1 and kv.split("=")[0].split(".")[-1] in lines[0], res.stderr
