"""``reference.source: engine``: the decision rule (gap per response token against
``reference.max_gap``, summed over processes), the frozen pi_0 copy being freed, and the config
refusals (no vLLM needed here; the live engine is tests/generation/test_vllm_engine_reference.py)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from pofe.loops.online.dap import TokenPair


class FakeGen:
    """The generator interface EngineReference uses: planted per-sequence sums."""

    def __init__(self, sums):
        self.sums, self.pinned, self.engine = list(sums), False, object()

    def completion_logprobs(self, seqs):
        assert len(seqs) == len(self.sums)
        return self.sums

    def pin(self):
        self.pinned = True


class OneProcess:
    device = None

    def sum(self, x):
        return float(x)


class TwoProcesses(OneProcess):
    """As if a second process had measured ``other`` (|diff|, tokens) on its own pairs."""

    def __init__(self, other):
        self.other, self.calls = list(other), 0

    def sum(self, x):
        self.calls += 1
        return float(x) + self.other[self.calls - 1]


def _pairs():
    # 2 pairs: response lengths 3 + 2 and 1 + 4 = 10 response tokens
    return [TokenPair((1, 2), (3, 4, 5), (6, 7), 1.0, "a"), TokenPair((1,), (8,), (9, 9, 9, 9), 1.0, "b")]


def _ref(tiny_model):
    from pofe.runtime import Reference

    return Reference(tiny_model, lora=False)


def test_within_max_gap_the_engine_takes_over_and_the_frozen_copy_is_freed(tiny_model):
    from pofe.loops.online.reference import EngineReference, ReferenceSettings

    ref = _ref(tiny_model)
    frozen = weakref.ref(ref.module)
    trainer = torch.tensor([-5.0, -2.0, -3.0, -4.0])  # chosen a, chosen b, rejected a, rejected b
    gen = FakeGen([-5.05, -2.0, -3.0, -4.1])  # |diff| = 0.05 + 0.1 = 0.15 over 10 tokens = 0.015
    er = EngineReference(ref, gen, ReferenceSettings(source="engine", max_gap=0.02))
    row = er.decide(_pairs(), trainer, OneProcess())
    assert row["reference/engine_gap"] == pytest.approx(0.015) and row["reference/from_engine"] == 1.0
    assert er.from_engine and gen.pinned and er.state() == {"source": "engine", "gap": pytest.approx(0.015)}
    gc.collect()
    assert frozen() is None  # the fp32 pi_0 copy is gone
    assert torch.equal(er.engine_logps(_pairs()), torch.tensor([-5.05, -2.0, -3.0, -4.1]))


def test_past_max_gap_the_trainer_pass_stays_and_nothing_is_freed(tiny_model):
    from pofe.loops.online.reference import EngineReference, ReferenceSettings

    ref = _ref(tiny_model)
    gen = FakeGen([-5.3, -2.0, -3.0, -4.0])  # 0.3 / 10 = 0.03 > 0.02
    er = EngineReference(ref, gen, ReferenceSettings(source="engine", max_gap=0.02))
    row = er.decide(_pairs(), torch.tensor([-5.0, -2.0, -3.0, -4.0]), OneProcess())
    assert row["reference/engine_gap"] == pytest.approx(0.03) and row["reference/from_engine"] == 0.0
    assert not er.from_engine and not gen.pinned and ref.module is not None
    assert er.summary() == {"source": "model", "engine_gap": pytest.approx(0.03), "max_gap": 0.02}


def test_the_gap_is_pooled_over_processes_so_every_process_decides_alike(tiny_model):
    from pofe.loops.online.reference import EngineReference, ReferenceSettings

    # this process alone: 0.15 / 10 = 0.015 (engine); the other process adds |diff| 0.45 over
    # 10 tokens: (0.15 + 0.45) / 20 = 0.03 > 0.02 -> model, on both
    er = EngineReference(_ref(tiny_model), FakeGen([-5.05, -2.0, -3.0, -4.1]),
                         ReferenceSettings(source="engine", max_gap=0.02))
    row = er.decide(_pairs(), torch.tensor([-5.0, -2.0, -3.0, -4.0]), TwoProcesses([0.45, 10]))
    assert row["reference/engine_gap"] == pytest.approx(0.03) and er.source == "model"


def test_a_resumed_engine_decision_frees_the_copy_without_measuring(tiny_model):
    from pofe.loops.online.reference import EngineReference, ReferenceSettings

    ref, gen = _ref(tiny_model), FakeGen([])
    er = EngineReference(ref, gen, ReferenceSettings(source="engine"), {"source": "engine", "gap": 0.004})
    assert er.from_engine and gen.pinned and ref.module is None and er.gap == 0.004


@pytest.mark.parametrize("sets, msg", [
    (["judge.kind=length"], "judge.kind=vllm"),
    (["judge.kind=vllm", "judge.model=other-model"], "judge.kind=vllm"),
    (["judge.kind=vllm", "model.lora.enabled=true"], "no copy to free"),
    (["judge.kind=vllm", "mode=offline", "data.preferences=x.jsonl"], "no annotator"),
    (["judge.kind=vllm", "mode=async", "sampling.engine=vllm"], "background thread"),
])
def test_engine_reference_refusals_name_what_is_missing(sets, msg):
    from pofe.config import ConfigError, load_config
    from pofe.loops.online import OnlineConfig

    with pytest.raises(ConfigError, match=msg) as e:
        load_config(OnlineConfig, None, ["reference.source=engine", *sets])
    assert "\n" not in str(e.value)


def test_engine_reference_with_the_annotator_as_pi0_parses():
    from pofe.config import load_config
    from pofe.loops.online import OnlineConfig

    c = load_config(OnlineConfig, None, ["reference.source=engine", "judge.kind=vllm", "reference.max_gap=0.05"])
    assert c.reference.source == "engine" and c.reference.max_gap == 0.05 and c.judge.model == c.model.name


def test_mismatch_kl_is_the_per_token_sum_of_sampler_minus_trainer_log_probs():
    from types import SimpleNamespace

    from pofe.generation.sync_check import mismatch_kl
    from pofe.loops.rl.step import add_mismatch

    acc = [0.0, 0]
    comps = [SimpleNamespace(logprobs=(-1.0, -2.0)), SimpleNamespace(logprobs=None), SimpleNamespace(logprobs=(-0.5,))]
    add_mismatch(acc, comps, torch.tensor([-3.5, -9.0, -0.25]))
    # (-3.0 - -3.5) + (-0.5 - -0.25) = 0.25 over 3 tokens; the sample without log-probs is left out
    assert acc == [pytest.approx(0.25), 3] and mismatch_kl(*acc) == pytest.approx(0.25 / 3)
    assert mismatch_kl(0.0, 0) is None


def test_token_pairs_keep_the_sampler_log_probs_through_a_checkpoint():
    p = TokenPair((1,), (2, 3), (4,), 1.0, "x", (-1.5, -0.25))
    assert TokenPair.from_dict(p.to_dict()) == p
    q = TokenPair((1,), (2,), (4,), 1.0, "y")
    assert "sampler_logps" not in q.to_dict() and TokenPair.from_dict(q.to_dict()) == q
