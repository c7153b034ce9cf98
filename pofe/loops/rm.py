"""``pofe rm``: a Bradley-Terry reward model trained on soft (AI) or hard (human) labels.

rlaif-constitutional-ai, "From judge log-probabilities to a label": the reward model is
trained with the Bradley-Terry cross-entropy against the soft target
(:func:`pofe.losses.soft_bt_loss`), whose per-pair minimiser is Δr = logit(p̃): the RM
inherits the judge's confidence, not only its ranking. Hard labels (p = 1) are the special
case. The seed mixes AI harmlessness labels with human helpfulness pairs; ``data.train``
takes several sources (``pofe label`` output, ``hh-rlhf:helpful``, any PreferencePair jsonl).

The model is a sequence-classification head (``num_labels = 1``) on any causal LM, full
fine-tuning or LoRA (:mod:`pofe.training.reward_model`); it is saved to ``<run>/final`` as a
plain ``AutoModelForSequenceClassification`` directory, so the ``reward-model`` judge
(P(A ≻ B) = σ(r_A − r_B)) and ``pofe rl`` load it directly.

Reported on held-out pairs (:func:`pofe.evaluation.rm_metrics.margin_metrics`): pairwise
accuracy, calibration (reliability bins and ECE of σ(Δr) against the labels), and margin
statistics next to the margin the labels imply (mean logit(p)): inflated margins are what RL
exploits (seed, "Overconfident labels").

``--resume RUN_DIR`` continues from the latest checkpoint: the batch schedule is a function of
the seed alone, metrics rows after the checkpoint are dropped, so the resumed run equals the
uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from pofe.config import PofeConfig
from pofe.losses import RMLossName, get_rm_loss
from pofe.records import PreferencePair
from pofe.runs import RunConfig, atomic_write_text, open_run, read_jsonl, write_config
from pofe.training.allocator import keep_freed_memory
from pofe.training import ModelConfig, OptimConfig
from pofe.training.precision import Precision, autocast
from pofe.training.resume import CheckpointConfig
from pofe.training.reward_model import evaluate_reward_model, load_reward_model, pair_prompt, rewards, wrap_reward_model
from pofe.training.tracking import LogConfig, MetricsSink, Progress

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
    """Stop after this many optimiser steps (default: epochs × ceil(pairs / batch_size))."""
    batch_size: int = Field(8, ge=1)
    """Pairs per optimiser step (2 x batch_size sequences per forward)."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on the held-out pairs every N steps (0: only before and after training)."""
    precision: Precision = "fp32"
    """bf16: forward and backward under bf16 autocast, fp32 master weights and optimiser state
    (AMX CPUs, GPUs; ``pofe.training.precision``)."""


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
    seed: int = 0
    """Seeds the split, the batch order and the score head's initialisation."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""


# ----------------------------------------------------------------------------- data

def hardened(pairs: Sequence[PreferencePair]) -> list[PreferencePair]:
    """Hard labels from soft ones: the favourite becomes chosen with p = 1; exact ties dropped."""
    return [h for h in (q.hardened() for q in pairs) if h is not None]


def split_pairs(pairs: list[PreferencePair], fraction: float, seed: int) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Deterministic train/eval split; at least one eval pair when fraction > 0 and n > 1."""
    idx = list(range(len(pairs)))
    random.Random(seed).shuffle(idx)
    k = round(len(pairs) * fraction)
    if fraction > 0 and k == 0 and len(pairs) > 1:
        k = 1
    ev = set(idx[:k])
    return [q for i, q in enumerate(pairs) if i not in ev], [q for i, q in enumerate(pairs) if i in ev]


def batch_schedule(n: int, batch_size: int, epochs: int, seed: int, steps: int | None = None) -> list[list[int]]:
    """Index batches for every optimiser step: each epoch a fresh shuffle from (seed, epoch).
    A function of its arguments alone, so a resumed run takes the same batches."""
    out = []
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(seed * 1009 + epoch).shuffle(order)
        out += [order[s:s + batch_size] for s in range(0, n, batch_size)]
    return out[:steps] if steps is not None else out


def load_data(cfg: RMConfig) -> tuple[list[PreferencePair], list[PreferencePair], dict[str, int]]:
    from pofe.data.preferences import load_pairs

    if not cfg.data.train:
        raise ValueError("rm: data.train is empty; give at least one pair source (e.g. runs/label-*/preferences.jsonl)")
    train: list[PreferencePair] = []
    per_source = {}
    for src in cfg.data.train:
        got = load_pairs(src, limit=cfg.data.max_pairs_per_source)
        per_source[src] = len(got)
        train += got
    if cfg.data.eval:
        eval_pairs = [q for src in cfg.data.eval for q in load_pairs(src, limit=cfg.data.max_pairs_per_source)]
    else:
        train, eval_pairs = split_pairs(train, cfg.data.eval_fraction, cfg.seed)
    if cfg.data.labels == "hard":
        train = hardened(train)
    if not train:
        raise ValueError("rm: no training pairs left")
    return train, eval_pairs, per_source


# ----------------------------------------------------------------------------- the step

