"""The Generator plug point without vLLM: the engine key, its validation, the name -> class
mapping, per-token log-probs of the hf engine (vs an independent forward pass) and the
online loop's engine metrics."""

from __future__ import annotations

import pytest
import torch


def test_engine_key_and_mapping():
    from pofe.config import ConfigError, load_config
    from pofe.generation import ENGINES, HFGenerator, SamplingConfig
    from pofe.loops.online import OnlineConfig

    assert sorted(ENGINES) == ["hf", "vllm", "vllm-server"] and ENGINES["hf"]() is HFGenerator
    assert SamplingConfig().engine == "hf"
    cfg = load_config(OnlineConfig, None, ["sampling.engine=vllm", "sampling.vllm.sync_every=2"])
    assert cfg.sampling.engine == "vllm" and cfg.sampling.vllm.sync_every == 2
    with pytest.raises(ConfigError, match="engine"):
        load_config(OnlineConfig, None, ["sampling.engine=sglang"])
    with pytest.raises(ConfigError, match="vllm.sync_every is only used with engine: vllm"):
        load_config(OnlineConfig, None, ["sampling.vllm.sync_every=2"])  # irrelevant with hf: an error
    with pytest.raises(ConfigError, match="kv_cach"):
        load_config(OnlineConfig, None, ["sampling.engine=vllm", "sampling.vllm.kv_cach_gb=2"])


def test_kv_cache_size_from_the_model_config(tiny_model_dir, monkeypatch):
    """The default CPU KV cache holds kv_cache_tokens tokens of this model: the tiny Llama has
    2 layers x 2 KV heads x head dim 16, so one bf16 token is 2 (K, V) x 2 x 2 x 16 x 2 bytes = 256."""
    from pofe.generation import VLLMSettings
    from pofe.generation.vllm import kv_cache_bytes

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_bytes(str(tiny_model_dir), VLLMSettings(), cuda=False) == 256 * 4096
    assert kv_cache_bytes(str(tiny_model_dir), VLLMSettings(dtype="float32", kv_cache_tokens=100,
                                                            max_model_len=512), cuda=False) == 512 * 512  # >= one full sequence
    assert kv_cache_bytes(str(tiny_model_dir), VLLMSettings(kv_cache_gb=0.5), cuda=False) == 2**29
    assert kv_cache_bytes(str(tiny_model_dir), VLLMSettings(), cuda=True) is None  # gpu_memory_utilization decides
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert kv_cache_bytes(str(tiny_model_dir), VLLMSettings(), cuda=False) is None  # the user's variable: vLLM reads it


def test_cpu_engines_start_without_vllms_aot_compile_unless_the_user_asks(monkeypatch):
    """vLLM-CPU cannot load back the AOT-compiled forward it saves, so new_llm defaults
    VLLM_USE_AOT_COMPILE to 0 on CPU; a value the user set is left alone, and CUDA keeps vLLM's default."""
    import os
    import types

    from pofe.generation.vllm import new_llm

    seen = []
    fake = types.SimpleNamespace(LLM=lambda **kw: seen.append(os.environ.get("VLLM_USE_AOT_COMPILE")) or kw)
    for name in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_USE_AOT_COMPILE"):
        monkeypatch.setenv(name, "1")  # recorded, so the teardown restores each one whatever new_llm sets
        monkeypatch.delenv(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert new_llm(fake, model="m") == {"model": "m"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    new_llm(fake, model="m")
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    new_llm(fake, model="m")
    assert seen == [None, "0", "1"]


def test_hf_logprobs_match_a_forward_pass(tiny_model, tokenizer):
    from pofe.generation import SamplingConfig, generate, make_generator

    s = SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=5, logprobs=True)
    assert make_generator(tiny_model, tokenizer, s).name == "hf"
    groups = generate(tiny_model, tokenizer, ["Hi there.", "Name a colour."], n=2, sampling=s, seed=3)
    for c in (x for g in groups for x in g):
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(tiny_model(ids).logits[0], -1)
        P = len(c.prompt_token_ids)
        # temperature-1, pre-top-p log-probs of the sampled tokens (vLLM's raw_logprobs)
        assert c.logprobs == pytest.approx([float(lp[P - 1 + t, tok]) for t, tok in enumerate(c.token_ids)], abs=1e-4)
    assert generate(tiny_model, tokenizer, ["Hi"], sampling=SamplingConfig(max_new_tokens=3))[0][0].logprobs is None


def test_online_rows_record_the_engine(tmp_path, tiny_model_dir):
    from pofe.loops.online import run
    from pofe.runs import read_jsonl
    from tests._online_utils import tiny_cfg

    summary = run(tiny_cfg(tmp_path, tiny_model_dir, "eval.enabled=false"))
    rows = read_jsonl(f"{summary['run_dir']}/metrics.jsonl")
    assert [(r["engine"], r["staleness"], r["time_sync"]) for r in rows] == [("hf", 0, 0.0)] * 2
    assert summary["engine"] == "hf" and summary["engine_syncs"] == 0


def test_online_samples_from_a_bf16_copy(tmp_path, tiny_model_dir):
    from pofe.loops.online import run
    from pofe.runs import read_jsonl
    from tests._online_utils import tiny_cfg

    summary = run(tiny_cfg(tmp_path, tiny_model_dir, "eval.enabled=false", "sampling.hf.dtype=bfloat16",
                           "train.precision=bf16"))
    rows = read_jsonl(f"{summary['run_dir']}/metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["gen_tokens"] > 0 and r["annotations"] == 2 for r in rows)


def test_hf_dtype_is_an_hf_key():
    from pofe.config import ConfigError, load_config
    from pofe.loops.online import OnlineConfig

    assert load_config(OnlineConfig, None, ["sampling.hf.dtype=bfloat16"]).sampling.hf.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="hf.dtype is only used with engine: hf"):
        load_config(OnlineConfig, None, ["sampling.engine=vllm", "sampling.hf.dtype=bfloat16"])


def test_half_precision_copy_casts_parameters_only_and_keeps_ties(tiny_model):
    from pofe.generation.sampling import half_precision_copy

    half = half_precision_copy(tiny_model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in half.parameters())
    assert half.get_input_embeddings().weight is half.get_output_embeddings().weight  # tied, one tensor
    buffers = dict(tiny_model.named_buffers())
    assert buffers and all(b.dtype == buffers[k].dtype for k, b in half.named_buffers())  # RoPE stays fp32
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())  # the original is untouched
    a, b = dict(tiny_model.named_parameters()), dict(half.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(b[k], a[k].to(torch.bfloat16)) for k in a)


