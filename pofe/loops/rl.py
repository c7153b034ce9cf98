"""``pofe rl``: KL-regularised policy optimisation against a reward model, a judge's
expected score (direct RLAIF) or a programmatic reward.

rlaif-constitutional-ai, "The RL objective is unchanged": maximise
E[r(x, y)] − β KL(π ‖ π_ref) with π_ref the SL-CAI model. Per step: sample k responses for
each of B prompts, score them, and take one on-policy gradient step with a group baseline,
RLOO (Ahmadian et al. 2024) or GRPO-style (Shao et al. 2024); the pieces (advantages, KL
estimators, the loss, the reward sources) are in :mod:`pofe.training.rl`.

KL to the reference (``pofe.training.Reference``: the adapter disabled under LoRA, else a
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
  strength (:mod:`pofe.training.tournament`); unreadable comparisons are masked and counted
  (``reward/unreadable``, ``reward/judge_calls_per_group``, ``reward/tie_rate``, ``reward/bt_spread``).

Logged per step (``metrics.jsonl``, TRL's names): ``objective/scores`` (the reward),
``objective/rlhf_reward`` (reward − β·k1 when KL is in the reward), ``objective/kl`` (k1 per
sequence; its mean estimates KL and is ≥ 0 in expectation) and ``objective/kl_k3``,
``objective/entropy``, length, and for judges the score distribution (mean of the 1-10
distribution, share at the top of the scale). An optional ``monitor`` reward is computed on
the same samples but never trained on: a judge score climbing while the monitor stays flat
is the reward-hacking sign of the seed ("Reward hacking the judge").

``--resume RUN_DIR`` continues from the latest checkpoint; metrics rows written after it are
dropped first, and every step reseeds from (seed, step), so the resumed run is the run that
would have happened without the crash.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from pofe.config import ConfigError, PofeConfig
from pofe.generation import SamplingConfig
from pofe.judges.base import Capability, require_capability
from pofe.judges.config import JudgeConfig
from pofe.runs import RunConfig, atomic_write_text, open_run, read_jsonl, write_config
from pofe.training.allocator import keep_freed_memory
from pofe.training import ModelConfig, OptimConfig, fault_point
from pofe.training.precision import Precision, autocast
from pofe.training.resume import CheckpointConfig
from pofe.training.rl import (
    JudgeScoreReward,
    LengthReward,
    RewardFn,
    kl_terms,
    masked_group_advantages,
    pg_loss,
    token_logprobs,
)
from pofe.training.tracking import LogConfig, MetricsSink, Progress

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class PairwiseRewardConfig(PofeConfig):
    """``reward.kind: pairwise``: how each prompt's samples are compared (``pofe.training.tournament``)."""

    pattern: Literal["all-pairs", "circular", "chunked"] = "all-pairs"
    """Matchups per group of k samples: all-pairs (k(k-1)/2), circular (i vs i+1 mod k: k) or chunked
    (chunks of group_size, all pairs inside each: linear in k)."""
    group_size: int = Field(3, ge=2)
    """chunked: samples per chunk m; m <= 3 keeps the cost within 2k ordered comparisons per group."""
    both_orders: bool = True
    """Read every matchup as (a, b) and (b, a) and average (position bias cancels); false halves the cost and keeps it."""
    score: Literal["mean", "bt"] = "mean"
    """A sample's reward: its mean soft win score (0..1) or its per-group Bradley-Terry strength (logit scale)."""
    bt_l2: float = Field(0.1, gt=0)
    """score bt: ridge on the strengths (keeps them finite when a sample wins every comparison)."""
    calibration: str | None = None
    """An audit report (``pofe audit`` output) whose fitted calibration map is applied to every verdict's p;
    checked when the config is parsed."""

    @field_validator("calibration")
    @classmethod
    def _readable_map(cls, v: str | None) -> str | None:
        if v is not None:
            from pofe.evaluation.calibrate import load_calibration_map

            try:
                load_calibration_map(v)
            except (OSError, ValueError) as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _applicable(self):
        # A setting the chosen pattern or score never reads would silently do nothing.
        if self.pattern != "chunked" and self.group_size != 3:
            raise ConfigError(f"bad value for 'reward.pairwise.group_size': it applies only to pattern chunked "
                              f"(pattern is {self.pattern}); remove it")
        if self.score != "bt" and self.bt_l2 != 0.1:
            raise ConfigError("bad value for 'reward.pairwise.bt_l2': it applies only to score bt (score is mean); remove it")
        return self


