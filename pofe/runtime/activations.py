"""Fewer saved activations in a training forward, with the same numbers.

In a bf16-autocast forward of a Llama-family decoder most of the memory the backward keeps is
not in the matmuls but around them (SmolLM2-135M, 4 bar pairs, ~640 tokens: ~1.0 GB saved for
the backward, ~1.6 MB per token):

* each RMSNorm keeps its fp32 input *and* its fp32 normalised value;
* SwiGLU keeps ``silu(gate)`` besides ``gate`` and ``up``;
* eager attention keeps k and v repeated to every query head, the fp32 softmax and its cast
  (the bar's response pass: ~5.2 MB per layer, where q, the unrepeated k and v and the masked
  scores before the mask is added, ~2.0 MB, are enough).

:func:`lean_activations` runs those pieces as autograd functions that keep only their
inputs and recompute the elementwise rest in the backward (no matmul is recomputed; the
attention's softmax and its inputs' repetition are). Their
backward replays the formulas autograd would apply to the original ops, kernel for kernel: the
losses are bitwise equal and the gradients equal up to the order fp32 sums a tensor's
contributions (<= 5e-7 of each gradient's largest entry; ``tests/runtime/test_activations.py``). Explicit
functions rather than ``torch.utils.checkpoint``: the checkpoint machinery cost ~0.13 s per bar
policy pass on 2 CPU cores (~180 regions a pass). On the bar benchmark's policy pass it lowers
the peak RSS by ~0.18 GB (benchmarks/online-notes.md).

Not done, on purpose: casting a norm's output to bf16 once inside it (autocast casts it once per
projection that reads it, q/k/v and gate/up, and saves each copy) would save ~0.1 GB more, but
the gradients of those projections would then be summed in bf16 on that one tensor instead of
in fp32 after each cast's backward: measured 2e-3 relative on the tied embedding's gradient.

Only module classes whose forward is known are touched (Llama's RMSNorm, gated MLP and eager
attention function, which Qwen2, Mistral and SmolLM share verbatim), and only once a probe has
shown the installed code still computes what the replacement computes (the attention: its output
and all three input gradients bit for bit); anything else runs as before. It is a no-op without
gradients, for modules in eval mode, for sharded models (FSDP2 / ZeRO-3 gather a module's
parameters around its own call, and a recompute in the backward would bypass that), and under
the model's own gradient checkpointing.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from pofe.runtime.precision import checkpointing, hf_model, sharded

# Classes whose forward is, verbatim, Llama's (transformers 5.x): ``weight * norm(x.float()).to(x.dtype)``
# and ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``.
_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"})
_MLPS = frozenset({"LlamaMLP", "Qwen2MLP", "MistralMLP"})
# Attention classes whose modeling module's ``eager_attention_forward`` is, verbatim, Llama's.
_ATTENTIONS = frozenset({"LlamaAttention", "Qwen2Attention", "MistralAttention"})


class _SwiGLU(torch.autograd.Function):
    """``silu(gate) * up`` saving ``gate`` and ``up`` only. The backward is autograd's own for the
    two ops (MulBackward0, then SiluBackward0 on ``grad * up``)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    @once_differentiable  # the replayed formulas are not themselves recorded: no double backward
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = grad * F.silu(gate) if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up


