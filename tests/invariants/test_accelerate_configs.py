"""``examples/accelerate/*.yaml`` as a user launches them (``accelerate launch --config_file ...
-m pofe <cmd>``), on CPU processes:

* ``ddp-cpu.yaml`` starts 2 data-parallel processes that train what ``torchrun
  --nproc_per_node 2`` trains: the same ``final/`` weights (both runs are 2 gloo processes with
  one thread each, so the same sums in the same order) and ``processes: 2`` in the summary.
* ``fsdp2.yaml`` trains ``sft`` sharded (pofe shards the model itself: accelerate alone turns FSDP
  into plain ``MULTI_CPU`` on CPU), the same weights as ``torchrun`` with the variables it
  exports; ``online`` sampling with transformers ``generate`` is refused before any model loads,
  with one line naming ``sampling.engine`` and exit 2, and leaves no run folder.
* ``zero3.yaml`` and ``zero2.yaml`` train ``sft`` under DeepSpeed ZeRO (pofe builds the engine:
  accelerate alone drops DeepSpeed on CPU), the same weights as ``torchrun`` with the variables
  they export; ``zero3.yaml`` refuses HF ``generate`` as ``fsdp2.yaml`` does. Skipped, saying why,
  without deepspeed.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import configs
from _cli import REPO, env, error_lines
from harness import final_weights, max_abs_diff, shared_run, summary, weights

ACCEL = REPO / "examples" / "accelerate"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerate(config_file: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # a free port: another launch in the same suite may hold accelerate's default 29500
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config_file),
           "--main_process_port", str(_port()), "-m", "pofe", *args]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)


def _over(tmp_path: Path) -> dict:
    """sft at batch 2 per process, 3 steps: the two-process run of the data-parallel, FSDP2 and ZeRO
    equalities (``shared_run``), so the torchrun side of each comparison is their run, not a new one."""
    return {"train.steps": 3, "optim.lr": 1e-3, "data.ift": [configs.ift_file(tmp_path, 12)], "train.batch_size": 2}


def _write(cfg: dict) -> tuple[Path, Path]:
    run_dir = Path(cfg["run"]["output_dir"]) / cfg["run"]["name"]
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path, run_dir


@pytest.mark.slow
def test_ddp_cpu_config_trains_what_torchrun_trains(tmp_path, tiny_model_dir):
    over = _over(tmp_path)
    path, run_dir = _write(configs.sft(tmp_path, tiny_model_dir, "accel", over))
    res = _accelerate(ACCEL / "ddp-cpu.yaml", "sft", "--config", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    ref = shared_run(("sft",), config=configs.sft(tmp_path, tiny_model_dir, "torchrun", over), processes=2)
    assert ref.rc == 0, ref.stderr[-3000:]
    s = summary(run_dir)
    assert s["processes"] == 2 and s["weights_identical_across_processes"] is True, s
    diff = max_abs_diff(weights(final_weights(run_dir)), weights(final_weights(ref.run_dir)))
    assert diff == 0.0, f"accelerate launch and torchrun trained different weights (max diff {diff:.3g})"
    moved = max_abs_diff(weights(final_weights(run_dir)), weights(Path(tiny_model_dir) / "model.safetensors"))
    assert moved > 1e-4  # else the equality proves nothing


@pytest.mark.slow
def test_fsdp2_config_trains_sft_sharded_as_torchrun_does(tmp_path, tiny_model_dir):
    """``fsdp2.yaml`` shards (it is not dropped on CPU): the same final/ weights as ``torchrun`` with
    the launcher variables it exports (both 2 gloo processes, one thread each: the same sums)."""
    over = _over(tmp_path)
    path, run_dir = _write(configs.sft(tmp_path, tiny_model_dir, "accel", over))
    res = _accelerate(ACCEL / "fsdp2.yaml", "sft", "--config", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    ref = shared_run(("sft",), config=configs.sft(tmp_path, tiny_model_dir, "torchrun", over), processes=2,
                     env={"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"})
    assert ref.rc == 0, ref.stderr[-3000:]
    s = summary(run_dir)
    assert s["processes"] == 2 and s["sharding"] == "FSDP2", s
    diff = max_abs_diff(weights(final_weights(run_dir)), weights(final_weights(ref.run_dir)))
    assert diff == 0.0, f"accelerate launch and torchrun trained different weights (max diff {diff:.3g})"


needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (scripts/setup.sh installs deepspeed 0.19.8)")


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("stage", [3, 2])
def test_zero_configs_train_sft_under_deepspeed_as_torchrun_does(stage, tmp_path, tiny_model_dir):
    """``zero3.yaml`` / ``zero2.yaml`` run DeepSpeed (not dropped on CPU): the same final/ weights as
    ``torchrun`` with the launcher variables they export (both 2 gloo processes, one thread each)."""
    over = _over(tmp_path)
    path, run_dir = _write(configs.sft(tmp_path, tiny_model_dir, "accel", over))
    res = _accelerate(ACCEL / f"zero{stage}.yaml", "sft", "--config", str(path))
    assert res.returncode == 0, res.stderr[-3000:]
    ref = shared_run(("sft",), config=configs.sft(tmp_path, tiny_model_dir, "torchrun", over), processes=2,
                     env={"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage)})
    assert ref.rc == 0, ref.stderr[-3000:]
    s = summary(run_dir)
    assert s["processes"] == 2 and s["sharding"] == f"DeepSpeed ZeRO-{stage}", s
    diff = max_abs_diff(weights(final_weights(run_dir)), weights(final_weights(ref.run_dir)))
    assert diff == 0.0, f"accelerate launch and torchrun trained different weights (max diff {diff:.3g})"
    moved = max_abs_diff(weights(final_weights(run_dir)), weights(Path(tiny_model_dir) / "model.safetensors"))
    assert moved > 1e-4  # else the equality proves nothing


@pytest.mark.slow
@pytest.mark.parametrize("config,kind", [
    ("fsdp2.yaml", "FSDP2"),
    pytest.param("zero3.yaml", "DeepSpeed ZeRO-3", marks=needs_deepspeed),
])
def test_sharded_config_refuses_hf_generate_with_one_line_before_any_model_loads(config, kind, tmp_path, tiny_model_dir):
    path, run_dir = _write(configs.online(tmp_path, tiny_model_dir, "sharded"))  # sampling.engine: hf (the default)
    res = _accelerate(ACCEL / config, "online", "--config", str(path), timeout=300)
    assert res.returncode != 0
    errors = [ln for ln in error_lines(res) if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr[-3000:]  # both processes fail with it: printed once
    # the launcher's closing summary names pofe's line as the cause (not "To enable traceback see ...")
    assert f"traceback : {errors[0]}" in res.stderr, res.stderr[-3000:]
    assert f"pofe online under {kind} cannot sample with transformers generate (sampling.engine=hf)" in errors[0], errors
    assert "set sampling.engine to vllm or vllm-server" in errors[0], errors
    assert "exit code: 2" in res.stderr or "exitcode  : 2" in res.stderr, res.stderr[-3000:]
    # the launcher prints its own ChildFailedError traceback; pofe's processes print none
    assert not [ln for ln in res.stderr.splitlines() if 'File "' in ln and f"{Path('pofe')}/" in ln], res.stderr[-3000:]
    assert not run_dir.exists()



def test_requested_sharding_reads_the_launcher_environment():
    from pofe.runtime.guards import ShardingRefused, refuse_sharding, requested_sharding

    assert requested_sharding({}) is None
    assert requested_sharding({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}) == "FSDP2"
    assert requested_sharding({"ACCELERATE_USE_FSDP": "True"}) == "FSDP1"
    assert requested_sharding({"ACCELERATE_USE_FSDP": "false"}) is None
    assert requested_sharding({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}) == "DeepSpeed ZeRO-3"
    # ZeRO-1/2 keep whole parameters but partition the optimiser state: asked for, not dropped
    assert requested_sharding({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}) == "DeepSpeed ZeRO-2"
    assert requested_sharding({"ACCELERATE_USE_DEEPSPEED": "true"}) == "DeepSpeed ZeRO-?"
    refuse_sharding("pofe sft", {})  # nothing asked: no error
    with pytest.raises(ShardingRefused) as e:
        refuse_sharding("pofe rm", {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"})
    assert e.value.exit_code == 2 and "\n" not in str(e.value) and "DeepSpeed ZeRO-3" in str(e.value)


def test_every_accelerate_example_is_valid_yaml_for_accelerate():
    files = sorted(ACCEL.glob("*.yaml"))
    assert {f.name for f in files} >= {"ddp-cpu.yaml", "ddp-gpus.yaml", "fsdp2.yaml", "zero2.yaml", "zero3.yaml"}
    for f in files:
        cfg = yaml.safe_load(f.read_text())
        assert cfg["distributed_type"] in ("MULTI_GPU", "FSDP", "DEEPSPEED"), f
        if cfg["distributed_type"] == "DEEPSPEED":
            assert cfg["deepspeed_config"]["zero_stage"] == int(f.stem[-1]), f
        assert cfg["num_processes"] >= 2 and cfg["num_machines"] == 1, f


def test_a_hand_set_world_size_without_a_launcher_is_one_line():
    from pofe.runtime.guards import MultiProcessRefused, require_launcher

    require_launcher("pofe sft", {})  # one process
    require_launcher("pofe sft", {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    with pytest.raises(MultiProcessRefused) as e:
        require_launcher("pofe sft", {"WORLD_SIZE": "2"})
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert "WORLD_SIZE=2 is set but RANK, MASTER_ADDR, MASTER_PORT not" in str(e.value)