def rm_step(model, tokenizer, batch: Sequence[PreferencePair], cfg: RMConfig, optimizer, scheduler, loss_fn) -> dict[str, Any]:
    """One optimiser step of the soft Bradley-Terry loss; TRL's metric names."""
    t0 = time.perf_counter()
    with autocast(cfg.train.precision, next(model.parameters()).device):  # rewards() returns fp32 scores
        r = rewards(model, tokenizer, [pair_prompt(q) for q in batch] * 2, [q.chosen for q in batch] + [q.rejected for q in batch],
                    max_length=cfg.max_length)
    margin = r[: len(batch)] - r[len(batch):]
    p = torch.tensor([q.p for q in batch], dtype=margin.dtype, device=margin.device)
    loss = loss_fn(margin, p).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    gn = None
    if cfg.optim.grad_clip:
        gn = float(torch.nn.utils.clip_grad_norm_([x for x in model.parameters() if x.requires_grad], cfg.optim.grad_clip))
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    m, r = margin.detach(), r.detach()
    decided = p != 0.5
    agree = ((m > 0) & (p > 0.5)) | ((m < 0) & (p < 0.5))
    return {"loss": float(loss), "rewards/chosen": float(r[: len(batch)].mean()),
            "rewards/rejected": float(r[len(batch):].mean()), "rewards/margins": float(m.mean()),
            "rewards/accuracies": float(agree[decided].float().mean()) if decided.any() else None,
            "grad_norm": gn, "learning_rate": lr, "seconds": round(time.perf_counter() - t0, 4)}


# ----------------------------------------------------------------------------- the command

def run(cfg: RMConfig, *, resume: str | Path | None = None, model=None, tokenizer=None) -> dict[str, Any]:
    """Setup -> train -> evaluate -> save (``<run>/final`` is a save_pretrained directory).

    ``resume``: a run folder to continue from its latest checkpoint (``cfg`` is its saved config)."""
    from pofe.training import (
        make_optimizer,
        make_scheduler,
        save_final,
        seed_everything,
    )
    from pofe.training.resume import checkpoint_if_due, resume_from_checkpoint

    # --- setup: data first (a bad file fails before any run folder exists)
    train, eval_pairs, per_source = load_data(cfg)
    schedule = batch_schedule(len(train), cfg.train.batch_size, cfg.train.epochs, cfg.seed, cfg.train.steps)
    total = len(schedule)
    run_dir = open_run(cfg.run, "rm", resume=resume)
    if resume is None:
        write_config(run_dir, cfg)
    keep_freed_memory()  # glibc: reuse freed buffers instead of page-faulting them in every step
    seed_everything(cfg.seed)
    if model is None:
        model, tokenizer = load_reward_model(cfg.model)
    else:
        model = wrap_reward_model(model, cfg.model, pad_token_id=tokenizer.pad_token_id)
    optimizer = make_optimizer(model, cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, total)
    loss_fn = get_rm_loss(cfg.loss)
    start, state = 0, {}
    if resume is not None:
        start, state = resume_from_checkpoint(run_dir, model=model, optimizer=optimizer, scheduler=scheduler)
        log.info("rm: resuming %s at step %d", run_dir, start)

    def evaluate():
        return evaluate_reward_model(model, tokenizer, eval_pairs, batch_size=cfg.train.batch_size,
                                     max_length=cfg.max_length, bins=cfg.calibration_bins)

    before = evaluate() if start == 0 else state.get("eval_before")
    log.info("rm: %d train / %d eval pairs (%s labels), %d steps", len(train), len(eval_pairs), cfg.data.labels, total)

    # --- train
    t0 = time.perf_counter()
    model.train()
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json"))
    bar = Progress(cfg.log, total=total, initial=start, desc="pofe rm",
                   show=(("loss", "loss", "{:.3f}"), ("rewards/accuracies", "acc", "{:.2f}")))
    steps_per_epoch = math.ceil(len(train) / cfg.train.batch_size)
    try:
        for step in range(start + 1, total + 1):
            batch = [train[i] for i in schedule[step - 1]]
            row = {"step": step, "epoch": (step - 1) // steps_per_epoch,
                   **rm_step(model, tokenizer, batch, cfg, optimizer, scheduler, loss_fn)}
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and eval_pairs:
                ev = evaluate()
                model.train()
                row.update({"eval_loss": ev["loss"], "eval_accuracy": ev["accuracy"], "eval_ece": ev["ece"],
                            "eval_margin_mean": ev["margin"]["mean"]})
            sink.write(row)
            bar.update(row)
            checkpoint_if_due(run_dir, cfg.checkpoint, step, total, model=model, optimizer=optimizer,
                              scheduler=scheduler, state={"eval_before": before})
    finally:
        bar.close()
        sink.close()
    seconds = time.perf_counter() - t0

    # --- save
    after = evaluate()
    out = save_final(model, tokenizer, run_dir / "final")
    atomic_write_text(out / "pofe_reward_model.json", json.dumps(
        {"format": "chat-template, reward at the last non-pad token", "num_labels": 1, "max_length": cfg.max_length,
         "labels": cfg.data.labels, "loss": cfg.loss, "base": cfg.model.name}, indent=2))
    summary = {
        "run_dir": str(run_dir), "final_model": str(out), "train_pairs": len(train), "eval_pairs": len(eval_pairs),
        "sources": per_source, "labels": cfg.data.labels, "steps": len(read_jsonl(run_dir / "metrics.jsonl")),
        "steps_run": total - start, "resumed_from": start if resume is not None else None,
        "seconds": round(seconds, 2), "eval_before": before, "eval": after,
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
