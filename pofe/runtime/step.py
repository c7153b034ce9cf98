"""The optimiser step every training command takes: the one place in pofe that calls
``optimizer.step()``.

A command computes its loss and backpropagates it (the sft, rm, rl and DAP passes); what
follows is the same for all of them and lives here, in this order:

1. gradient sync across processes (``DataParallel.all_reduce_grads``; nothing for the DDP
   wrapper of ``pofe online``, whose backward already averaged them);
2. the finite-loss check on the loss of the whole step (every process's), before clipping and
   before the optimiser touches a weight: a NaN loss stops the run naming the step, and the
   last checkpoint on disk stays finite (:func:`pofe.runtime.guards.check_finite`);
3. clipping (DeepSpeed ZeRO clips inside its own step, so the norm is read after it);
4. ``optimizer.step()``, the learning-rate schedule, and ``zero_grad`` for the next step.

A step with nothing to train anywhere (an online step whose pairs were all dropped) skips 2-4's
optimiser update but still advances the schedule, so the learning rate stays a function of the
step number and a resumed run matches an uninterrupted one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from pofe.runtime.guards import check_finite
from pofe.runtime.parallel import DataParallel, stepped_grad_norm


@dataclass(frozen=True)
class Stepped:
    """What a step reports: the learning rate it used and the pre-clip gradient norm (None when
    not clipped or nothing was trained)."""

    lr: float
    grad_norm: float | None


def optimizer_step(optimizer, scheduler, params: Iterable[torch.nn.Parameter], *, losses: Mapping[str, object],
                   step: int, grad_clip: float | None = None, dp: DataParallel | None = None,
                   clip: Callable[[list[torch.nn.Parameter], float], float | None] | None = None,
                   trained: bool = True) -> Stepped:
    """Sync, check, clip, step and schedule (module docstring). ``losses`` maps what was trained
    (``""`` for the step as a whole, ``"pair 17"``) to its loss, a float or a tensor; every
    entry is checked and the first non-finite one names the step and itself in the error.
    Callers pass losses that are the same on every process (all-reduced) where they can, so
    every process stops together. ``dp`` all-reduces the gradients (None: already synced);
    ``clip`` overrides ``dp.clip_grad_norm`` (accelerate's clip for the DDP wrapper)."""
    params = [p for p in params if p.requires_grad]
    lr = scheduler.get_last_lr()[0]
    grad_norm = None
    if trained:
        if dp is not None:
            dp.all_reduce_grads(params)
        for detail, loss in losses.items():
            check_finite(loss, step=step, detail=detail)
        if grad_clip:
            clip = clip if clip is not None else (dp or DataParallel()).clip_grad_norm
            grad_norm = clip(params, grad_clip)
        optimizer.step()
        if grad_clip:
            grad_norm = stepped_grad_norm(optimizer, grad_norm)  # ZeRO: DeepSpeed clipped in its step
    with warnings.catch_warnings():  # a step that skipped optimizer.step() still advances the schedule
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return Stepped(lr=lr, grad_norm=None if grad_norm is None else float(grad_norm))