class _RMSNorm(torch.autograd.Function):
    """Llama's RMSNorm, ``w * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)``, saving ``x`` and ``w``
    only (autograd would also keep the fp32 normalised value). The backward recomputes the
    normalisation and replays, op for op, the formulas autograd applies to the forward's graph
    (derivatives.yaml: mul, rsqrt ``-0.5 * grad * result^3``, mean ``expand / n``, pow
    ``grad * (2 * x^1)``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        x32 = x.to(torch.float32)
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    @staticmethod
    @once_differentiable  # the replayed formulas are not themselves recorded: no double backward
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        x32 = x.to(torch.float32)
        r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + ctx.eps)
        normed = (x32 * r).to(x.dtype)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad * normed).sum(dim=tuple(range(grad.dim() - weight.dim()))).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_n = (grad * weight).to(x.dtype).to(torch.float32)  # through the forward's cast back to x.dtype
            grad_r = (grad_n * x32).sum(-1, keepdim=True)
            grad_sq = ((-0.5 * grad_r) * r.pow(3)).expand(x32.shape) / x32.shape[-1]
            grad_x = (grad_n * r + grad_sq * (2.0 * x32.pow(1.0))).to(x.dtype)
        return grad_x, grad_w, None


def _repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: (b, kv heads, s, d) -> (b, kv heads * n, s, d)."""
    if n == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class _EagerAttention(torch.autograd.Function):
    """Llama's eager attention, ``softmax(q k^T * scaling + mask, fp32).to(q.dtype) v`` with k and v
    repeated to every query head, saving q, the unrepeated k and v, and the scores before the mask
    (the mask is one tensor shared by every layer). The backward recomputes the repetition and the
    softmax and replays autograd's formulas for the graph the original records (derivatives.yaml:
    bmm, ``_softmax_backward_data``, the casts, mul by the scale, expand's sum): input gradients
    bit for bit those of the original (checked by :func:`_attention_agrees` before use)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scaling: float, n_rep: int):
        ctx.dtypes = (query.dtype, key.dtype, value.dtype)
        if torch.is_autocast_enabled(query.device.type):
            # what autocast's matmuls would cast them to (q and k come out of RoPE in fp32): the casts are
            # what the original saves, and the gradients flow back through them (to() -> to() back)
            low = torch.get_autocast_dtype(query.device.type)
            query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
        k, v = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
        scores = torch.matmul(query, k.transpose(2, 3)) * scaling
        x = scores + mask if mask is not None else scores
        ctx.save_for_backward(query, key, value, scores, mask)
        ctx.scaling, ctx.n_rep, ctx.x_dtype = scaling, n_rep, x.dtype
        return torch.matmul(F.softmax(x, dim=-1, dtype=torch.float32).to(query.dtype), v)

    @staticmethod
    @once_differentiable  # the replayed formulas are not themselves recorded: no double backward
    def backward(ctx, grad: torch.Tensor):
        query, key, value, scores, mask = ctx.saved_tensors
        n = ctx.n_rep
        k, v = _repeat_kv(key, n), _repeat_kv(value, n)
        p32 = F.softmax(scores + mask if mask is not None else scores, dim=-1, dtype=torch.float32)
        grad_v = p32.to(query.dtype).transpose(-1, -2).matmul(grad)
        grad_x = torch._softmax_backward_data(grad.matmul(v.transpose(-1, -2)).to(torch.float32), p32, -1,
                                              torch.float32)
        grad_s = grad_x.to(ctx.x_dtype).to(scores.dtype) * ctx.scaling  # the mask's add, then the scale
        # back through autocast's casts (a no-op without autocast), which the original applies to the
        # *repeated* k and v: their heads are summed after the cast, in the inputs' dtype
        grad_q = grad_s.matmul(k).to(ctx.dtypes[0])
        grad_k = query.transpose(-1, -2).matmul(grad_s).transpose(-1, -2).to(ctx.dtypes[1])
        grad_v = grad_v.to(ctx.dtypes[2])
        if n > 1:  # repeat_kv's expand: its gradient is the sum over the repeated heads
            b, h, sk, d = key.shape
            grad_k = grad_k.reshape(b, h, n, sk, d).sum(2)
            grad_v = grad_v.reshape(b, h, n, sk, d).sum(2)
        return grad_q, grad_k, grad_v, None, None, None


def _lean_eager(orig):
    """A stand-in for a modeling module's ``eager_attention_forward`` (same signature) that runs
    :class:`_EagerAttention` when a training forward needs gradients, ``orig`` otherwise. It returns
    no attention probabilities (nothing in a training forward reads them)."""

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if not (_active(module) and dropout == 0.0 and (query.requires_grad or key.requires_grad
                                                        or value.requires_grad)):
            return orig(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        out = _EagerAttention.apply(query, key, value, attention_mask, scaling, module.num_key_value_groups)
        return out.transpose(1, 2).contiguous(), None

    eager_attention_forward.pofe_original = orig
    return eager_attention_forward


_ATT_AGREES: dict[tuple, bool] = {}


def _attention_agrees(modeling: types.ModuleType) -> bool:
    """Whether ``modeling.eager_attention_forward`` computes what :class:`_EagerAttention` computes:
    output and the gradients of q, k and v bit for bit on random fp32 inputs (4 query heads over 2
    KV heads, a padding mask), with a private RNG, under the current CPU autocast. Checked once per
    modeling module and autocast dtype."""
    cast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    name = (modeling.__name__, cast)  # checked under the autocast the forwards will run in
    if name not in _ATT_AGREES:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(*shape, generator=g) for shape in ((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)))
        mask = torch.zeros(2, 1, 3, 5)
        mask[0, :, :, :2] = torch.finfo(torch.float32).min
        grad = torch.randn(2, 3, 4, 8, generator=g)
        stand_in = types.SimpleNamespace(num_key_value_groups=2, training=True)
        try:
            with torch.enable_grad():
                results = []
                for run in (lambda *a: modeling.eager_attention_forward(stand_in, *a, scaling=0.35)[0],
                            lambda *a: _EagerAttention.apply(*a, 0.35, 2).transpose(1, 2).contiguous()):
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    out = run(*leaves, mask)
                    out.backward(grad)
                    results.append([out.detach()] + [t.grad for t in leaves])
            _ATT_AGREES[name] = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(*results))
        except Exception:  # any surprise in the function: leave it alone
            _ATT_AGREES[name] = False
    return _ATT_AGREES[name]


def _active(module: torch.nn.Module) -> bool:
    return module.training and torch.is_grad_enabled()


class _LeanNorm:
    """Mixed in front of a known RMSNorm class for the duration of :func:`lean_activations`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _active(self):
            return type(self).__mro__[2].forward(self, x)  # mro: Lean subclass, _LeanNorm, original
        return _RMSNorm.apply(x, self.weight, self.variance_epsilon)


