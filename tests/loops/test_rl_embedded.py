"""``pofe rl`` with a pairwise tournament reward on the embedded model, as the example ships:
with the pairwise length judge (prefer the shorter answer, all pairs, both orders), RLOO makes
the held-out responses at least 40% shorter (in characters) within the example's steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import pofe

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl-pairwise-length.yaml"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "hh-rlhf"


@pytest.mark.slow
@pytest.mark.long
def test_the_pairwise_length_example_makes_responses_40_percent_shorter(tmp_path):
    if not DATA.exists():
        pytest.skip(f"HH-RLHF is not at {DATA} (the example's prompts)")
    r = pofe("rl", "--config", str(EXAMPLE), "--set", f"run.output_dir={tmp_path}", "--set", "log.progress=false",
             "--set", "log.tensorboard=false", timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "rl-pairwise-length" / "summary.json").read_text())
    before, after = s["eval_before"]["chars"], s["eval_after"]["chars"]
    assert s["reward"].startswith("pairwise:all-pairs:mean:length") and s["steps"] == 8
    assert after <= 0.6 * before, (before, after)