def test_hf_bf16_sampling_follows_the_current_weights(tiny_model, tokenizer, tmp_path):
    """Samples (same seed) from sampling.hf.dtype=bfloat16 equal those of the same weights loaded
    in bf16 by transformers (an independent cast), before and after an in-place update: the copy
    is made from the weights of the moment, never kept. (Sampled, not greedy: a tiny random model
    greedily repeats the prompt's last token whatever its weights.)"""
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig, generate

    prompts = ["Name a colour.", "Say hello."]
    half = SamplingConfig(temperature=1.0, max_new_tokens=8, hf={"dtype": "bfloat16"})
    plain = SamplingConfig(temperature=1.0, max_new_tokens=8)
    texts = []
    for update in (False, True):
        if update:
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in tiny_model.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * p.std())
        tiny_model.save_pretrained(tmp_path / str(update))
        ref = AutoModelForCausalLM.from_pretrained(tmp_path / str(update), dtype=torch.bfloat16)
        ours = [g[0].token_ids for g in generate(tiny_model, tokenizer, prompts, sampling=half, seed=0)]
        theirs = [g[0].token_ids for g in generate(ref, tokenizer, prompts, sampling=plain, seed=0)]
        assert ours == theirs
        texts.append(ours)
    assert texts[0] != texts[1]  # the update changed what is sampled, so the second check had teeth


def test_hf_bf16_copy_of_a_lora_policy_keeps_its_adapter_switched_off(tiny_model, tokenizer):
    """pi_0 of a LoRA policy is the policy with its adapter off (the reference's context): the
    copy must sample pi_0 then, and the adapted policy otherwise."""
    from peft import LoraConfig, get_peft_model

    from pofe.generation import SamplingConfig, generate
    from pofe.generation.sampling import half_precision_copy

    base = half_precision_copy(tiny_model, torch.bfloat16)
    peft = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an adapter that changes what is sampled (a fresh one is B = 0: no change)
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    half = SamplingConfig(temperature=1.0, max_new_tokens=8, hf={"dtype": "bfloat16"})
    plain = SamplingConfig(temperature=1.0, max_new_tokens=8)
    prompts = ["Name a colour.", "Say hello."]
    x = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        with peft.disable_adapter():
            off = [g[0].token_ids for g in generate(peft, tokenizer, prompts, sampling=half, seed=0)]
            off_logits = half_precision_copy(peft, torch.bfloat16)(**x).logits
        on_logits = half_precision_copy(peft, torch.bfloat16)(**x).logits
        base_logits = base(**x).logits
    assert off == [g[0].token_ids for g in generate(base, tokenizer, prompts, sampling=plain, seed=0)]
    assert torch.equal(off_logits, base_logits)
    assert (on_logits.float() - off_logits.float()).abs().max() > 0.1  # the adapter is on in a copy made with it on


def test_hf_dtype_uses_a_model_already_in_that_dtype_as_it_is(tiny_model, tokenizer, monkeypatch):
    import pofe.generation.sampling as sampling_mod
    from pofe.generation import SamplingConfig, generate

    copies = []
    real = sampling_mod.half_precision_copy
    monkeypatch.setattr(sampling_mod, "half_precision_copy", lambda m, d: copies.append(d) or real(m, d))
    half = SamplingConfig(temperature=1.0, max_new_tokens=4, hf={"dtype": "bfloat16"})
    generate(tiny_model, tokenizer, ["Say hello."], sampling=half, seed=0)
    assert copies == [torch.bfloat16]  # fp32 model: one copy for the call
    generate(tiny_model.to(torch.bfloat16), tokenizer, ["Say hello."], sampling=half, seed=0)
    assert copies == [torch.bfloat16]  # already bf16: no second copy
