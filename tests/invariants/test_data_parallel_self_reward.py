"""Invariant (c) for ``pofe self-reward`` on CPU processes (torchrun, gloo).

Every process runs every stage: candidates and their scores, greedy responses and judging are
split by prompt block (``DataParallel.map``), SFT and DPO shard their steps through the driver,
and rank 0 alone writes the one run folder. Sampled candidates depend on the number of
processes (each block draws from ``block_seed(chunk seed, rank)``), so:

* with ``candidates.chunk: 1`` every chunk is one prompt, rank 0's block, sampled from the
  chunk's own seed -- exactly what one process samples -- so the candidates, their length-judge
  scores, the pairs and the greedy held-out / validation responses of a 2-process run equal the
  1-process run's, row for row and in order; DPO (a global batch split over the processes) ends
  with identical weights on both processes;
* with chunks of 2 (one prompt per process, both sampling) a 2-process run SIGKILLed after the
  first candidate chunk (``candidates:0``) or inside DPO (``1:after_judge``) and resumed with 2
  processes writes what the uninterrupted 2-process run wrote, and ends with the same weights.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import configs
from harness import assert_same_rows, one_run_folder, rows, run_pofe, same_weights, shared_run, summary

pytestmark = pytest.mark.slow

CMD = configs.COMMANDS["self-reward"]
ONE_AT_A_TIME = {"candidates.sampling.batch_size": 1, "eval.sampling.batch_size": 1}


def _ok(*results) -> None:
    for r in results:
        assert r.rc == 0, r.stderr[-3000:]


def test_self_reward_two_processes_equal_one_where_deterministic(tmp_path, varied_model_dir):
    over = {**ONE_AT_A_TIME, "candidates.chunk": 1}
    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(run_pofe, CMD.argv, config=CMD.config(tmp_path, varied_model_dir, "one", over))
        f2 = pool.submit(run_pofe, CMD.argv, config=CMD.config(tmp_path, varied_model_dir, "two", over), processes=2)
        one, two = f1.result(), f2.result()
    _ok(one, two)
    for name in ("iter_1/eval_responses.jsonl", "iter_2/data/candidates.jsonl", "iter_2/data/aift.jsonl",
                 "iter_2/prev_val_responses.jsonl"):
        assert_same_rows(rows(two.run_dir / name), rows(one.run_dir / name), name)
    cands = rows(two.run_dir / "iter_2/data/candidates.jsonl")
    # every prompt once, in order (the pool's first 4), each with its length-judge scores: chars, shorter preferred
    assert [r["index"] for r in cands] == [0, 1, 2, 3]
    assert [r["prompt"] for r in cands] == [f"Question number {i}: what is {i} plus {i}?" for i in range(4)]
    assert all(r["scores"] == [-float(len(y)) for y in r["responses"]] for r in cands)
    assert len({y for r in cands for y in r["responses"]}) == 8  # sampled texts that differ, else order proves nothing
    ev = rows(two.run_dir / "iter_1/eval_responses.jsonl")
    assert len(ev) == 2 and len({r["response"] for r in ev}) == 2
    # M2's held-out responses: one per held-out prompt, in the order iteration 1 answered them
    assert [r["prompt"] for r in rows(two.run_dir / "iter_2/eval_responses.jsonl")] == [r["prompt"] for r in ev]
    s1, s2 = summary(one.run_dir), summary(two.run_dir)
    assert (s1.get("processes", 1), s2["processes"]) == (1, 2)
    assert [m["pairs"] for m in s2["iterations"][1:]] == [m["pairs"] for m in s1["iterations"][1:]]
    assert s2["iterations"][0]["eval_mean_score"] == s1["iterations"][0]["eval_mean_score"]  # M1, greedy
    dpo = summary(two.run_dir / "iter_2" / "dpo")
    assert dpo["processes"] == 2 and dpo["weights_identical_across_processes"] is True
    assert [r["step"] for r in rows(two.run_dir / "metrics.jsonl")] == [1, 2]
    one_run_folder(tmp_path, "two")


@pytest.mark.parametrize("point", ["candidates:0", "1:after_judge"])
def test_self_reward_two_process_sigkill_then_resume_equals_the_uninterrupted_run(point, tmp_path, tiny_model_dir):
    over = ONE_AT_A_TIME
    with ThreadPoolExecutor(2) as pool:
        f_full = pool.submit(shared_run, CMD.argv, config=CMD.config(tmp_path, tiny_model_dir, "full", over),
                             processes=2)  # the same uninterrupted run for every kill point
        f_crash = pool.submit(run_pofe, CMD.argv, config=CMD.config(tmp_path, tiny_model_dir, "crash", over),
                              processes=2, fault=point)
        full, crash = f_full.result(), f_crash.result()
    _ok(full)
    assert crash.rc != 0 and not (crash.run_dir / "summary.json").exists(), crash.stderr[-3000:]
    if point == "candidates:0":  # killed before chunk 2: at most chunk 0's two rows on disk (none, or a torn
        # line, when the other process's kill stopped rank 0 first), never a later chunk's
        lines = (crash.run_dir / "iter_2/data/candidates.jsonl").read_text().splitlines()
        assert len(lines) <= 2 and not (crash.run_dir / "iter_2/data/aift.jsonl").exists()
    resumed = run_pofe(CMD.argv, resume=crash.run_dir, processes=2)
    _ok(resumed)
    for out in CMD.outputs:
        a, b = crash.run_dir / out.path, full.run_dir / out.path
        if out.kind == "rows":
            assert_same_rows(rows(a, out.drop), rows(b, out.drop), out.path)
        else:
            assert a.read_text() == b.read_text(), out.path
    cands = rows(full.run_dir / "iter_2/data/candidates.jsonl")
    assert [r["index"] for r in cands] == [0, 1, 2, 3]
    assert len({y for r in cands for y in r["responses"]}) > 1  # sampled texts that differ
    identical, diff = same_weights(_weights(crash.run_dir), _weights(full.run_dir))
    assert identical, diff
    s = summary(crash.run_dir)
    assert s["processes"] == 2 and s["resumed_from"] == 1 and s["steps"] == 2


def _weights(run_dir: Path) -> Path:
    return next((run_dir / "iter_2" / "model").resolve().glob("*.safetensors"))


def test_self_reward_seed_stage_on_two_processes(tmp_path, tiny_model_dir):
    """The seed stage under 2 processes: the IFT-only SFT baseline and M1's SFT shard their
    steps (one example per process per step, identical weights after), rank 0 alone writes the
    EFT files (a random tiny model never writes "Score: N": both build groups unscored, no EFT
    example invented) and both processes measure M1 on the held-out ranked split, each its block
    of the 4 responses, all reported unscored."""
    import json

    ift = tmp_path / "ift.jsonl"
    ift.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response": f"Answer {i}."}) + "\n" for i in range(4)))
    ranked = tmp_path / "ranked.jsonl"
    ranked.write_text("".join(json.dumps({"prompt": f"Q{i}", "responses": [f"good {i}", f"bad {i}"]}) + "\n"
                              for i in range(4)))
    cfg = {"model": {"name": str(tiny_model_dir)}, "iterations": 1,
           "seed_sft": {"enabled": True, "ift": [str(ift)], "train": {"steps": 2, "batch_size": 1, "grad_accum": 1}},
           "eft": {"ranked": str(ranked), "eval_fraction": 0.5},
           "judge": {"kind": "rubric", "template": "rubric", "rubric": {"samples": 1, "max_new_tokens": 6}},
           "eval": {"num_prompts": 2, "sampling": {"max_new_tokens": 4, "batch_size": 1}},
           "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path), "name": "seed"}}
    r = run_pofe(CMD.argv, config=cfg, processes=2)
    _ok(r)
    it = r.run_dir / "iter_1"
    for sub in ("sft_baseline", "sft"):
        s = summary(it / sub)
        assert s["processes"] == 2 and s["weights_identical_across_processes"] is True and s["steps"] == 2, sub
    stats = json.loads((it / "data" / "eft_stats.json").read_text())
    assert stats["groups"] == 2 and stats["groups_unscored"] == 2 and stats["examples"] == 0
    assert len(rows(it / "data" / "ift.jsonl")) == 4 and len(rows(it / "data" / "rm_eval.jsonl")) == 2
    assert [r_["prompt"] for r_ in rows(it / "eval_responses.jsonl")] == json.loads(
        (r.run_dir / "inputs.json").read_text())["eval_prompts"]
    s = summary(r.run_dir)
    m1 = s["iterations"][0]
    assert s["processes"] == 2 and m1["sft"]["data"] == {"ift": 4, "eft": 0, "eft_capped": 0}
    assert m1["rm_metrics"]["n_unscored_responses"] == 4 and m1["rm_metrics"]["pairwise_accuracy"] is None
    assert (it / "model" / "config.json").exists() and (r.run_dir / "final").exists()
    one_run_folder(tmp_path, "seed")
