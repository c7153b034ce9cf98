"""Mixed precision: bf16 compute with fp32 master weights and optimiser state.

Why autocast and not ``model.to(bfloat16)``: the optimiser must update fp32 weights (a bf16
weight cannot represent an lr 5e-7 step on a value of ~1e-2), while the matmuls of the
forward and backward run in bf16, which on CPUs with AMX is ~3x the fp32 throughput
(shared/docs: 720 vs 223 GFLOP/s at 2 threads) and on GPUs is the default. Log-probs are
still reduced in fp32 (:func:`pofe.logprobs.selective_logprobs`).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

Precision = Literal["fp32", "bf16"]


def autocast(precision: Precision, device: torch.device | str | None = None):
    """Context manager for the forward (and so the backward) of policy and reference."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    kind = torch.device(device).type if device is not None else "cpu"
    return torch.autocast(device_type=kind, dtype=torch.bfloat16)
