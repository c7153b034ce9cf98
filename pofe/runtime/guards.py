"""Guards every training loop shares: a non-finite loss stops the run before it is stepped or
checkpointed, commands that do not run data-parallel refuse ``WORLD_SIZE > 1``, and fault
injection points for the crash/resume suite."""

from __future__ import annotations

import math
import os
import signal
from typing import Any

from pofe.errors import PofeError


class NonFiniteLoss(PofeError, RuntimeError):
    """A NaN/inf loss. Raised before ``optimizer.step()`` and before any checkpoint, so the last
    checkpoint on disk stays finite (a NaN loss logged as ``null`` with a NaN checkpoint saved
    before the crash would make the crash unrecoverable). ``str(e)`` is one line naming the step and the pair."""

    exit_code = 1


def check_finite(loss: Any, *, step: int, detail: str = "") -> None:
    """Raise :class:`NonFiniteLoss` when ``loss`` (a float or a tensor of any shape) holds a NaN
    or inf. ``detail`` names what was being trained (e.g. ``pair 17 (prompt 'Why ...')``)."""
    if hasattr(loss, "detach"):
        import torch

        bad = not bool(torch.isfinite(loss.detach()).all())
        value = loss.detach().float().flatten()[0].item() if loss.numel() == 1 else "non-finite entries"
    else:
        bad = not math.isfinite(float(loss))
        value = loss
    if bad:
        where = f" on {detail}" if detail else ""
        raise NonFiniteLoss(f"non-finite loss ({value}) at step {step}{where}; stopped before the optimiser step "
                            f"and before any checkpoint (lower optim.lr or check the data)")


class NonFiniteWeights(PofeError, RuntimeError):
    """Weights that an optimiser step made NaN/inf (a finite loss with a diverging update, e.g.
    a far too large ``optim.lr``). Raised before such weights are checkpointed, so a resume
    never starts from them. ``str(e)`` is one line naming the step and a tensor."""

    exit_code = 1


def check_finite_weights(tensors: dict[str, Any], *, step: int) -> None:
    """Raise :class:`NonFiniteWeights` when any tensor of ``tensors`` (name -> tensor, e.g. the
    trainable state dict about to be checkpointed) holds a NaN or inf."""
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteWeights(f"non-finite weights ({name}) after step {step}: the update diverged; not "
                                   f"checkpointed, the last checkpoint on disk is from before it (lower optim.lr)")


class MultiProcessRefused(PofeError):
    """A command that does not run data-parallel was started with ``WORLD_SIZE > 1``."""

    exit_code = 2


class ShardingRefused(PofeError):
    """The launcher asked for sharding (FSDP, DeepSpeed ZeRO) that this command or config does not train with."""

    exit_code = 2


def requested_sharding(environ=None) -> str | None:
    """The parameter sharding an ``accelerate launch`` config asked for, read from the variables
    the launcher exports (``ACCELERATE_USE_FSDP``, ``FSDP_VERSION``, ``ACCELERATE_USE_DEEPSPEED``,
    ``ACCELERATE_DEEPSPEED_ZERO_STAGE``), or None. Read from the environment rather than from
    ``Accelerator.distributed_type`` because accelerate quietly drops FSDP and DeepSpeed when it
    runs on CPU (``MULTI_CPU``): the run would train replicated weights while the user believes
    they are sharded."""
    env = os.environ if environ is None else environ
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return f"FSDP{env.get('FSDP_VERSION', '1')}"
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        # every stage: ZeRO-1/2 keep whole parameters but partition the optimiser state (and
        # gradients), which a plain data-parallel run would silently not do
        return f"DeepSpeed ZeRO-{env.get('ACCELERATE_DEEPSPEED_ZERO_STAGE') or '?'}"
    return None


def refuse_sharding(command: str, environ=None) -> None:
    """Raise :class:`ShardingRefused` (one line, exit 2) when the launch asked for sharded
    parameters: every pofe training command keeps whole parameters on each process (data
    parallel), so running it would silently ignore the sharding and its memory saving."""
    kind = requested_sharding(environ)
    if kind is not None:
        raise ShardingRefused(f"{command} does not train sharded parameters ({kind} asked by the accelerate "
                              "config): launch it data-parallel (examples/accelerate/ddp-cpu.yaml, ddp-gpus.yaml)")


def require_launcher(command: str, environ=None) -> None:
    """Refuse ``WORLD_SIZE > 1`` without the rest of a launcher's environment (``RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``, which torchrun and accelerate launch set): a hand-set
    WORLD_SIZE would otherwise end in torch.distributed's own error deep inside accelerate."""
    env = os.environ if environ is None else environ
    n = env.get("WORLD_SIZE", "1") or "1"
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if n not in ("1", "0") and missing:
        raise MultiProcessRefused(f"{command}: WORLD_SIZE={n} is set but {', '.join(missing)} not: start several "
                                  "processes with torchrun or accelerate launch (README, 'GPUs and scale')")


def world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return 1


def require_single_process(command: str) -> None:
    """Refuse ``WORLD_SIZE > 1`` for a command that does not run data-parallel: under
    torchrun / accelerate launch it would otherwise run N independent copies (two
    run folders from ``pofe sft`` with 2 processes). Raises :class:`MultiProcessRefused` (the CLI
    exits 2 with its one line)."""
    n = world_size()
    if n > 1:
        raise MultiProcessRefused(f"pofe {command} does not run data-parallel; it was started with WORLD_SIZE={n} "
                                  f"(launch it as one process; the README's 'GPUs and scale' lists the commands that run data-parallel)")


def fault_point(name: str) -> None:
    """Fault injection for the crash/resume suite: ``POFE_FAULT=<name>`` sends SIGKILL to this
    process right here (no cleanup, no flush beyond what the loop already did); ``<name>:stop``
    sends it SIGSTOP instead (a process that stops answering without exiting, for the distributed
    timeout tests). ``POFE_FAULT_RANK=<r>`` limits either to the process of that ``RANK`` (torchrun
    gives every process the same environment). Loops call it at named points, e.g.
    ``fault_point(f"{step}:after_checkpoint")``; free when unset."""
    fault = os.environ.get("POFE_FAULT")
    if not fault or fault not in (name, f"{name}:stop"):
        return
    only = os.environ.get("POFE_FAULT_RANK")
    if only not in (None, "") and only != (os.environ.get("RANK") or "0"):
        return
    os.kill(os.getpid(), signal.SIGSTOP if fault.endswith(":stop") and fault != name else signal.SIGKILL)
