"""The ``vllm-server`` engine without vLLM, against in-process fake servers (fake_vllm.py):
its config section, prompts split across servers and merged in input order, the weight push
(the pushed checkpoint holds exactly the trainer's current tensors; version recorded and
checked), one-line errors within the timeout, and the online loop's ``sync/...`` metrics."""

from __future__ import annotations

import time

import pytest
import torch

from tests.generation.fake_vllm import FakeVLLM, completion_tokens

PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello.", "One word about the sea.", "Count to three."]


@pytest.fixture
def fakes(tokenizer):
    made: list[FakeVLLM] = []

    def make(n: int = 1) -> list[FakeVLLM]:
        made.extend(FakeVLLM(marker=7 + k, eos=tokenizer.eos_token_id) for k in range(n))
        return made[-n:]

    yield make
    for f in made:
        f.close()


def _sampling(*urls: str, **server):
    from pofe.generation import SamplingConfig

    return SamplingConfig(engine="vllm-server", temperature=0.0, max_new_tokens=8,
                          server={"base_urls": list(urls), "timeout_s": 5.0, **server})


def _ids(tokenizer, prompt: str) -> list[int]:
    from pofe.models import apply_chat_template

    return tokenizer(apply_chat_template(tokenizer, prompt), add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------- config
def test_server_section_is_validated_before_anything_loads():
    from pofe.config import ConfigError, load_config
    from pofe.generation import ENGINES, SamplingConfig
    from pofe.loops.online import OnlineConfig

    assert "vllm-server" in ENGINES and ENGINES["vllm-server"]().name == "vllm-server"
    cfg = load_config(OnlineConfig, None, ["sampling.engine=vllm-server",
                                           "sampling.server.base_urls=http://127.0.0.1:8000/v1/"])
    assert cfg.sampling.server.base_urls == ["http://127.0.0.1:8000"]  # one URL, /v1 and slash dropped
    cfg = load_config(OnlineConfig, None, ["sampling.engine=vllm-server",
                                           "sampling.server.base_urls=[http://a:1, https://b:2/]"])
    assert cfg.sampling.server.base_urls == ["http://a:1", "https://b:2"] and cfg.sampling.server.timeout_s == 120
    bad = {
        "server.base_urls: engine vllm-server needs at least one": ["sampling.engine=vllm-server"],
        "server.timeout_s is only used with engine: vllm-server": ["sampling.server.timeout_s=5"],
        "timeout_seconds": ["sampling.engine=vllm-server", "sampling.server.base_urls=http://a:1",
                            "sampling.server.timeout_seconds=5"],  # unknown key: named
        "'127.0.0.1:8000' is not an http": ["sampling.engine=vllm-server", "sampling.server.base_urls=127.0.0.1:8000"],
        "lists a server twice": ["sampling.engine=vllm-server", "sampling.server.base_urls=[http://a:1, http://a:1/v1]"],
        "timeout_s": ["sampling.engine=vllm-server", "sampling.server.base_urls=http://a:1", "sampling.server.timeout_s=0"],
        "weight_sync": ["sampling.engine=vllm-server", "sampling.server.base_urls=http://a:1",
                        "sampling.server.weight_sync=ipc"],
        "vllm.tensor_parallel_size is only used with engine: vllm": [
            "sampling.engine=vllm-server", "sampling.server.base_urls=http://a:1", "sampling.vllm.tensor_parallel_size=2"],
    }
    for msg, sets in bad.items():
        with pytest.raises(ConfigError, match=msg.replace("(", r"\(")):
            load_config(OnlineConfig, None, sets)
    assert SamplingConfig().vllm.tensor_parallel_size == 1


def test_cli_refuses_a_bad_server_section_with_exit_2(tmp_path):
    from tests._cli import invoke

    res = invoke("online", "--set", "sampling.engine=vllm-server", "--set", f"run.output_dir={tmp_path}")
    assert res.returncode == 2 and "server.base_urls" in (res.stdout + res.stderr), res
    assert not any(tmp_path.iterdir())  # refused before any run folder (or model) existed


def test_tensor_parallel_size_reaches_the_in_process_engine(tiny_model_dir):
    from pofe.generation import VLLMSettings
    from pofe.generation.vllm import engine_kwargs

    assert engine_kwargs(str(tiny_model_dir), VLLMSettings(), lora_rank=None, cuda=False)["tensor_parallel_size"] == 1
    kw = engine_kwargs(str(tiny_model_dir), VLLMSettings(tensor_parallel_size=2), lora_rank=None, cuda=True)
    assert kw["tensor_parallel_size"] == 2 and kw["model"] == str(tiny_model_dir)


def test_engine_batch_limits_reach_the_in_process_engine_only_when_set(tiny_model_dir):
    from pofe.generation import VLLMSettings
    from pofe.generation.vllm import engine_kwargs

    kw = engine_kwargs(str(tiny_model_dir), VLLMSettings(), lora_rank=None, cuda=False)
    assert "max_num_seqs" not in kw and "max_num_batched_tokens" not in kw  # vLLM's own defaults
    kw = engine_kwargs(str(tiny_model_dir), VLLMSettings(max_num_seqs=16, max_num_batched_tokens=1024), lora_rank=None,
                       cuda=False)
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"]) == (16, 1024)
    with pytest.raises(ValueError, match="max_num_seqs"):
        VLLMSettings(max_num_seqs=0)


def test_split_blocks():
    from pofe.generation.vllm_server import split_blocks

    assert [list(b) for b in split_blocks(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(b) for b in split_blocks(2, 3)] == [[0], [1], []]
    assert [list(b) for b in split_blocks(6, 3)] == [[0, 1], [2, 3], [4, 5]]


# ----------------------------------------------------------------------------- sampling
def test_prompts_split_across_two_servers_come_back_in_input_order(fakes, tiny_model, tokenizer):
    from pofe.generation import generate

    a, b = fakes(2)
    s = _sampling(a.url, b.url, max_concurrency=2).model_copy(update={"temperature": 0.9})
    groups = generate(tiny_model, tokenizer, PROMPTS, n=2, sampling=s, seed=40)
    # contiguous blocks: prompts 0-2 on the first server, 3-4 on the second, each request seeded seed + i
    assert sorted(r["seed"] for r in a.completions) == [40, 41, 42]
    assert sorted(r["seed"] for r in b.completions) == [43, 44]
    assert all(r["n"] == 2 and r["return_token_ids"] and r["temperature"] == 0.9 and r["top_k"] == 0
               and r["stop_token_ids"] == [tokenizer.eos_token_id] for r in a.completions + b.completions)
    for i, (prompt, group) in enumerate(zip(PROMPTS, groups)):
        ids = _ids(tokenizer, prompt)
        marker = 7 if i < 3 else 8
        assert len(group) == 2
        for k, c in enumerate(group):  # the server's token ids, EOS kept, prompt ids as sent
            assert list(c.token_ids) == completion_tokens(ids, 40 + i, k, marker, tokenizer.eos_token_id)
            assert list(c.prompt_token_ids) == ids and c.finished and c.prompt == prompt
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_greedy_sends_one_sample_and_repeats_it(fakes, tiny_model, tokenizer):
    from pofe.generation import generate

    (a,) = fakes(1)
    groups = generate(tiny_model, tokenizer, PROMPTS[:2], n=3, sampling=_sampling(a.url), seed=5)
    assert [r["n"] for r in a.completions] == [1, 1] and all(r["temperature"] == 0.0 for r in a.completions)
    assert all(g[0].token_ids == g[1].token_ids == g[2].token_ids for g in groups)


# ----------------------------------------------------------------------------- weight push
def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_every_update_is_pushed_once_with_a_new_checked_version(fakes, tiny_model, tokenizer):
    from pofe.generation import generate, make_generator

    (a,) = fakes(1)
    s = _sampling(a.url)
    gen = make_generator(tiny_model, tokenizer, s)
    assert gen.name == "vllm-server" and make_generator(tiny_model, tokenizer, s) is gen
    generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)  # first use: push
    assert a.posts("/collective_rpc") == 1 and a.version == gen.served_name == f"pofe-{gen.token}-1"
    order = [p.split("?")[0] for m, p in a.calls if m == "POST" and p != "/v1/completions"]
    assert order == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
    want = _state(tiny_model)
    # every tensor under its checkpoint name, the tied LM head too (vLLM's reload keeps a layer it is not given)
    assert set(a.loaded[0]) == set(want) and "lm_head.weight" in want
    assert all(torch.equal(a.loaded[0][k], want[k]) for k in want)
    for step in (2, 3):
        with torch.no_grad():
            tiny_model.model.layers[0].mlp.down_proj.weight.add_(0.01 * step)  # an in-place update, as optimiser steps are
        assert gen.stale
        gen.sync()  # what the online loop does after each optimiser step
        assert not gen.stale and a.version == f"pofe-{gen.token}-{step}"
        assert torch.equal(a.loaded[-1]["model.layers.0.mlp.down_proj.weight"],
                           tiny_model.model.layers[0].mlp.down_proj.weight)
        generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)
        m = gen.sync_metrics()
        assert m["sync/version"] == step and m["sync/staleness"] == 0 and m["sync/bytes"] > 0
    assert a.posts("/collective_rpc") == 3  # unchanged weights: no push, only the version check
    gets = sum(1 for m, p in a.calls if p == "/weight_info")
    generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)
    assert a.posts("/collective_rpc") == 3 and sum(1 for m, p in a.calls if p == "/weight_info") == gets + 1
    # changed weights without an explicit sync: generate pushes first (never samples old weights)
    with torch.no_grad():
        tiny_model.model.norm.weight.mul_(1.5)
    generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)
    assert a.posts("/collective_rpc") == 4 and torch.equal(a.loaded[-1]["model.norm.weight"], tiny_model.model.norm.weight)