class RewardConfig(PofeConfig):
    """Where the reward comes from."""

    kind: Literal["programmatic", "reward-model", "judge", "pairwise"] = "programmatic"
    """programmatic (a function of the response), reward-model (a ``pofe rm`` model), judge (a pointwise judge)
    or pairwise (a tournament of each prompt's samples under a pairwise judge)."""
    model: str | None = None
    """reward-model: a ``pofe rm`` output directory (its ``final/``: AutoModelForSequenceClassification, num_labels = 1)."""
    max_length: int = Field(512, ge=1)
    """reward-model: tokens per (prompt, response) scored."""
    # judge
    judge: JudgeConfig | None = None
    """judge: a pointwise judge (kind expected-score for direct RLAIF, rubric, reward-model, length, ...);
    pairwise: any pairwise judge (llm, llamacpp, openai, vllm, length, keyword, reward-model, ...)."""

    @field_validator("judge")
    @classmethod
    def _judge_fits_kind(cls, v, info: ValidationInfo):
        if v is not None:
            if info.data.get("kind") == "pairwise":  # the tournament compares two completions
                require_capability(v, Capability.PAIRWISE, where="reward.judge")
            else:  # the reward of one completion is a pointwise score
                require_capability(v, Capability.POINTWISE, where="reward.judge")
        return v

    pairwise: PairwiseRewardConfig = PairwiseRewardConfig()
    """pairwise: matchup pattern, orders, score and calibration of the tournament."""

    @field_validator("pairwise")
    @classmethod
    def _pairwise_fits_kind(cls, v: PairwiseRewardConfig, info: ValidationInfo):
        if info.data.get("kind") != "pairwise" and v.model_dump() != PairwiseRewardConfig().model_dump():
            raise ConfigError(f"bad value for 'reward.pairwise': it applies only to reward.kind = pairwise "
                              f"(kind is {info.data.get('kind')}); remove it")
        judge = info.data.get("judge")
        if not v.both_orders and getattr(judge, "both_orders", False):
            # The judge would still read both orders and average them: one order is not what runs.
            raise ConfigError("bad value for 'reward.pairwise.both_orders': false, but reward.judge.both_orders is true "
                              "(the judge reads both orders itself); set reward.judge.both_orders=false too")
        return v
    # programmatic
    function: Literal["length"] = "length"
    """programmatic: the function of the response."""
    prefer: Literal["shorter", "longer"] = "shorter"
    """programmatic: the direction rewarded."""
    unit: Literal["tokens", "chars", "words"] = "tokens"
    """programmatic: how length is counted."""
    scale: float = Field(1.0, gt=0)
    """Programmatic: reward = ±scale · length / normaliser (max_new_tokens for tokens, 4x that for chars,
    the same for words), so rewards sit in [−scale, 0] or [0, scale]."""

    @model_validator(mode="after")
    def _source_given(self):
        # Checked when the config is parsed, not after the run folder exists and the policy loaded.
        if self.kind == "reward-model" and not self.model:
            raise ValueError("reward.kind = reward-model needs reward.model (a pofe rm output directory)")
        if self.kind == "judge" and self.judge is None:
            raise ValueError("reward.kind = judge needs reward.judge (e.g. kind: expected-score)")
        if self.kind == "pairwise" and self.judge is None:
            raise ValueError("reward.kind = pairwise needs reward.judge (any pairwise judge, e.g. kind: length or llm)")
        return self


class RLTrainConfig(PofeConfig):
    """Steps and batch shape."""

    steps: int = Field(20, ge=1)
    """Optimiser steps."""
    batch_size: int = Field(4, ge=1)
    """Prompts per step."""
    group_size: int = Field(4, ge=2)
    """Samples per prompt (k); the group is the baseline."""
    micro_batch: int = Field(16, ge=1)
    """Sequences per forward/backward (gradient accumulation within a step)."""
    precision: Precision = "fp32"
    """bf16: forward and backward under bf16 autocast, fp32 master weights and optimiser state
    (AMX CPUs, GPUs; ``pofe.training.precision``)."""


