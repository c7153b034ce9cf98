"""``pofe online``: direct alignment from Online AI Feedback (OAIF, Guo et al. 2024, Sec. 3,
Algorithm 1), with the paper's offline baseline and an iterative variant.

Each step of Algorithm 1:

1. draw a batch of prompts x from D_X;
2. sample two responses y1, y2 ~ pi_theta_t(.|x) from the *current* policy (T = 0.9,
   Sec. 4.1); with more than two samples the best and worst (round-robin judged) form the pair;
3. ask the annotator which is better, in both orders (position debiasing, Sec. 3 and
   Appendix E), giving y+ / y- (hard labels, the paper) or p = P(y1 > y2) (soft labels);
4. take a gradient step on the DAP loss l(x, y+, y-, theta_t) against the reference
   pi_0 = the initial policy (DPO Eq. 1, IPO Eq. 2, SLiC Eq. 3). No gradient flows through
   sampling or annotation (the explainer's "stop_gradient").

Modes are pair sources (:mod:`pofe.loops.online.pair_sources`): ``online`` (the above), ``async``
(step t+1's steps 1-3 in a background thread while step t trains: one update stale, vllm only),
``iterative`` (steps 1-3 for K steps at once), ``offline`` (a fixed file: OAIF's baseline).
Steering the objective is a change of ``judge.template`` (Sec. 4.6). The annotator is
:mod:`pofe.loops.online.annotator`; step 4 and the metrics row :mod:`pofe.loops.online.step`; Appendix
B's off-policy gap :mod:`pofe.loops.online.diagnostics`; judge drift :mod:`pofe.evaluation.drift`.
Data parallel (gradients all-reduced), or FSDP2-sharded with sampling.engine=vllm (each process
pushes the gathered weights to its own engine; :mod:`pofe.runtime.sharding`)::

    torchrun --nproc_per_node 2 -m pofe.cli.main online --config C.yaml --set model.device=cpu  # CPU, gloo (tested)
    accelerate launch --config_file examples/accelerate/ddp-gpus.yaml -m pofe.cli.main online --config C.yaml  # GPUs, DDP
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from pofe.config import MAX_BATCH_SIZE, ConfigError, PofeConfig, Seed
from pofe.generation import SamplingConfig
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.labels import LabelPolicy
from pofe.losses import LossName, default_beta, get_loss
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig, OptimConfig
from pofe.loops.online.annotator import build_annotator
from pofe.loops.online.dap import tokenize_pair
from pofe.loops.online.diagnostics import DiagnosticsSettings, OffPolicyProbe, offpolicy_summary
from pofe.evaluation.drift import DriftMonitor, DriftSettings, drift_summary
from pofe.loops.online.reference import ReferenceSettings, engine_reference, engine_refusal, measure_reference
from pofe.loops.online.online_pairs import label_annotations, sample_and_annotate
from pofe.loops.online.online_settings import DataSettings, EvalSettings
from pofe.loops.online.pair_sources import eval_due, load_data, mode_refusal
from pofe.runtime.precision import Precision
from pofe.runtime.tracking import LogConfig

__all__ = ["OnlineConfig", "OnlineRecipe", "run", "LossSettings", "TrainSettings", "DataSettings", "EvalSettings",
           "load_data", "build_annotator", "tokenize_pair", "label_annotations", "sample_and_annotate", "get_loss"]


# ----------------------------------------------------------------------------- config

class LossSettings(PofeConfig):
    """The DAP loss (OAIF Eq. 1-3)."""

    name: LossName = "dpo"
    """dpo (Eq. 1), ipo (Eq. 2), slic (Eq. 3), or a loss an installed plugin package adds (``pofe.losses``)."""
    beta: float | None = Field(None, gt=0)
    """None = the paper's value for the loss (Sec. 4.1): DPO 0.1, IPO 1.0, SLiC 0.002. Must be
    > 0: a negative beta trains *against* the judge while the loss looks normal."""
    labels: Literal["hard", "soft"] = "hard"
    """hard: y+ = the response the judge prefers (the paper; exact ties p = 0.5 are skipped and
    counted). soft: train towards P(y1 > y2) = p itself (Bradley-Terry cross-entropy for DPO)."""

    @property
    def beta_value(self) -> float:
        return self.beta if self.beta is not None else default_beta(self.name)


class TrainSettings(PofeConfig):
    """Optimisation loop sizes."""

    steps: int = Field(40, ge=1)
    """Optimiser steps."""
    batch_size: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    """Prompts per micro-batch per process (one pair per prompt)."""
    grad_accum: int = Field(1, ge=1, le=MAX_BATCH_SIZE)
    """Micro-batches per optimiser step; prompts per step per process = batch_size * grad_accum."""
    samples_per_prompt: int = Field(2, ge=2)
    """Responses sampled per prompt (OAIF: 2). With more, all pairs are judged and the best
    vs worst (by mean win probability) is trained on."""
    iterative_every: int = Field(4, ge=1)
    """mode=iterative: regenerate and relabel every K steps (K=1 is online)."""
    precision: Precision = "fp32"
    """bf16: policy and reference passes under bf16 autocast, fp32 master weights (AMX CPUs, GPUs)."""


class OnlineConfig(PofeConfig):
    """``pofe online`` (OAIF Algorithm 1)."""

    mode: Literal["online", "async", "iterative", "offline"] = "online"
    """online (Algorithm 1), async (Algorithm 1 with step t+1's samples and labels produced in a
    background thread while step t trains: one step stale, needs sampling.engine=vllm), iterative
    (relabel every train.iterative_every steps) or offline (pairs from data.preferences: the baseline)."""
    seed: Seed = 0
    """Seeds LoRA init, prompt order, held-out split and every step's sampling."""
    model: ModelConfig = ModelConfig()
    """The policy; its initial weights are the reference pi_0."""
    judge: JudgeConfig = LLMJudgeConfig()
    """The annotator (any judge kind: llm, llamacpp, openai, length, reward-model, ...)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=48, temperature=0.9)
    """How training responses are sampled (OAIF Sec. 4.1: T = 0.9)."""
    loss: LossSettings = LossSettings()
    """The DAP loss."""
    labels: LabelPolicy = LabelPolicy()
    """Label hygiene: which judge labels are trained on (``pofe.labels``)."""
    optim: OptimConfig = OptimConfig()
    """Optimiser and schedule (OAIF Sec. 4.1)."""
    train: TrainSettings = TrainSettings()
    """Steps and batch sizes."""
    data: DataSettings = DataSettings()
    """Prompts, held-out prompts, the offline preference file."""
    eval: EvalSettings = EvalSettings()
    """Win rate vs the initial policy."""
    diagnostics: DiagnosticsSettings = DiagnosticsSettings()
    """OAIF Appendix B's off-policy gap (``pofe.loops.online.diagnostics``)."""
    reference: ReferenceSettings = ReferenceSettings()
    """Where pi_0's log-probs come from: the trainer's frozen copy, or the annotator's vLLM engine
    (``pofe.loops.online.reference``)."""
    audit: DriftSettings = DriftSettings()
    """Judge drift: the live annotator re-audited every ``audit.every`` steps (``pofe.evaluation.drift``)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Resumable checkpoints."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, TensorBoard / W&B / MLflow, the progress bar."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @model_validator(mode="after")
    def _mode_fits(self) -> OnlineConfig:
        if why := mode_refusal(self) or engine_refusal(self):  # mode: greedy online samples, async's sampler,
            raise ConfigError(why)                             # what offline cannot do; pi_0 from the annotator
        return self


# ----------------------------------------------------------------------------- the command

class OnlineRecipe(Recipe):
    """setup -> per step: pairs from the mode's source -> DAP update -> engine sync -> metrics row
    (and the win rate vs pi_0 at ``eval.every``) -> ``final/`` (:mod:`pofe.recipe`)."""

    command = "online"
    outputs = ("ledger.jsonl",)
    data_parallel = True
    show = (("loss", "loss", "{:.3f}"), ("mean_len", "len", "{:.1f}"), ("mean_p", "p", "{:.2f}"),
            ("winrate_vs_init", "win", "{:.2f}"))

    def __init__(self, cfg: OnlineConfig, *, model=None, tokenizer=None, judge=None, eval_judge=None,
                 require_audit: str | Path | None = None):
        super().__init__(cfg)
        self.model, self.tokenizer, self.require_audit = model, tokenizer, require_audit
        self.judges, self.source, self.ledger = (judge, eval_judge), None, None

    def load_data(self) -> None:
        self.items, self.eval_prompts = load_data(self.cfg)
        self.offpolicy = OffPolicyProbe.load(self.cfg, self.items)
        self.drift = DriftMonitor.load(self.cfg.audit, self.cfg.seed)

    def audit_identity(self) -> dict[str, Any]:
        from pofe.evaluation.audit import judge_identity

        # the full identity (endpoint URL, both orders, CoT, choices, template hash, ...), not only the id
        return judge_identity(self.cfg.judge)

    def setup(self, run: RunContext) -> None:
        from pofe.evaluation.vs_initial import initial_responses
        from pofe.generation import make_generator
        from pofe.loops.online.annotator import build_judges, reference_to_bf16
        from pofe.loops.online.pair_sources import make_source
        from pofe.runtime import Reference, load_policy, make_optimizer, make_scheduler

        cfg, self.run = self.cfg, run
        self.model, self.tokenizer = load_policy(cfg.model, model=self.model, tokenizer=self.tokenizer)
        self.model.to(run.acc.device)
        self.model.train()
        self.reference = Reference(self.model, lora=cfg.model.lora.enabled)  # pi_0, before any update or resume
        self.model = run.shard(self.model, mean=True)  # FSDP2: after pi_0's copy; gradients averaged as by DDP
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, cfg.train.steps)
        self.total_steps = cfg.train.steps
        self.loss_fn, self.beta = get_loss(cfg.loss.name), cfg.loss.beta_value
        run.restore_checkpoint()
        # After the checkpoint is loaded: the engine copies the resumed weights, and is built before
        # the judges so that a vLLM judge of the same model shares it.
        acc, tok = run.acc, self.tokenizer
        self.ddp, self.optimizer = (self.model, self.optimizer) if run.sharded else acc.prepare(self.model, self.optimizer)
        engine = make_generator(self.model, tok, cfg.sampling)  # handed to the source, which owns it from here
        judge, eval_judge = self.judges
        self.judges = build_judges(cfg, self.reference, tok, judge=judge, eval_judge=eval_judge, check=self._audited)
        self.my_eval = self.eval_prompts[run.rank::run.world] if cfg.eval.enabled else []
        self.initial = initial_responses(self.reference, tok, self.my_eval, sampling=cfg.eval.sampling, seed=cfg.seed)
        reference_to_bf16(cfg, self.reference, self.judges)  # after pi_0's own responses, in its own dtype
        if cfg.reference.source == "engine":  # after the cast: the engine is synced from the copy as the judge reads it
            self.reference = engine_reference(self.reference, tok, cfg, engine, run.state.get("reference"))
        self.ledger = run.writer("ledger.jsonl") if cfg.mode != "offline" else None
        self.source = make_source(cfg, acc, self.ddp, tok, self.judges, self.items, run.state, ledger=self.ledger,
                                  engine=engine, start=run.start)
        run.on_close(self.source.close)  # mode=async: waits for the step in flight (it holds the engine)
        run.meter(self.source)  # judge.budget spent
        if self.drift is not None:
            run.meter(self.drift)  # audit.on_drift=stop

    def _audited(self, judge) -> None:
        if self.require_audit is not None:  # the built judge is the audited one, not only its config
            from pofe.evaluation.audit import require_audit

            require_audit(self.require_audit, self.audit_identity(), judge_id=judge.id)

    def step(self, step: int) -> dict[str, Any]:
        from pofe.evaluation.vs_initial import evaluate_vs_initial
        from pofe.runtime import fault_point, seed_everything
        from pofe.loops.online.step import dap_update, step_row
        from pofe.runtime.seeds import step_seed

        cfg, acc = self.cfg, self.run.acc
        seed_everything(step_seed(cfg.seed, step, self.run.rank))
        t0 = time.perf_counter()
        sp = self.source.pairs(step)  # 1-3. prompts -> samples -> AI feedback (or pairs from the file)
        fault_point(f"{step}:after_judge")
        probe = self.offpolicy.before_update(step, acc.unwrap_model(self.ddp), self.tokenizer, cfg.sampling,
                                             device=acc.device) if self.offpolicy else {}
        measured = measure_reference(self.reference, sp.pairs, self.run.dp, self.tokenizer, cfg)  # once, engine only
        res, grad_norm, lr = dap_update(acc, self.ddp, self.reference, sp.pairs, optimizer=self.optimizer,  # 4.
                                        scheduler=self.scheduler, loss_fn=self.loss_fn, beta=self.beta, pad_token_id=self.tokenizer.pad_token_id,
                                        cfg=cfg, step=step, times=sp.times)
        self.source.after_update(step, sp.times)
        sp.times["step"] = time.perf_counter() - t0
        row = step_row(acc, step, sp, res, lr=lr, grad_norm=grad_norm, ledger=self.ledger, sync=self.source.sync)
        row.update(measured)
        row.update(self.offpolicy.row(step, probe, sp.pairs, res, acc=acc) if self.offpolicy else {})
        row.update(self.drift.check(step, self.judges.judge, self.judges.ctx, self.run.dp) if self.drift else {})
        if eval_due(cfg, step):
            row.update(evaluate_vs_initial(acc, self.model, self.tokenizer, self.judges.eval_judge, self.judges.eval_ctx,
                                           self.my_eval, self.initial, sampling=cfg.eval.sampling, seed=cfg.seed,
                                           run_dir=self.run.dir, step=step))
        return row

    def checkpoint_state(self) -> dict[str, Any]:
        ref = {"reference": self.reference.state()} if hasattr(self.reference, "state") else {}
        return {**self.source.state(), **ref}  # every process: the label buffers (and judge usage) gathered there

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        from pofe.loops.online.metrics import online_summary

        judge = None if self.cfg.mode == "offline" else getattr(self.judges.judge, "id", self.cfg.judge.kind)
        more = {"offpolicy": offpolicy_summary(history), "drift": drift_summary(history), **self.source.summary(history),
                "reference": self.reference.summary() if hasattr(self.reference, "summary") else None}
        return {**online_summary(history, self.cfg, beta=self.beta, judge=judge, engine=self.source.sync.summary()),
                **{k: v for k, v in more.items() if v is not None}}


def run(cfg: OnlineConfig, *, resume: str | Path | None = None, model=None, tokenizer=None, judge=None,
        eval_judge=None, require_audit: str | Path | None = None) -> dict[str, Any]:
    """Run OAIF Algorithm 1 (or its variants); returns the summary. ``resume``: a run folder to continue;
    ``model``, ``tokenizer``, ``judge``, ``eval_judge``: in-memory objects instead of building them;
    ``require_audit``: an audit report of the annotator (AuditError unless it passed for this judge)."""
    if cfg.mode == "offline":
        require_audit = None
    recipe = OnlineRecipe(cfg, model=model, tokenizer=tokenizer, judge=judge, eval_judge=eval_judge,
                          require_audit=require_audit)
    return drive(recipe, resume=resume, require_audit=require_audit)
