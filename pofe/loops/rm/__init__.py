"""``pofe rm``: a Bradley-Terry reward model trained on soft (AI) or hard (human) labels.

rlaif-constitutional-ai, "From judge log-probabilities to a label": the reward model is
trained with the Bradley-Terry cross-entropy against the soft target
(:func:`pofe.losses.soft_bt_loss`), whose per-pair minimiser is Δr = logit(p̃): the RM
inherits the judge's confidence, not only its ranking. Hard labels (p = 1) are the special
case. The seed mixes AI harmlessness labels with human helpfulness pairs; ``data.train``
takes several sources (``pofe label`` output, ``hh-rlhf:helpful``, any PreferencePair jsonl).

The model is a sequence-classification head (``num_labels = 1``) on any causal LM, full
fine-tuning or LoRA (:mod:`pofe.loops.rm.reward_model`); it is saved to ``<run>/final`` as a
plain ``AutoModelForSequenceClassification`` directory, so the ``reward-model`` judge
(P(A ≻ B) = σ(r_A − r_B)) and ``pofe rl`` load it directly.

Reported on held-out pairs (:func:`pofe.evaluation.rm_metrics.margin_metrics`): pairwise
accuracy, calibration (reliability bins and ECE of σ(Δr) against the labels), and margin
statistics next to the margin the labels imply (mean logit(p)): inflated margins are what RL
exploits (seed, "Overconfident labels").

The run folder, ``--resume``, checkpoints, metrics and ``final/`` are the driver's
(:mod:`pofe.recipe`); the batch schedule is a function of the seed alone, so a resumed run
equals the uninterrupted one.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.data.rm_pairs import hardened, load_rm_pairs, split_pairs
from pofe.losses import RMLossName, get_rm_loss
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig, OptimConfig
from pofe.runtime.precision import Precision
from pofe.loops.rm.step import batch_schedule, rm_step
from pofe.runtime.tracking import LogConfig

__all__ = ["RMConfig", "RMRecipe", "run", "rm_step", "batch_schedule", "hardened", "split_pairs"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class RMDataConfig(PofeConfig):
    """Training and held-out pairs."""

    train: list[str] = Field(default_factory=list)
    """Pair sources, mixed: PreferencePair jsonl files (e.g. runs/label-*/preferences.jsonl) or hh-rlhf:helpful / hh-rlhf:harmless."""
    eval: list[str] | None = None
    """Held-out pair sources (default: a random ``eval_fraction`` of train)."""
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of the training pairs held out when ``eval`` is not given."""
    max_pairs_per_source: int | None = Field(None, ge=1)
    """Read at most this many pairs from each source (null: all)."""
    labels: Literal["soft", "hard"] = "soft"
    """soft: train on p as given; hard: threshold at 0.5 (p = 1 for the favourite; p = 0.5 pairs dropped)."""


class RMTrainConfig(PofeConfig):
    """Steps and batch shape."""

    epochs: int = Field(1, ge=1)
    """Passes over the training pairs (each reshuffled)."""
    steps: int | None = Field(None, ge=1)
    """Stop after this many optimiser steps (default: epochs × ceil(pairs / (batch_size × processes)))."""
    batch_size: int = Field(8, ge=1, le=MAX_BATCH_SIZE)
    """Pairs per optimiser step per process (2 x batch_size sequences per forward)."""
    precision: Precision = "fp32"
    """bf16: forward and backward under bf16 autocast, fp32 master weights and optimiser state
    (AMX CPUs, GPUs; ``pofe.runtime.precision``)."""


class RMEvalConfig(PofeConfig):
    """The held-out measurement (the pairs are ``data.eval`` or a split of ``data.train``)."""

    every: int = Field(0, ge=0)
    """Evaluate on the held-out pairs every N steps (0: only before and after training)."""


class RMConfig(PofeConfig):
    """``pofe rm``."""

    model: ModelConfig = ModelConfig()
    """Base causal LM (a score head is added) and LoRA settings."""
    data: RMDataConfig = RMDataConfig()
    """Training and held-out pairs."""
    loss: RMLossName = "soft-bt"
    """Reward-model loss (``pofe.losses.RM_LOSSES``): the soft Bradley-Terry cross-entropy, or a ``pofe.rm_losses`` plugin's."""
    optim: OptimConfig = OptimConfig(lr=1e-5, warmup_steps=0)
    """RM defaults: a reward head trains at a far higher rate than OAIF's policy lr, no warm-up."""
    eval: RMEvalConfig = RMEvalConfig()
    """When the held-out pairs are measured during training."""
    train: RMTrainConfig = RMTrainConfig()
    """Steps and batch shape."""
    max_length: int = Field(512, ge=1)
    """Tokens per (prompt, response); truncated from the left so the scored last token survives."""
    calibration_bins: int = Field(10, ge=1)
    """Bins of the reliability table (ECE)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints for ``--resume``."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: Seed = 0
    """Seeds the split, the batch order and the score head's initialisation."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""


