"""Sharded training (FSDP2, torch's ``fully_shard``): parameters, gradients and optimiser state
split across the processes, so a model whose weights and Adam state outgrow one device still
trains.

Asked for the way accelerate asks for it: ``accelerate launch --config_file
examples/accelerate/fsdp2.yaml`` exports ``ACCELERATE_USE_FSDP=true`` and ``FSDP_VERSION=2``; a
``torchrun`` launch sets the same two variables (:func:`pofe.runtime.guards.requested_sharding`
reads them). pofe shards the model itself, on CPU (gloo) and GPU alike, and builds a plain
data-parallel accelerator: accelerate drops FSDP on CPU without a word, and its own FSDP wrapping
would divide the gradients by the process count while pofe's losses are already normalised over
the global batch.

What changes under sharding (everything else is the data-parallel path of
:class:`pofe.runtime.parallel.DataParallel`):

* each decoder layer and then the root model is a ``fully_shard`` unit (:func:`shard_model`);
  gradients are *summed* in the reduce-scatter (divide factor 1), as pofe's own all-reduce sums
  them, and that all-reduce is skipped;
* every process runs the same number of forward/backward passes (each pass all-gathers and
  reduce-scatters): a process with fewer micro-batches runs zero-weight passes
  (:func:`lockstep_passes`);
* the gradient norm for clipping is the global one (:func:`clip_grad_norm`);
* checkpoints, ``final/`` and every weight push gather the full tensors (collectives, every
  process): the checkpoint is pofe's one format, and a sharded run resumes from it exactly; each
  process pushes the gathered weights to its own in-process vLLM engine
  (:func:`pofe.generation.vllm.hf_weights`).

LoRA trains sharded too (the adapter is split with its layers; checkpoints hold the adapter,
``final/`` the adapter and the merged model); a LoRA policy that samples pushes base + merged
adapter, gathered whole (``sampling.vllm.lora_sync=merged``).

DeepSpeed ZeRO (stages 1-3) is the other sharded path (:mod:`pofe.runtime.zero`); the refusals
below apply to it too. Refused with one line (exit 2) before any model loads
(:func:`refuse_unsupported`): FSDP1, commands that do not train, sampling from the sharded policy with transformers
``generate`` (``sampling.engine=hf``), which would need every process to call ``generate`` in
lockstep, a served engine (``vllm-server``), ``mode=async``, and a LoRA policy that would push
its adapter alone (``lora_sync`` other than ``merged``: the adapter file is written from the
sharded model).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from pofe.runtime.guards import ShardingRefused, requested_sharding

TRAINED_SHARDED = ("sft", "rm", "online", "rl")
"""Commands that train sharded parameters (the others refuse a sharded launch)."""


def active(world: int, environ=None) -> bool:
    """Whether this launch trains sharded parameters: FSDP2 asked and more than one process
    (one process has nothing to shard with)."""
    return requested_sharding(environ) == "FSDP2" and world > 1


def refuse_unsupported(command: str, cfg: Any, environ=None) -> None:
    """Raise :class:`ShardingRefused` (one line, exit 2) when the launch asks for sharding that
    ``command`` with ``cfg`` cannot train; called before any model loads."""
    kind = requested_sharding(environ)
    if kind is None:
        return
    name = f"pofe {command}"
    if kind == "FSDP1":
        raise ShardingRefused(f"{name}: FSDP1 is not supported; use FSDP2 (fsdp_version: 2, "
                              "examples/accelerate/fsdp2.yaml)")
    if kind != "FSDP2" and not kind.startswith("DeepSpeed ZeRO-"):
        raise ShardingRefused(f"{name} does not train with {kind}; use FSDP2 (examples/accelerate/fsdp2.yaml) "
                              "or launch it data-parallel (examples/accelerate/ddp-gpus.yaml)")
    env = os.environ if environ is None else environ
    if kind == "FSDP2" and env.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() in ("true", "1"):
        # transformers then loads the weights on rank 0 only (the others' would be empty) and
        # expects FSDP to broadcast them; pofe shards each process's own loaded copy
        raise ShardingRefused(f"{name}: fsdp_cpu_ram_efficient_loading is not supported (every process loads the "
                              "model, then shards it); set it to false in the accelerate config")
    if command not in TRAINED_SHARDED:
        raise ShardingRefused(f"{name} does not train sharded parameters ({kind} asked by the launcher): launch it "
                              "data-parallel (examples/accelerate/ddp-cpu.yaml, ddp-gpus.yaml)")
    if kind != "FSDP2":
        from pofe.runtime import zero

        zero.refuse_unsupported(name, kind, cfg, environ)
    model = getattr(cfg, "model", None)
    lora = model is not None and (getattr(model, "adapter", None) or getattr(getattr(model, "lora", None), "enabled", False))
    samples = command == "rl" or (command == "online" and getattr(cfg, "mode", "offline") != "offline")
    if lora and samples and cfg.sampling.vllm.lora_sync != "merged":
        raise ShardingRefused(f"{name}: a LoRA policy under {kind} pushes its weights merged (gathered whole); set "
                              f"sampling.vllm.lora_sync=merged (was {cfg.sampling.vllm.lora_sync})")
    if samples:
        engine = cfg.sampling.engine
        if engine == "hf":
            raise ShardingRefused(f"{name} under {kind} cannot sample with transformers generate "
                                  "(sampling.engine=hf): set sampling.engine to vllm or vllm-server")
        if engine != "vllm":
            raise ShardingRefused(f"{name} under {kind} pushes gathered weights to an in-process engine only: set "
                                  f"sampling.engine=vllm (was {engine}), or launch it data-parallel")
        if getattr(cfg, "mode", None) == "async":
            raise ShardingRefused(f"{name} under {kind}: mode=async samples in a background thread, out of step with "
                                  "the other processes' weight gathers; use mode=online or iterative")
    if getattr(getattr(cfg, "diagnostics", None), "offpolicy", False):
        raise ShardingRefused(f"{name} under {kind}: diagnostics.offpolicy scores each process's own pairs with the "
                              "sharded policy out of step with the others; set diagnostics.offpolicy=false")
    evaluation = getattr(cfg, "eval", None)
    if command == "online" and getattr(evaluation, "enabled", False):
        raise ShardingRefused(f"{name} under {kind}: eval.enabled samples the sharded policy with transformers "
                              "generate; set eval.enabled=false")


# ----------------------------------------------------------------------------- the model

def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of ``model``: modules whose class a transformers model names in
    ``_no_split_modules`` (the unit accelerate's TRANSFORMER_BASED_WRAP shards), outermost first."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: torch.nn.Module, *, mean: bool = False) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, head; tied
    weights stay one parameter of the root). Gradients are summed over processes, as pofe's own
    all-reduce sums them when each process's loss is divided by the *global* batch's count
    (sft, rm); ``mean``: averaged, as DDP's all-reduce averages them (``pofe online``, whose loss
    is divided by the pairs per process)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard

    layers = decoder_layers(model)
    if not layers:
        raise ShardingRefused(f"{type(model).__name__}: no decoder layers found to shard (FSDP2 needs a "
                              "transformers model naming its blocks in _no_split_modules)")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # a SUM then a division (gloo has neither PREMUL_SUM nor AVG)
            m.set_gradient_divide_factor(float(dist.get_world_size()) if mean else 1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model) -> bool:
    if model is None:
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules())


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every process calls it), else ``t``."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to ``max_norm`` and return the pre-clip norm of all gradients: with sharded gradients
    the norm of every process's shards together (torch computes it as a replicated DTensor)."""
    return float(full_tensor(torch.nn.utils.clip_grad_norm_(list(params), max_norm)))


