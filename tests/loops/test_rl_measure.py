"""``pofe rl``'s before/after measurement carries the 95% interval of its mean reward (the run
report draws it as error bars; without it the bars were means only)."""

from __future__ import annotations

import pytest

import pofe.generation
from pofe.generation import SamplingConfig
from pofe.loops.rl.step import measure
from pofe.records import Completion


def test_measure_records_the_wilson_interval_of_a_rate_reward(monkeypatch):
    def fake_generate(policy, tokenizer, prompts, *, n, sampling, seed):
        return [[Completion(prompt=p, text=f"r{i}", token_ids=(1, 2)) for i in range(n)] for p in prompts]

    monkeypatch.setattr(pofe.generation, "generate", fake_generate)
    rewards = [1.0, 1.0, 0.0, 1.0]  # 3 of 4: Wilson 95% = [0.3006, 0.9544]
    out = measure(None, None, ["a", "b"], lambda xs, comps: (rewards, {}), SamplingConfig(), n=2, seed=0)
    assert out["reward"] == 0.75 and out["n"] == 4
    assert out["reward_ci95"] == pytest.approx([0.3006, 0.9544], abs=1e-4)


def test_measure_without_a_reward_has_no_interval(monkeypatch):
    monkeypatch.setattr(pofe.generation, "generate",
                        lambda policy, tokenizer, prompts, *, n, sampling, seed: [[Completion(prompt=p, text="x")] for p in prompts])
    out = measure(None, None, ["a"], lambda xs, comps: ([None], {}), SamplingConfig(), n=1, seed=0)
    assert out["reward"] is None and "reward_ci95" not in out
