"""``pofe self-reward`` v2 end to end: Meta-Rewarding and Temporal Self-Rewarding's
future-guided chosen on the tiny random model (wiring, stage files, records, resume after a
kill between stages) and on the embedded SmolLM2 (slow: each mechanism applies and is
asserted in the run's record)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pofe.loops.self_reward import SelfRewardConfig, run
from pofe.runs import read_jsonl
from pofe.training.meta_rewarding import length_controlled_pairs
from pofe.training.self_reward_variants import build_anchored_pairs, replace_chosen

EXPECTED_RUBRIC = Path(__file__).resolve().parents[2] / "examples" / "templates" / "rubric-expected-score.yaml"
SCORE_FIRST = Path(__file__).resolve().parents[2] / "examples" / "templates" / "rubric-score-first.yaml"


def _tiny(tmp_path, model, name: str, **variants) -> dict:
    from pofe.data.prompts import DEFAULT_PROMPTS

    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(DEFAULT_PROMPTS[:8]))
    return {
        "model": {"name": str(model)}, "iterations": 2,
        "judge": {"kind": "expected-score", "template": str(EXPECTED_RUBRIC), "batch_size": 8},
        "data": {"prompts": str(pool), "per_iteration": 4},
        "candidates": {"n": 3, "chunk": 4, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
        "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 2, "grad_accum": 1, "steps": 2},
        "selection": {"enabled": False}, "eval": {"num_prompts": 2, "rm_metrics": False, "sampling": {"max_new_tokens": 6}},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path / "runs"), "name": name},
        **variants,
    }


FUTURE = {"temporal": {"anchor": "m1", "future": True}}


def _check_future(root: Path, it: dict, t: int, prev_model: str) -> None:
    """The future-guided pairs of iteration ``t`` recomputed from the stage files: the anchored
    pairs (recomputed from the candidates) and M_t''s scored candidates."""
    data = root / f"iter_{t}" / "data"
    rows = read_jsonl(data / "candidates.jsonl")
    anchored, _ = build_anchored_pairs(rows, rows)  # iteration 2: M1 is the current model
    assert read_jsonl(data / "anchored_pairs.jsonl") == anchored
    future = read_jsonl(data / "future_candidates.jsonl")
    assert [r["prompt"] for r in future] == [p["prompt"] for p in anchored]
    want, counts = replace_chosen(anchored, future, f"M{t}'")
    assert read_jsonl(data / "aift.jsonl") == want
    f = it["temporal"]["future"]
    assert f["enabled"] and f["replaced"] == counts["replaced"] and f["pairs"] == len(anchored) >= 1
    assert (root / f"iter_{t}" / "future" / "final" / "config.json").exists()
    assert yaml.safe_load((root / f"iter_{t}" / "future" / "config.yaml").read_text())["model"]["name"] == prev_model


def test_future_guided_chosen_two_iterations_tiny(tmp_path, tiny_model_dir):
    """temporal.future on the tiny model judging itself: M2' is a DPO run from M1 on the anchored
    pairs, its candidates are scored by M1, and aift.jsonl equals the pairs recomputed from the
    stage files with every better-scored M2' candidate as the chosen."""
    s = run(SelfRewardConfig.model_validate(_tiny(tmp_path, tiny_model_dir, "fut", **FUTURE)))
    root = Path(s["run_dir"])
    assert s["variants"]["temporal_future"] is True
    _check_future(root, s["iterations"][1], 2, str(tiny_model_dir))  # M2' starts from M1 = the given model
    row = read_jsonl(root / "metrics.jsonl")[1]
    assert row["temporal/replaced_chosen"] == s["iterations"][1]["temporal"]["future"]["replaced"]


def test_meta_judge_two_iterations_tiny(tmp_path, tiny_model_dir):
    """meta_judge on the tiny random model: the stage files are written and the record counts
    them. A random model never writes "Score: N", so every judgment is unscored and counted,
    no meta-judgment is asked for and no judge pair is invented; the actor pairs are the
    length-controlled ones recomputed from the candidates."""
    cfg = _tiny(tmp_path, tiny_model_dir, "meta", meta_judge={
        "enabled": True, "length_control": 0.5,
        "judge": {"rubric": {"samples": 2, "max_new_tokens": 6}}})
    s = run(SelfRewardConfig.model_validate(cfg))
    root = Path(s["run_dir"])
    data = root / "iter_2" / "data"
    m = s["iterations"][1]["meta_judge"]
    rows = read_jsonl(data / "candidates.jsonl")
    actor, _ = length_controlled_pairs(rows, 0.5)
    assert read_jsonl(data / "aift.jsonl") == actor and m["actor_pairs"] == len(actor) >= 1
    assert m["judgments"] == 4 * 3 * 2 == len([s for r in read_jsonl(data / "judgments.jsonl") for ss in r["scores"]
                                                for s in ss])
    assert m["judgments_unscored"] == m["judgments"] and m["meta_judgments"] == 0 and m["judge_pairs"] == 0
    assert m["judge_pair_counts"]["no_judged_response"] == 4
    row = read_jsonl(root / "metrics.jsonl")[1]
    assert row["meta_judge/actor_pairs"] == len(actor) and row["meta_judge/judge_pairs"] == 0


