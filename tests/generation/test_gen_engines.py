"""The Generator plug point without vLLM: the engine key, its validation, the name -> class
mapping, per-token log-probs of the hf engine (vs an independent forward pass) and the
online loop's engine metrics."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_engine_key_and_mapping():
    from pofe.config import ConfigError, load_config
    from pofe.generation import ENGINES, HFGenerator, SamplingConfig
    from pofe.loops.online import OnlineConfig

    assert sorted(ENGINES) == ["hf", "vllm"] and ENGINES["hf"]() is HFGenerator
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
