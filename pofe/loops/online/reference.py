"""Reference log-probs read from the annotator's vLLM engine (``reference.source: engine``).

Why: in OAIF's usual setting the annotator *is* pi_0 (Guo et al. 2024, Sec. 3: the annotator and
the reference are both the initial model), and with ``judge.kind: vllm`` pofe already keeps pi_0's
weights in a vLLM engine for the judge. The DAP loss needs log pi_0(y|x) of each pair's two
responses (Eq. 1-3); the engine computes them as prompt log-probs (``prompt_logprobs=0``: the
log-prob of every given token) in one prefill batch, so the trainer's frozen pi_0 copy -- a whole
model in fp32, plus its forward pass every step -- is no longer needed and is freed.

The engine's numbers are not the trainer's: its kernels, dtype (the judge engine's, bf16 by
default) and attention differ from the HF reference pass under ``train.precision``. So the
switch is *measured*: on the first step both passes score the step's pairs, the gap
``sum |log pi_0^engine - log pi_0^trainer| / response tokens`` (over all processes) is compared
with ``reference.max_gap``, and only within it does the engine take over (the step's row logs
``reference/engine_gap``; the summary records the decision). Past it the run keeps the trainer's
pass and says why. The decision is checkpoint state, so ``--resume`` continues with the same
source (and frees the copy again) without measuring anew.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
from pydantic import Field

from pofe.config import PofeConfig

log = logging.getLogger(__name__)


class ReferenceSettings(PofeConfig):
    """Where the reference policy pi_0's log-probs come from (``pofe online``)."""

    source: Literal["model", "engine"] = "model"
    """model: a forward pass of the trainer's frozen pi_0 (a LoRA policy with its adapter off).
    engine: prompt log-probs from the annotator's vLLM engine, which holds pi_0 when the annotator
    is the policy's own initial model (``judge.kind: vllm``, ``judge.model`` = ``model.name``, full
    fine-tuning); measured against the trainer's pass on the first step and used only within
    ``max_gap``, after which the trainer's pi_0 copy is freed. When the annotator shares the policy
    sampler's engine (identical vLLM settings), the reads come after judging, while it holds pi_0,
    and pi_0 is pushed from a file of its weights from then on (on CPU swapped back in: see
    :mod:`pofe.generation.kept_weights`)."""
    max_gap: float = Field(0.02, gt=0)
    """Largest mean |log pi_0 engine - log pi_0 trainer| per response token (nats), measured on the
    first step's pairs, at which the engine replaces the trainer's reference pass. Measured on
    SmolLM2-135M at the bar benchmark (bf16 engine, ``train.precision: bf16``): 0.0094; an fp32
    engine against an fp32 pass: < 1e-4. At 0.02 a 48-token response's log pi_0 moves by <= ~1 nat."""


def engine_refusal(cfg) -> str | None:
    """Why ``reference.source: engine`` cannot run with this ``pofe online`` config, or None."""
    from pofe.models import same_model

    if cfg.reference.source != "engine":
        return None
    if cfg.mode == "offline":
        return "reference.source=engine reads pi_0 from the annotator's vLLM engine; mode=offline has no annotator"
    if cfg.mode == "async":  # one vLLM engine is not to be driven from two threads at once
        return ("reference.source=engine reads pi_0 on the annotator's engine, which mode=async drives from its "
                "background thread (judging step t+1 while step t trains): use mode=online")
    if cfg.judge.kind != "vllm" or not same_model(getattr(cfg.judge, "model", None), cfg.model.name):
        return ("reference.source=engine needs the annotator to be pi_0 on vLLM: judge.kind=vllm with judge.model "
                f"= model.name (judge.kind is {cfg.judge.kind!r})")
    if cfg.model.lora.enabled:
        return ("reference.source=engine frees the trainer's frozen pi_0 copy; with model.lora the reference is the "
                "policy itself (adapter off), so there is no copy to free: use reference.source=model")
    return None