class RLConfig(PofeConfig):
    """``pofe rl``."""

    model: ModelConfig = ModelConfig()
    """The policy; its initial weights are the reference π_ref."""
    prompts: str = "hh-rlhf:helpful"
    """Prompt source: a file or advbench, xstest[:safe|:unsafe], hh-rlhf:harmless, hh-rlhf:helpful."""
    max_prompts: int | None = Field(64, ge=1)
    """Use at most this many prompts (null: all)."""
    eval_prompts: int = Field(8, ge=0)
    """Held-out prompts (taken from the end of the prompt list) for the before/after measurement."""
    eval_samples: int = Field(4, ge=1)
    """Samples per held-out prompt."""
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
    seed: int = 0
    """Seeds sampling, batches and initialisation."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

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
        return self


def build_reward(cfg: RewardConfig, *, max_new_tokens: int, judge=None) -> RewardFn:
    # RewardConfig guarantees reward.model / reward.judge for their kinds (checked when parsed).
    if cfg.kind == "programmatic":
        return LengthReward(prefer=cfg.prefer, unit=cfg.unit, scale=cfg.scale, max_new_tokens=max_new_tokens)
    if cfg.kind == "pairwise":
        from pofe.training.rl import PairwiseTournamentReward

        pw = cfg.pairwise
        calib = None
        if pw.calibration:
            from pofe.evaluation.calibrate import load_calibration_map

            calib = load_calibration_map(pw.calibration)
        if judge is None:
            from pofe.judges.registry import build_judge

            judge = build_judge(cfg.judge)
        return PairwiseTournamentReward(judge, pattern=pw.pattern, group_size=pw.group_size, both_orders=pw.both_orders,
                                        score=pw.score, calibration=calib, l2=pw.bt_l2)
    if cfg.kind == "reward-model":
        # The shared reward-model judge (P(A>B) = sigma(r_A - r_B)) reads a ``pofe rm``
        # directory; its pointwise ``score`` is r(x, y), rendered exactly as in training.
        from pofe.judges.reward_model import RewardModelJudge

        return JudgeScoreReward(RewardModelJudge(cfg.model, max_length=cfg.max_length))
    if judge is None:
        from pofe.judges.registry import build_judge

        judge = build_judge(cfg.judge)
    return JudgeScoreReward(judge)


# ----------------------------------------------------------------------------- the step

def rl_step(policy, ref, tokenizer, prompts: Sequence[str], cfg: RLConfig, reward_fn: RewardFn, optimizer, scheduler,
            *, seed: int, monitor_fn: RewardFn | None = None) -> dict[str, Any]:
    """Sample -> score -> one group-baseline policy-gradient update. Returns the step's metrics."""
    from pofe.generation import generate

    k, mb = cfg.train.group_size, cfg.train.micro_batch
    t0 = time.perf_counter()
    comps = [c for g in generate(policy, tokenizer, list(prompts), n=k, sampling=cfg.sampling, seed=seed) for c in g]
    xs = [x for x in prompts for _ in range(k)]
    t1 = time.perf_counter()
    raw, info = reward_fn(xs, comps)
    mon = monitor_fn(xs, comps)[0] if monitor_fn is not None else None
    t2 = time.perf_counter()

    valid = torch.tensor([r is not None for r in raw])
    r = torch.tensor([float(v) if v is not None else 0.0 for v in raw])
    pad = tokenizer.pad_token_id
    n = len(comps)
    # Reference log-probs (no grad), then policy log-probs with grad in micro-batches.
    cast = lambda: autocast(cfg.train.precision, next(policy.parameters()).device)  # noqa: E731 (log-probs stay fp32)
    with ref.model() as ref_model, cast():
        chunks = [(s, *(t.detach() for t in token_logprobs(ref_model, comps[s:s + mb], pad))) for s in range(0, n, mb)]
    policy.train()
    k1, k3, ent = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    if cfg.kl_in == "reward":
        # The KL penalty is part of the reward, so it must be known before the advantages:
        # one extra no-grad pass (the policy has not moved since sampling, so this is the
        # KL of the samples under the current policy).
        with torch.no_grad(), cast():
            for s, rlp, m in chunks:
                plp, _ = token_logprobs(policy, comps[s:s + mb], pad)
                kt = kl_terms(plp, rlp, m)
                k1[s:s + len(plp)], k3[s:s + len(plp)] = kt["k1"].cpu(), kt["k3"].cpu()
        total = r - cfg.beta * k1
    else:
        total = r.clone()
    adv = masked_group_advantages(total, valid, k, cfg.algo)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for s, rlp, m in chunks:
        with cast():
            plp, _ = token_logprobs(policy, comps[s:s + mb], pad)
        loss = pg_loss(plp, m, adv[s:s + mb].to(plp.device), cfg.algo)
        ent[s:s + len(plp)] = (-(plp * m).sum(-1)).detach().cpu()  # TRL's objective/entropy: −Σ_t log π
        if cfg.kl_in == "loss":
            kt = kl_terms(plp, rlp, m)
            k1[s:s + len(plp)], k3[s:s + len(plp)] = kt["k1"].detach().cpu(), kt["k3"].detach().cpu()
            loss = loss + cfg.beta * kt["k3"] / m.sum(-1).clamp(min=1)
        loss = loss.sum() / n
        loss.backward()
        loss_sum += float(loss.detach())
    params = [p for p in policy.parameters() if p.requires_grad]
    gn = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)) if cfg.optim.grad_clip else None
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    t3 = time.perf_counter()
    rv = r[valid]
    row = {
        "loss": loss_sum, "objective/scores": float(rv.mean()) if len(rv) else None,
        "objective/scores_std": float(rv.std()) if len(rv) > 1 else 0.0,
        "objective/rlhf_reward": float(total[valid].mean()) if len(rv) else None,
        "objective/kl": float(k1.mean()), "objective/kl_k3": float(k3.mean()), "objective/entropy": float(ent.mean()),
        "unscored": int((~valid).sum()), "length": sum(c.num_tokens for c in comps) / n,
        "chars": sum(len(c.text) for c in comps) / n, "finished": sum(c.finished for c in comps) / n,
        "grad_norm": gn, "learning_rate": lr,
        "seconds": {"generate": round(t1 - t0, 3), "reward": round(t2 - t1, 3), "update": round(t3 - t2, 3)},
    }
    if mon is not None:
        mv = [v for v in mon if v is not None]
        row["monitor"] = sum(mv) / len(mv) if mv else None
    if info.get("score_distribution"):
        row["judge"] = info["score_distribution"]
    row.update(info.get("metrics") or {})  # the reward's own counts (a tournament's judge calls, unreadable, ties)
    return row