def test_both_servers_get_every_push(fakes, tiny_model, tokenizer):
    from pofe.generation import generate, make_generator

    a, b = fakes(2)
    s = _sampling(a.url, b.url)
    generate(tiny_model, tokenizer, PROMPTS[:2], sampling=s)
    gen = make_generator(tiny_model, tokenizer, s)
    assert a.version == b.version == gen.served_name and a.posts("/collective_rpc") == b.posts("/collective_rpc") == 1


# ----------------------------------------------------------------------------- failures
def test_a_server_that_keeps_its_old_version_is_refused(fakes, tiny_model, tokenizer):
    from pofe.generation import generate
    from pofe.generation.vllm_server import ServerError

    (a,) = fakes(1)
    a.ignore_versions = True
    with pytest.raises(ServerError, match=r"reports weight version 'default', not 'pofe-\w+-1'") as e:
        generate(tiny_model, tokenizer, PROMPTS[:1], sampling=_sampling(a.url))
    assert e.value.exit_code == 1 and a.url in str(e.value) and not a.completions  # nothing was sampled


def test_a_version_changed_behind_the_trainer_is_refused_before_sampling(fakes, tiny_model, tokenizer):
    from pofe.generation import generate
    from pofe.generation.vllm_server import ServerError

    (a,) = fakes(1)
    s = _sampling(a.url)
    generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)
    n = len(a.completions)
    a.version = "another-trainer-7"  # a restarted server reports "default"; another trainer its own
    with pytest.raises(ServerError, match="reports weight version 'another-trainer-7'.*refusing to sample"):
        generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)
    assert len(a.completions) == n