class EngineReference:
    """The :class:`pofe.runtime.Reference` interface (``model()``, ``module``, ``lora``), plus
    :meth:`engine_logps` once the engine has been measured and chosen."""

    def __init__(self, reference, generator, settings: ReferenceSettings, state: dict[str, Any] | None = None,
                 *, shared: bool = False):
        self._ref, self.generator, self.settings = reference, generator, settings
        self.shared = shared  # the policy's generator syncs the same engine (pi_0 there only between swaps)
        state = state or {}
        self.source: str | None = state.get("source")  # None until measured
        self.gap: float | None = state.get("gap")
        if self.source == "engine":
            self._release()  # a resumed run: the engine already won on the first step

    # -- the Reference interface -----------------------------------------------------------
    lora = False

    @property
    def module(self):
        return self._ref.module

    @contextlib.contextmanager
    def model(self) -> Iterator[Any]:
        with self._ref.model() as m:
            yield m

    def linear_weights_to(self, dtype: torch.dtype) -> int:
        return self._ref.linear_weights_to(dtype)

    @property
    def from_engine(self) -> bool:
        return self.source == "engine"

    # -- the engine's numbers ---------------------------------------------------------------
    def engine_logps(self, pairs: Sequence) -> torch.Tensor:
        """Summed response log-probs (2m,), chosen then rejected, as :func:`pofe.loops.online.dap.pair_logps`."""
        seqs = [(p.prompt_ids, p.chosen_ids) for p in pairs] + [(p.prompt_ids, p.rejected_ids) for p in pairs]
        return torch.tensor(self.generator.completion_logprobs(seqs), dtype=torch.float32)

    def decide(self, pairs: Sequence, trainer_lp: torch.Tensor, dp) -> dict[str, float]:
        """Measure the engine against the trainer's pass ``trainer_lp`` (2m,) on ``pairs`` (summed over
        processes) and choose the source; returns the step's metrics. Every process decides alike."""
        eng = self.engine_logps(pairs) if pairs else torch.zeros(0)
        tokens = sum(len(p.chosen_ids) + len(p.rejected_ids) for p in pairs)
        diff = float((eng - trainer_lp.detach().float().cpu()).abs().sum()) if pairs else 0.0
        diff, tokens = dp.sum(diff), dp.sum(tokens)
        if tokens == 0:
            return {}  # nothing to measure on this step (no pairs anywhere): decide on the next one
        self.gap = diff / tokens
        if self.gap <= self.settings.max_gap:
            self.source = "engine"
            log.info("reference: pi_0 from the annotator's vLLM engine (gap %.4g <= reference.max_gap=%g nats/token)",
                     self.gap, self.settings.max_gap)
            self._release()
        else:
            self.source = "model"
            log.warning("reference: keeping the trainer's pi_0 pass: the annotator's engine is %.4g nats/token away "
                        "(> reference.max_gap=%g)", self.gap, self.settings.max_gap)
        return {"reference/engine_gap": self.gap, "reference/from_engine": float(self.source == "engine")}

    def _release(self) -> None:
        """Keep the engine on pi_0 (an engine of its own: for good; one shared with the policy's
        generator: pushed from a file of pi_0's weights whenever the annotator or the reference reads)
        and free the trainer's frozen copy."""
        if self.shared:
            self.generator.freeze()
        else:
            self.generator.pin()  # synced from the copy first (a resumed run's fresh engine), then unbound
        self._ref.release()
        gc.collect()

    def state(self) -> dict[str, Any]:
        return {"source": self.source, "gap": self.gap}

    def summary(self) -> dict[str, Any]:
        return {"source": self.source or "model", "engine_gap": self.gap, "max_gap": self.settings.max_gap}


def pi0_generator(reference, tokenizer, judge_cfg):
    """The vLLM generator the annotator reads pi_0 through (the one :func:`pofe.judges.registry.build_judge`
    bound to the reference module: ``generator_for`` keeps one per model and settings)."""
    from pofe.generation.base import SamplingConfig
    from pofe.generation.vllm import generator_for

    return generator_for(reference.module, tokenizer, SamplingConfig(engine="vllm", vllm=judge_cfg.vllm))


def trainer_logps(reference, pairs: Sequence, *, pad_token_id: int, device, precision) -> torch.Tensor:
    """The trainer's own pi_0 pass on ``pairs`` (2m,): what :func:`pofe.loops.online.dap.dap_backward` computes
    without the engine (joint batch; the packed pass agrees with it to float rounding)."""
    from pofe.loops.online.dap import pair_logps
    from pofe.runtime.precision import autocast

    if not pairs:
        return torch.zeros(0)
    with reference.model() as ref_model, autocast(precision, device):
        return pair_logps(ref_model, pairs, pad_token_id, device, shared=False).float().cpu()


def engine_reference(reference, tokenizer, cfg, policy_engine, state: dict[str, Any] | None) -> EngineReference:
    """``pofe online``'s reference with ``reference.source: engine`` (built after the annotator, whose
    generator it reads through).

    An annotator engine the policy's generator also syncs (identical vLLM settings give both one
    pooled engine) holds pi_0 between the annotator's push and the next sample's. The reference
    reads come in that window (after judging, before the update), so they cost no extra push; once
    the engine is chosen, pi_0 is pushed from a file of its weights (:meth:`VLLMGenerator.freeze`)."""
    gen = pi0_generator(reference, tokenizer, cfg.judge)
    shared = policy_engine is not None and getattr(policy_engine, "engine", None) is gen.engine
    return EngineReference(reference, gen, cfg.reference, state, shared=shared)


def measure_reference(reference, pairs: Sequence, dp, tokenizer, cfg) -> dict[str, float]:
    """On the first step with pairs: score them with both sources and let :meth:`EngineReference.decide`
    choose (one extra reference pass, once); afterwards nothing."""
    if not isinstance(reference, EngineReference) or reference.source is not None:
        return {}
    lp = trainer_logps(reference, pairs, pad_token_id=tokenizer.pad_token_id,
                       device=next(reference.module.parameters()).device,
                       precision=cfg.train.precision)
    return reference.decide(pairs, lp, dp)