def _cli(cfg_path: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "POFE_FAULT": fault} if fault else {k: v for k, v in os.environ.items() if k != "POFE_FAULT"}
    return subprocess.run([sys.executable, "-m", "pofe", "self-reward", *args, "--json"] +
                          (["--config", str(cfg_path)] if "--resume" not in args else []),
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["sr2:after_future_dpo", "candidates:0"])
def test_future_stages_resume_after_a_kill(tmp_path, tiny_model_dir, fault):
    """SIGKILL (POFE_FAULT) once M2' is trained, or once the first chunk of M2''s candidates is
    written (the first ``candidates:0`` is iteration 2's own candidates: the kill happens there,
    before any future stage), then ``--resume``: the run ends as the uninterrupted one (pairs,
    rows, final weights)."""
    from safetensors.torch import load_file

    ref = run(SelfRewardConfig.model_validate(_tiny(tmp_path, tiny_model_dir, "ref", **FUTURE)))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_tiny(tmp_path, tiny_model_dir, "r", **FUTURE)))
    killed = _cli(path, fault=fault)
    assert killed.returncode == -9, killed.stderr[-2000:]
    root = tmp_path / "runs" / "r"
    assert not (root / "iter_2" / "data" / "aift.jsonl").exists()
    done = _cli(path, "--resume", str(root))
    assert done.returncode == 0, done.stderr[-2000:]
    ref_root = Path(ref["run_dir"])
    for f in ("iter_2/data/aift.jsonl", "iter_2/data/anchored_pairs.jsonl", "iter_2/data/future_candidates.jsonl"):
        assert read_jsonl(root / f) == read_jsonl(ref_root / f), f
    drop = ("seconds", "run_dir", "model", "wall_s", "time")
    rows = [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in read_jsonl(root / "metrics.jsonl")]
    want = [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in read_jsonl(ref_root / "metrics.jsonl")]
    assert rows == want
    w, w_ref = load_file(str(root / "final" / "model.safetensors")), load_file(str(ref_root / "final" / "model.safetensors"))
    assert w.keys() == w_ref.keys() and all(w[k].equal(w_ref[k]) for k in w)


@pytest.mark.slow
def test_meta_judge_stages_resume_after_a_kill(tmp_path, tiny_model_dir):
    """SIGKILL after the judgments file is written (``sr2:after_judgments``), then ``--resume``:
    the judgments are read back (not rewritten) and the run ends as the uninterrupted one."""
    from safetensors.torch import load_file

    meta = {"meta_judge": {"enabled": True, "judge": {"rubric": {"samples": 2, "max_new_tokens": 6}}}}
    ref = run(SelfRewardConfig.model_validate(_tiny(tmp_path, tiny_model_dir, "ref", **meta)))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_tiny(tmp_path, tiny_model_dir, "r", **meta)))
    killed = _cli(path, fault="sr2:after_judgments")
    assert killed.returncode == -9, killed.stderr[-2000:]
    root = tmp_path / "runs" / "r"
    judgments = root / "iter_2" / "data" / "judgments.jsonl"
    before = judgments.stat().st_mtime_ns
    assert not (root / "iter_2" / "data" / "meta_judgments.jsonl").exists()
    done = _cli(path, "--resume", str(root))
    assert done.returncode == 0, done.stderr[-2000:]
    assert judgments.stat().st_mtime_ns == before
    ref_root = Path(ref["run_dir"])
    for f in ("iter_2/data/aift.jsonl", "iter_2/data/judgments.jsonl", "iter_2/data/meta_judgments.jsonl"):
        assert read_jsonl(root / f) == read_jsonl(ref_root / f), f
    s = json.loads((root / "summary.json").read_text())
    assert s["iterations"][1]["meta_judge"] == ref["iterations"][1]["meta_judge"]
    w, w_ref = load_file(str(root / "final" / "model.safetensors")), load_file(str(ref_root / "final" / "model.safetensors"))
    assert w.keys() == w_ref.keys() and all(w[k].equal(w_ref[k]) for k in w)
