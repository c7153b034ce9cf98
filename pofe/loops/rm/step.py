"""One ``pofe rm`` step (the Bradley-Terry loss against the soft target, one optimiser update)
and the batch order of every step."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from pofe.records import PreferencePair
from pofe.runtime.activations import lean_activations
from pofe.runtime.parallel import DataParallel
from pofe.runtime.precision import autocast
from pofe.runtime.seeds import epoch_shuffle_seed
from pofe.loops.rm.reward_model import pair_prompt, rewards
from pofe.runtime.step import optimizer_step


def batch_schedule(n: int, batch_size: int, epochs: int, seed: int, steps: int | None = None) -> list[list[int]]:
    """Index batches for every optimiser step: each epoch a fresh shuffle from (seed, epoch).
    A function of its arguments alone, so a resumed run takes the same batches."""
    out = []
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(epoch_shuffle_seed(seed, epoch)).shuffle(order)
        out += [order[s:s + batch_size] for s in range(0, n, batch_size)]
    return out[:steps] if steps is not None else out


def rm_step(model, tokenizer, batch: Sequence[PreferencePair], cfg, optimizer, scheduler, loss_fn,
            dp: DataParallel = DataParallel(), *, step: int) -> dict[str, Any]:
    """One optimiser step of ``loss_fn(Δr, p)`` (the soft Bradley-Terry loss by default, whose
    per-pair minimiser is Δr = logit(p)) on this process's ``batch``, the mean taken over every
    process's pairs; ``cfg`` is ``pofe rm``'s config (``train.precision``, ``max_length``,
    ``optim.grad_clip``). ``step`` (1-based) names the step in a non-finite-loss error. TRL's
    metric names, over the whole step."""
    t0 = time.perf_counter()
    n = dp.sum(len(batch))
    optimizer.zero_grad(set_to_none=True)
    r = margin = torch.zeros(0)
    loss_sum = 0.0
    dp.lockstep(model, int(bool(batch)), pad_token_id=tokenizer.pad_token_id)  # sharded: a zero pass for an empty batch
    if batch:  # an uneven last batch can leave a process nothing; it still joins the all-reduce
        with autocast(cfg.train.precision, next(model.parameters()).device), lean_activations(model):  # rewards() returns fp32 scores
            r = rewards(model, tokenizer, [pair_prompt(q) for q in batch] * 2, [q.chosen for q in batch] + [q.rejected for q in batch],
                        max_length=cfg.max_length)
        margin = r[: len(batch)] - r[len(batch):]
        p = torch.tensor([q.p for q in batch], dtype=margin.dtype, device=margin.device)
        loss = loss_fn(margin, p).sum() / n
        loss.backward()
        loss_sum = float(loss.detach())
    done = optimizer_step(optimizer, scheduler, model.parameters(), losses={"": dp.sum(loss_sum)}, step=step,
                          grad_clip=cfg.optim.grad_clip, dp=dp)
    gn, lr = done.grad_norm, done.lr
    k = len(batch)
    chosen, rejected = (torch.tensor(dp.cat(v.detach().cpu().tolist())) for v in (r[:k], r[k:]))
    m, p = chosen - rejected, torch.tensor(dp.cat([q.p for q in batch]))
    decided = p != 0.5
    agree = ((m > 0) & (p > 0.5)) | ((m < 0) & (p < 0.5))
    return {"loss": dp.sum(loss_sum), "rewards/chosen": float(chosen.mean()),
            "rewards/rejected": float(rejected.mean()), "rewards/margins": float(m.mean()),
            "rewards/accuracies": float(agree[decided].float().mean()) if decided.any() else None,
            "grad_norm": gn, "learning_rate": lr, "seconds": round(time.perf_counter() - t0, 4)}
