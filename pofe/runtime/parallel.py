"""Data-parallel plumbing shared by the training loops (accelerate): the accelerator, object
gathering and sums across processes, :class:`DataParallel` (a process's shard of a step, the
gradient all-reduce, and :meth:`DataParallel.map` -- shard, compute, gather in input order --
that every labelling command runs its items through), a weights digest to check that copies
agree. (The per-step and per-block seeds: :mod:`pofe.runtime.seeds`.)

Kept out of the loops so that a loop reads as its recipe (setup -> loop -> save).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from pofe.errors import PofeError

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)


DEFAULT_COLLECTIVE_TIMEOUT_S = 600
_TIMEOUT: dict[str, int] = {}  # "s": the collective timeout the process group was started with


class CollectiveTimeout(PofeError, RuntimeError):
    """A collective (all-reduce, gather, barrier) of a distributed run waited longer than
    ``run.collective_timeout_s`` for another process. ``str(e)`` is one line; exit 1."""

    exit_code = 1


def collective_timeout_line(seconds: int | None, rank: int, world: int) -> str:
    """The one line a process prints when a collective timed out. Gloo says only that a receive
    timed out, not from whom: with two processes the silent one is the other rank, with more it
    is one of the others (each process that waited prints its own line)."""
    others = [r for r in range(world) if r != rank]
    who = f"rank {others[0]}" if len(others) == 1 else (f"one of ranks {', '.join(map(str, others))}" if others else "another process")
    after = f"after {seconds} s " if seconds else ""
    return (f"collective timed out {after}on rank {rank} of {world}: {who} stopped answering (stopped, hung or "
            f"swapped out); checkpoints and metrics written so far are kept, --resume RUN_DIR continues "
            f"(run.collective_timeout_s)")


def as_collective_timeout(e: BaseException) -> CollectiveTimeout | None:
    """``e`` as a :class:`CollectiveTimeout` when it is torch.distributed's error for a collective
    that timed out (gloo: "Timed out waiting ...ms for recv operation"; NCCL's watchdog:
    "Watchdog caught collective operation timeout"), else None."""
    import os
    import sys

    if not isinstance(e, RuntimeError) or "torch.distributed" not in sys.modules:
        return None
    text = str(e).lower()
    if "timed out" not in text and "timeout" not in text:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    return CollectiveTimeout(collective_timeout_line(_TIMEOUT.get("s"), rank, world))


def make_accelerator(device: str, *, command: str = "pofe online", sharded: bool = False,
                     collective_timeout_s: int | None = None):
    """An ``accelerate.Accelerator`` on ``model.device`` (CPU when asked or when no GPU is there),
    always a plain data-parallel one. A sharded launch (FSDP, DeepSpeed ZeRO) is refused
    (:func:`pofe.runtime.guards.refuse_sharding`, on every device: on CPU accelerate drops it
    without a word) unless ``sharded``: the training commands that shard the model themselves
    (:mod:`pofe.runtime.sharding`, which has already refused what cannot run) -- accelerate then
    does not see the FSDP / DeepSpeed request, so that it neither drops it on CPU nor wraps the
    model its way. ``collective_timeout_s`` (``run.collective_timeout_s``; default 600): how long a
    collective waits for the other processes before it raises (torch's own default is 30 minutes
    of silence); the CLI turns that error into one line (:func:`as_collective_timeout`)."""
    import os

    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    from pofe.runtime.guards import refuse_sharding, require_launcher

    require_launcher(command)
    if not sharded:
        refuse_sharding(command)
    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    hidden = {k: os.environ.pop(k) for k in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")
              if sharded and k in os.environ}  # pofe builds the FSDP2 / DeepSpeed model itself
    try:
        seconds = int(collective_timeout_s or DEFAULT_COLLECTIVE_TIMEOUT_S)
        acc = Accelerator(cpu=cpu, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=seconds))])
        _TIMEOUT.setdefault("s", seconds)  # the first accelerator started the process group
    finally:
        os.environ.update(hidden)
    ds = getattr(acc.state, "deepspeed_plugin", None)
    if acc.distributed_type == DistributedType.FSDP or (ds is not None and getattr(ds, "zero_stage", 0) == 3):
        raise NotImplementedError(f"{command} samples from the current policy, which needs whole parameters: "
                                  "use DDP or DeepSpeed ZeRO-1/2 (FSDP and ZeRO-3 shard them)")
    return acc


def leave_process_group() -> None:
    """End a torchrun launch's process group once the command is done, on every process.

    Why: left to interpreter exit, gloo's teardown races its own worker threads. A data-parallel
    ``pofe label`` that had finished and written everything aborted there once in a full test run
    (rank 1: "terminate called without an active exception", SIGABRT, so torchrun reported
    failure), and ``pofe online`` could hang at exit. Not when in-process vLLM engines exist:
    under torchrun they build their groups on this one and tear them down at exit, which fails
    once it is destroyed (then their teardown ends it).
    """
    import os
    import sys

    import torch.distributed as dist

    engines = getattr(sys.modules.get("pofe.generation.vllm"), "_POOL", None)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and dist.is_available() and dist.is_initialized() and not engines:
        # Every process first: a process that tears its connections down while a peer is still
        # in its last collective is the race above (it happened again, to a finished data-parallel
        # ``pofe audit``, after the group was ended without this barrier). It cannot hang: a
        # process that failed makes torchrun stop the others.
        dist.barrier()
        dist.destroy_process_group()


def gather(acc, obj) -> list:
    """Objects from all processes (a list with one entry per process)."""
    if acc.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object

    return gather_object([obj])


def reduce_sum(acc, x: float) -> float:
    """Sum of a number over processes."""
    if acc.num_processes == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=acc.device)
    return float(acc.reduce(t, reduction="sum").item())


def weights_digest(model) -> str:
    """sha256 of the trainable weights (to check that data-parallel copies agree)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def weights_identical(acc, model) -> bool | None:
    """Whether every process ended with the same trainable weights (None with one process);
    a difference is logged as an error (gradients are all-reduced, so it is a bug)."""
    if acc.num_processes == 1:
        return None
    digests = gather(acc, weights_digest(model))
    if len(set(digests)) != 1:
        log.error("processes ended with different weights: %s", digests)
    return len(set(digests)) == 1


