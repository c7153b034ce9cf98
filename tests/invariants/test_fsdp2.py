"""Sharded training (FSDP2, :mod:`pofe.runtime.sharding`) on CPU processes (torchrun, gloo), asked
the way ``accelerate launch --config_file examples/accelerate/fsdp2.yaml`` asks for it
(``ACCELERATE_USE_FSDP=true FSDP_VERSION=2``):

* ``sft``, ``rm`` and ``online`` mode=offline (full fine-tuning and LoRA) on 2 sharded processes with ``train.batch_size`` B each equal 1 process with
  2B (the same global batch): ``final/`` weights to ``ATOL`` (= lr/10, as for data parallel),
  step 1's loss and gradient norm to 1e-5 relative, later steps to 1e-3 (the tolerances of
  ``test_data_parallel.py``, which explains them). rm's last step of each epoch holds one pair,
  so one process has nothing to train and must still run its (zero-weight) passes, or the
  other's all-gathers wait forever.
* the checkpoint is pofe's one format (the same tensor names as the one-process run's), and a
  SIGKILLed sharded run resumed sharded ends bit-identical to the uninterrupted sharded run.
* what a sharded launch cannot train is refused with one line before any model loads
  (:func:`pofe.runtime.sharding.refuse_unsupported`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import configs
from sharded import ATOL, LORA, OFFLINE, RTOL, RTOL_LATER, launch_two, overrides
from harness import VLLM, Result, final_weights, max_abs_diff, rows, same_weights, shared_run, summary, weights

FSDP2 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}

# case -> (command, overrides); one process trains batch 4, each of two sharded processes batch 2
EQUAL = {
    "sft": ("sft", {"train.steps": 3}),
    "sft-lora": ("sft", {"train.steps": 3, **LORA}),  # the adapter sharded with its layers
    "rm": ("rm", {}),
    "rm-lora": ("rm", LORA),
    # DAP on a fixed preference file; pi_0 a whole frozen copy on each process; 2 micro-batches a step
    "online": ("online", OFFLINE),
    "online-lora": ("online", {**OFFLINE, **LORA}),  # pi_0: the sharded policy with its adapter off
}


def sharded(argv, **kw) -> Result:
    """``pofe`` on 2 torchrun processes with FSDP2 asked (what the accelerate config exports)."""
    return launch_two(argv, FSDP2, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EQUAL))  # about 20 s each: not marked slow
def test_two_sharded_processes_equal_one_with_the_same_global_batch(case, tmp_path, tiny_model_dir):
    command, common = EQUAL[case]
    over = {**common, **overrides(command, tmp_path)}
    fn, argv = configs.COMMANDS[command].config, configs.COMMANDS[command].argv
    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(shared_run, argv, config=fn(tmp_path, tiny_model_dir, "one", {**over, "train.batch_size": 4}))
        f2 = pool.submit(shared_run, argv, processes=2, env=FSDP2,  # read again by test_accelerate_configs
                         config=fn(tmp_path, tiny_model_dir, "two", {**over, "train.batch_size": 2}))
        one, two = f1.result(), f2.result()
    assert one.rc == 0, one.stderr[-3000:]
    assert two.rc == 0, two.stderr[-3000:]
    s = summary(two.run_dir)
    assert s["processes"] == 2 and s["sharding"] == "FSDP2", s
    assert "weights_identical_across_processes" not in s  # one split copy: nothing to compare
    wa, wb = weights(final_weights(one.run_dir)), weights(final_weights(two.run_dir))
    assert max_abs_diff(wa, wb) <= ATOL
    base = weights(Path(tiny_model_dir) / "model.safetensors")  # rm's final/ adds a score head
    assert max_abs_diff({k: wa[k] for k in base if k in wa}, {k: base[k] for k in base if k in wa}) > 1e-4  # it trained
    a, b = rows(one.run_dir / "metrics.jsonl", configs.TIMING), rows(two.run_dir / "metrics.jsonl", configs.TIMING)
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 3
    for ra, rb in zip(a, b):
        rel = RTOL if ra["step"] == 1 else RTOL_LATER
        assert rb["loss"] == pytest.approx(ra["loss"], rel=rel), (ra["step"], ra["loss"], rb["loss"])
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=rel), (ra["step"], ra["grad_norm"], rb["grad_norm"])
    # one checkpoint format: the sharded run's last checkpoint holds the same tensors as the one-process run's
    step = a[-1]["step"]
    for f in ("model.safetensors", "trainer_state.safetensors"):
        x, y = (weights(r / "checkpoints" / f"step-{step}" / f) for r in (one.run_dir, two.run_dir))
        assert x.keys() == y.keys() and all(x[k].shape == y[k].shape for k in x), f


@pytest.mark.slow
def test_sharded_sigkill_then_resume_equals_the_uninterrupted_sharded_run(tmp_path, tiny_model_dir):
    over = overrides("sft", tmp_path)
    with ThreadPoolExecutor(2) as pool:
        f_full = pool.submit(sharded, ("sft",), config=configs.sft(tmp_path, tiny_model_dir, "full", over))
        f_crash = pool.submit(sharded, ("sft",), config=configs.sft(tmp_path, tiny_model_dir, "crash", over),
                              fault="3:after_step")
        full, crash = f_full.result(), f_crash.result()
    assert full.rc == 0, full.stderr[-3000:]
    assert crash.rc != 0 and not (crash.run_dir / "summary.json").exists(), crash.stderr[-3000:]
    resumed = sharded(("sft",), resume=crash.run_dir)
    assert resumed.rc == 0, resumed.stderr[-3000:]
    assert rows(crash.run_dir / "metrics.jsonl", configs.TIMING) == rows(full.run_dir / "metrics.jsonl", configs.TIMING)
    ident, diff = same_weights(final_weights(crash.run_dir), final_weights(full.run_dir))
    assert ident, f"final/ weights differ after a sharded resume (max |diff| {diff:.3g})"
    s = summary(crash.run_dir)
    assert s["resumed_from"] == 2 and s["sharding"] == "FSDP2"


# ----------------------------------------------------------------------------- refusals (no processes)

def _refusal(command: str, cfg, environ=FSDP2) -> str:
    from pofe.runtime.guards import ShardingRefused
    from pofe.runtime.sharding import refuse_unsupported

    with pytest.raises(ShardingRefused) as e:
        refuse_unsupported(command, cfg, environ)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    return str(e.value)


def test_what_a_sharded_launch_cannot_train_is_one_line():
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig
    from pofe.loops.sft import SFTConfig
    from pofe.runtime.sharding import refuse_unsupported

    refuse_unsupported("sft", SFTConfig(), FSDP2)  # trains sharded
    refuse_unsupported("online", OnlineConfig(mode="offline", eval={"enabled": False}), FSDP2)
    refuse_unsupported("rl", RLConfig(), {})  # nothing asked
    hf = _refusal("online", OnlineConfig())
    assert "sampling.engine=hf" in hf and "set sampling.engine to vllm or vllm-server" in hf, hf
    refuse_unsupported("online", OnlineConfig(sampling={"engine": "vllm"}, eval={"enabled": False}), FSDP2)
    server = _refusal("online", OnlineConfig(sampling={"engine": "vllm-server", "server": {"base_urls": ["http://h:1"]}},
                                              eval={"enabled": False}))
    assert "set sampling.engine=vllm (was vllm-server)" in server, server
    assert "mode=async" in _refusal("online", OnlineConfig(mode="async", sampling={"engine": "vllm"},
                                                           judge={"kind": "length"}, eval={"enabled": False}))
    assert "sampling.engine=hf" in _refusal("rl", RLConfig())
    refuse_unsupported("rl", RLConfig(sampling={"engine": "vllm"}), FSDP2)
    ram = _refusal("sft", SFTConfig(), {**FSDP2, "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"})
    assert "fsdp_cpu_ram_efficient_loading is not supported" in ram, ram
    assert "FSDP1 is not supported; use FSDP2" in _refusal("sft", SFTConfig(), {"ACCELERATE_USE_FSDP": "true"})
    zero0 = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "0"}  # ZeRO 1-3: test_zero.py
    assert "DeepSpeed ZeRO-0 is not a ZeRO stage pofe trains with" in _refusal("sft", SFTConfig(), zero0)
    refuse_unsupported("sft", SFTConfig(model={"lora": {"enabled": True}}), FSDP2)  # trains sharded
    lora = _refusal("rl", RLConfig(model={"lora": {"enabled": True}}, sampling={"engine": "vllm"}))
    assert "set sampling.vllm.lora_sync=merged (was auto)" in lora, lora
    refuse_unsupported("rl", RLConfig(model={"lora": {"enabled": True}},
                                      sampling={"engine": "vllm", "vllm": {"lora_sync": "merged"}}), FSDP2)
    assert "eval.enabled" in _refusal("online", OnlineConfig(mode="offline"))
    assert "pofe label does not train sharded parameters" in _refusal("label", None)


# ----------------------------------------------------------------------------- sampling with vLLM



@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-merged"])
def test_sharded_online_pushes_the_gathered_weights_to_each_process_engine(lora, tmp_path, tiny64):
    """Each process gathers the whole weights after every update and pushes them to its own
    in-process vLLM engine; ``sampling.sync_check`` then scores fixed tokens on the engine and by
    the sharded trainer's own forward pass (transformers), after each update: the two agree to
    fp32 rounding only when the engine holds the updated weights. With LoRA the push is the base
    weights plus the merged adapter, both gathered whole."""
    over = {**LORA, "sampling.vllm": {**VLLM, "lora_sync": "merged"}} if lora else {"sampling.vllm": VLLM}
    cfg = configs.online(tmp_path, tiny64, "vl", {"eval.enabled": False, "train.steps": 2, "optim.lr": 1e-2,
                                                  "sampling.engine": "vllm", "sampling.sync_check.enabled": True,
                                                  "sampling.sync_check.max_gap": 1e-3, **over})
    res = sharded(("online",), config=cfg, timeout=600)
    assert res.rc == 0, res.stderr[-3000:]
    assert "Invalid process group" not in res.stderr  # the engines' exit teardown ran on a live group
    s = summary(res.run_dir)
    assert s["processes"] == 2 and s["sharding"] == "FSDP2", s
    got = rows(res.run_dir / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["engine"] == "vllm" and r["sync/logp_gap"] < 1e-4, r
    assert got[-1]["engine_syncs"] > got[0]["engine_syncs"] > 0  # a push after each update
    base = weights(Path(tiny64) / "model.safetensors")
    assert max_abs_diff(weights(final_weights(res.run_dir)), base) > 1e-3  # the pushed weights moved


@pytest.mark.slow
def test_sharded_rl_samples_from_the_pushed_weights(tmp_path, tiny64):
    """``pofe rl`` sharded: each process samples its prompts' groups on its own engine, which holds
    the gathered weights after every update: ``sync/mismatch_kl`` (per sampled token, the engine's
    log-prob minus the sharded trainer's, transformers, in the update's own pass) is fp32 rounding,
    and ``sampling.sync_check`` (max_gap 1e-3, else the run fails) passed after every push. The
    run trains (its final/ moved) and measures before and after."""
    cfg = configs.rl(tmp_path, tiny64, "rl", {"data.prompts": configs.prompts_file(tmp_path, 12), "train.steps": 2,
                                               "sampling.engine": "vllm", "sampling.vllm": VLLM,
                                               "sampling.sync_check.enabled": True,
                                               "sampling.sync_check.max_gap": 1e-3})
    res = sharded(("rl",), config=cfg, timeout=600)
    assert res.rc == 0, res.stderr[-3000:]
    s = summary(res.run_dir)
    assert s["processes"] == 2 and s["sharding"] == "FSDP2", s
    assert s["eval_before"]["n"] == s["eval_after"]["n"] > 0
    got = rows(res.run_dir / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert abs(r["sync/mismatch_kl"]) < 1e-4, r
    base = weights(Path(tiny64) / "model.safetensors")
    assert max_abs_diff(weights(final_weights(res.run_dir)), base) > 1e-4
