"""One ``pofe rl`` step (sample -> score -> one group-baseline policy-gradient update), the
held-out measurement, and the prompts of a step; the pieces are in :mod:`pofe.loops.rl.policy_gradient`."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from pofe.generation import SamplingConfig
from pofe.runtime.parallel import DataParallel, merge_metrics
from pofe.runtime.precision import autocast
from pofe.runtime.seeds import rl_prompts_seed
from pofe.stats import mean
from pofe.loops.rl.policy_gradient import (RewardFn, group_shaping, kl_terms, list_items, masked_group_advantages, pg_loss,
                              token_logprobs)
from pofe.runtime.step import optimizer_step


def rl_step(policy, ref, tokenizer, prompts: Sequence[str], cfg, reward_fn: RewardFn, optimizer, scheduler,
            *, seed: int, step: int, monitor_fn: RewardFn | None = None, dp: DataParallel = DataParallel()) -> dict[str, Any]:
    """Sample -> score -> one group-baseline policy-gradient update (``cfg``: the command's RLConfig) on this
    process's ``prompts``. A group never spans processes, so its baseline is local; the loss is the
    mean over every process's sequences. Returns the step's metrics, over all processes."""
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
    shaped, shaping = shape_rewards(r, comps, valid, k, cfg.reward.shaping)
    shaping_row = shaping_metrics(shaping, valid, dp)  # this process's groups, summed over processes
    pad = tokenizer.pad_token_id
    n = len(comps)
    n_all = dp.sum(n)
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
        total = shaped - cfg.beta * k1
    else:
        total = shaped.clone()
    adv = masked_group_advantages(total, valid, k, cfg.algo)
    optimizer.zero_grad(set_to_none=True)
    loss_sum, mis = 0.0, [0.0, 0]  # sync/mismatch_kl's sum and tokens
    # sharded: as many passes as any process (every process has batch_size x group_size samples,
    # so the no-grad passes above already agree)
    dp.lockstep(policy, len(chunks), pad_token_id=pad)
    for s, rlp, m in chunks:
        with cast():
            plp, _ = token_logprobs(policy, comps[s:s + mb], pad)
        add_mismatch(mis, comps[s:s + mb], (plp.detach() * m).sum(-1))
        loss = pg_loss(plp, m, adv[s:s + mb].to(plp.device), cfg.algo)
        ent[s:s + len(plp)] = (-(plp * m).sum(-1)).detach().cpu()  # TRL's objective/entropy: −Σ_t log π
        if cfg.kl_in == "loss":
            kt = kl_terms(plp, rlp, m)
            k1[s:s + len(plp)], k3[s:s + len(plp)] = kt["k1"].detach().cpu(), kt["k3"].detach().cpu()
            loss = loss + cfg.beta * kt["k3"] / m.sum(-1).clamp(min=1)
        loss = loss.sum() / n_all
        loss.backward()
        loss_sum += float(loss.detach())
    done = optimizer_step(optimizer, scheduler, policy.parameters(), losses={"": dp.sum(loss_sum)}, step=step,
                          grad_clip=cfg.optim.grad_clip, dp=dp)
    gn, lr = done.grad_norm, done.lr
    t3 = time.perf_counter()
    r, valid, total, k1, k3, ent = (torch.tensor(dp.cat(x.tolist())) for x in (r, valid, total, k1, k3, ent))
    rv = r[valid]
    row = {
        "loss": dp.sum(loss_sum), "objective/scores": float(rv.mean()) if len(rv) else None,
        "objective/scores_std": float(rv.std()) if len(rv) > 1 else 0.0,
        "objective/rlhf_reward": float(total[valid].mean()) if len(rv) else None,
        "objective/kl": float(k1.mean()), "objective/kl_k3": float(k3.mean()), "objective/entropy": float(ent.mean()),
        "unscored": int((~valid).sum()), "length": dp.sum(sum(c.num_tokens for c in comps)) / n_all,
        "chars": dp.sum(sum(len(c.text) for c in comps)) / n_all, "finished": dp.sum(sum(c.finished for c in comps)) / n_all,
        "grad_norm": gn, "learning_rate": lr,
        "seconds": {"generate": round(t1 - t0, 3), "reward": round(t2 - t1, 3), "update": round(t3 - t2, 3)},
    }
    row.update(shaping_row)
    if cfg.sampling.sync_check.enabled:  # the same on every process (collectives)
        from pofe.generation.sync_check import mismatch_kl

        row["sync/mismatch_kl"] = mismatch_kl(dp.sum(mis[0]), dp.sum(mis[1]))
    if mon is not None:
        mv = [v for v in dp.cat(mon) if v is not None]
        row["monitor"] = sum(mv) / len(mv) if mv else None
    info = merge_metrics(dp.cat([(info, n)]))  # the reward's own counts summed, its rates weighted by samples
    if info.get("score_distribution"):
        row["judge"] = info["score_distribution"]
    row.update(info.get("metrics") or {})  # the reward's own counts (a tournament's judge calls, unreadable, ties)
    return row


def shape_rewards(r: torch.Tensor, comps, valid: torch.Tensor, k: int, shaping) -> tuple[torch.Tensor, dict]:
    """The reward plus the zero-centred group shaping terms of ``reward.shaping`` (length in response
    tokens, markdown list items), and the terms by name (empty when shaping is off)."""
    if not shaping.active:
        return r, {}
    feats = {"length": torch.tensor([float(c.num_tokens) for c in comps]),
             "lists": torch.tensor([float(list_items(c.text)) for c in comps])}
    coefs = {"length": shaping.length, "lists": shaping.lists}
    terms = group_shaping({n: x for n, x in feats.items() if coefs[n]}, coefs, valid, k)
    return r + sum(terms.values()).to(r.dtype), terms


def shaping_metrics(terms: dict, valid: torch.Tensor, dp: DataParallel) -> dict[str, float]:
    """``reward/shaping_abs``: mean |sum of the shaping terms| over the scored samples of every
    process (and ``reward/shaping_<term>_abs`` per term): how far shaping moves a reward."""
    if not terms:
        return {}
    n = dp.sum(int(valid.sum()))
    total = sum(terms.values())
    out = {"reward/shaping_abs": dp.sum(float(total[valid].abs().sum())) / n if n else None}
    for name, t in terms.items():
        out[f"reward/shaping_{name}_abs"] = dp.sum(float(t[valid].abs().sum())) / n if n else None
    return out


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
    vals = [v for v in raw if v is not None]  # unreadable rewards are counted by the reward, never averaged in
    out = {"reward": mean(vals), "length": sum(c.num_tokens for c in comps) / len(comps),
           "chars": sum(len(c.text) for c in comps) / len(comps), "n": len(comps)}
    if vals:  # before vs after is a comparison of two means: each with its 95% interval (the report's error bars)
        import numpy as np

        from pofe.stats import bootstrap_ci

        out["reward_ci95"] = [float(x) for x in bootstrap_ci(np.asarray(vals, dtype=float))]
    if monitor_fn is not None:
        mv = [v for v in monitor_fn(xs, comps)[0] if v is not None]
        out["monitor"] = sum(mv) / len(mv) if mv else None
    if info.get("score_distribution"):
        out["judge"] = info["score_distribution"]
    return out


def batch_for_step(prompts: Sequence[str], batch_size: int, seed: int, step: int) -> list[str]:
    """The prompts of one step, a function of (seed, step) only: a resumed run sees the same ones."""
    return random.Random(rl_prompts_seed(seed, step)).sample(list(prompts), min(batch_size, len(prompts)))


def add_mismatch(acc: list, comps, trainer_sums: torch.Tensor) -> None:
    """Add the samples' log p_sampler - log p_trainer (summed over each response) and their tokens
    to ``acc`` = [sum, tokens], for the samples whose engine returned log-probs."""
    for c, t in zip(comps, trainer_sums.tolist()):
        if c.logprobs is not None:
            acc[0] += sum(c.logprobs) - t
            acc[1] += len(c.logprobs)