@dataclass(frozen=True)
class DataParallel:
    """This process's part of a data-parallel step (one process: ``DataParallel()``, every
    method the identity).

    Every process takes a contiguous block of the step's global batch (:meth:`shard`); the loss
    is normalised by the *global* count (:meth:`sum`) and the summed gradients are all-reduced
    (:meth:`all_reduce_grads`) before clipping, so each process holds the gradient of the
    global-batch loss -- the gradient a single process computes on the whole batch, up to the
    order of float sums. Per-item results come back in input order (:meth:`cat`).

    Why not DDP's wrapper (as ``pofe online`` uses): it all-reduces inside ``backward`` and
    needs every process to run the same number of backward passes; shards of uneven size
    (11 examples on 2 processes) and steps where one process has nothing to train would then
    hang. One all-reduce after the backward passes has neither constraint."""

    acc: Any = None

    @property
    def rank(self) -> int:
        return 0 if self.acc is None else self.acc.process_index

    @property
    def world(self) -> int:
        return 1 if self.acc is None else self.acc.num_processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Whether the trained model is sharded over the processes (FSDP2, :mod:`pofe.runtime.sharding`):
        its gradients are reduce-scattered in ``backward``, and every process must run the same
        number of forward/backward passes."""
        from pofe.runtime.sharding import active

        return self.acc is not None and (active(self.world) or self.zero)

    @property
    def zero(self) -> bool:
        """Whether the model trains under DeepSpeed ZeRO (:mod:`pofe.runtime.zero`; also
        :attr:`sharded`): the engine reduces the gradients in ``backward`` and clips them in its step."""
        from pofe.runtime import zero

        return self.acc is not None and zero.active(self.world)

    @property
    def sharding(self) -> str | None:
        """The sharding this run trains with (``"FSDP2"``, ``"DeepSpeed ZeRO-3"``, ...), or None."""
        from pofe.runtime.guards import requested_sharding

        return requested_sharding() if self.sharded else None

    @property
    def device(self):
        """The accelerator's device for this process (None with one process and no accelerator)."""
        return None if self.acc is None else self.acc.device

    def bounds(self, n: int) -> tuple[int, int]:
        """This process's block of ``n`` items: sizes differ by at most one, blocks in rank order."""
        q, r = divmod(n, self.world)
        lo = self.rank * q + min(self.rank, r)
        return lo, lo + q + (self.rank < r)

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's contiguous block of ``items`` (concatenated in rank order they are ``items``)."""
        lo, hi = self.bounds(len(items))
        return list(items[lo:hi])

    def sum(self, x: float) -> float:
        """``x`` summed over processes."""
        return float(x) if self.world == 1 else reduce_sum(self.acc, x)

    def cat(self, values: Sequence[T]) -> list[T]:
        """Every process's ``values`` concatenated in rank order (picklable items)."""
        if self.world == 1:
            return list(values)
        return [v for part in gather(self.acc, list(values)) for v in part]

    def map(self, fn: Callable[[list[T]], Sequence[R]], items: Sequence[T]) -> list[R]:
        """``fn`` on this process's block of ``items`` (:meth:`shard`), and every block's results on
        every process in input order (:meth:`cat`): the one "shard, compute, gather" of the
        labelling commands (judge verdicts, sampled pairs, revisions, eval responses). ``fn`` takes
        a list and returns one result per item; an empty block is not computed (a judge is never
        called on nothing, a model never loaded for nothing). A collective: every process calls it."""
        mine = self.shard(items)
        out = list(fn(mine)) if mine else []
        if len(out) != len(mine):
            raise RuntimeError(f"{len(out)} results for {len(mine)} items on process {self.rank}")
        return self.cat(out)

    def from_main(self, obj: T) -> T:
        """Rank 0's ``obj`` on every process (what only rank 0 reads: the run folder it owns). A
        collective: every process calls it (the others' ``obj`` is ignored)."""
        if self.world == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=0)[0]

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients over processes (one flat buffer per dtype and device). A parameter
        without a gradient here (a process whose shard was empty) contributes zeros. Nothing under
        sharding: FSDP2 has summed them in each ``backward`` (reduce-scatter)."""
        if self.world == 1 or self.sharded:
            return
        import torch.distributed as dist

        groups: dict[tuple, list[torch.nn.Parameter]] = {}
        for p in params:
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                groups.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for ps in groups.values():
            flat = torch.cat([p.grad.reshape(-1) for p in ps])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            at = 0
            for p in ps:
                n = p.grad.numel()
                p.grad.copy_(flat[at:at + n].view_as(p.grad))
                at += n

    def lockstep(self, model, mine: int, *, pad_token_id: int) -> None:
        """Under sharding, called before this process's ``mine`` forward/backward passes of the step:
        zero-weight passes so that it runs as many as the process with the most (every process
        calls it, before any pass: the count is itself a collective). Without sharding nothing:
        the gradients are all-reduced once, after the passes."""
        if not self.sharded:
            return
        from pofe.runtime.sharding import dummy_backward, lockstep_passes

        for _ in range(lockstep_passes(self.acc, mine) - mine):
            dummy_backward(model, pad_token_id, self.device)

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
        """Clip to ``max_norm``; returns the pre-clip norm of the whole gradient (with sharded
        gradients, every process's shards together). Under ZeRO nothing and None: DeepSpeed clips
        in its step (:func:`stepped_grad_norm` reads the norm after it)."""
        if self.zero:
            return None
        from pofe.runtime.sharding import clip_grad_norm

        return clip_grad_norm(params, max_norm)

    def wait(self) -> None:
        if self.world > 1:
            self.acc.wait_for_everyone()


def stepped_grad_norm(optimizer, norm: float | None) -> float | None:
    """The pre-clip gradient norm of the step just taken: DeepSpeed's own under ZeRO (it clips
    inside ``optimizer.step()``, :class:`pofe.runtime.zero.ZeroOptimizer`), else ``norm`` (the
    one :meth:`DataParallel.clip_grad_norm` returned before the step)."""
    from pofe.runtime.zero import ZeroOptimizer

    return optimizer.grad_norm if isinstance(optimizer, ZeroOptimizer) and norm is None else norm


def launched(device: str = "auto", *, command: str, collective_timeout_s: int | None = None) -> DataParallel:
    """The :class:`DataParallel` of a command that runs outside the driver (``pofe eval``, ``pofe
    audit``): an accelerator when launched with ``WORLD_SIZE > 1`` (torchrun, accelerate launch),
    else one process with nothing distributed set up. Call it before any model loads: the
    accelerator picks this process's GPU, which ``device: auto`` then resolves to."""
    from pofe.runtime.guards import world_size

    if world_size() <= 1:
        return DataParallel()
    return DataParallel(make_accelerator(device, command=command, collective_timeout_s=collective_timeout_s))


def merge_metrics(parts: Sequence[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """One metrics dict from every process's ``(dict, weight)``: counts (ints) summed, rates and
    means (floats) averaged with the weights (each process's number of items), nested dicts and
    equal-length lists merged the same way entry by entry, None ignored, anything else taken
    from the first process."""
    if len(parts) == 1:
        return dict(parts[0][0])
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for d, _ in parts for k in d):
        vals = [(d[key], w) for d, w in parts if d.get(key) is not None]
        if not vals:
            out[key] = None
        elif all(isinstance(v, dict) for v, _ in vals):
            out[key] = merge_metrics(vals)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v, _ in vals):
            out[key] = sum(v for v, _ in vals)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v, _ in vals):
            total = sum(w for _, w in vals)
            out[key] = sum(v * w for v, w in vals) / total if total else vals[0][0]
        elif all(isinstance(v, list) and len(v) == len(vals[0][0]) for v, _ in vals):  # a distribution: per entry
            out[key] = [merge_metrics([({"x": v[i]}, w) for v, w in vals])["x"] for i in range(len(vals[0][0]))]
        else:
            out[key] = vals[0][0]
    return out
