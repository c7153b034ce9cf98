"""Sharded training with DeepSpeed ZeRO (stages 1, 2 and 3): optimiser state (1), gradients (2)
and parameters (3) split across the processes.

Asked the way accelerate asks for it: ``accelerate launch --config_file
examples/accelerate/zero3.yaml`` (or ``zero2.yaml``) exports ``ACCELERATE_USE_DEEPSPEED=true`` and
``ACCELERATE_DEEPSPEED_ZERO_STAGE``; a ``torchrun`` launch sets the same two variables
(:func:`pofe.runtime.guards.requested_sharding`). As with FSDP2 (:mod:`pofe.runtime.sharding`,
whose refusals apply unchanged), pofe builds the engine itself, on CPU (gloo,
``DS_ACCELERATOR=cpu``) and GPU alike, from its own model and its own torch optimiser, on the
process group accelerate made: accelerate drops DeepSpeed on CPU without a word, and its own
``prepare`` would take over the micro-batching, the loss scaling and the schedule.

What changes (the driver swaps ``recipe.model`` / ``recipe.optimizer`` for the engine and a
:class:`ZeroOptimizer` after ``setup``; the loops stay as they are):

* forward passes go through the engine (ZeRO-3 gathers each module's parameters in hooks) and
  the loops' own ``loss.backward()`` is DeepSpeed's torch-style backward: gradients are reduced
  (stage 2/3: reduce-scattered) in each backward and accumulated until ``step``
  (``managed_gradient_accumulation: false``, so pofe's micro-batch loop stays pofe's);
* DeepSpeed *averages* gradients over the processes; where pofe's loss is normalised over the
  global batch and the gradients summed (sft, rm, rl), the gradient entering the backward is
  multiplied by the process count (:func:`initialize`, ``mean=False``);
* clipping is DeepSpeed's (``gradient_clipping`` = ``optim.grad_clip``, the global norm, the same
  formula as ``torch.nn.utils.clip_grad_norm_``); the logged norm is DeepSpeed's pre-clip one;
  pofe's learning-rate schedule still drives the optimiser's groups;
* every process runs the same number of forward/backward passes (each is a collective), as
  under FSDP2 (``DataParallel.lockstep``);
* checkpoints stay pofe's one format (whole weights and a torch ``AdamW`` state dict, rank 0
  writes): gathered with ``GatheredParameters`` and ``safe_get_full_optimizer_state``, restored
  with ``safe_set_full_*``; a ZeRO run resumes exactly from its own checkpoints and its
  checkpoints load anywhere. Weights held in bf16 (``model.dtype``) are updated through an fp32
  master copy of each partition (DeepSpeed's, where one plain process updates the bf16 weights
  themselves), and the checkpoint holds that fp32 copy.

LoRA trains under ZeRO too (checkpoints hold the adapter, ``final/`` the adapter and the merged
model); a LoRA policy that samples pushes base + merged adapter, gathered whole
(``sampling.vllm.lora_sync=merged``, as under FSDP2). Refused with one line (exit 2) besides
FSDP2's refusals: DeepSpeed not installed, a stage other than 1-3, an optimiser other than AdamW.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from pofe.runtime.guards import ShardingRefused, requested_sharding


def stage(environ=None) -> int | None:
    """The ZeRO stage the launcher asked for (1, 2, 3; 0 or another value as given), or None when
    DeepSpeed was not asked for."""
    kind = requested_sharding(environ)
    if kind is None or not kind.startswith("DeepSpeed ZeRO-"):
        return None
    try:
        return int(kind.rsplit("-", 1)[1])
    except ValueError:
        return -1


def active(world: int, environ=None) -> bool:
    """Whether this launch trains under ZeRO: a stage asked and more than one process (one process
    has nothing to partition with)."""
    return stage(environ) in (1, 2, 3) and world > 1


def refuse_unsupported(name: str, kind: str, cfg: Any, environ=None) -> None:
    """What a ZeRO launch refuses beyond FSDP2's refusals (one line, exit 2, before any model loads)."""
    s = stage(environ)
    if s not in (1, 2, 3):
        raise ShardingRefused(f"{name}: {kind} is not a ZeRO stage pofe trains with; set zero_stage to 1, 2 or 3 "
                              "(examples/accelerate/zero2.yaml, zero3.yaml), or launch it data-parallel")
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise ShardingRefused(f"{name}: {kind} asked but deepspeed is not installed (scripts/setup.sh installs "
                              "deepspeed 0.19.8); use FSDP2 (examples/accelerate/fsdp2.yaml)")
    optim = getattr(getattr(cfg, "optim", None), "name", "adamw")
    if optim != "adamw":  # checkpoints gather and restore Adam's moments (exp_avg, exp_avg_sq)
        raise ShardingRefused(f"{name}: optim.name={optim} is not trained under {kind}; set optim.name=adamw or use "
                              "FSDP2 (examples/accelerate/fsdp2.yaml)")


