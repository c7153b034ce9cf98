"""Every derived seed lives in pofe.runtime.seeds: hand-computed values of each stream (so a
published number cannot move silently), no collisions where a resume or two processes depend on
it, and no seed arithmetic left anywhere else in the package."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pofe.runtime import seeds

PKG = Path(__file__).resolve().parents[2] / "pofe"


def test_step_seed_is_the_sha256_of_seed_step_rank():
    want = int.from_bytes(hashlib.sha256(b"7/3/1").digest()[:4], "little")
    assert seeds.step_seed(7, 3, 1) == want
    assert seeds.derived(7, 3, 1) == want


def test_block_seed_keeps_the_one_process_seed_on_rank_0():
    assert seeds.block_seed(11, 0) == 11
    assert seeds.block_seed(11, 1) == seeds.step_seed(11, 0, 1) != 11


def test_the_shipped_streams_by_hand():
    assert seeds.epoch_shuffle_seed(3, 2) == 3 * 1009 + 2 == 3029
    assert seeds.rl_prompts_seed(3, 5) == 300014
    assert seeds.rl_sampling_seed(3, 5, 0) == 3005
    assert seeds.rl_sampling_seed(3, 5, 2) == 3005 + 2_000_006
    assert seeds.chunk_seed(3, 4) == 3 + 4 * 7919 and seeds.chunk_seed(3, 4, stream=1) == 4 + 4 * 7919
    assert seeds.probe_seed(2, 9) == 2_000_015
    assert seeds.critique_seed(5, 0, revision=False) == 1005 and seeds.critique_seed(5, 1, revision=True) == 2505


def test_no_two_processes_or_steps_share_a_stream():
    for fn in (seeds.step_seed, seeds.rl_sampling_seed):
        drawn = [fn(0, step, rank) for step in range(1, 2001) for rank in range(8)]
        assert len(set(drawn)) == len(drawn), fn.__name__


_ARITHMETIC = re.compile(r"\bseed\w*\s*\*\s*\d|\d\s*\*\s*\w*seed\b|\bseed\w*\s*\+\s*\d{3,}")


def test_no_seed_arithmetic_outside_the_seeds_module():
    hits = []
    for p in sorted(PKG.rglob("*.py")):
        if p.name == "seeds.py" and p.parent.name == "runtime":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _ARITHMETIC.search(code):
                hits.append(f"{p.relative_to(PKG.parent)}:{i}: {line.strip()}")
    assert not hits, "seed arithmetic belongs in pofe/runtime/seeds.py:\n" + "\n".join(hits)
