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


EAGER_ATTENTION_BUDGET = 512 * 2**20
"""Bytes of attention weights (batch x heads x T^2 x layers, ~6 bytes each with the fp32 softmax)
that a bf16 CPU pass may keep for its backward with eager attention."""


def hf_model(model):
    """The transformers model inside DDP and PEFT wrappers (its config picks the attention)."""
    model = getattr(model, "module", model) if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def sharded(model) -> bool:
    """FSDP2-sharded or a DeepSpeed ZeRO engine: parameters are gathered around each module's own call."""
    from pofe.runtime.sharding import is_sharded
    from pofe.runtime.zero import is_engine

    return is_sharded(model) or is_engine(model)


def checkpointing(base) -> bool:
    """Whether the (unwrapped) transformers model trains with its own gradient checkpointing."""
    # transformers 5.24 renames is_gradient_checkpointing (deprecated) to is_activation_checkpointing
    name = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(base, name, False))


def eager_attention_pays(model, precision: Precision, device, batch: int, length: int) -> bool:
    """Whether a bf16 pass of ``batch`` sequences of ``length`` tokens on CPU should use eager
    (matmul + softmax) attention instead of SDPA.

    Why: PyTorch's CPU flash-attention backward is slow in bf16 at short lengths. On the bar
    benchmark's 8 sequences of ~90 tokens (SmolLM2-135M, 2 threads) it took 7.6 ms per layer, 0.22
    of the 1.44 s of a policy forward+backward, where eager's bmm took 0.04 s in all (1.44 -> 1.24 s;
    in fp32 the two are equal). Eager keeps the (batch, heads, T, T) weights for the backward, so
    only when that fits in :data:`EAGER_ATTENTION_BUDGET`."""
    if precision != "bf16" or torch.device(device).type != "cpu":
        return False
    cfg = getattr(hf_model(model), "config", None)
    heads, layers = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_hidden_layers", None)
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not heads or not layers:
        return False  # a user's own choice (flash, a kernel, eager already), or no way to size it
    return batch * heads * length * length * layers * 6 <= EAGER_ATTENTION_BUDGET


@contextlib.contextmanager
def attention_for(model, eager: bool):
    """Run the forwards inside with eager attention when ``eager`` (see :func:`eager_attention_pays`),
    then give the model back its own implementation. transformers reads the implementation at
    each forward (attention layers and mask alike), so the switch is consistent within a pass,
    and a backward after the block uses the graph the forward recorded."""
    base = hf_model(model)
    if not eager:
        yield
        return
    own = base.config._attn_implementation
    base.set_attn_implementation("eager")
    try:
        yield
    finally:
        base.set_attn_implementation(own)