@torch.no_grad()
def measure(policy, tokenizer, prompts: Sequence[str], reward_fn: RewardFn, sampling: SamplingConfig, *, n: int, seed: int,
            monitor_fn: RewardFn | None = None) -> dict[str, Any] | None:
    """The measured quantities on fixed prompts with a fixed sampling seed (before vs after);
    it must not move the training RNG (a resumed run skips the "before" measurement)."""
    from pofe.generation import generate

    if not prompts:
        return None
    with torch.random.fork_rng(devices=[]):
        comps = [c for g in generate(policy, tokenizer, list(prompts), n=n, sampling=sampling, seed=seed) for c in g]
    xs = [x for x in prompts for _ in range(n)]
    raw, info = reward_fn(xs, comps)
    vals = [v for v in raw if v is not None]
    out = {"reward": sum(vals) / len(vals) if vals else None, "length": sum(c.num_tokens for c in comps) / len(comps),
           "chars": sum(len(c.text) for c in comps) / len(comps), "n": len(comps)}
    if monitor_fn is not None:
        mv = [v for v in monitor_fn(xs, comps)[0] if v is not None]
        out["monitor"] = sum(mv) / len(mv) if mv else None
    if info.get("score_distribution"):
        out["judge"] = info["score_distribution"]
    return out


def batch_for_step(prompts: Sequence[str], batch_size: int, seed: int, step: int) -> list[str]:
    """The prompts of one step, a function of (seed, step) only: a resumed run sees the same ones."""
    return random.Random(seed * 100003 + step).sample(list(prompts), min(batch_size, len(prompts)))


# ----------------------------------------------------------------------------- the command

