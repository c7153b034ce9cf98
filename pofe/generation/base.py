"""The generation plug point: a :class:`Generator` turns prompts + a :class:`SamplingConfig`
into completions (token ids always, per-token log-probs on request). Engines are a plain
name -> class mapping (:data:`pofe.generation.sampling.ENGINES`, next to the ``hf`` engine:
this module holds only the settings and the protocol, which both engines import);
``sampling.engine`` picks one, so every command that samples (online, rl, self-reward, label,
cai revise, eval, chat) switches engine through the same entry point,
:func:`pofe.generation.generate`.

Both engines share one sampling semantics: ``temperature`` (0 = greedy, n identical
samples), nucleus ``top_p`` with no top-k cut, ``max_new_tokens``, stop at (and keep) the
first EOS of the model's generation config or tokenizer, ``n`` samples per prompt, and
``seed`` (same seed -> same samples within one engine; engines draw from different RNGs, so
sampled text is not identical *across* engines, greedy text is up to numerics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field, model_validator

from pofe.config import PofeConfig
from pofe.records import Completion


class VLLMSettings(PofeConfig):
    """The in-process vLLM engine (``sampling.engine: vllm``)."""

    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Engine weights. bf16 is where vLLM-CPU's kernels are fast (AVX-512/AMX); float32 makes
    greedy text match the fp32 HF engine token for token (the no-stale-weights test)."""
    max_model_len: int = 2048
    """Prompt + response tokens per sequence (sizes the KV cache blocks)."""
    kv_cache_gb: float | None = Field(None, gt=0)
    """KV cache in GiB (vLLM's ``kv_cache_memory_bytes``). Default on CPU: room for ``kv_cache_tokens``
    tokens, sized from the model's config (SmolLM2-135M in bf16: 4096 tokens = 0.09 GiB, against
    vLLM-CPU's own default of 4 GiB). vLLM queues what does not fit, so a smaller cache is slower,
    never wrong. Default on CUDA: ``gpu_memory_utilization`` decides."""
    kv_cache_tokens: int = Field(4096, ge=1)
    """CPU: tokens the default KV cache holds at once (at least ``max_model_len``): 4096 = ~27
    online-loop sequences of a 100-token prompt + 48 new tokens, or 2 full 2048-token ones. The
    bar benchmark (8 samples, then 8 judge reads of ~280 tokens) ran as fast with 4096 as with
    16384 and its peak RSS fell 6.06 -> 5.53 GB (two engines; benchmarks/online-notes.md). Raise
    it when one call samples many long sequences at once."""
    block_size: int | None = Field(None, ge=1)
    """Tokens per KV cache block, which is also the granularity of vLLM's prefix cache (only whole
    blocks are reused). None = 32 on CPU, vLLM's own default on CUDA. vLLM-CPU's default of 128 is
    longer than what judge reads share (the template's header; the question, which both orders of a
    pair repeat), so nothing was reused: 4 pairs read in both orders (~2200 tokens) took 0.59-0.71 s
    at 128 and 0.45 s at 32 (64: 0.52 s). The CPU attention kernel needs a multiple of 32."""
    gpu_memory_utilization: float = 0.3
    """CUDA: share of GPU memory for vLLM when it is colocated with training on the same GPU."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile: start-up in seconds. false on CPU (SmolLM2-135M, bf16): start-up
    46-55 s instead of 7 s, then sampling 8 x 48 tokens takes 0.79 s instead of 0.98 s, so compiling
    pays after a few hundred steps; weight syncs reach the compiled forward (tested)."""
    lora_sync: Literal["auto", "adapter", "merged"] = "auto"
    """LoRA policies. adapter: save the adapter and serve it as a new LoRARequest per sync (no merge).
    merged: push base + scale * B @ A as full weights (``reload_weights``); the trained model stays
    unmerged. auto = adapter on CUDA, merged on CPU, where vLLM's LoRA path is a torch fallback that
    gathers the adapter per token (one 8-sample step of SmolLM2 did not finish in 6 minutes here)."""
    sync_every: int = 1
    """Training loops: push the policy's weights to the engine every N optimiser steps. 1 = on-policy
    (OAIF); N > 1 = semi-online (fairseq2 / oat): samples may come from weights up to N-1 steps old,
    recorded as ``staleness`` in the metrics."""
    seed: int = 0
    """Engine seed (per-request seeds come from ``generate(seed=)``)."""


class HFSettings(PofeConfig):
    """The in-process transformers engine (``sampling.engine: hf``)."""

    dtype: Literal["model", "bfloat16", "float16"] = "model"
    """Weights ``generate`` runs on. model = the model's own tensors (always current, no copy).
    bfloat16 / float16 = a half-precision copy made at each call from the current weights (tied
    weights stay tied, buffers such as RoPE's frequencies keep their dtype) and freed after it:
    decoding reads half the bytes per token; a model already in that dtype is used as it is.
    SmolLM2-135M, 8 x 48 tokens on this 2-core AMX CPU: 2.5 s instead of 4.3 s, the copy included
    (benchmarks/online-notes.md). Samples then come from the rounded weights, as with a bf16 vLLM
    engine."""


class SamplingConfig(PofeConfig):
    """How responses are sampled."""

    engine: Literal["hf", "vllm"] = "hf"
    """hf = transformers ``generate`` in this process; vllm = an in-process vLLM engine (``pip install
    'pofe[vllm]'``), kept in step with the trained weights."""
    max_new_tokens: int = Field(48, ge=1)
    """Maximum tokens per response."""
    temperature: float = Field(0.9, ge=0)
    """Sampling temperature (OAIF Sec. 4.1 uses 0.9 during training); 0 = greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    batch_size: int = Field(16, ge=1)
    """Prompts per generate() call (hf; vLLM schedules its own batches)."""
    logprobs: bool = False
    """Also return each generated token's log-prob under the model (temperature 1, before top-p: vLLM's raw_logprobs)."""
    vllm: VLLMSettings = VLLMSettings()
    hf: HFSettings = HFSettings()

    @model_validator(mode="after")
    def _engine_keys_need_their_engine(self):
        # An irrelevant key is an error, not silently ignored (project rule).
        for name, default in (("vllm", VLLMSettings()), ("hf", HFSettings())):
            changed = [k for k, v in default.model_dump().items() if getattr(getattr(self, name), k) != v]
            if self.engine != name and changed:
                raise ValueError(f"{name}.{changed[0]} is only used with engine: {name} (engine is {self.engine!r})")
        return self


Prompts = Sequence["str | list[dict[str, str]]"]


class Generator(Protocol):
    """Prompts (text or chat messages) -> ``n`` completions per prompt."""

    name: str

    def generate(self, prompts: Prompts, n: int, sampling: SamplingConfig, seed: int | None = None, *,
                 chat_template: bool = True) -> list[list[Completion]]:
        """``chat_template=False``: string prompts are raw completion prompts (own special tokens)."""
        ...

    def sync(self) -> float:
        """Make the engine generate with the bound model's current weights; returns seconds."""
        ...

    @classmethod
    def bind(cls, model, tokenizer, sampling: SamplingConfig) -> Generator:
        """The generator of ``model`` (an engine may keep one per model across calls)."""
        ...
