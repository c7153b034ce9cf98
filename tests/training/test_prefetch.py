"""mode=async's pieces that need no engine: the refusals raised while the config loads (before any
model), the one-slot background queue, and the sampling seed drawn off torch's global RNG."""

from __future__ import annotations

import threading

import pytest
import torch

from pofe.config import ConfigError, load_config
from pofe.loops.online import OnlineConfig
from pofe.runtime.checkpoints import seed_everything
from pofe.runtime.parallel import sampling_seed, step_seed
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
