"""``pofe rl``: KL-regularised policy optimisation against a reward model, a judge's
expected score (direct RLAIF) or a programmatic reward.

rlaif-constitutional-ai, "The RL objective is unchanged": maximise
E[r(x, y)] − β KL(π ‖ π_ref) with π_ref the SL-CAI model. Per step: sample k responses for
each of B prompts, score them, and take one on-policy gradient step with a group baseline,
RLOO (Ahmadian et al. 2024) or GRPO-style (Shao et al. 2024); the pieces (advantages, KL
estimators, the loss, the reward sources) are in :mod:`pofe.loops.rl.policy_gradient`.

KL to the reference (``pofe.runtime.Reference``: the adapter disabled under LoRA, else a
frozen copy) either enters the reward, r − β Σ_t (log π − log π_ref) (RLOO's form), or the
loss, + β mean_t k3 with k3 = e^{ref−logπ} − (ref − logπ) − 1 ≥ 0 (GRPO's form).

Reward sources (``reward.kind``):
* ``reward-model``: a ``pofe rm`` directory, r = r_φ(x, y);
* ``judge``: a pointwise judge's score; for the ``expected-score`` judge this is direct
  RLAIF (Lee et al. 2023): the expected value of the 1-10 score-token distribution,
  normalised to [0, 1] by the judge; unscored samples (score None) get no gradient;
* ``programmatic``: a function of the response (length in tokens, chars or words);
* ``pairwise``: any pairwise judge compares each prompt's k samples in a tournament
  (``reward.pairwise``: all-pairs, circular or chunked matchups, both orders, optional
  calibration map); a sample's reward is its mean soft win score or per-group Bradley–Terry
  strength (:mod:`pofe.loops.rl.tournament`); unreadable comparisons are masked and counted
  (``reward/unreadable``, ``reward/judge_calls_per_group``, ``reward/tie_rate``, ``reward/bt_spread``).

Logged per step (``metrics.jsonl``, TRL's names): ``objective/scores`` (the reward),
``objective/rlhf_reward`` (reward − β·k1 when KL is in the reward), ``objective/kl`` (k1 per
sequence; its mean estimates KL and is ≥ 0 in expectation) and ``objective/kl_k3``,
``objective/entropy``, length, and for judges the score distribution (mean of the 1-10
distribution, share at the top of the scale). An optional ``monitor`` reward is computed on
the same samples but never trained on: a judge score climbing while the monitor stays flat
is the reward-hacking sign of the seed ("Reward hacking the judge").

The run folder, ``--resume``, checkpoints, metrics and ``final/`` are the driver's
(:mod:`pofe.recipe`); every step reseeds from (seed, step), so a resumed run is the run that
would have happened without the crash.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pofe.config import MAX_BATCH_SIZE, ConfigError, PofeConfig, Seed
from pofe.errors import DataError
from pofe.generation import SamplingConfig
from pofe.judges.usage import BudgetMeter, budget_of
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig, OptimConfig
from pofe.evaluation.drift import DriftMonitor, DriftSettings, drift_summary
from pofe.runtime.precision import Precision
from pofe.runtime.seeds import rl_sampling_seed
from pofe.loops.rl.rewards import PairwiseRewardConfig, RewardConfig, build_reward
from pofe.loops.rl.policy_gradient import RewardFn
from pofe.loops.rl.step import batch_for_step, measure, rl_step
from pofe.runtime.tracking import LogConfig

__all__ = ["RLConfig", "RLRecipe", "run", "RewardConfig", "PairwiseRewardConfig", "build_reward", "rl_step", "measure",
           "batch_for_step"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class RLTrainConfig(PofeConfig):
    """Steps and batch shape."""

    steps: int = Field(20, ge=1)
    """Optimiser steps."""
    batch_size: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    """Prompts per step per process."""
    group_size: int = Field(4, ge=2)
    """Samples per prompt (k); the group is the baseline."""
    micro_batch: int = Field(16, ge=1)
    """Sequences per forward/backward (gradient accumulation within a step)."""
    precision: Precision = "fp32"
    """bf16: forward and backward under bf16 autocast, fp32 master weights and optimiser state
    (AMX CPUs, GPUs; ``pofe.runtime.precision``)."""


class RLDataConfig(PofeConfig):
    """Where the prompts come from."""

    prompts: str = "hh-rlhf:helpful"
    """Prompt source: a file or advbench, xstest[:safe|:unsafe], hh-rlhf:harmless, hh-rlhf:helpful."""
    max_prompts: int | None = Field(64, ge=1)
    """Use at most this many prompts (null: all)."""


class RLEvalConfig(PofeConfig):
    """The held-out measurement before and after training."""

    num_prompts: int = Field(8, ge=0)
    """Held-out prompts (taken from the end of the prompt list) for the before/after measurement."""
    samples: int = Field(4, ge=1)
    """Samples per held-out prompt."""


class RLConfig(PofeConfig):
    """``pofe rl``."""

    model: ModelConfig = ModelConfig()
    """The policy; its initial weights are the reference π_ref."""
    data: RLDataConfig = RLDataConfig()
    """The prompts."""
    eval: RLEvalConfig = RLEvalConfig()
    """The before/after measurement on held-out prompts."""
    algo: Literal["rloo", "grpo"] = "rloo"
    """Group baseline: RLOO leave-one-out or GRPO standardised advantages."""
    beta: float = Field(0.05, gt=0)
    """KL coefficient β."""
    kl_in: Literal["reward", "loss"] = "reward"
    """Where the KL penalty enters: the reward (k1, RLOO's form) or the loss (k3, GRPO's form)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=48, temperature=1.0)
    """On-policy samples at temperature 1 (the policy's own distribution)."""
    reward: RewardConfig = RewardConfig()
    """The reward that is optimised."""
    monitor: RewardConfig | None = None
    """An independent reward computed on the same samples and logged, never optimised."""
    optim: OptimConfig = OptimConfig(lr=1e-5, warmup_steps=0)
    """Optimiser and schedule (RL defaults: lr 1e-5, no warm-up)."""
    train: RLTrainConfig = RLTrainConfig()
    """Steps and batch shape."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints for ``--resume``."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: Seed = 0
    """Seeds sampling, batches and initialisation."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""
    audit: DriftSettings = DriftSettings()
    """Judge drift: the reward's live judge re-audited every ``audit.every`` steps (``pofe.evaluation.drift``)."""

    @field_validator("sampling")
    @classmethod
    def _on_policy(cls, v: SamplingConfig) -> SamplingConfig:
        # Greedy samples of one prompt are identical, so every group baseline would be 0.
        if not v.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0 for on-policy group samples, got {v.temperature}")
        return v

    @model_validator(mode="after")
    def _chunks_smaller_than_groups(self):
        pw = self.reward.pairwise
        if self.reward.kind == "pairwise" and pw.pattern == "chunked" and pw.group_size >= self.train.group_size:
            # One chunk holding the whole group is all-pairs at all-pairs' cost, not the linear pattern asked for.
            raise ConfigError(f"bad value for 'reward.pairwise.group_size': {pw.group_size} must be smaller than "
                              f"train.group_size ({self.train.group_size}) for pattern chunked (or use all-pairs)")
        if self.monitor is not None and self.monitor.shaping.active:  # the monitor is never optimised
            raise ConfigError("bad value for 'monitor.shaping': shaping applies only to the optimised reward; remove it")
        if self.monitor is not None and budget_of(self.monitor.judge) is not None:
            raise ConfigError("bad value for 'monitor.judge.budget': the budget is the optimised reward's "
                              "(reward.judge.budget); remove it")
        if self.audit.every and self.reward.kind == "programmatic":
            raise ConfigError("bad value for 'audit.every': reward.kind=programmatic has no judge to re-audit")
        return self


