"""Where each process's vLLM engine lands with several processes on one machine: the exact
``vllm.LLM`` arguments pofe passes (``engine_kwargs``; no vLLM started). vLLM on CUDA never ran
in this project (its wheel cannot travel to the lent GPU machine; docs/scale.md), so these are
the arguments of vLLM's documented colocated pattern, the one TRL's ``vllm_mode="colocate"``
passes: ``distributed_executor_backend="external_launcher"`` and a seed per process."""

from __future__ import annotations

import pytest

from pofe.generation.base import VLLMSettings
from pofe.generation.vllm import EnginePlacementError, engine_kwargs, launch_placement


def test_several_processes_on_cuda_use_the_external_launcher_with_a_seed_each(tiny_model_dir):
    path = str(tiny_model_dir)
    kws = [engine_kwargs(path, VLLMSettings(seed=3), lora_rank=None, cuda=True, processes=4, rank=r) for r in range(4)]
    assert [kw["distributed_executor_backend"] for kw in kws] == ["external_launcher"] * 4
    assert [kw["seed"] for kw in kws] == [3, 4, 5, 6]  # TRL: rank // tensor_parallel_size, here 1
    assert all(kw["tensor_parallel_size"] == 1 for kw in kws)
    # everything else is what one process passes
    one = engine_kwargs(path, VLLMSettings(seed=3), lora_rank=None, cuda=True)
    assert {k: v for k, v in kws[2].items() if k not in ("distributed_executor_backend", "seed")} == \
        {k: v for k, v in one.items() if k != "seed"}
    assert "distributed_executor_backend" not in one and one["seed"] == 3


def test_one_process_and_cpu_keep_vllms_own_executor(tiny_model_dir):
    """CPU engines (the gloo tests: each process its own one-process engine) and a single CUDA
    process pass no executor, and the configured seed."""
    path = str(tiny_model_dir)
    for kw in (engine_kwargs(path, VLLMSettings(), lora_rank=None, cuda=False, processes=2, rank=1),
               engine_kwargs(path, VLLMSettings(), lora_rank=None, cuda=True, processes=1, rank=0)):
        assert "distributed_executor_backend" not in kw and kw["seed"] == 0


def test_tensor_parallel_across_launched_processes_is_refused_in_one_line(tiny_model_dir):
    with pytest.raises(EnginePlacementError) as e:
        engine_kwargs(str(tiny_model_dir), VLLMSettings(tensor_parallel_size=2), lora_rank=None, cuda=True,
                      processes=2, rank=0)
    assert str(e.value) == ("sampling.vllm.tensor_parallel_size=2 with 2 processes: each process runs its own engine "
                            "on its own GPU (tensor_parallel_size 1), or use engine: vllm-server")
    assert e.value.exit_code == 2


def test_launch_placement_reads_the_launchers_variables():
    assert launch_placement({}) == (1, 0)
    assert launch_placement({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}) == (2, 1)
    assert launch_placement({"WORLD_SIZE": "", "RANK": ""}) == (1, 0)


def test_a_prompt_over_the_engines_context_is_one_line_naming_it():
    """The vLLM path's bound (the transformers path has check_prompt_lengths): vLLM's own
    refusal of a prompt over max_model_len was a ValueError, shown as an internal error."""
    from pofe.errors import DataError
    from pofe.generation.vllm import check_engine_prompt_lengths

    check_engine_prompt_lengths([(1,) * 100, (2,) * 4], ["a", "b"], 28, 128)  # 100 + 28 = 128 fits
    with pytest.raises(DataError) as e:
        check_engine_prompt_lengths([(1,) * 3, (2,) * 101], ["short", "word word  word\n" * 20], 28, 128)
    assert str(e.value) == ("a prompt ('word word word word word word word wor'...) is 101 tokens: with "
                            "sampling.max_new_tokens=28 that is over the engine's context of 128 tokens "
                            "(sampling.vllm.max_model_len); shorten it or leave it out of the prompts")
