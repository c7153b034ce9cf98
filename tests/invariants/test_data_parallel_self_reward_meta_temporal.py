"""``pofe self-reward``'s v2 stages (Meta-Rewarding's judgments and meta-judgments, Temporal
Self-Rewarding's one-step-ahead M_t') on 2 CPU processes.

With ``candidates.chunk: 1`` and batch size 1, iteration 2's candidates (M1's, the unchanged tiny
model) and their length-judge scores on 2 processes equal the 1-process run's (see
:mod:`tests.invariants.test_data_parallel_self_reward_variants`), so every pair built from them
does too: the anchored pairs that train M2', and Meta-Rewarding's length-controlled actor pairs.
M2' itself is not bit-equal across the runs (sharded DPO's all-reduce sums in another order), so
the future-guided pairs are recomputed inside the 2-process run from its own stage files. The
judge role on the random tiny model never writes "Score: N": every judgment is unscored and
counted on both runs, and rank 0 writes each stage file once, one row per prompt in order.
"""

from __future__ import annotations

import pytest

import configs
from harness import assert_same_rows, one_and_two_processes, rows, summary
from pofe.loops.self_reward.meta_rewarding import length_controlled_pairs
from pofe.loops.self_reward.self_reward_variants import replace_chosen

pytestmark = pytest.mark.slow

CMD = configs.COMMANDS["self-reward"]
SAME = {"candidates.sampling.batch_size": 1, "eval.sampling.batch_size": 1, "candidates.chunk": 1,
        "selection.enabled": False}


def _both(tmp_path, tiny_model_dir, over: dict):
    return one_and_two_processes(CMD, tmp_path, tiny_model_dir, over)


def test_future_guided_chosen_two_processes(tmp_path, tiny_model_dir):
    one, two = _both(tmp_path, tiny_model_dir, {**SAME, "temporal.anchor": "m1", "temporal.future": True})
    name = "iter_2/data/anchored_pairs.jsonl"
    assert_same_rows(rows(two.run_dir / name), rows(one.run_dir / name), name)
    anchored = rows(two.run_dir / name)
    future = rows(two.run_dir / "iter_2/data/future_candidates.jsonl")
    assert [r["index"] for r in future] == list(range(len(anchored))) and len(anchored) >= 1
    assert all(r["scores"] == [-float(len(y)) for y in r["responses"]] for r in future)  # length judge: shorter
    want, counts = replace_chosen(anchored, future, "M2'")
    assert rows(two.run_dir / "iter_2/data/aift.jsonl") == want
    assert summary(two.run_dir)["iterations"][1]["temporal"]["future"]["replaced"] == counts["replaced"]


def test_meta_judge_two_processes(tmp_path, tiny_model_dir):
    over = {**SAME, "meta_judge.enabled": True, "meta_judge.judge.rubric.samples": 2,
            "meta_judge.judge.rubric.max_new_tokens": 4}
    one, two = _both(tmp_path, tiny_model_dir, over)
    for name in ("iter_2/data/candidates.jsonl", "iter_2/data/aift.jsonl"):
        assert_same_rows(rows(two.run_dir / name), rows(one.run_dir / name), name)
    cands = rows(two.run_dir / "iter_2/data/candidates.jsonl")
    actor, _ = length_controlled_pairs(cands, 0.25)
    assert rows(two.run_dir / "iter_2/data/aift.jsonl") == actor
    for r in (one, two):
        j = rows(r.run_dir / "iter_2/data/judgments.jsonl")
        assert [x["index"] for x in j] == [c["index"] for c in cands]
        assert all(len(t) == 2 for x in j for t in x["texts"]) and all(s is None for x in j for ss in x["scores"] for s in ss)
        m = summary(r.run_dir)["iterations"][1]["meta_judge"]
        assert m["judgments"] == m["judgments_unscored"] == len(cands) * 2 * 2 and m["judge_pairs"] == 0