class _LeanMLP:
    """Mixed in front of a known gated-MLP class for the duration of :func:`lean_activations`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _active(self):
            return type(self).__mro__[2].forward(self, x)
        return self.down_proj(_SwiGLU.apply(self.gate_proj(x), self.up_proj(x)))


def _swiglu_mlp(module) -> bool:
    return type(module.act_fn).__name__ in ("SiLU", "SiLUActivation")


_LEAN: dict[type, type] = {}
_AGREES: dict[type, bool] = {}


def _lean_class(cls: type) -> type | None:
    if cls not in _LEAN:
        mixin = _LeanNorm if cls.__name__ in _NORMS else _LeanMLP if cls.__name__ in _MLPS else None
        _LEAN[cls] = None if mixin is None else type(f"Lean{cls.__name__}", (mixin, cls), {"__module__": __name__})
    return _LEAN[cls]


@torch.no_grad()
def _agrees(module: torch.nn.Module, lean: type) -> bool:
    """Whether ``lean``'s forward gives ``module``'s own output, bit for bit, on a random input.

    Why: the class names say the forward is Llama's in the transformers this was written against;
    a later release (or a kernel swapped into the class) could change it, and the switch must then
    not happen rather than compute the old formula. Checked once per class, in eval mode (a LoRA
    projection's dropout would otherwise make two calls differ)."""
    cls = type(module)
    if cls not in _AGREES:
        norm = lean.__mro__[1] is _LeanNorm
        weight = module.weight if norm else module.gate_proj.weight  # (hidden,) or (intermediate, hidden)
        x = torch.randn(3, weight.shape[-1], dtype=torch.float32 if norm else weight.dtype, device=weight.device,
                        generator=torch.Generator(weight.device).manual_seed(0))  # the run's own RNG stream untouched
        was = module.training
        module.eval()
        try:
            own = cls.forward(module, x)
            ours = (_RMSNorm.apply(x, module.weight, module.variance_epsilon) if norm
                    else module.down_proj(_SwiGLU.apply(module.gate_proj(x), module.up_proj(x))))
            _AGREES[cls] = bool(own.dtype == ours.dtype and torch.equal(own, ours))
        except Exception:  # any surprise in the class: leave it alone
            _AGREES[cls] = False
        finally:
            module.train(was)
    return _AGREES[cls]


@contextlib.contextmanager
def lean_activations(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, known norms and MLPs of ``model`` save less for the backward (see the
    module docstring); yields how many modules were switched. The backward may run after the
    block: the autograd functions recorded in the graph do not depend on the switch."""
    swapped: list[tuple[torch.nn.Module, type]] = []
    patched: list[tuple[types.ModuleType, object]] = []
    # With the model's own gradient checkpointing the layers' activations are recomputed already.
    if not (sharded(model) or checkpointing(hf_model(model))):
        for m in model.modules():
            lean = _lean_class(type(m))
            if lean is not None and (lean.__mro__[1] is not _LeanMLP or _swiglu_mlp(m)) and _agrees(m, lean):
                swapped.append((m, type(m)))
                m.__class__ = lean
            if type(m).__name__ in _ATTENTIONS:
                # The attention's forward looks its eager function up in its modeling module at each
                # call: that global is switched (only while the block runs; the stand-in falls back to
                # the original without gradients, so another model's no-grad forward is unchanged).
                modeling = sys.modules.get(type(m).__module__)
                own = getattr(modeling, "eager_attention_forward", None)
                if own is not None and not hasattr(own, "pofe_original") and _attention_agrees(modeling):
                    patched.append((modeling, own))
                    modeling.eager_attention_forward = _lean_eager(own)
    try:
        yield len(swapped)
    finally:
        for m, cls in swapped:
            m.__class__ = cls
        for modeling, own in patched:
            modeling.eager_attention_forward = own


@contextlib.contextmanager
def sparse_tied_embedding(model: torch.nn.Module) -> Iterator[bool]:
    """Within the block, the input embedding of a model whose LM head shares its weight (SmolLM2,
    Llama 3.2, Qwen2.5 small) back-propagates a sparse gradient (rows of the looked-up tokens);
    yields whether it was switched. Only for a forward that also runs the LM head.

    Why: a dense embedding backward zero-fills a vocabulary x hidden fp32 tensor, scatters the
    tokens' rows into it and is then added to the LM head's gradient (SmolLM2: 113 MB written
    twice and read twice, ~30 ms a bar policy pass on 2 CPU cores). Sparse, autograd adds the
    rows into the head's dense gradient in place, so the weight's gradient is still one dense
    tensor (what the fused AdamW needs), equal up to the order its fp32 sums run. Not for DDP or
    sharded models (their gradient hooks and buckets expect dense tensors), nor when the weight
    is frozen or untied (a sparse gradient alone would reach the optimiser)."""
    base = hf_model(model)
    emb = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    on = (type(emb) is torch.nn.Embedding and head is not None and getattr(head, "weight", None) is emb.weight
          and emb.weight.requires_grad and not emb.sparse and torch.is_grad_enabled()
          and not isinstance(model, torch.nn.parallel.DistributedDataParallel) and not sharded(model))
    if on:
        emb.sparse = True
    try:
        yield on
    finally:
        if on:
            emb.sparse = False
