"""Sharded training with DeepSpeed ZeRO (:mod:`pofe.runtime.zero`) on CPU processes (torchrun,
gloo, ``DS_ACCELERATOR=cpu``), asked the way ``accelerate launch --config_file
examples/accelerate/zero3.yaml`` asks for it (``ACCELERATE_USE_DEEPSPEED=true
ACCELERATE_DEEPSPEED_ZERO_STAGE=3``):

* ``sft``, ``rm`` and ``online`` mode=offline on 2 ZeRO-3 processes with ``train.batch_size`` B
  each equal 1 plain process with 2B (the same global batch), with the tolerances of
  ``test_fsdp2.py`` (weights to lr/10, step 1's loss and gradient norm to 1e-5 relative, later
  steps 1e-3); ``sft`` under ZeRO-2 and ZeRO-1 likewise. rm's last step of each epoch holds one pair, so one
  process runs only a zero-weight pass (ZeRO-3 gathers parameters in every forward).
* the checkpoint is pofe's one format (the one-process run's tensor names and shapes), and a
  SIGKILLed ZeRO-3 run resumed under ZeRO-3 ends with the uninterrupted run's weights.

Skipped, saying why, where deepspeed is not installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import configs
import pytest
from sharded import ATOL, LORA, OFFLINE, RTOL, RTOL_LATER, launch_two, overrides
from harness import (
    VLLM,
    Result,
    final_weights,
    max_abs_diff,
    rows,
    same_weights,
    shared_run,
    summary,
    weights,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="deepspeed is not installed (scripts/setup.sh installs deepspeed 0.19.8)")


def zero(stage: int) -> dict[str, str]:
    return {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage)}


# case -> (stage, command, overrides); one process trains batch 4, each of two ZeRO processes batch 2
EQUAL = {
    "zero3-sft": (3, "sft", {"train.steps": 3}),
    "zero3-rm": (3, "rm", {}),
    "zero3-online": (3, "online", OFFLINE),  # DAP; pi_0 a whole frozen copy on each process; 2 micro-batches
    "zero3-sft-lora": (3, "sft", {"train.steps": 3, **LORA}),  # the adapter partitioned with the base
    "zero3-rm-lora": (3, "rm", LORA),
    "zero3-online-lora": (3, "online", {**OFFLINE, **LORA}),  # pi_0: the policy with its adapter off
    "zero2-sft": (2, "sft", {"train.steps": 3}),
    "zero1-sft": (1, "sft", {"train.steps": 3}),
}


def launched(argv, *, stage: int = 3, **kw) -> Result:
    """``pofe`` on 2 torchrun processes with ZeRO ``stage`` asked (what the accelerate config exports)."""
    return launch_two(argv, zero(stage), **kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EQUAL))  # 11-18 s each here: not marked slow (as test_fsdp2.py's)
def test_two_zero_processes_equal_one_with_the_same_global_batch(case, tmp_path, tiny_model_dir):
    stage, command, common = EQUAL[case]
    over = {**common, **overrides(command, tmp_path)}
    fn, argv = configs.COMMANDS[command].config, configs.COMMANDS[command].argv
    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(shared_run, argv, config=fn(tmp_path, tiny_model_dir, "one", {**over, "train.batch_size": 4}))
        f2 = pool.submit(shared_run, argv, processes=2, env=zero(stage),  # read again by test_accelerate_configs
                         config=fn(tmp_path, tiny_model_dir, "two", {**over, "train.batch_size": 2}))
        one, two = f1.result(), f2.result()
    assert one.rc == 0, one.stderr[-3000:]
    assert two.rc == 0, two.stderr[-3000:]
    s = summary(two.run_dir)
    assert s["processes"] == 2 and s["sharding"] == f"DeepSpeed ZeRO-{stage}", s
    wa, wb = weights(final_weights(one.run_dir)), weights(final_weights(two.run_dir))
    assert wa.keys() == wb.keys()
    assert max_abs_diff(wa, wb) <= ATOL
    base = weights(Path(tiny_model_dir) / "model.safetensors")  # rm's final/ adds a score head
    assert max_abs_diff({k: wa[k] for k in base if k in wa}, {k: base[k] for k in base if k in wa}) > 1e-4  # it trained
    a, b = rows(one.run_dir / "metrics.jsonl", configs.TIMING), rows(two.run_dir / "metrics.jsonl", configs.TIMING)
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 3
    for ra, rb in zip(a, b):
        rel = RTOL if ra["step"] == 1 else RTOL_LATER
        assert rb["loss"] == pytest.approx(ra["loss"], rel=rel), (ra["step"], ra["loss"], rb["loss"])
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=rel), (ra["step"], ra["grad_norm"], rb["grad_norm"])
        assert rb["learning_rate"] == ra["learning_rate"]  # pofe's schedule drives DeepSpeed's optimiser
    # one checkpoint format: the ZeRO run's last checkpoint holds the one-process run's tensors (its Adam
    # state gathered whole from the partitions)
    step = a[-1]["step"]
    for f in ("model.safetensors", "trainer_state.safetensors"):
        x, y = (weights(r / "checkpoints" / f"step-{step}" / f) for r in (one.run_dir, two.run_dir))
        assert x.keys() == y.keys() and all(x[k].shape == y[k].shape for k in x), f
        if f == "trainer_state.safetensors":  # the optimiser state: step counts equal, moments to 1e-4
            opt = [k for k in x if k.startswith("optimizer.") and x[k].is_floating_point()]
            scalars = [k for k in opt if x[k].numel() == 1]
            assert scalars and all(float(x[k]) == float(y[k]) for k in scalars)
            assert len(opt) > len(scalars) and max((x[k] - y[k]).abs().max().item() for k in opt) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero3_sigkill_then_resume_equals_the_uninterrupted_zero3_run(dtype, tmp_path, tiny_model_dir):
    """bf16 weights: DeepSpeed updates an fp32 master copy of each partition, which the checkpoint
    holds (fp32 tensors where the weights are bf16), so the resumed run continues from it exactly."""
    over = {**overrides("sft", tmp_path), "model.dtype": dtype}
    with ThreadPoolExecutor(2) as pool:
        f_full = pool.submit(launched, ("sft",), config=configs.sft(tmp_path, tiny_model_dir, "full", over))
        f_crash = pool.submit(launched, ("sft",), config=configs.sft(tmp_path, tiny_model_dir, "crash", over),
                              fault="3:after_step")
        full, crash = f_full.result(), f_crash.result()
    assert full.rc == 0, full.stderr[-3000:]
    assert crash.rc != 0 and not (crash.run_dir / "summary.json").exists(), crash.stderr[-3000:]
    resumed = launched(("sft",), resume=crash.run_dir)
    assert resumed.rc == 0, resumed.stderr[-3000:]
    assert rows(crash.run_dir / "metrics.jsonl", configs.TIMING) == rows(full.run_dir / "metrics.jsonl", configs.TIMING)
    ident, diff = same_weights(final_weights(crash.run_dir), final_weights(full.run_dir))
    assert ident, f"final/ weights differ after a ZeRO-3 resume (max |diff| {diff:.3g})"
    s = summary(crash.run_dir)
    assert s["resumed_from"] == 2 and s["sharding"] == "DeepSpeed ZeRO-3"
    final = weights(final_weights(crash.run_dir))
    assert {str(v.dtype) for v in final.values()} == {f"torch.{dtype}"}
    ckpt = weights(crash.run_dir / "checkpoints" / "step-4" / "model.safetensors")
    assert {str(v.dtype) for v in ckpt.values()} == {"torch.float32"}  # the fp32 masters


# ----------------------------------------------------------------------------- refusals (no processes)

def _refusal(command: str, cfg, environ) -> str:
    from pofe.runtime.guards import ShardingRefused
    from pofe.runtime.sharding import refuse_unsupported

    with pytest.raises(ShardingRefused) as e:
        refuse_unsupported(command, cfg, environ)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    return str(e.value)


def test_what_a_zero_launch_cannot_train_is_one_line():
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig
    from pofe.loops.sft import SFTConfig
    from pofe.runtime.sharding import refuse_unsupported

    for stage in (1, 2, 3):
        refuse_unsupported("sft", SFTConfig(), zero(stage))  # trains under every stage
    refuse_unsupported("online", OnlineConfig(mode="offline", eval={"enabled": False}), zero(3))
    refuse_unsupported("rl", RLConfig(sampling={"engine": "vllm"}), zero(3))
    hf = _refusal("online", OnlineConfig(), zero(3))
    assert "pofe online under DeepSpeed ZeRO-3 cannot sample with transformers generate (sampling.engine=hf)" in hf, hf
    assert "sampling.engine=hf" in _refusal("rl", RLConfig(), zero(2))
    assert "pofe label does not train sharded parameters (DeepSpeed ZeRO-2 asked" in _refusal("label", None, zero(2))
    assert "DeepSpeed ZeRO-0 is not a ZeRO stage" in _refusal("sft", SFTConfig(), zero(0))
    assert "DeepSpeed ZeRO-? is not a ZeRO stage" in _refusal("sft", SFTConfig(), {"ACCELERATE_USE_DEEPSPEED": "true"})
    refuse_unsupported("sft", SFTConfig(model={"lora": {"enabled": True}}), zero(3))  # LoRA trains
    lora = _refusal("rl", RLConfig(model={"lora": {"enabled": True}}, sampling={"engine": "vllm"}), zero(3))
    assert "set sampling.vllm.lora_sync=merged (was auto)" in lora, lora  # the adapter alone is not pushed
    refuse_unsupported("rl", RLConfig(model={"lora": {"enabled": True}},
                                      sampling={"engine": "vllm", "vllm": {"lora_sync": "merged"}}), zero(3))
    assert "optim.name=adafactor is not trained under DeepSpeed ZeRO-3" in _refusal(
        "sft", SFTConfig(optim={"name": "adafactor"}), zero(3))


# ----------------------------------------------------------------------------- sampling with vLLM



@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-merged"])
def test_zero3_online_pushes_the_gathered_weights_to_each_process_engine(lora, tmp_path, tiny64):
    """Each process gathers the whole ZeRO-3 weights after every update and pushes them to its own
    in-process vLLM engine; ``sampling.sync_check`` then scores fixed tokens on the engine and by
    the trainer's own forward pass (through the engine, parameters gathered by its hooks) after
    each push: the two agree to fp32 rounding only when the engine holds the updated weights. With
    LoRA the push is the base weights plus the merged adapter, both gathered whole."""
    over = {"model.lora.enabled": True, "model.lora.r": 4, "sampling.vllm": {**VLLM, "lora_sync": "merged"}} \
        if lora else {"sampling.vllm": VLLM}
    cfg = configs.online(tmp_path, tiny64, "vl", {"eval.enabled": False, "train.steps": 2, "optim.lr": 1e-2,
                                                  "sampling.engine": "vllm", "sampling.sync_check.enabled": True,
                                                  "sampling.sync_check.max_gap": 1e-3, **over})
    res = launched(("online",), config=cfg, timeout=600)
    assert res.rc == 0, res.stderr[-3000:]
    s = summary(res.run_dir)
    assert s["processes"] == 2 and s["sharding"] == "DeepSpeed ZeRO-3", s
    got = rows(res.run_dir / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["engine"] == "vllm" and r["sync/logp_gap"] < 1e-4, r
    assert got[-1]["engine_syncs"] > got[0]["engine_syncs"] > 0  # a push after each update
    base = weights(Path(tiny64) / "model.safetensors")
    assert max_abs_diff(weights(final_weights(res.run_dir)), base) > 1e-3  # the pushed weights moved


@pytest.mark.slow
def test_zero3_rl_samples_from_the_pushed_weights(tmp_path, tiny64):
    """``pofe rl`` under ZeRO-3: each process samples its prompts' groups on its own engine, which
    holds the gathered weights after every update: ``sync/mismatch_kl`` (per sampled token, the
    engine's log-prob minus the trainer's in the update's own pass) is fp32 rounding, and
    ``sampling.sync_check`` (max_gap 1e-3, else the run fails) passed after every push."""
    cfg = configs.rl(tmp_path, tiny64, "rl", {"data.prompts": configs.prompts_file(tmp_path, 12), "train.steps": 2,
                                               "sampling.engine": "vllm", "sampling.vllm": VLLM,
                                               "sampling.sync_check.enabled": True,
                                               "sampling.sync_check.max_gap": 1e-3})
    res = launched(("rl",), config=cfg, timeout=600)
    assert res.rc == 0, res.stderr[-3000:]
    s = summary(res.run_dir)
    assert s["processes"] == 2 and s["sharding"] == "DeepSpeed ZeRO-3", s
    assert s["eval_before"]["n"] == s["eval_after"]["n"] > 0
    got = rows(res.run_dir / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert abs(r["sync/mismatch_kl"]) < 1e-4, r
    base = weights(Path(tiny64) / "model.safetensors")
    assert max_abs_diff(weights(final_weights(res.run_dir)), base) > 1e-4
