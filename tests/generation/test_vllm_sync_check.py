"""``sampling.sync_check`` on the in-process vllm engine: after a real push the engine's
log-probs of the fixed tokens equal the trainer's (fp32: gap < 1e-3, reported as
``sync/logp_gap``); a planted push that loads nothing is caught at the first sync after an
optimiser step, the engine refuses to sample, and a real push afterwards restores it."""

from __future__ import annotations

import pytest
import torch

from tests.generation.conftest import PROMPTS

pytestmark = pytest.mark.usefixtures("vllm_ok")


def test_a_push_that_loads_nothing_is_caught_within_one_step(tiny64_dir, tokenizer, monkeypatch):
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig, generate, make_generator
    from pofe.generation.sync_check import SyncCheckError, check_ids, trainer_logprobs
    from pofe.generation.vllm import Engine, EngineSyncError

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    s = SamplingConfig(engine="vllm", temperature=0.0, max_new_tokens=4,
                       vllm={"dtype": "float32", "max_model_len": 1024},
                       sync_check={"enabled": True, "max_gap": 0.01})
    gen = make_generator(model, tokenizer, s)
    gen.sync()
    assert gen.sync_metrics()["sync/logp_gap"] < 1e-3
    before = trainer_logprobs(model, check_ids(tokenizer, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    loss = model(torch.tensor([check_ids(tokenizer, 16)]), labels=torch.tensor([check_ids(tokenizer, 16)])).loss
    loss.backward()
    opt.step()
    after = trainer_logprobs(model, check_ids(tokenizer, 32))
    moved = sum(abs(a - b) for a, b in zip(before, after)) / len(after)
    assert moved > 0.01  # the step moved the scored tokens by more than max_gap: a stale engine is visible

    with monkeypatch.context() as m:
        def loads_nothing(self, weights, fp):  # planted: reports success, loads nothing
            self.holds = ("full", fp)

        m.setattr(Engine, "load_full", loads_nothing)
        with pytest.raises(SyncCheckError, match="the vLLM engine scores fixed tokens"):
            gen.sync()
        with pytest.raises(EngineSyncError, match="refusing to sample"):
            generate(model, tokenizer, PROMPTS[:1], sampling=s)
    gen.sync()  # a real push: the engine is usable again and agrees with the trainer
    assert gen.sync_metrics()["sync/logp_gap"] < 1e-3
    assert generate(model, tokenizer, PROMPTS[:1], sampling=s)[0][0].token_ids == \
        generate(model, tokenizer, PROMPTS[:1], sampling=SamplingConfig(temperature=0.0, max_new_tokens=4))[0][0].token_ids