def test_a_slow_server_fails_within_the_timeout_in_one_line(fakes, tiny_model, tokenizer):
    from pofe.generation import generate
    from pofe.generation.vllm_server import ServerError

    (a,) = fakes(1)
    s = _sampling(a.url, timeout_s=0.5)
    generate(tiny_model, tokenizer, PROMPTS[:1], sampling=s)  # pushed and sampled while fast
    a.delay = 3.0
    t0 = time.perf_counter()
    with pytest.raises(ServerError) as e:
        generate(tiny_model, tokenizer, PROMPTS, sampling=s)
    took = time.perf_counter() - t0
    msg = str(e.value)
    assert took < 2.0, took  # the timeout, not the server's 3 s
    assert msg == f"vllm-server {a.url}: sampling (POST /v1/completions) timed out after 0.5 s (sampling.server.timeout_s)"
    assert e.value.exit_code == 1


def test_a_dead_server_fails_at_once_naming_it(fakes, tiny_model, tokenizer):
    from pofe.generation import generate
    from pofe.generation.vllm_server import ServerError

    (a,) = fakes(1)
    url = a.url
    a.close()
    t0 = time.perf_counter()
    with pytest.raises(ServerError, match="is the server running") as e:
        generate(tiny_model, tokenizer, PROMPTS[:1], sampling=_sampling(url))
    assert time.perf_counter() - t0 < 2.0 and str(e.value).startswith(f"vllm-server {url}: ") and "\n" not in str(e.value)


