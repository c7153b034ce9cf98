"""The in-training win rate of ``pofe online``: the current policy against the initial one
on held-out prompts, the judge reading both orders (OAIF Sec. 4.1 evaluates against the SFT
policy). Sharded over data-parallel processes, counts summed; rows in ``eval/step-N.jsonl``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from pofe.evaluation.winrate import head_to_head, wilson_interval
from pofe.generation import SamplingConfig, generate
from pofe.records import Completion, Prompt
from pofe.runs import JsonlWriter
from pofe.generation.base import prompt_input
from pofe.runtime.parallel import gather, reduce_sum


def winrate(judge, prompts: Sequence[Prompt], current: Sequence[Completion], initial: Sequence[Completion],
            judge_context: Callable = contextlib.nullcontext) -> tuple[dict[str, int], list[dict]]:
    """Win / tie / loss counts of the current policy (A) against the initial one (B) under
    the one tie rule of :mod:`pofe.evaluation.winrate` (the judge reads both orders; orders
    that disagree are a tie, as in ``pofe eval``). Identical responses are ties without a
    judge call; an unreadable pair is counted as unlabelled and left out of the rate."""
    h = head_to_head(judge, [p.text for p in prompts], [c.text for c in current], [i.text for i in initial],
                     references=[p.reference for p in prompts], judge_context=judge_context)
    counts = {"wins": h["wins"], "ties": h["ties"], "losses": h["losses"], "unlabelled": h["dropped_unparsed"]}
    rows = [{"prompt": p.text, "current": c.text, "initial": i.text, "len_current": c.num_tokens,
             "len_initial": i.num_tokens, **pr} for p, c, i, pr in zip(prompts, current, initial, h["pairs"])]
    return counts, rows


def winrate_value(counts: dict[str, int]) -> float | None:
    n = counts["wins"] + counts["ties"] + counts["losses"]
    return (counts["wins"] + 0.5 * counts["ties"]) / n if n else None


def initial_responses(reference, tok, prompts: Sequence[Prompt], *, sampling: SamplingConfig, seed: int) -> list[Completion]:
    """The initial policy's responses to the held-out prompts, once per run (seeded: the same
    after a resume), from ``reference.model()`` (pi_0: the frozen copy or the adapter disabled)."""
    from pofe.runtime.seeds import seed_everything

    if not prompts:
        return []
    seed_everything(seed)
    with reference.model() as pi0:
        return [g[0] for g in generate(pi0, tok, [prompt_input(p) for p in prompts], n=1, sampling=sampling)]


def evaluate_vs_initial(acc, policy, tok, judge, judge_ctx, prompts: Sequence[Prompt],
                        init_responses: Sequence[Completion], *, sampling: SamplingConfig, seed: int, run_dir: Path,
                        step: int) -> dict:
    """Win rate of the current policy vs the initial one on held-out prompts (sharded over
    processes, counts summed). Rows go to ``eval/step-N.jsonl``."""
    t0 = time.perf_counter()
    counts, rows, tot_len = {"wins": 0, "ties": 0, "losses": 0, "unlabelled": 0}, [], 0.0
    if prompts:
        with torch.random.fork_rng(devices=[]):  # evaluation must not move the training RNG
            torch.manual_seed(seed + 1)
            current = [g[0] for g in generate(policy, tok, [prompt_input(p) for p in prompts], n=1, sampling=sampling)]
        counts, rows = winrate(judge, prompts, current, init_responses, judge_context=judge_ctx)
        tot_len = sum(c.num_tokens for c in current)
    g = {k: int(reduce_sum(acc, v)) for k, v in counts.items()}
    n_eval, tot_len = reduce_sum(acc, len(prompts)), reduce_sum(acc, tot_len)
    all_rows = [r for rs in gather(acc, rows) for r in rs]
    if acc.is_main_process:
        with JsonlWriter(run_dir / "eval" / f"step-{step}.jsonl") as w:
            for r in all_rows:
                w.write(r)
    n = g["wins"] + g["ties"] + g["losses"]
    lo, hi = wilson_interval(g["wins"] + 0.5 * g["ties"], n)
    return {"winrate_vs_init": winrate_value(g), "winrate_vs_init_ci95": [lo, hi] if n else [None, None],
            "eval_wins": g["wins"], "eval_ties": g["ties"],
            "eval_losses": g["losses"], "eval_unlabelled": g["unlabelled"],
            "eval_mean_len": tot_len / n_eval if n_eval else None, "time_eval": time.perf_counter() - t0}
