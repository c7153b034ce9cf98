"""The fixed inputs of a ``pofe self-reward`` run: held-out evaluation and validation prompts,
Self-Instruct seed prompts (or a prompt pool), and the human-ranked split (EFT build / RM
evaluation). No prompt is in two of {evaluation, validation, seeds/training}: a policy is
never measured on prompts it trained on or generated from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from pofe.config import PofeConfig
from pofe.data.eft import RankedPrompt, load_ranked, split_ranked
from pofe.data.prompts import DEFAULT_PROMPTS, load_prompts


class SelfRewardDataConfig(PofeConfig):
    """Where each iteration's training prompts come from (``data``, the prompt-source section
    every command has; the held-out prompts are ``eval.prompts`` / ``selection.prompts``)."""

    prompts: str | None = None
    """null: generated each iteration by few-shot Self-Instruct (the paper). A prompt file or a
    built-in set (as ``data.prompts`` of other commands): ``per_iteration`` prompts drawn from it
    per iteration without replacement (how NeMo-Aligner runs it; useful for controlled experiments)."""
    per_iteration: int = Field(64, ge=1)
    """With ``data.prompts``: prompts drawn per iteration."""
    seeds: str | None = None
    """Seed prompts for Self-Instruct demonstrations; None = the IFT prompts, else the
    built-in prompts (minus the held-out ones)."""
    seed_field: str | None = None
    """Field holding the seed prompt (default: the usual prompt fields)."""


@dataclass
class Inputs:
    """Prompts and ranked groups of one run (``cfg`` is a :class:`SelfRewardConfig`)."""

    seeds: list[str]
    eval_prompts: list[str]
    val_prompts: list[str]
    train_pool: list[str] = field(default_factory=list)
    ranked_build: list[RankedPrompt] = field(default_factory=list)
    ranked_eval: list[RankedPrompt] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)


def load_inputs(cfg: Any) -> Inputs:
    """Held-out evaluation and validation prompts, seed prompts, the ranked split. No prompt is
    in two of {evaluation, validation, seeds/training}."""
    rng = random.Random(f"self-reward-{cfg.seed}")
    builtin = list(DEFAULT_PROMPTS)
    rng.shuffle(builtin)
    taken: set[str] = set()

    def take(path: str | None, n: int) -> list[str]:
        if path:
            ps = [p.text for p in load_prompts(path)]
        else:
            ps = [p for p in builtin if p not in taken]
        out = [p for p in ps if p not in taken][:n]
        taken.update(out)
        return out

    eval_prompts = take(cfg.eval.prompts, cfg.eval.num_prompts)
    val_prompts = take(cfg.selection.prompts, cfg.selection.num_prompts if cfg.selection.enabled else 0)
    if cfg.data.seeds:
        seeds = [p.text for p in load_prompts(cfg.data.seeds, field=cfg.data.seed_field)]
    elif cfg.seed_sft.ift:
        from pofe.data.sft import load_examples

        from pofe.data.chat import transcript

        seeds = [e.prompt if isinstance(e.prompt, str) else transcript(e.prompt)  # a chat seed is its transcript
                 for e in load_examples(cfg.seed_sft.ift, "ift", cfg.seed_sft.limit)]
    else:
        seeds = [p for p in builtin if p not in taken]
    seeds = [s for s in dict.fromkeys(seeds) if s not in taken]
    pool = [p.text for p in load_prompts(cfg.data.prompts)] if cfg.data.prompts is not None else []
    pool = [p for p in dict.fromkeys(pool) if p not in taken]
    inp = Inputs(seeds, eval_prompts, val_prompts, pool)
    if cfg.eft.ranked:
        groups, skipped = load_ranked(cfg.eft.ranked, limit=cfg.eft.limit)
        inp.ranked_build, inp.ranked_eval = split_ranked(groups, cfg.eft.eval_fraction, seed=cfg.seed,
                                                         max_eval=cfg.eft.max_eval)
        inp.counts["ranked"] = {"groups": len(groups), "skipped": skipped, "build": len(inp.ranked_build),
                                "eval": len(inp.ranked_eval)}
    inp.counts.update(seeds=len(seeds), eval_prompts=len(eval_prompts), val_prompts=len(val_prompts), train_pool=len(pool))
    return inp