def test_a_server_without_dev_mode_is_named(fakes, tiny_model, tokenizer):
    from pofe.generation import generate
    from pofe.generation.vllm_server import ServerError

    (a,) = fakes(1)
    a.missing = {"/pause"}
    with pytest.raises(ServerError, match="start the server with VLLM_SERVER_DEV_MODE=1"):
        generate(tiny_model, tokenizer, PROMPTS[:1], sampling=_sampling(a.url))


def test_data_parallel_processes_are_refused(fakes, tiny_model, tokenizer, monkeypatch):
    from pofe.config import ConfigError
    from pofe.generation.vllm_server import ServerGenerator

    (a,) = fakes(1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="WORLD_SIZE=2"):
        ServerGenerator(tiny_model, tokenizer, _sampling(a.url))


# ----------------------------------------------------------------------------- online loop
@pytest.mark.slow
def test_online_rows_carry_the_served_version(fakes, tmp_path, tiny_model_dir):
    """``pofe online`` on a fake server: a push on first use and after every step; each row says
    which version the servers hold and that samples were not stale."""
    from pofe.loops.online import run
    from pofe.runs import read_jsonl
    from tests._online_utils import tiny_cfg

    (a,) = fakes(1)
    summary = run(tiny_cfg(tmp_path, tiny_model_dir, "eval.enabled=false", "train.steps=3",
                           "sampling.engine=vllm-server", f"sampling.server.base_urls={a.url}"))
    rows = read_jsonl(f"{summary['run_dir']}/metrics.jsonl")
    assert [r["engine"] for r in rows] == ["vllm-server"] * 3
    assert [r["sync/version"] for r in rows] == [2, 3, 4]  # first use + one push after each step
    assert [r["engine_syncs"] for r in rows] == [2, 3, 4] and [r["sync/staleness"] for r in rows] == [0, 0, 0]
    assert all(r["time_sync"] > 0 and r["sync/bytes"] > 0 for r in rows)
    assert a.posts("/collective_rpc") == 4 and summary["engine"] == "vllm-server" and summary["engine_syncs"] == 4


# ----------------------------------------------------------------------------- sync check
@pytest.mark.slow
def test_sync_check_settings_and_gap():
    from pofe.config import ConfigError, load_config
    from pofe.generation.sync_check import SyncCheckError, check, check_ids, logp_gap
    from pofe.loops.online import OnlineConfig
    from pofe.models import load_tokenizer

    with pytest.raises(ConfigError, match="sync_check is only used with engines vllm and vllm-server"):
        load_config(OnlineConfig, None, ["sampling.sync_check.enabled=true"])
    cfg = load_config(OnlineConfig, None, ["sampling.engine=vllm", "sampling.sync_check.enabled=true",
                                           "sampling.sync_check.max_gap=0.02"])
    assert cfg.sampling.sync_check.enabled and cfg.sampling.sync_check.tokens == 32
    assert logp_gap([-1.0, -2.0, -3.0], [-1.5, -2.0, -2.0]) == pytest.approx(0.5)  # (0.5 + 0 + 1) / 3
    assert check(0.05, 0.1, "x") == 0.05
    with pytest.raises(SyncCheckError, match=r"x scores fixed tokens 0.5 nats/token away .*max_gap=0.1\)") as e:
        check(0.5, 0.1, "x")
    assert e.value.exit_code == 1
    ids = check_ids(load_tokenizer(), 300)  # longer than the text: repeated
    assert len(ids) == 300 and ids[:5] == check_ids(load_tokenizer(), 5)