# ----------------------------------------------------------------------------- the command

class RMRecipe(Recipe):
    """pairs -> held-out measurement -> one rm_step per batch -> measurement and ``final/`` (:mod:`pofe.recipe`)."""

    command = "rm"
    data_parallel = True
    show = (("loss", "loss", "{:.3f}"), ("rewards/accuracies", "acc", "{:.2f}"))

    def __init__(self, cfg: RMConfig, *, model=None, tokenizer=None):
        super().__init__(cfg)
        self.model, self.tokenizer = model, tokenizer

    def load_data(self) -> None:
        cfg = self.cfg
        self.train, self.eval_pairs, self.sources = load_rm_pairs(cfg.data, cfg.seed)

    def audit_identity(self):
        from pofe.evaluation.audit import labels_identity

        return labels_identity(self.cfg.data.train)  # the judge that labelled the training pairs

    def setup(self, run: RunContext) -> None:
        from pofe.runtime import make_optimizer, make_scheduler
        from pofe.loops.rm.reward_model import load_reward_model, wrap_reward_model

        cfg = self.cfg
        if self.model is None:
            self.model, self.tokenizer = load_reward_model(cfg.model)
        else:
            self.model = wrap_reward_model(self.model, cfg.model, pad_token_id=self.tokenizer.pad_token_id)
        self.model = run.shard(self.model.to(run.acc.device))  # FSDP2 launch: sharded before the optimiser
        self.dp = run.dp
        # pairs per step = train.batch_size per process, as in every data-parallel trainer
        self.schedule = batch_schedule(len(self.train), cfg.train.batch_size * run.world, cfg.train.epochs, cfg.seed,
                                       cfg.train.steps)
        self.total_steps = len(self.schedule)
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, self.total_steps)
        self.loss_fn = get_rm_loss(cfg.loss)
        self.steps_per_epoch = math.ceil(len(self.train) / (cfg.train.batch_size * run.world))
        self.model.train()
        run.restore_checkpoint()
        self.before = run.measured_before("eval_before", self.evaluate)
        log.info("rm: %d train / %d eval pairs (%s labels), %d steps", len(self.train), len(self.eval_pairs),
                 cfg.data.labels, self.total_steps)

    def evaluate(self):
        from pofe.loops.rm.reward_model import evaluate_reward_model

        cfg = self.cfg
        return evaluate_reward_model(self.model, self.tokenizer, self.eval_pairs, batch_size=cfg.train.batch_size,
                                     max_length=cfg.max_length, bins=cfg.calibration_bins)

    def step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        batch = [self.train[i] for i in self.dp.shard(self.schedule[step - 1])]  # this process's part of the step
        row = {"epoch": (step - 1) // self.steps_per_epoch,
               **rm_step(self.model, self.tokenizer, batch, cfg, self.optimizer, self.scheduler, self.loss_fn, self.dp,
                       step=step)}
        if cfg.eval.every and step % cfg.eval.every == 0 and self.eval_pairs:
            ev = self.evaluate()
            row.update({"eval_loss": ev["loss"], "eval_accuracy": ev["accuracy"], "eval_ece": ev["ece"],
                        "eval_margin_mean": ev["margin"]["mean"]})
        return row

    def save_final(self, out: Path) -> Path | None:
        from pofe.loops.rm.reward_model import save_reward_model

        cfg = self.cfg
        return save_reward_model(self.model, self.tokenizer, out, max_length=cfg.max_length, labels=cfg.data.labels,
                                 loss=cfg.loss, base=cfg.model.name)

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return {"train_pairs": len(self.train), "eval_pairs": len(self.eval_pairs), "sources": self.sources,
                "labels": cfg.data.labels, "eval_before": self.before, "eval": self.evaluate()}


def run(cfg: RMConfig, *, resume: str | Path | None = None, model=None, tokenizer=None,
        require_audit: str | Path | None = None) -> dict[str, Any]:
    """Setup -> train -> evaluate -> save (``<run>/final`` is a save_pretrained directory).

    ``resume``: a run folder to continue from its latest checkpoint (``cfg`` is its saved config).
    ``require_audit``: a ``pofe audit`` report that must have passed for the judge that labelled
    ``data.train`` (checked before any model loads)."""
    return drive(RMRecipe(cfg, model=model, tokenizer=tokenizer), resume=resume, require_audit=require_audit)
