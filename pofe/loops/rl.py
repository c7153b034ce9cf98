"""``pofe rl``: KL-regularised policy optimisation against a reward model, a judge's
expected score (direct RLAIF) or a programmatic reward.

rlaif-constitutional-ai, "The RL objective is unchanged": maximise
E[r(x, y)] − β KL(π ‖ π_ref) with π_ref the SL-CAI model. Per step: sample k responses for
each of B prompts, score them, and take one on-policy gradient step with a group baseline:

* **RLOO** (Ahmadian et al. 2024): the whole response is one action; advantage
  A_i = r_i − mean_{j≠i} r_j (leave-one-out, unbiased), loss −A_i · log π(y_i | x).
* **GRPO-style** (Shao et al. 2024): A_i = (r_i − mean r) / (std r + ε), applied to every
  token and averaged per response, loss −(1/|y_i|) Σ_t A_i log π(y_i,t).

One update per batch keeps it on-policy, so the PPO ratio is 1 and clipping is inactive;
what remains is the REINFORCE gradient with a group baseline (no value model).

KL to the reference (``pofe.training.Reference``: the adapter disabled under LoRA, else a
frozen copy) either enters the reward, r − β Σ_t (log π − log π_ref) (RLOO's form), or the
loss, + β mean_t k3 with k3 = e^{ref−logπ} − (ref − logπ) − 1 ≥ 0 (GRPO's form).

Reward sources (``reward.kind``):
* ``reward-model``: a ``pofe rm`` directory, r = r_φ(x, y);
* ``judge``: a pointwise judge's score; for the ``expected-score`` judge this is direct
  RLAIF (Lee et al. 2023): the expected value of the 1-10 score-token distribution,
  normalised to [0, 1] by the judge; unscored samples (score None) get no gradient;
* ``programmatic``: a function of the response (length in tokens, chars or words).

Logged per step (``metrics.jsonl``): reward, KL (k1 per sequence and k3, both reported;
the mean k1 estimates KL and is ≥ 0 in expectation), length, and for judges the score
distribution (mean of the 1-10 distribution, share at the top of the scale). An optional
``monitor`` reward is computed on the same samples but never trained on: a judge score
climbing while the monitor stays flat is the reward-hacking sign of the seed ("Reward
hacking the judge").
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import Field

from pofe.config import PofeConfig
from pofe.generation import SamplingConfig
from pofe.judges.registry import JudgeConfig
from pofe.records import Completion
from pofe.runs import (
    JsonlWriter,
    RunConfig,
    atomic_write_text,
    new_run_dir,
    write_config,
)
from pofe.training import ModelConfig, OptimConfig

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class RewardConfig(PofeConfig):
    """Where the reward comes from."""

    kind: Literal["programmatic", "reward-model", "judge"] = "programmatic"
    # reward-model
    model: str | None = None
    """reward-model: a ``pofe rm`` output directory (AutoModelForSequenceClassification, num_labels = 1)."""
    max_length: int = 512
    # judge
    judge: JudgeConfig | None = None
    """judge: a pointwise judge (kind expected-score for direct RLAIF, or any judge with ``score``)."""
    # programmatic
    function: Literal["length"] = "length"
    prefer: Literal["shorter", "longer"] = "shorter"
    unit: Literal["tokens", "chars", "words"] = "tokens"
    scale: float = 1.0
    """Programmatic: reward = ±scale · length / normaliser (max_new_tokens for tokens, 4x that for chars,
    the same for words), so rewards sit in [−scale, 0] or [0, scale]."""


# Subclasses rather than default instances, so a partial override (``--set optim.lr=1e-4``)
# keeps the other defaults of this command.
class RLOptimConfig(OptimConfig):
    lr: float = 1e-5
    warmup_steps: int = 0


class RLSamplingConfig(SamplingConfig):
    """On-policy samples at temperature 1 (the policy's own distribution)."""

    max_new_tokens: int = 48
    temperature: float = 1.0


class RLConfig(PofeConfig):
    """``pofe rl``."""

    model: ModelConfig = ModelConfig()
    """The policy; its initial weights are the reference π_ref."""
    prompts: str = "hh-rlhf:helpful"
    max_prompts: int | None = 64
    eval_prompts: int = 8
    """Held-out prompts (taken from the end of the prompt list) for the before/after measurement."""
    eval_samples: int = 4
    steps: int = 20
    batch_prompts: int = 4
    """Prompts per step."""
    group_size: int = Field(4, ge=2)
    """Samples per prompt (k); the group is the baseline."""
    algo: Literal["rloo", "grpo"] = "rloo"
    beta: float = 0.05
    """KL coefficient β."""
    kl_in: Literal["reward", "loss"] = "reward"
    sampling: RLSamplingConfig = RLSamplingConfig()
    reward: RewardConfig = RewardConfig()
    monitor: RewardConfig | None = None
    """An independent reward computed on the same samples and logged, never optimised."""
    optim: RLOptimConfig = RLOptimConfig()
    micro_batch: int = 16
    """Sequences per forward/backward (gradient accumulation within a step)."""
    save_every: int | None = None
    resume: bool = False
    """Continue the run folder ``run.name`` from its latest checkpoint."""
    seed: int = 0
    run: RunConfig = RunConfig()


# ----------------------------------------------------------------------------- reward sources

class RewardFn:
    """(prompts, completions) -> (rewards list with None for unscored, info dict)."""

    id: str = "reward"

    def __call__(self, prompts: Sequence[str], completions: Sequence[Completion]) -> tuple[list[float | None], dict[str, Any]]:
        raise NotImplementedError


class ProgrammaticReward(RewardFn):
    def __init__(self, cfg: RewardConfig, max_new_tokens: int):
        self.cfg = cfg
        self.sign = -1.0 if cfg.prefer == "shorter" else 1.0
        self.norm = float(max_new_tokens * (4 if cfg.unit == "chars" else 1))
        self.id = f"length:{cfg.prefer}:{cfg.unit}"

    def length(self, c: Completion) -> int:
        if self.cfg.unit == "tokens":
            return c.num_tokens
        return len(c.text) if self.cfg.unit == "chars" else len(c.text.split())

    def __call__(self, prompts, completions):
        return [self.sign * self.cfg.scale * self.length(c) / self.norm for c in completions], {}


class JudgeScoreReward(RewardFn):
    """A pointwise judge's score as the reward (direct RLAIF with the expected-score judge).

    The judge returns :class:`~pofe.records.Score` with ``score`` already normalised when it
    is an expected-score judge; a score distribution found in ``Score.extra`` (key
    ``distribution`` / ``probs``) is averaged for logging. ``None`` scores stay None.
    """

    def __init__(self, judge):
        if not callable(getattr(judge, "score", None)):
            raise ValueError(f"judge {getattr(judge, 'id', judge)!r} is not pointwise (no score method); "
                             "use kind expected-score (direct RLAIF) or another pointwise judge")
        self.judge = judge
        self.id = f"judge:{getattr(judge, 'id', '?')}"

    def __call__(self, prompts, completions):
        scores = self.judge.score(list(prompts), [c.text for c in completions])
        vals = [s.score if s.parse_ok else None for s in scores]
        return vals, {"score_distribution": score_distribution(scores)}


def score_distribution(scores) -> dict[str, Any] | None:
    """Mean of the judges' distributions over the score tokens (1..10), the expected raw score
    when available, and the share of samples at the top of the scale (E[score] ≥ 90% of the
    range): the number to watch for reward hacking."""
    dists, expected = [], []
    for s in scores:
        extra = getattr(s, "extra", None) or {}
        d = extra.get("distribution") or extra.get("probs") or extra.get("score_probs")
        if isinstance(d, dict):
            keys = sorted(d, key=lambda k: float(k))
            d = [d[k] for k in keys]
        if isinstance(d, (list, tuple)) and d:
            dists.append([float(v) for v in d])
        e = extra.get("expected_score", extra.get("expected"))
        if e is not None:
            expected.append(float(e))
    out: dict[str, Any] = {}
    if dists and len({len(d) for d in dists}) == 1:
        n = len(dists[0])
        mean = [sum(d[i] for d in dists) / len(dists) for i in range(n)]
        out["mean_distribution"] = [round(v, 4) for v in mean]
        evs = [sum((i + 1) * v for i, v in enumerate(d)) / max(sum(d), 1e-12) for d in dists]
        out["top_of_scale_share"] = sum(e >= 1 + 0.9 * (n - 1) for e in evs) / len(evs)
    if expected:
        out["expected_score_mean"] = sum(expected) / len(expected)
    return out or None


def build_reward(cfg: RewardConfig, *, max_new_tokens: int, judge=None) -> RewardFn:
    if cfg.kind == "programmatic":
        return ProgrammaticReward(cfg, max_new_tokens)
    if cfg.kind == "reward-model":
        if not cfg.model:
            raise ValueError("reward.kind = reward-model needs reward.model (a pofe rm output directory)")
        # The shared reward-model judge (P(A>B) = sigma(r_A - r_B)) reads a ``pofe rm``
        # directory; its pointwise ``score`` is r(x, y), rendered exactly as in training.
        from pofe.judges.reward_model import RewardModelJudge

        return JudgeScoreReward(RewardModelJudge(cfg.model, max_length=cfg.max_length))
    if judge is None:
        from pofe.judges.registry import build_judge

        if cfg.judge is None:
            raise ValueError("reward.kind = judge needs reward.judge (e.g. kind: expected-score)")
        judge = build_judge(cfg.judge)
    return JudgeScoreReward(judge)


class CallableReward(RewardFn):
    """Wrap a Python ``f(prompt, completion) -> float | None`` (library use and tests)."""

    def __init__(self, f: Callable[[str, Completion], float | None], id: str = "callable"):
        self.f, self.id = f, id

    def __call__(self, prompts, completions):
        return [self.f(x, c) for x, c in zip(prompts, completions)], {}


# ----------------------------------------------------------------------------- pure pieces

def group_advantages(rewards: torch.Tensor, algo: str, eps: float = 1e-6) -> torch.Tensor:
    """Advantages for rewards of shape (G, k): RLOO leave-one-out or GRPO standardised.

    RLOO: A_i = r_i − (Σ_j r_j − r_i)/(k − 1)  (= k/(k − 1) · (r_i − mean r)).
    GRPO: A_i = (r_i − mean r)/(std r + ε), std with the unbiased 1/(k − 1) normaliser
    (torch's default); a constant group gives 0 either way.
    """
    k = rewards.shape[1]
    if k < 2:
        raise ValueError("group baselines need at least 2 samples per prompt")
    if algo == "rloo":
        loo_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
        return rewards - loo_mean
    if algo == "grpo":
        return (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + eps)
    raise ValueError(f"unknown algo {algo!r}")


def kl_terms(policy_tok: torch.Tensor, ref_tok: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sequence KL estimates from per-token log-probs on the sampled tokens (Schulman 2020):
    k1 = Σ_t (log π − log π_ref) (unbiased, can be negative per sample),
    k3 = Σ_t [e^{ref − log π} − (ref − log π) − 1] (≥ 0 per token)."""
    d = (ref_tok - policy_tok) * mask
    k1 = (-d).sum(-1)
    k3 = ((torch.exp(d) - d - 1.0) * mask).sum(-1)
    return {"k1": k1, "k3": k3}


def pg_loss(policy_tok: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, algo: str) -> torch.Tensor:
    """Per-sequence policy-gradient loss: RLOO −A·Σ_t logπ; GRPO −A·mean_t logπ."""
    seq = (policy_tok * mask).sum(-1)
    if algo == "grpo":
        seq = seq / mask.sum(-1).clamp(min=1)
    return -(adv * seq)


# ----------------------------------------------------------------------------- the step

def _token_logprobs(model, comps: Sequence[Completion], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    from pofe.logprobs import build_batch, token_logprobs

    b = build_batch([c.prompt_token_ids for c in comps], [c.token_ids for c in comps], pad_token_id=pad_id)
    dev = next(model.parameters()).device
    b.input_ids, b.attention_mask, b.completion_mask = (t.to(dev) for t in (b.input_ids, b.attention_mask, b.completion_mask))
    lp = token_logprobs(model, b)
    return lp, b.completion_mask.to(lp.dtype)


def rl_step(policy, ref, tokenizer, prompts: Sequence[str], cfg: RLConfig, reward_fn: RewardFn, optimizer, scheduler,
            *, seed: int, monitor_fn: RewardFn | None = None) -> dict[str, Any]:
    """Sample -> score -> one group-baseline policy-gradient update. Returns the step's metrics."""
    from pofe.generation import generate

    k = cfg.group_size
    t0 = time.perf_counter()
    groups = generate(policy, tokenizer, list(prompts), n=k, sampling=cfg.sampling, seed=seed)
    comps = [c for g in groups for c in g]
    xs = [x for x in prompts for _ in range(k)]
    t1 = time.perf_counter()
    raw, info = reward_fn(xs, comps)
    mon = monitor_fn(xs, comps)[0] if monitor_fn is not None else None
    t2 = time.perf_counter()

    valid = torch.tensor([r is not None for r in raw])
    r = torch.tensor([float(v) if v is not None else 0.0 for v in raw])
    pad = tokenizer.pad_token_id
    # Reference log-probs (no grad), then policy log-probs with grad in micro-batches.
    ref_tok_all = []
    with ref.model() as ref_model:
        for s in range(0, len(comps), cfg.micro_batch):
            lp, m = _token_logprobs(ref_model, comps[s : s + cfg.micro_batch], pad)
            ref_tok_all.append((lp.detach(), m))
    policy.train()
    n = len(comps)
    chunks = list(zip(range(0, n, cfg.micro_batch), ref_tok_all))
    k1 = torch.zeros(n)
    k3 = torch.zeros(n)
    if cfg.kl_in == "reward":
        # The KL penalty is part of the reward, so it must be known before the advantages:
        # one extra no-grad pass (the policy has not moved since sampling, so this is the
        # KL of the samples under the current policy).
        with torch.no_grad():
            for s, (rlp, m) in chunks:
                plp, _ = _token_logprobs(policy, comps[s : s + cfg.micro_batch], pad)
                kt = kl_terms(plp, rlp, m)
                k1[s : s + len(plp)] = kt["k1"].cpu()
                k3[s : s + len(plp)] = kt["k3"].cpu()
        total = r - cfg.beta * k1
    else:
        total = r.clone()
    # Unscored samples: no gradient, and they do not move their group's baseline.
    adv = torch.zeros_like(total)
    for gi in range(len(prompts)):
        sl = slice(gi * k, (gi + 1) * k)
        v = valid[sl]
        if int(v.sum()) >= 2:
            adv_g = torch.zeros(k)
            adv_g[v] = group_advantages(total[sl][v].unsqueeze(0), cfg.algo).squeeze(0)
            adv[sl] = adv_g
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for s, (rlp, m) in chunks:
        plp, _ = _token_logprobs(policy, comps[s : s + cfg.micro_batch], pad)
        a = adv[s : s + cfg.micro_batch].to(plp.device)
        loss = pg_loss(plp, m, a, cfg.algo)
        if cfg.kl_in == "loss":
            kt = kl_terms(plp, rlp, m)
            k1[s : s + len(plp)] = kt["k1"].detach().cpu()
            k3[s : s + len(plp)] = kt["k3"].detach().cpu()
            loss = loss + cfg.beta * kt["k3"] / m.sum(-1).clamp(min=1)
        loss = loss.sum() / n
        loss.backward()
        loss_sum += float(loss.detach())
    params = [p for p in policy.parameters() if p.requires_grad]
    gn = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)) if cfg.optim.grad_clip else None
    optimizer.step()
    scheduler.step()
    t3 = time.perf_counter()
    lengths = [c.num_tokens for c in comps]
    rv = r[valid]
    row = {
        "loss": loss_sum, "reward": float(rv.mean()) if len(rv) else None, "reward_std": float(rv.std()) if len(rv) > 1 else 0.0,
        "reward_total": float(total[valid].mean()) if len(rv) else None, "unscored": int((~valid).sum()),
        "kl": float(k1.mean()), "kl_k3": float(k3.mean()), "length": sum(lengths) / n,
        "chars": sum(len(c.text) for c in comps) / n, "finished": sum(c.finished for c in comps) / n,
        "grad_norm": gn, "lr": scheduler.get_last_lr()[0],
        "seconds": {"generate": round(t1 - t0, 3), "reward": round(t2 - t1, 3), "update": round(t3 - t2, 3)},
    }
    if mon is not None:
        mv = [v for v in mon if v is not None]
        row["monitor"] = sum(mv) / len(mv) if mv else None
    if info.get("score_distribution"):
        row["judge"] = info["score_distribution"]
    return row