def lockstep_passes(acc, mine: int) -> int:
    """The number of forward/backward passes every process runs this step: the most any process
    has (a collective). Under FSDP2 each pass all-gathers and reduce-scatters, so a process that
    stopped early would leave the others waiting."""
    if acc is None or acc.num_processes == 1:
        return mine
    import torch.distributed as dist

    t = torch.tensor([mine], dtype=torch.long, device=acc.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def dummy_backward(model, pad_token_id: int, device) -> None:
    """A forward/backward contributing exactly zero gradient that joins the collectives of one
    pass (``logits.sum() * 0``: every parameter on the path gets a zero gradient)."""
    ids = torch.full((1, 1), pad_token_id, dtype=torch.long, device=device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    logits = out.logits if hasattr(out, "logits") else out[0]
    (logits.float().sum() * 0.0).backward()


# ----------------------------------------------------------------------------- full state

def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model, names: set[str] | None = None, *, keep: bool = True) -> dict[str, torch.Tensor]:
    """The whole weights on CPU (those in ``names`` when given): a collective, every process
    all-gathers each tensor in turn; only a process that ``keep``s them (rank 0, which writes)
    holds the copy, the others get an empty dict."""
    sd: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if names is None or k in names:
            whole = full_tensor(v)
            if keep:
                sd[k] = whole.detach().cpu().clone()
    return sd


def plain_copy(model, *, main: bool):
    """An unsharded copy of ``model`` holding its whole weights on rank 0 (``main``), for
    ``final/`` (saved by the recipe's own ``save_final``); None on the other processes. Every
    process gathers (a collective). The copy is a new instance of the model's own class from its
    config, in the weights' dtype, with its generation config."""

    full = full_model_state(model, keep=main)
    if not main:
        return None
    dtype = next((v.dtype for v in full.values() if v.is_floating_point()), torch.float32)
    plain = _unsharded_twin(model).to(dtype)
    plain.load_state_dict(full, strict=True)
    if getattr(model, "generation_config", None) is not None:
        plain.generation_config = model.generation_config
    plain.eval()
    return plain


def _unsharded_twin(model):
    """A new, unsharded instance of ``model``'s architecture (its weights to be loaded): the
    transformers class from its config, and for a LoRA (peft) model the same adapter config on it."""
    from torch.distributed.fsdp import FSDPModule

    def plain_class(m):
        return next(c for c in type(m).__mro__ if not issubclass(c, FSDPModule))

    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        from peft import get_peft_model

        base = model.get_base_model()
        name, cfg = next(iter(model.peft_config.items()))
        return get_peft_model(plain_class(base)(base.config), cfg, adapter_name=name)
    return plain_class(model)(model.config)


def _fqns(model, optimizer) -> list[str]:
    """The parameter names in the optimiser's index order (the keys of ``optimizer.state_dict()``)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_optimizer_state(model, optimizer, *, keep: bool = True) -> dict[str, Any]:
    """``optimizer.state_dict()`` as one process would hold it unsharded (whole moment tensors,
    parameters by index): pofe's one checkpoint format, whatever the launch. A collective; only a
    process that ``keep``s it holds the whole tensors (the others get None)."""
    sd = optimizer.state_dict()
    state = {i: {k: full_tensor(v).detach().cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
             for i, s in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]} if keep else None


def load_full_state(model, sd: dict[str, torch.Tensor] | None, optimizer=None, osd: dict[str, Any] | None = None) -> None:
    """Load whole weights (and an optimiser state in :func:`full_optimizer_state`'s format) into
    the sharded ``model`` / ``optimizer``: each process keeps its shard."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    if sd:
        set_model_state_dict(model, sd, options=_options(strict=False))
    if optimizer is not None and osd is not None:
        names = _fqns(model, optimizer)
        state = {names[int(i)]: s for i, s in osd["state"].items()}
        groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in osd["param_groups"]]
        set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=_options())

