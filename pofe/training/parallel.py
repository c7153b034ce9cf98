"""Data-parallel plumbing shared by the training loops (accelerate): the accelerator, object
gathering and sums across processes, a weights digest to check that copies agree, and the
per-step seed.

Kept out of the loops so that a loop reads as its recipe (setup -> loop -> save).
"""

from __future__ import annotations

import hashlib
import logging

import torch

log = logging.getLogger(__name__)


def make_accelerator(device: str, *, command: str = "pofe online"):
    """An ``accelerate.Accelerator`` on ``model.device`` (CPU when asked or when no GPU is there). FSDP and
    ZeRO-3 are refused: sampling from the current policy needs the parameters whole, and a
    sharded generate would hang rather than fail."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    acc = Accelerator(cpu=cpu)
    ds = getattr(acc.state, "deepspeed_plugin", None)
    if acc.distributed_type == DistributedType.FSDP or (ds is not None and getattr(ds, "zero_stage", 0) == 3):
        raise NotImplementedError(f"{command} samples from the current policy, which needs whole parameters: "
                                  "use DDP or DeepSpeed ZeRO-1/2 (FSDP and ZeRO-3 shard them)")
    return acc


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


def step_seed(seed: int, step: int, rank: int) -> int:
    """Every step reseeds from (seed, step, rank): a resumed run samples exactly what the
    uninterrupted one did, and each process samples different responses."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()[:4], "little")


def sampling_seed(seed: int, step: int, rank: int) -> int:
    """The sampling seed a generator draws from torch's RNG right after
    ``seed_everything(step_seed(seed, step, rank))``, computed on a private generator: a step
    sampled ahead in a background thread (mode=async) must not touch the process-wide one."""
    g = torch.Generator().manual_seed(step_seed(seed, step, rank))
    return int(torch.randint(0, 2**31 - 1, (1,), generator=g).item())


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
