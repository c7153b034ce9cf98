"""Step 4 of OAIF Algorithm 1 (Guo et al. 2024) for ``pofe online``: the DAP update on this
process's pairs against the reference pi_0 (DPO Eq. 1, IPO Eq. 2, SLiC Eq. 3), gradients
averaged over data-parallel processes, and the step's ``metrics.jsonl`` row with the
per-pair losses written to the ledger. No gradient flows through sampling or annotation."""

from __future__ import annotations

import time
from typing import Any

from pofe.loops.online.dap import DapResult, TokenPair, dap_backward
from pofe.loops.online.ledger import loss_row
from pofe.loops.online.metrics import step_metrics
from pofe.runtime.parallel import gather, reduce_sum
from pofe.runtime.step import optimizer_step
from pofe.runtime.zero import ZeroOptimizer


def dap_update(acc, policy, reference, pairs: list[TokenPair], *, optimizer, scheduler, loss_fn, beta: float, pad_token_id: int,
               cfg, step: int, times: dict[str, float]) -> tuple[DapResult | None, float | None]:
    """One optimiser step on the DAP loss of ``pairs`` (this process's; ``policy`` is the DDP
    wrapper). The loss is normalised by the pairs of all processes, so the all-reduced mean
    gradient is the gradient of the global mean loss. A NaN/inf loss stops the run before the
    optimiser step (and so before any checkpoint). Returns the result and the gradient norm
    (None when nothing was trained anywhere: the optimiser step is skipped) and the learning rate the
    step used; the schedule advances either way (:func:`pofe.runtime.step.optimizer_step`)."""
    world = acc.num_processes
    n_global = reduce_sum(acc, len(pairs))
    res = None
    if n_global > 0:
        res = dap_backward(policy, reference, pairs, loss_fn=loss_fn, beta=beta, micro_batches=cfg.train.grad_accum,
                           normaliser=n_global / world, pad_token_id=pad_token_id, backward=acc.backward, device=acc.device,
                           # ZeRO reduces in every backward and accumulates until its step: no no_sync
                           no_sync=None if isinstance(optimizer, ZeroOptimizer) else lambda: acc.no_sync(policy),
                           lockstep=world > 1, precision=cfg.train.precision)
        t_opt = time.perf_counter()
        # ZeRO clips inside its own step; otherwise accelerate's clip on the DDP wrapper's parameters
        clip = (lambda ps, m: None) if isinstance(optimizer, ZeroOptimizer) else (
            lambda ps, m: float(acc.clip_grad_norm_(ps, m)))
        done = optimizer_step(optimizer, scheduler, policy.parameters(), step=step, grad_clip=cfg.optim.grad_clip,
                              losses={f"pair {ps.pair_id}": ps.loss for ps in res.pairs}, clip=clip)
        times.update(reference=res.time_ref, policy=res.time_policy, optimizer=time.perf_counter() - t_opt)
    else:  # nothing labelled on any process: no update, but the schedule still advances with the step
        done = optimizer_step(optimizer, scheduler, policy.parameters(), step=step, losses={}, trained=False)
    return res, done.grad_norm, done.lr


def step_row(acc, step: int, sp, res: DapResult | None, *, lr: float, grad_norm: float | None, ledger, sync,
             ) -> dict[str, Any]:
    """The step's metrics row (every process gathered); the per-pair losses go to the ledger
    (main process) after the step's annotations; ``sync``: the source's engine sync, which holds the
    sampling engine (:class:`pofe.loops.online.pair_sources.EngineSync`)."""
    pair_stats = [ps for r in gather(acc, res.pairs if res else []) for ps in r]
    counts = {k: int(reduce_sum(acc, v)) for k, v in sp.counts.items()}
    tokens, chars, samples = (int(reduce_sum(acc, x)) for x in sp.gen)
    if ledger is not None:
        for ps in pair_stats:
            ledger.write(loss_row(ps, step))
    row = step_metrics(step=step, annotations=sp.rows, pairs=pair_stats, counts=counts, times=sp.times,
                       gen_tokens=tokens, gen_chars=chars, num_samples=samples, lr=lr, grad_norm=grad_norm)
    engine = sync.row(acc, res)
    row.update(engine=engine.pop("engine"), time_sync=sp.times.get("sync", 0.0), staleness=max(0, sp.staleness),
               engine_syncs=engine.pop("engine_syncs"), **sp.extra)
    row.update(engine)
    row.pop("step")  # the driver writes it
    return row