@torch.no_grad()
def measure(policy, tokenizer, prompts: Sequence[str], reward_fn: RewardFn, sampling: SamplingConfig, *, n: int, seed: int,
            monitor_fn: RewardFn | None = None) -> dict[str, Any]:
    """The measured quantities on fixed prompts with a fixed sampling seed (before vs after)."""
    from pofe.generation import generate

    groups = generate(policy, tokenizer, list(prompts), n=n, sampling=sampling, seed=seed)
    comps = [c for g in groups for c in g]
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


# ----------------------------------------------------------------------------- the command

def run(cfg: RLConfig, *, policy=None, tokenizer=None, reward_fn: RewardFn | None = None, judge=None) -> dict[str, Any]:
    """Setup -> RL loop -> save (``<run>/final``). Returns the summary (also ``summary.json``)."""
    from pofe.data.prompts import load_prompt_texts as load_prompts
    from pofe.training import (
        Reference,
        latest_checkpoint,
        load_checkpoint,
        load_policy,
        make_optimizer,
        make_scheduler,
        save_checkpoint,
        save_final,
        seed_everything,
    )

    # --- setup
    seed_everything(cfg.seed)
    if cfg.resume:
        if not cfg.run.name:
            raise ValueError("rl: resume needs run.name (the run folder to continue)")
        from pathlib import Path

        run_dir = Path(cfg.run.output_dir) / cfg.run.name
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(cfg.run, "rl")
    write_config(run_dir, cfg)
    prompts = load_prompts(cfg.prompts, limit=cfg.max_prompts)
    n_eval = min(cfg.eval_prompts, max(0, len(prompts) - cfg.batch_prompts))
    train_prompts, eval_prompts = (prompts[:-n_eval], prompts[-n_eval:]) if n_eval else (prompts, [])
    if not train_prompts:
        raise ValueError(f"rl: no prompts in {cfg.prompts!r}")
    policy, tokenizer = load_policy(cfg.model, model=policy, tokenizer=tokenizer)
    ref = Reference(policy, lora=cfg.model.lora.enabled)
    reward_fn = reward_fn or build_reward(cfg.reward, max_new_tokens=cfg.sampling.max_new_tokens, judge=judge)
    monitor_fn = build_reward(cfg.monitor, max_new_tokens=cfg.sampling.max_new_tokens) if cfg.monitor else None
    optimizer = make_optimizer(policy, cfg.optim)
    scheduler = make_scheduler(optimizer, cfg.optim, cfg.steps)
    start = 0
    ckpt = latest_checkpoint(run_dir) if cfg.resume else None
    if ckpt is not None:
        start = load_checkpoint(ckpt, model=policy, optimizer=optimizer, scheduler=scheduler)["step"]
        log.info("rl: resumed from %s (step %d)", ckpt, start)
    rng = random.Random(cfg.seed)
    before = measure(policy, tokenizer, eval_prompts, reward_fn, cfg.sampling, n=cfg.eval_samples, seed=cfg.seed + 7,
                     monitor_fn=monitor_fn) if eval_prompts and start == 0 else None
    log.info("rl: %s, %d steps x %d prompts x %d samples, reward %s, KL in %s (beta %g)", cfg.algo, cfg.steps,
             cfg.batch_prompts, cfg.group_size, reward_fn.id, cfg.kl_in, cfg.beta)

    # --- loop
    t0 = time.perf_counter()
    history = []
    with JsonlWriter(run_dir / "metrics.jsonl") as mw:
        for step in range(start, cfg.steps):
            # Deterministic batch per step (so a resumed run sees the same prompts).
            batch = random.Random(cfg.seed * 100003 + step).sample(train_prompts, min(cfg.batch_prompts, len(train_prompts)))
            row = {"step": step + 1, **rl_step(policy, ref, tokenizer, batch, cfg, reward_fn, optimizer, scheduler,
                                               seed=cfg.seed * 1000 + step, monitor_fn=monitor_fn)}
            mw.write(row)
            history.append(row)
            log.info("step %d reward %.4f kl %.4f len %.1f", step + 1, row["reward"] or float("nan"), row["kl"], row["length"])
            if cfg.save_every and (step + 1) % cfg.save_every == 0:
                save_checkpoint(run_dir / "checkpoints" / f"step-{step + 1}", model=policy, optimizer=optimizer,
                                scheduler=scheduler, step=step + 1)
    del rng
    seconds = time.perf_counter() - t0

    # --- save
    after = measure(policy, tokenizer, eval_prompts, reward_fn, cfg.sampling, n=cfg.eval_samples, seed=cfg.seed + 7,
                    monitor_fn=monitor_fn) if eval_prompts else None
    out = save_final(policy, tokenizer, run_dir / "final")
    last = history[-5:]

    def avg(key):
        v = [h[key] for h in last if h.get(key) is not None]
        return sum(v) / len(v) if v else None

    summary = {
        "run_dir": str(run_dir), "model_dir": str(out), "algo": cfg.algo, "kl_in": cfg.kl_in, "beta": cfg.beta,
        "reward": reward_fn.id, "steps": len(history), "seconds": round(seconds, 2),
        "first_step": {k: history[0].get(k) for k in ("reward", "kl", "length")} if history else None,
        "last5": {"reward": avg("reward"), "kl": avg("kl"), "kl_k3": avg("kl_k3"), "length": avg("length"), "monitor": avg("monitor")},
        "eval_before": before, "eval_after": after,
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary
