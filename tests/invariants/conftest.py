"""Fixtures shared by the sharded-training invariants (FSDP2, ZeRO)."""

from __future__ import annotations

import pytest

@pytest.fixture
def tiny64(tmp_path, tokenizer):
    """A tiny random Llama whose head size (64) vLLM's CPU attention supports (16 is not)."""
    from pofe.generation.vllm import vllm_available
    from pofe.models import tiny_causal_lm

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vLLM not usable here: {why}")
    d = tmp_path / "tiny64"
    tiny_causal_lm(tokenizer, hidden_size=128, num_heads=2, seed=1).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