# ----------------------------------------------------------------------------- LoRA policies
def _lora_model(tiny_model):
    from pofe.runtime import LoraSettings, apply_lora

    model = apply_lora(tiny_model, LoraSettings(enabled=True, r=8, alpha=16))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B = 0 at init: give the adapter an effect
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def test_a_merged_lora_policy_pushes_w_plus_scaled_ba(fakes, tiny_model, tokenizer):
    from pofe.generation import generate

    model = _lora_model(tiny_model)
    (a,) = fakes(1)
    generate(model, tokenizer, PROMPTS[:1], sampling=_sampling(a.url))
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    want = q.base_layer.weight + (16 / 8) * q.lora_B["default"].weight @ q.lora_A["default"].weight
    assert torch.allclose(a.loaded[-1]["model.layers.0.self_attn.q_proj.weight"], want, atol=1e-6)
    assert not any("lora" in k for k in a.loaded[-1])
    with model.disable_adapter():  # pi_0 of the LoRA policy: the base weights
        generate(model, tokenizer, PROMPTS[:1], sampling=_sampling(a.url))
    assert torch.equal(a.loaded[-1]["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)


def test_an_adapter_lora_policy_loads_a_new_adapter_per_version(fakes, tiny_model, tokenizer):
    from pofe.generation import generate, make_generator

    model = _lora_model(tiny_model)
    (a,) = fakes(1)
    s = _sampling(a.url, lora_sync="adapter")
    generate(model, tokenizer, PROMPTS[:1], sampling=s)
    gen = make_generator(model, tokenizer, s)
    v1 = gen.served_name
    # first push: the base weights once (the server may hold another run's), then the adapter by the version's name
    assert a.posts("/collective_rpc") == 1 and a.adapters == [v1] and a.completions[-1]["model"] == v1
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    assert torch.equal(a.loaded[-1]["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)
    with torch.no_grad():
        q.lora_B["default"].weight.add_(0.05)
    generate(model, tokenizer, PROMPTS[:1], sampling=s)
    v2 = gen.served_name
    assert v2 != v1 and a.adapters == [v2] and a.completions[-1]["model"] == v2  # the old adapter unloaded
    assert a.posts("/collective_rpc") == 1  # the base is not pushed again
    with model.disable_adapter():  # pi_0: the base model's name, no adapter
        generate(model, tokenizer, PROMPTS[:1], sampling=s)
    assert a.completions[-1]["model"] == "tiny" and a.posts("/v1/load_lora_adapter") == 2


def test_two_models_of_one_process_take_turns_on_a_server(fakes, tokenizer):
    """pi_0 and the policy sampled on one server (e.g. an evaluation's reference responses): a
    version another generator of this process pushed is pushed over, not refused."""
    from pofe.generation import generate
    from pofe.models import tiny_causal_lm

    (a,) = fakes(1)
    s = _sampling(a.url)
    m1, m2 = tiny_causal_lm(tokenizer, seed=1), tiny_causal_lm(tokenizer, seed=2)
    for m, pushes in ((m1, 1), (m2, 2), (m1, 3), (m1, 3)):
        generate(m, tokenizer, PROMPTS[:1], sampling=s)
        assert a.posts("/collective_rpc") == pushes
        assert torch.equal(a.loaded[-1]["model.norm.weight"], m.model.norm.weight) and \
            torch.equal(a.loaded[-1]["model.embed_tokens.weight"], m.model.embed_tokens.weight)