def run(cfg: RLConfig, *, resume: str | Path | None = None, policy=None, tokenizer=None, reward_fn: RewardFn | None = None,
        judge=None) -> dict[str, Any]:
    """Setup -> RL loop -> save (``<run>/final``). Returns the summary (also ``summary.json``).

    ``resume``: a run folder to continue from its latest checkpoint (``cfg`` is its saved config)."""
    from pofe.data.prompts import load_prompt_texts as load_prompts
    from pofe.training import (
        Reference,
        load_policy,
        make_optimizer,
        make_scheduler,
        save_final,
        seed_everything,
    )
    from pofe.training.resume import checkpoint_if_due, resume_from_checkpoint

    # --- setup: data first (a bad file fails before any run folder exists)
    prompts = load_prompts(cfg.prompts, limit=cfg.max_prompts)
    n_eval = min(cfg.eval_prompts, max(0, len(prompts) - cfg.train.batch_size))
    train_prompts, eval_prompts = (prompts[:-n_eval], prompts[-n_eval:]) if n_eval else (prompts, [])
    if not train_prompts:
        raise ValueError(f"rl: no prompts in {cfg.prompts!r}")
    run_dir = open_run(cfg.run, "rl", resume=resume)
    if resume is None:
        write_config(run_dir, cfg)
    keep_freed_memory()  # glibc: reuse freed buffers instead of page-faulting them in every step
    seed_everything(cfg.seed)
    policy, tokenizer = load_policy(cfg.model, model=policy, tokenizer=tokenizer)
    ref = Reference(policy, lora=cfg.model.lora.enabled)
    reward_fn = reward_fn or build_reward(cfg.reward, max_new_tokens=cfg.sampling.max_new_tokens, judge=judge)
    monitor_fn = build_reward(cfg.monitor, max_new_tokens=cfg.sampling.max_new_tokens) if cfg.monitor else None
    optimizer = make_optimizer(policy, cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, cfg.train.steps)
    start, state = 0, {}
    if resume is not None:
        start, state = resume_from_checkpoint(run_dir, model=policy, optimizer=optimizer, scheduler=scheduler)
        log.info("rl: resuming %s at step %d", run_dir, start)

    def eval_now():
        return measure(policy, tokenizer, eval_prompts, reward_fn, cfg.sampling, n=cfg.eval_samples,
                       seed=cfg.seed + 7, monitor_fn=monitor_fn)
    before = eval_now() if start == 0 else state.get("eval_before")
    log.info("rl: %s, %d steps x %d prompts x %d samples, reward %s, KL in %s (beta %g)", cfg.algo, cfg.train.steps,
             cfg.train.batch_size, cfg.train.group_size, reward_fn.id, cfg.kl_in, cfg.beta)

    # --- loop
    t0 = time.perf_counter()
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json"))
    bar = Progress(cfg.log, total=cfg.train.steps, initial=start, desc="pofe rl",
                   show=(("objective/scores", "reward", "{:.3f}"), ("objective/kl", "kl", "{:.3f}"), ("length", "len", "{:.1f}")))
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            batch = batch_for_step(train_prompts, cfg.train.batch_size, cfg.seed, step)
            row = {"step": step, **rl_step(policy, ref, tokenizer, batch, cfg, reward_fn, optimizer, scheduler,
                                           seed=cfg.seed * 1000 + step, monitor_fn=monitor_fn)}
            sink.write(row)
            bar.update(row)
            fault_point(f"{step}:after_step")  # crash/resume suite: metrics row written, no checkpoint yet
            if checkpoint_if_due(run_dir, cfg.checkpoint, step, cfg.train.steps, model=policy, optimizer=optimizer,
                                 scheduler=scheduler, state={"eval_before": before}):
                fault_point(f"{step}:after_checkpoint")
    finally:
        bar.close()
        sink.close()
    seconds = time.perf_counter() - t0

    # --- save
    after = eval_now()
    out = save_final(policy, tokenizer, run_dir / "final")
    history = read_jsonl(run_dir / "metrics.jsonl")
    last = history[-5:]

    def avg(key):
        v = [h[key] for h in last if h.get(key) is not None]
        return sum(v) / len(v) if v else None

    keys = ("objective/scores", "objective/kl", "objective/kl_k3", "length", "monitor")
    summary = {
        "run_dir": str(run_dir), "final_model": str(out), "algo": cfg.algo, "kl_in": cfg.kl_in, "beta": cfg.beta,
        "reward": reward_fn.id, "steps": len(history), "steps_run": cfg.train.steps - start,
        "resumed_from": start if resume is not None else None, "seconds": round(seconds, 2),
        "first_step": {k: history[0].get(k) for k in keys[:2] + ("length",)} if history else None,
        "last5": {k: avg(k) for k in keys}, "eval_before": before, "eval_after": after,
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary
