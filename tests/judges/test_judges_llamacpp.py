"""Integration: a real llama.cpp server (xllamacpp) on 127.0.0.1 serving the embedded GGUF,
read through the OpenAI-compatible backend, against the in-process transformers backend on
the same model. The safetensors copy is the GGUF's Q4_1 weights de-quantised, so the only
differences are llama.cpp's quantised matmuls: per-order probabilities agree within 0.05."""

from __future__ import annotations

import pytest

pytest.importorskip("xllamacpp")

PROMPTS = ["What is the capital of France?", "Give me a synonym for happy.", "How many legs does a spider have?"]
A = ["The capital of France is Paris.", "Joyful.", "Eight."]
B = ["I don't know, maybe Berlin.", "Sad.", "Six legs, like an insect."]


@pytest.mark.slow
def test_llamacpp_server_matches_transformers_on_embedded_model(tmp_path):
    import httpx

    from pofe.judges import build_judge
    from pofe.judges.config import LlamaCppJudgeConfig, LLMJudgeConfig
    from pofe.models import load_model

    cache = {"path": str(tmp_path / "c.sqlite")}
    lj = build_judge(LlamaCppJudgeConfig(cache=cache, llamacpp={"n_threads": 1, "n_parallel": 2}))
    try:
        lv = lj.judge(PROMPTS, A, B)
        server = lj.backend.server
        assert server is not None and server.base_url.startswith("http://127.0.0.1:")
        # it is a real OpenAI-compatible HTTP server on loopback
        assert httpx.get(server.base_url + "/models", timeout=10).status_code == 200
        calls = lj.backend.stats.calls
        assert lj.judge(PROMPTS, A, B)[0].cached and lj.backend.stats.calls == calls
    finally:
        lj.close()
    model, tok = load_model()
    tv = build_judge(LLMJudgeConfig(cache={"enabled": False}), model=model, tokenizer=tok).judge(PROMPTS, A, B)
    for a, b in zip(lv, tv):
        assert a.parse_ok and b.parse_ok and not a.hard_label_fallback
        assert a.p_ab == pytest.approx(b.p_ab, abs=0.05)
        assert a.p_ba == pytest.approx(b.p_ba, abs=0.05)
        assert a.template_hash == b.template_hash
    assert lv[0].extra["backend"] == "llamacpp" and tv[0].extra["backend"] == "transformers"
