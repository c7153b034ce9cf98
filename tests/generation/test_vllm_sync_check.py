"""``sampling.sync_check`` on the in-process vllm engine: after a real push the engine's
log-probs of the fixed tokens equal the trainer's (fp32: gap < 1e-3, reported as
``sync/logp_gap``); a planted push that loads nothing is caught at the first sync after an
optimiser step, the engine refuses to sample, and a real push afterwards restores it."""

from __future__ import annotations

import pytest
import torch

from tests.generation.conftest import PROMPTS

pytestmark = pytest.mark.usefixtures("vllm_ok")


@pytest.mark.slow
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


@pytest.mark.slow
def test_an_online_run_stops_at_the_step_whose_push_did_not_load(tmp_path, tiny64_dir, tokenizer, monkeypatch):
    """``pofe online``: the first push loads, every later one is planted to load nothing; the
    run stops with SyncCheckError at the push after step 1 (before step 1's row is written)."""
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig, make_generator
    from pofe.generation.sync_check import SyncCheckError
    from pofe.generation.vllm import Engine
    from pofe.loops.online import run
    from tests._online_utils import tiny_cfg

    real, pushes = Engine.load_full, []

    def first_only(self, weights, fp):
        pushes.append(fp)
        if len(pushes) == 1:
            return real(self, weights, fp)
        self.holds = ("full", fp)  # planted: reports success, loads nothing

    monkeypatch.setattr(Engine, "load_full", first_only)
    sets = ["sampling.engine=vllm", "sampling.vllm.dtype=float32", "sampling.vllm.max_model_len=1024",
            "sampling.sync_check.enabled=true", "sampling.sync_check.max_gap=0.001"]
    try:
        with pytest.raises(SyncCheckError, match="the vLLM engine scores fixed tokens"):
            run(tiny_cfg(tmp_path, tiny64_dir, "eval.enabled=false", "train.steps=3", "train.batch_size=4",
                         "optim.lr=1e-2", *sets))
        assert len(pushes) == 2  # first use, then the push after step 1: caught there
        (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
        metrics = run_dir / "metrics.jsonl"
        assert not metrics.exists() or metrics.read_text().strip() == ""
    finally:  # the pooled engine is left "broken": a real push makes it usable for later tests
        monkeypatch.undo()
        model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
        make_generator(model, tokenizer, SamplingConfig(engine="vllm", vllm={"dtype": "float32",
                                                                             "max_model_len": 1024})).sync()


@pytest.mark.slow
def test_mismatch_kl_is_near_zero_on_fresh_weights_and_grows_on_stale_ones(tmp_path, tiny64_dir):
    """``sync/mismatch_kl`` (online, full fine-tuning, fp32 engine): with ``sync_every=2`` the engine
    samples step 2 (and 4) from weights one update old; on the steps sampled right after a push the
    sampler's log-probs of its tokens equal the trainer's (fp32 both sides), on the stale ones they
    do not."""
    from pofe.loops.online import run
    from pofe.runs import read_jsonl
    from tests._online_utils import tiny_cfg

    s = run(tiny_cfg(tmp_path, tiny64_dir, "eval.enabled=false", "train.steps=4", "train.batch_size=4", "optim.lr=3e-2",
                     "sampling.engine=vllm", "sampling.vllm.dtype=float32", "sampling.vllm.max_model_len=1024",
                     "sampling.vllm.sync_every=2", "sampling.sync_check.enabled=true"))
    rows = read_jsonl(f"{s['run_dir']}/metrics.jsonl")
    assert [r["staleness"] for r in rows] == [0, 1, 0, 1]
    fresh, stale = [abs(r["sync/mismatch_kl"]) for r in rows[0::2]], [abs(r["sync/mismatch_kl"]) for r in rows[1::2]]
    assert max(fresh) < 1e-4 and min(stale) > 1e-2, (fresh, stale)


@pytest.mark.slow
def test_rl_logs_mismatch_kl_from_the_vllm_samples(tmp_path, tiny64_dir):
    from pofe.config import load_config
    from pofe.loops.rl import RLConfig, run
    from pofe.runs import read_jsonl
    from tests.generation.conftest import PROMPTS

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    cfg = load_config(RLConfig, None, [
        f"model.name={tiny64_dir}", f"data.prompts={prompts}", "train.steps=2", "train.batch_size=2", "train.group_size=2",
        "eval.num_prompts=0", "reward.kind=judge", "reward.judge.kind=length", "sampling.max_new_tokens=5",
        "sampling.engine=vllm", "sampling.vllm.dtype=float32", "sampling.vllm.max_model_len=1024",
        "sampling.sync_check.enabled=true", "optim.warmup_steps=0", f"run.output_dir={tmp_path}", "log.progress=false",
        "log.tensorboard=false"])
    rows = read_jsonl(f"{run(cfg)['run_dir']}/metrics.jsonl")
    assert len(rows) == 2 and all(abs(r["sync/mismatch_kl"]) < 1e-4 for r in rows)