def _deepspeed():
    """``import deepspeed`` on the CPU accelerator when no CUDA device exists (DeepSpeed picks its
    accelerator once, at import)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


class ZeroOptimizer:
    """What the loops call on ``recipe.optimizer`` under ZeRO: ``step`` is the engine's (gradient
    reduction finalised, clipping, the wrapped torch optimiser's update), ``zero_grad`` a no-op
    (the engine clears after its step), ``param_groups`` the torch optimiser's (whose ``lr`` pofe's
    scheduler sets). ``grad_norm``: the pre-clip global norm of the last step."""

    def __init__(self, engine, inner: torch.optim.Optimizer, names: list[str], groups: list[dict[str, Any]]):
        self.engine, self.inner = engine, inner
        self.names = names
        """The trained parameters' names in the torch optimiser's index order (its state dict's keys)."""
        self.groups = groups
        """The torch optimiser's ``param_groups`` as indices (its state dict's), before DeepSpeed flattened them."""
        self.grad_norm: float | None = None

    @property
    def param_groups(self):
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        self.grad_norm = None if norm is None else float(norm)

    def state_dict(self):
        raise RuntimeError("a ZeRO optimiser's state is partitioned: use pofe.runtime.zero.full_optimizer_state")


def is_engine(model) -> bool:
    return any(c.__name__ == "DeepSpeedEngine" for c in type(model).__mro__)


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""module -> its engine: code that unwrapped the engine (accelerate's ``unwrap_model`` does) still
finds it, to gather the weights and to forward through its hooks."""


def engine_of(model):
    """The DeepSpeed engine of ``model`` (the engine itself, or the module it wraps), else None."""
    if model is None:
        return None
    if is_engine(model):
        return model
    try:
        return _ENGINES.get(model)
    except TypeError:  # not weak-referenceable: no engine
        return None


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, grad_clip: float | None,
               mean: bool = False):
    """The DeepSpeed engine over ``model`` with pofe's ``optimizer`` inside, and its
    :class:`ZeroOptimizer`. ``mean``: gradients averaged over the processes (DeepSpeed's own
    reduction, as DDP's; ``pofe online``); else summed (the loss of each process is already divided
    by the global batch's count): the gradient entering each backward is multiplied by the process
    count, which DeepSpeed's average then divides out."""
    import torch.distributed as dist

    ds = _deepspeed()
    by_id = {id(p): n for n, p in model.named_parameters()}
    names = [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]
    groups = optimizer.state_dict()["param_groups"]
    world = dist.get_world_size()
    config = {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        # pofe's loop owns the micro-batches: backward accumulates, step() is the boundary
        "managed_gradient_accumulation": False,
        "zero_optimization": {"stage": stage()}, "gradient_clipping": float(grad_clip or 0.0),
        "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = ds.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    _ENGINES[engine.module] = engine
    if not mean and world > 1:
        per_tensor = engine._backward_prologue_per_tensor  # DeepSpeed's own 1/gradient_accumulation_steps

        def summed(grad, _f=per_tensor, _w=float(world)):
            out = _f(grad)
            return out * _w if out is not None else out

        engine._backward_prologue_per_tensor = summed
    return engine, ZeroOptimizer(engine, optimizer, names, groups)


# ----------------------------------------------------------------------------- full state

def gathered(engine, params: list[torch.nn.Parameter], modifier_rank: int | None = None):
    """``params`` whole inside the block under ZeRO-3 (a collective; ``modifier_rank``: that
    process's changes are partitioned back on exit); nothing under ZeRO-1/2, whose parameters are whole."""
    ds = _deepspeed()
    return ds.zero.GatheredParameters(params, modifier_rank=modifier_rank, enabled=stage() == 3)


def full_model_state(engine, names: set[str] | None = None, *, keep: bool = True,
                     master: bool = False) -> dict[str, torch.Tensor]:
    """The whole trained weights on CPU (those in ``names`` when given), parameter by parameter (a
    collective under ZeRO-3: every process gathers); only a process that ``keep``s them holds the
    copy. ``master``: a trained parameter held in bf16/fp16 gives DeepSpeed's fp32 master copy
    instead (what the next step updates), so that a checkpoint resumes exactly; it still loads
    into the model's dtype anywhere."""
    from deepspeed.utils import safe_get_full_fp32_param

    sd: dict[str, torch.Tensor] = {}
    for n, p in engine.module.named_parameters():
        if names is None or n in names:
            if master and p.requires_grad and p.dtype != torch.float32:
                whole = safe_get_full_fp32_param(p)  # a collective, as the gather
                if keep:
                    sd[n] = whole.detach().cpu().clone().view(getattr(p, "ds_shape", p.shape))
                continue
            with gathered(engine, [p]):
                if keep:
                    sd[n] = p.detach().cpu().clone()
    return sd


def whole_weights(engine) -> list[tuple[str, torch.Tensor]]:
    """The engine's model as ``(name, tensor)`` in ``state_dict`` order and naming (a LoRA model:
    its base weights in HF naming, as :func:`pofe.generation.vllm.hf_weights`), every tensor whole
    (ZeRO-3: gathered parameter by parameter, a collective, every process keeps the copy): for the
    weight push to each process's own vLLM engine. Tied weights stay one tensor."""
    module = engine.module
    peft = hasattr(module, "peft_config") and hasattr(module, "get_base_model")
    out, seen = [], {}
    for k, v in (module.get_base_model() if peft else module).state_dict(keep_vars=True).items():
        if peft and ("lora_" in k or "modules_to_save" in k):  # a LoRA model's base, in HF naming
            continue
        if id(v) not in seen:
            with gathered(engine, [v] if hasattr(v, "ds_id") else []):
                seen[id(v)] = v.detach().clone()
        out.append((k.replace(".base_layer.", ".") if peft else k, seen[id(v)]))
    return out


def full_optimizer_state(optimizer: ZeroOptimizer, *, keep: bool = True) -> dict[str, Any] | None:
    """The torch optimiser's ``state_dict()`` as one unsharded process holds it (whole ``exp_avg`` /
    ``exp_avg_sq`` per parameter, by index; the step count): pofe's one checkpoint format. A
    collective."""
    from deepspeed.utils import safe_get_full_optimizer_state

    params = dict(optimizer.engine.module.named_parameters())
    steps = [s["step"] for s in optimizer.inner.state.values() if "step" in s]
    state: dict[int, dict[str, Any]] = {}
    for i, n in enumerate(optimizer.names):
        entry = {k: safe_get_full_optimizer_state(params[n], k) for k in ("exp_avg", "exp_avg_sq")}
        if keep and steps and all(v is not None for v in entry.values()):
            step = steps[0]
            shape = getattr(params[n], "ds_shape", params[n].shape)  # ZeRO-3: the placeholder is empty
            state[i] = {"step": step.detach().cpu().clone() if isinstance(step, torch.Tensor) else torch.tensor(float(step)),
                        **{k: v.detach().cpu().clone().view(shape) for k, v in entry.items()}}
    if not keep:
        return None
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.inner.param_groups]
    groups = [{**{k: h.get(k, g0[k]) for k in g0 if k != "params"}, "params": g0["params"]}
              for g0, h in zip(optimizer.groups, hyper)]
    return {"state": state, "param_groups": groups}


def load_full_state(engine, sd: dict[str, torch.Tensor] | None, optimizer: ZeroOptimizer | None = None,
                    osd: dict[str, Any] | None = None) -> None:
    """Load whole weights (and an optimiser state in :func:`full_optimizer_state`'s format) into
    the engine: each process keeps its partition of the weights, of their fp32 master copy and of
    the Adam moments; the step count and the groups' hyper-parameters are set on the torch
    optimiser. A collective (every process has read the same checkpoint)."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    params = dict(engine.module.named_parameters())
    for n, p in params.items():
        if sd and n in sd:
            with gathered(engine, [p], modifier_rank=0), torch.no_grad():
                p.data.copy_(sd[n].to(p.dtype).view_as(p.data))
            safe_set_full_fp32_param(p, sd[n].to(torch.float32))
    if optimizer is None or osd is None:
        return
    _adam_state(engine, optimizer.inner)
    step = None
    for i, s in osd["state"].items():
        p = params[optimizer.names[int(i)]]
        for k in ("exp_avg", "exp_avg_sq"):
            if k in s:
                safe_set_full_optimizer_state(p, s[k].to(torch.float32), k)
        step = s.get("step", step)
    if step is not None:
        for st in optimizer.inner.state.values():
            if "step" in st:
                if isinstance(st["step"], torch.Tensor):
                    st["step"].copy_(torch.as_tensor(step, dtype=st["step"].dtype))
                else:
                    st["step"] = float(step)
    for g, saved in zip(optimizer.inner.param_groups, osd["param_groups"]):
        g.update({k: v for k, v in saved.items() if k != "params" and k in g})


def _adam_state(engine, inner: torch.optim.Optimizer) -> None:
    """Create the torch AdamW state of every flat fp32 partition that has none yet, as AdamW's first
    step would (step 0, zero moments): a run resumed before its first step has nowhere to write the
    checkpoint's moments otherwise. ZeRO-3 puts its partitions in the optimiser's groups only
    during a step (``fp32_partitioned_groups_flat``); ZeRO-1/2 keep them there."""
    zo = engine.optimizer
    if hasattr(zo, "fp32_partitioned_groups_flat"):
        flat = [(p, inner.param_groups[zo.sub_group_to_group_id[i]]) for i, p in enumerate(zo.fp32_partitioned_groups_flat)]
    else:
        flat = [(p, g) for g in inner.param_groups for p in g["params"]]
    for p, g in flat:
        st = inner.state[p]
        if "exp_avg" not in st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if g.get("fused") else "cpu")
            for k in ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if g.get("amsgrad") else ())):
                st[k] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _twin(module):
    """A new instance of ``module``'s architecture (its weights to be loaded): the transformers
    class from its config, and for a LoRA (peft) model the same adapter config on it."""
    if hasattr(module, "peft_config") and hasattr(module, "get_base_model"):
        from peft import get_peft_model

        base = module.get_base_model()
        name, cfg = next(iter(module.peft_config.items()))
        return get_peft_model(type(base)(base.config), cfg, adapter_name=name)
    return type(module)(module.config)


def plain_copy(engine, *, main: bool):
    """An unsharded copy of the engine's model holding its whole weights on rank 0 (``main``), for
    ``final/``; None on the other processes. Every process gathers (a collective)."""
    module = engine.module
    full = full_model_state(engine, keep=main)
    if not main:
        return None
    buffers = {n: b.detach().cpu().clone() for n, b in module.named_buffers()}
    dtype = next((v.dtype for v in full.values() if v.is_floating_point()), torch.float32)
    plain = _twin(module).to(dtype)
    plain.load_state_dict({**buffers, **full}, strict=False)
    missing = set(dict(plain.named_parameters())) - set(full)
    if missing:
        raise RuntimeError(f"ZeRO plain copy: parameters not gathered: {sorted(missing)[:3]}")
    if getattr(module, "generation_config", None) is not None:
        plain.generation_config = module.generation_config
    plain.eval()
    return plain
