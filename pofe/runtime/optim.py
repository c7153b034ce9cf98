"""Optimisers and learning-rate schedules (the ``optim:`` section of the training commands):
AdamW (fused where every parameter allows it) or Adafactor over the trainable parameters, and a
linear warm-up followed by a constant rate or a linear / cosine decay.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator

from pofe.config import NonNegativeFloat, NonNegativeInt, PofeConfig, PositiveFloat


class OptimConfig(PofeConfig):
    """Optimiser and schedule (OAIF Sec. 4.1: Adafactor, lr 5e-7, 150 warm-up steps)."""

    name: Literal["adamw", "adafactor"] = "adamw"
    """Optimiser."""
    lr: PositiveFloat = 5e-7
    """Peak learning rate (> 0)."""
    warmup_steps: NonNegativeInt = 150
    """Linear warm-up steps (>= 0)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """After warm-up: constant (OAIF), or linear / cosine decay to ``min_lr_ratio * lr``."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Floor of the decay as a fraction of lr, in [0, 1]."""
    weight_decay: NonNegativeFloat = 0.0
    """Decoupled weight decay (>= 0)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam moment coefficients, each in [0, 1)."""
    grad_clip: PositiveFloat | None = 1.0
    """Max global grad norm (> 0); null disables clipping."""

    @model_validator(mode="after")
    def _betas_in_range(self):
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must each be in [0, 1), got {list(self.betas)}")
        return self


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _bump_versions(opt, args, kwargs) -> None:
    torch.autograd.graph.increment_version([p for g in opt.param_groups for p in g["params"]])


def make_optimizer(model, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = trainable_parameters(model)
    if cfg.name == "adamw":
        # fused: one kernel over all tensors instead of a Python loop of ops per tensor. Same update up
        # to float rounding (tests/runtime/test_runtime_plumbing.py::test_fused_adamw_equals_the_per_tensor_update); on
        # this CPU a 128M-parameter step takes 0.034 s vs 0.245 s unfused (benchmarks/online-notes.md).
        fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused)
        if fused:
            # The fused kernel writes the parameters without bumping their version counters, which
            # is how an engine tells that the policy changed since its last sync
            # (pofe.generation.vllm.fingerprint): without this, a vLLM engine kept sampling the old
            # weights (tests/generation/test_vllm_online.py caught it).
            opt.register_step_post_hook(_bump_versions)
        return opt
    from transformers.optimization import Adafactor

    # relative_step=False so the configured lr is used (the paper sets lr explicitly).
    return Adafactor(params, lr=cfg.lr, relative_step=False, scale_parameter=False, warmup_init=False,
                     weight_decay=cfg.weight_decay)


def make_scheduler(optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warm = max(0, cfg.warmup_steps)

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if cfg.schedule == "constant" or total_steps <= warm:
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total_steps - warm))
        lo = cfg.min_lr_ratio
        if cfg.schedule == "linear":
            return lo + (1 - lo) * (1 - frac)
        return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * frac))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
