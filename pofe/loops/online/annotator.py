"""The annotator of a DAP loop with online AI feedback (``pofe online``) and its evaluation
judge, and what they decide about pi_0's weights.

OAIF's annotator is frozen (Guo et al. 2024, Sec. 3): when it is an LLM with the initial
policy's own weights it *is* pi_0, so it shares the reference module (the frozen copy, or the
LoRA policy with its adapter disabled inside ``reference.model()``) and no third copy is
loaded. It is never the current policy (self-rewarding is another command). Sharing decides
two more things: whether mode=async may run the annotator in a background thread (not on
tensors the step trains or toggles), and whether the frozen reference may be cast to bf16
(only when nothing but bf16 passes reads it).

``cfg`` here is any loop config with ``model``, ``judge``, ``eval``, ``mode`` and ``train``
sections (``pofe.loops.online.OnlineConfig``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from pofe.judges.base import Capability, as_pairwise, has_capability
from pofe.judges.config import JudgeConfig
from pofe.judges.registry import build_judge
from pofe.models import same_model


def build_annotator(jcfg: JudgeConfig, *, cfg, reference, tokenizer):
    """The judge and the context its calls run in (``reference.model`` when it shares pi_0)."""
    # a transformers judge shares only weights of its own dtype; a vLLM judge has no dtype of its own
    # here (its engine's is jcfg.vllm.dtype) and reads pi_0's weights whatever their dtype
    if shares_pi0(jcfg, cfg):
        # cache_tag: these weights never change (pi_0), so the judge cache may reuse reads;
        # the cache fingerprint is a hash of the weights themselves, not the model's name.
        judge = build_judge(jcfg, model=reference.module, tokenizer=tokenizer, cache_tag="initial-policy")
        return as_pairwise(judge), reference.model
    return as_pairwise(build_judge(jcfg)), contextlib.nullcontext


def shares_pi0(jcfg: JudgeConfig, cfg) -> bool:
    """Whether :func:`build_annotator` hands this annotator the reference module (pi_0's weights)."""
    return (has_capability(jcfg, Capability.SHARES_WEIGHTS) and same_model(jcfg.model, cfg.model.name)
            and getattr(jcfg, "dtype", cfg.model.dtype) == cfg.model.dtype)


def computes_on_pi0_tensors(jcfg: JudgeConfig, cfg) -> bool:
    """A shared annotator that runs on pi_0's torch tensors: a transformers judge, or any judge of a
    LoRA policy (its context switches the adapter off on the policy itself). A vLLM judge of a
    full model reads the frozen copy's weights once into its engine."""
    return shares_pi0(jcfg, cfg) and (cfg.model.lora.enabled or jcfg.kind != "vllm")


def reads_pi0_in_bf16_only(jcfg: JudgeConfig, ctx, reference) -> bool:
    """Whether an annotator built by :func:`build_annotator` leaves pi_0's weights to bf16 passes:
    it does not share them (its context is not ``reference.model``), or it reads them through a
    bf16 vLLM engine. A transformers judge computes on the very tensors, in its own dtype."""
    if ctx != reference.model:  # bound methods: equal, never identical
        return True
    return jcfg.kind == "vllm" and jcfg.vllm.dtype == "bfloat16"


@dataclass
class Judges:
    """The annotator (None in mode=offline) and the evaluation judge (None without evaluation),
    each with the context its calls run in."""

    judge: Any = None
    ctx: Callable = contextlib.nullcontext
    eval_judge: Any = None
    eval_ctx: Callable = contextlib.nullcontext


def build_judges(cfg, reference, tokenizer, *, judge=None, eval_judge=None,
                 check: Callable[[Any], None] | None = None) -> Judges:
    """The annotator (unless given or mode=offline), ``check(judge)`` right after it is built
    (the audit's judge id), then the evaluation judge: ``eval.judge``, else the annotator itself
    (OAIF Sec. 4.1 evaluates with another model; the default reuses the annotator)."""
    out = Judges(judge=judge)
    if judge is None and cfg.mode != "offline":
        out.judge, out.ctx = build_annotator(cfg.judge, cfg=cfg, reference=reference, tokenizer=tokenizer)
    if check is not None and out.judge is not None:
        check(out.judge)
    if eval_judge is not None or not cfg.eval.enabled:
        out.eval_judge = eval_judge
    elif cfg.eval.judge is None and out.judge is not None:
        out.eval_judge, out.eval_ctx = out.judge, out.ctx
    else:
        out.eval_judge, out.eval_ctx = build_annotator(cfg.eval.judge or cfg.judge, cfg=cfg, reference=reference,
                                                       tokenizer=tokenizer)
    return out


def reference_to_bf16(cfg, reference, judges: Judges) -> bool:
    """Cast the frozen reference's linear weights to bf16 when only bf16 passes read pi_0 from
    now on (``train.precision=bf16``: dap_backward under autocast, bit-identical there, and no
    weight cast per pass) -- not under LoRA (the reference is the policy itself) and not when
    an annotator computes on those tensors in its own dtype. Returns whether it did."""
    readers = ((cfg.judge, judges.ctx), (cfg.eval.judge or cfg.judge, judges.eval_ctx))
    if cfg.train.precision != "bf16" or reference.lora or not all(
            reads_pi0_in_bf16_only(j, c, reference) for j, c in readers):
        return False
    reference.linear_weights_to(torch.bfloat16)
    return True
