"""Fewer saved activations in a training forward, with the same numbers.

In a bf16-autocast forward of a Llama-family decoder most of the memory the backward keeps is
not in the matmuls but around them (SmolLM2-135M, 4 bar pairs, ~640 tokens: ~1.0 GB saved for
the backward, ~1.6 MB per token):

* each RMSNorm keeps its fp32 input *and* its fp32 normalised value;
* SwiGLU keeps ``silu(gate)`` besides ``gate`` and ``up``.

:func:`lean_activations` runs those two pieces under non-reentrant activation checkpointing,
which keeps only their inputs and recomputes the elementwise rest in the backward (no matmul is
recomputed). The forward and the backward run the same kernels on the same values as without
it, so losses and gradients are bitwise equal (``tests/training/test_activations.py``). On the
bar benchmark's policy pass it lowers the peak RSS by ~0.18 GB (benchmarks/online-notes.md).

Not done, on purpose: casting a norm's output to bf16 once inside it (autocast casts it once per
projection that reads it, q/k/v and gate/up, and saves each copy) would save ~0.1 GB more, but
the gradients of those projections would then be summed in bf16 on that one tensor instead of
in fp32 after each cast's backward: measured 2e-3 relative on the tied embedding's gradient.

Only module classes whose forward is known are touched (Llama's RMSNorm and gated MLP, which
Qwen2, Mistral and SmolLM share verbatim); anything else runs as before. It is a no-op without
gradients, for modules in eval mode, for sharded models (FSDP2 / ZeRO-3 gather a module's
parameters around its own call, and a recompute in the backward would bypass that), and under
the model's own gradient checkpointing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from pofe.training.precision import checkpointing, hf_model, sharded

# Classes whose forward is, verbatim, Llama's (transformers 5.x): ``weight * norm(x.float()).to(x.dtype)``
# and ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``.
_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"})
_MLPS = frozenset({"LlamaMLP", "Qwen2MLP", "MistralMLP"})


def _swiglu(act, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return act(gate) * up


def _active(module: torch.nn.Module) -> bool:
    return module.training and torch.is_grad_enabled()


class _LeanNorm:
    """Mixed in front of a known RMSNorm class for the duration of :func:`lean_activations`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = type(self).__mro__[2]  # the original class (mro: Lean subclass, _LeanNorm, original)
        if not _active(self):
            return base.forward(self, x)
        return checkpoint(base.forward, self, x, use_reentrant=False, preserve_rng_state=False)


class _LeanMLP:
    """Mixed in front of a known gated-MLP class for the duration of :func:`lean_activations`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _active(self):
            return type(self).__mro__[2].forward(self, x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(checkpoint(_swiglu, self.act_fn, gate, up, use_reentrant=False, preserve_rng_state=False))


_LEAN: dict[type, type] = {}


def _lean_class(cls: type) -> type | None:
    if cls not in _LEAN:
        mixin = _LeanNorm if cls.__name__ in _NORMS else _LeanMLP if cls.__name__ in _MLPS else None
        _LEAN[cls] = None if mixin is None else type(f"Lean{cls.__name__}", (mixin, cls), {"__module__": __name__})
    return _LEAN[cls]


@contextlib.contextmanager
def lean_activations(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, known norms and MLPs of ``model`` save less for the backward (see the
    module docstring); yields how many modules were switched. The backward may run after the
    block: each checkpoint holds the original forward it recomputes."""
    swapped: list[tuple[torch.nn.Module, type]] = []
    # With the model's own gradient checkpointing the layers' activations are recomputed already.
    if not (sharded(model) or checkpointing(hf_model(model))):
        for m in model.modules():
            lean = _lean_class(type(m))
            if lean is not None:
                swapped.append((m, type(m)))
                m.__class__ = lean
    try:
        yield len(swapped)
    finally:
        for m, cls in swapped:
            m.__class__ = cls