# ----------------------------------------------------------------------------- the command

class RLRecipe(Recipe):
    """setup -> one rl_step per step -> held-out measurement and ``final/`` (:mod:`pofe.recipe`)."""

    command = "rl"
    data_parallel = True
    show = (("objective/scores", "reward", "{:.3f}"), ("objective/kl", "kl", "{:.3f}"), ("length", "len", "{:.1f}"))

    def __init__(self, cfg: RLConfig, *, policy=None, tokenizer=None, reward_fn: RewardFn | None = None, judge=None,
                 require_audit: str | Path | None = None):
        super().__init__(cfg)
        self.model, self.tokenizer, self.reward_fn, self._judge = policy, tokenizer, reward_fn, judge
        self.require_audit = require_audit

    def load_data(self) -> None:
        from pofe.data.prompts import load_prompt_texts

        cfg = self.cfg
        prompts = load_prompt_texts(cfg.data.prompts, limit=cfg.data.max_prompts)
        n_eval = min(cfg.eval.num_prompts, max(0, len(prompts) - cfg.train.batch_size))
        self.train_prompts, self.eval_prompts = (prompts[:-n_eval], prompts[-n_eval:]) if n_eval else (prompts, [])
        if not self.train_prompts:
            raise DataError(f"rl: no prompts in {cfg.data.prompts!r}")
        self.drift = DriftMonitor.load(cfg.audit, cfg.seed)  # an unreadable calibration file fails before any model

    def audit_identity(self):
        from pofe.evaluation.audit import reward_identity

        return reward_identity(self.cfg.reward)

    def setup(self, run: RunContext) -> None:
        from pofe.runtime import Reference, load_policy, make_optimizer, make_scheduler

        cfg, self.dp = self.cfg, run.dp
        if len(self.train_prompts) < run.world:
            raise DataError(f"rl: {len(self.train_prompts)} training prompts for {run.world} processes")
        self.model, self.tokenizer = load_policy(cfg.model, model=self.model, tokenizer=self.tokenizer)
        self.model.to(run.acc.device)
        self.ref = Reference(self.model, lora=cfg.model.lora.enabled)
        self.model = run.shard(self.model)  # FSDP2 launch: after pi_0's whole copy, before the optimiser
        tokens = cfg.sampling.max_new_tokens
        self.reward_fn = self.reward_fn or build_reward(cfg.reward, max_new_tokens=tokens, judge=self._judge)
        self.monitor_fn = build_reward(cfg.monitor, max_new_tokens=tokens) if cfg.monitor else None
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, cfg.train.steps)
        self.total_steps = cfg.train.steps
        run.restore_checkpoint()
        # the reward judge's tokens and cost per step (the held-out measurement's in step 1), reward.judge.budget's stop
        self.meter = BudgetMeter(budget_of(cfg.reward.judge), [getattr(self.reward_fn, "judge", None)], dp=self.dp,
                                 state=run.state)
        run.meter(self.meter)
        if self.drift is not None:
            run.meter(self.drift)  # audit.on_drift=stop
        self.before = run.measured_before("eval_before", self.measure)
        log.info("rl: %s, %d steps x %d prompts x %d samples, reward %s, KL in %s (beta %g)", cfg.algo, cfg.train.steps,
                 cfg.train.batch_size, cfg.train.group_size, self.reward_fn.id, cfg.kl_in, cfg.beta)

    def measure(self):
        cfg = self.cfg
        return measure(self.model, self.tokenizer, self.eval_prompts, self.reward_fn, cfg.sampling, n=cfg.eval.samples,
                       seed=cfg.seed + 7, monitor_fn=self.monitor_fn)

    def step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        dp = self.dp  # train.batch_size prompts per process, each process its block of the step's
        batch = dp.shard(batch_for_step(self.train_prompts, cfg.train.batch_size * dp.world, cfg.seed, step))
        # rank 0 keeps the one-process seed; the others are offset past any step count, so no two
        # processes (nor two steps) share a sampling seed
        row = rl_step(self.model, self.ref, self.tokenizer, batch, cfg, self.reward_fn, self.optimizer, self.scheduler,
                      seed=rl_sampling_seed(cfg.seed, step, dp.rank), step=step, monitor_fn=self.monitor_fn, dp=dp)
        row.update(self.drift.check(step, getattr(self.reward_fn, "judge", None), dp=dp) if self.drift else {})
        return {**row, **self.meter.row(step)}  # a collective under data parallel

    def checkpoint_state(self) -> dict[str, Any]:
        return self.meter.state()

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        from pofe.loops.rl.rewards import audit_length_bias
        from pofe.stats import mean

        cfg, last = self.cfg, history[-5:]

        keys = ("objective/scores", "objective/kl", "objective/kl_k3", "length", "monitor")
        out = {"algo": cfg.algo, "kl_in": cfg.kl_in, "beta": cfg.beta, "reward": self.reward_fn.id,
               "first_step": {k: history[0].get(k) for k in keys[:2] + ("length",)} if history else None,
               "last5": {k: mean(h.get(k) for h in last) for k in keys}, "eval_before": self.before,
               "eval_after": None if self.meter.stop else self.measure()}  # a spent budget is not spent further
        more = {"shaping": cfg.reward.shaping.model_dump() if cfg.reward.shaping.active else None,
                "audit": audit_length_bias(self.require_audit), "drift": drift_summary(history),
                "judge_usage": self.meter.summary()}  # after eval_after: the run's whole judging
        return {**out, **{k: v for k, v in more.items() if v is not None}}


def run(cfg: RLConfig, *, resume: str | Path | None = None, policy=None, tokenizer=None, reward_fn: RewardFn | None = None,
        judge=None, require_audit: str | Path | None = None) -> dict[str, Any]:
    """Setup -> RL loop -> save (``<run>/final``). Returns the summary (also ``summary.json``).

    ``resume``: a run folder to continue from its latest checkpoint (``cfg`` is its saved config)."""
    recipe = RLRecipe(cfg, policy=policy, tokenizer=tokenizer, reward_fn=reward_fn, judge=judge, require_audit=require_audit)
    return drive(recipe, resume=resume, require_audit=require_audit)
