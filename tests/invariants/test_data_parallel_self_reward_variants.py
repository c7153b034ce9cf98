"""Invariant (c) for ``pofe self-reward``'s variants (CREAM, anchored rejection) on CPU processes.

With ``candidates.chunk: 1`` every chunk is rank 0's one prompt sampled from the chunk's own seed
(:mod:`tests.invariants.test_data_parallel_self_reward`), so iteration 3's anchor candidates (M1's,
the unchanged tiny model) and their length-judge scores on 2 processes equal the 1-process run's,
row for row. M2 itself is not bit-equal across the two runs (sharded DPO's all-reduce sums in
another order), so iteration 3's own candidates are checked inside the 2-process run: the
previous judge's scores are the length judge's (a deterministic judge: tau = 1, C = 1), every
pair's chosen is one of M2's candidates and its rejected the worst of M1's.
"""

from __future__ import annotations

import pytest

import configs
from harness import assert_same_rows, one_and_two_processes, rows, summary

pytestmark = pytest.mark.slow

CMD = configs.COMMANDS["self-reward"]


def test_variants_two_processes_equal_one(tmp_path, tiny_model_dir):
    over = {"candidates.sampling.batch_size": 1, "eval.sampling.batch_size": 1, "candidates.chunk": 1,
            "iterations": 3, "cream.enabled": True, "temporal.anchor": "m1", "selection.enabled": False}
    one, two = one_and_two_processes(CMD, tmp_path, tiny_model_dir, over)
    name = "iter_3/data/anchor_candidates.jsonl"
    assert_same_rows(rows(two.run_dir / name), rows(one.run_dir / name), name)
    anchor = rows(two.run_dir / name)
    assert [r["index"] for r in anchor] == [0, 1, 2, 3]
    assert all(r["scores"] == [-float(len(y)) for y in r["responses"]] for r in anchor)  # length judge: chars, shorter
    cands = rows(two.run_dir / "iter_3/data/candidates.jsonl")
    prev = rows(two.run_dir / "iter_3/data/cream_scores.jsonl")
    assert [q["scores"] for q in prev] == [[-float(len(y)) for y in r["responses"]] for r in cands]
    s1, s2 = summary(one.run_dir), summary(two.run_dir)
    assert s2["processes"] == 2
    c1, c2 = s1["iterations"][2]["cream"], s2["iterations"][2]["cream"]
    assert c1["C"] == c2["C"] == 1.0 and c2["applied"] is True and c2["prompts"] == 4
    assert s2["iterations"][1]["cream"]["applied"] is False
    pairs = rows(two.run_dir / "iter_3/data/aift.jsonl")
    by_prompt = {r["prompt"]: r for r in anchor}
    own = {r["prompt"]: r["responses"] for r in cands}
    assert pairs and all(p["p"] == 1.0 and p["rejected_from"] == "M1" for p in pairs)
    for p in pairs:
        a = by_prompt[p["prompt"]]
        assert p["rejected"] == a["responses"][a["scores"].index(min(a["scores"]))] and p["chosen"] in own[p["prompt"]]
