"""``pofe sft``: supervised fine-tuning on (prompt, response) pairs, loss on response tokens only.

Self-Rewarding LMs Sec. 3.4 ("Seed training data"): the seed model M1 is the base model
fine-tuned on IFT data (instruction -> human response) mixed with EFT data (LLM-as-a-Judge
prompt -> justification + "Score: N"), "loss computed only on target tokens", learning rate
5.5e-6 decaying with a cosine schedule to 1.1e-6, batch size 16. The same loop serves
SL-CAI (revisions as targets) and self-reward's seed stages through :func:`run`.

Reads top to bottom: config -> the recipe (data -> tokenise -> one :func:`sft_step` per
optimiser step) -> :func:`run`. Nothing is truncated silently: examples longer than
``data.max_length`` tokens are dropped and counted. The run folder, ``--resume`` (from the
run's own ``config.yaml`` and latest checkpoint), checkpoints, metrics and ``final/`` are the
driver's (:mod:`pofe.recipe`); the batches of a step are a function of (seed, step), so a
resumed run is the run that would have happened without the crash.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Sequence

from pydantic import Field

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.errors import DataError
from pofe.data.sft import SFTExample, load_sft_data, source_counts
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig, OptimConfig
from pofe.runtime.precision import Precision
from pofe.loops.sft.step import batch_indices, sft_step, tokenize_examples
from pofe.runtime.tracking import LogConfig

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class SFTDataConfig(PofeConfig):
    """Where the training examples come from."""

    ift: list[str] = []
    """Instruction-following files: rows with prompt/response (also instruction[/input]/output,
    Self-Instruct ``instances``, or chat ``messages`` ending with the assistant's turn)."""
    eft: list[str] = []
    """Evaluation (LLM-as-a-Judge) files in the same shape: judge prompt -> justification +
    "Score: N" (written by ``pofe self-reward``'s EFT builder)."""
    eft_max_ratio: float | None = Field(None, ge=0)
    """Cap EFT examples at this multiple of the IFT count (null = use all; paper: 1630 EFT
    with 3200 IFT, i.e. about 0.5)."""
    limit: int | None = Field(None, ge=1)
    """Use at most this many examples per file (for smoke runs)."""
    max_length: int = Field(1024, ge=1)
    """Drop (and count) examples whose prompt + response exceed this many tokens."""


class SFTTrainSettings(PofeConfig):
    """Steps and batch sizes. Examples per optimiser step = batch_size x grad_accum x processes (paper: 16);
    the loss is the token mean over the whole optimiser batch whatever the split."""

    steps: int | None = Field(None, ge=1)
    """Optimiser steps; None = ``epochs`` passes over the data."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data when ``steps`` is None."""
    batch_size: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    """Examples per forward pass (per process)."""
    grad_accum: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    """Forward passes per optimiser step."""
    precision: Precision = "fp32"
    """bf16: forward and backward under bf16 autocast, fp32 master weights and optimiser state
    (AMX CPUs, GPUs; ``pofe.runtime.precision``)."""


class SFTConfig(PofeConfig):
    """``pofe sft``."""

    seed: Seed = 0
    """Seeds the model init (LoRA) and the per-epoch data order."""
    model: ModelConfig = ModelConfig()
    """The model fine-tuned."""
    data: SFTDataConfig = SFTDataConfig()
    """IFT (and EFT) files."""
    optim: OptimConfig = OptimConfig(lr=5.5e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.2)
    """Paper: 5.5e-6 cosine-decayed to 1.1e-6 (= 0.2 x lr)."""
    train: SFTTrainSettings = SFTTrainSettings()
    """Steps and batch sizes."""
    checkpoint: CheckpointConfig = CheckpointConfig(every=100)
    """Checkpoints for ``--resume``, the last step's too; kept once ``final/`` is written, so that
    resuming a finished run or a torn ``final/`` starts from the last one, not from step 0."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, TensorBoard / W&B / MLflow, the progress bar."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""


# ----------------------------------------------------------------------------- the command

class SFTRecipe(Recipe):
    """examples -> tokenise -> one sft_step per optimiser step -> ``final/`` (:mod:`pofe.recipe`)."""

    command = "sft"
    data_parallel = True
    show = (("loss", "loss", "{:.3f}"),)

    def __init__(self, cfg: SFTConfig, *, model=None, tokenizer=None, examples: Sequence[SFTExample] | None = None):
        super().__init__(cfg)
        self.model, self.tokenizer, self.examples = model, tokenizer, examples

    def load_data(self) -> None:
        cfg = self.cfg
        if self.examples is not None:  # in memory (self-reward, CAI): counted by source, never capped here
            self.examples = list(self.examples)
            self.data_stats = source_counts(self.examples)
        elif not cfg.data.ift and not cfg.data.eft:
            raise DataError("sft: no data; set data.ift (and optionally data.eft)")
        else:
            self.examples, self.data_stats = load_sft_data(cfg.data, cfg.seed)

    def setup(self, run: RunContext) -> None:
        from pofe.runtime import load_policy, make_optimizer, make_scheduler

        cfg, t, self.dp = self.cfg, self.cfg.train, run.dp
        self.model, self.tokenizer = load_policy(cfg.model, model=self.model, tokenizer=self.tokenizer)
        self.model = run.shard(self.model.to(run.acc.device))  # FSDP2 launch: sharded before the optimiser
        self.data, self.dropped = tokenize_examples(self.tokenizer, self.examples, cfg.data.max_length)
        if not self.data:
            raise DataError(f"sft: no usable examples (dropped: {self.dropped})")
        per_step = t.batch_size * t.grad_accum * run.world  # per process, as in every data-parallel trainer
        # by epochs, a step never holds one example twice (a data set smaller than a step)
        self.per_step = min(per_step, len(self.data)) if t.steps is None else per_step
        self.total_steps = t.steps if t.steps is not None else max(1, math.ceil(t.epochs * len(self.data) / self.per_step))
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, self.total_steps)
        tok = self.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.model.train()

    def step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        idx = batch_indices(step - 1, self.per_step, len(self.data), cfg.seed)  # the whole step's, then this process's
        return sft_step(self.model, [self.data[i] for i in self.dp.shard(idx)], self.optimizer, self.scheduler,
                        micro_batch=cfg.train.batch_size, pad_token_id=self.pad, precision=cfg.train.precision,
                        grad_clip=cfg.optim.grad_clip, step=step, detail=f"examples {idx}", dp=self.dp)

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        # from metrics.jsonl, so that a resumed run summarises the whole run
        losses = [r["loss"] for r in history if r.get("loss") is not None]
        return {"examples": len(self.data), "data": self.data_stats, "dropped": self.dropped,
                "examples_per_step": self.per_step, "loss_first": losses[0] if losses else None,
                "loss_last": losses[-1] if losses else None,
                "loss_last_mean": sum(losses[-5:]) / len(losses[-5:]) if losses else None}


def run(cfg: SFTConfig, *, resume: str | Path | None = None, model=None, tokenizer=None,
        examples: Sequence[SFTExample] | None = None, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune and save ``<run_dir>/final``; returns the summary (also ``summary.json``).

    ``resume``: a run folder to continue from its latest checkpoint (the CLI reads its config).
    ``model``/``tokenizer``: an in-memory model to train instead of loading ``cfg.model.name``.
    ``examples``: in-memory examples instead of ``cfg.data`` files (used by self-reward and CAI).
    ``run_dir``: write here (created if needed) instead of a fresh folder under ``cfg.run``;
    an existing checkpoint there is resumed, a finished folder returns its summary (self-reward's stages).
    """
    recipe = SFTRecipe(cfg, model=model, tokenizer=tokenizer, examples=examples)
    return drive(recipe, resume=resume, run_dir=run_dir)
