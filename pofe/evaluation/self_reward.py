"""How ``pofe self-reward`` measures its iterations: head-to-head between two models' responses
(both orders; a disagreement is a tie), reward-modelling metrics of a judge on human-ranked
groups (Self-Rewarding LMs Table 4), and checkpoint selection by head-to-head win rate
against the previous model ("Early stopping").

Data-parallel (``dp``, a :class:`pofe.runtime.parallel.DataParallel`; every function taking one
is a collective): each process judges its contiguous block of the items (``dp.map``) and every
process gets the same numbers, which do not depend on the number of processes for a
deterministic judge; only rank 0 writes ``selection.json`` and ``iter_t/model``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import Field

from pofe.config import PofeConfig
from pofe.data.eft import RankedPrompt
from pofe.judges.base import Capability, as_pairwise, has_capability
from pofe.judges.config import JudgeConfig
from pofe.runtime.parallel import DataParallel

ONE = DataParallel()


class SelectionSettings(PofeConfig):
    """Checkpoint selection by head-to-head win rate against the previous iteration."""

    enabled: bool = True
    """false: M_t is the last DPO checkpoint."""
    num_checkpoints: int = Field(3, ge=1)
    """Evenly spaced DPO checkpoints compared (the last is always one of them)."""
    num_prompts: int = Field(16, ge=0)
    """Validation prompts (disjoint from the evaluation prompts; paper: 253)."""
    prompts: str | None = None
    """Validation prompt file; None = a seeded split of the built-in prompts."""
    judge: JudgeConfig | None = None
    """None = the training judge, fixed at M_{t-1} (the paper uses an external judge, Claude 2)."""
    keep_checkpoints: bool = False
    """Keep the DPO checkpoints after selection (they are full copies of the trainable weights)."""


def head_to_head(judge, prompts: Sequence[str], a: Sequence[str], b: Sequence[str], dp: DataParallel = ONE) -> dict[str, Any]:
    """W/T/L of A vs B under the one tie rule of :mod:`pofe.evaluation.winrate` (both orders;
    a disagreement between orders = a tie — the paper's protocol, FastChat's). Identical
    responses are ties without a judge call; unreadable pairs are dropped and counted. Each
    process judges its block of the pairs; the outcomes are counted once, in order."""
    from pofe.evaluation import winrate

    pw = as_pairwise(judge)

    def block(idx: list[int]) -> list[int | None]:
        h = winrate.head_to_head(pw, [prompts[i] for i in idx], [a[i] for i in idx], [b[i] for i in idx])
        return [r["outcome"] for r in h["pairs"]]

    return winrate.count_outcomes(dp.map(block, list(range(len(prompts)))))


def score_all(judge, prompts: Sequence[str], responses: Sequence[str], dp: DataParallel = ONE) -> list:
    """``judge.score`` of every (prompt, response), each process scoring its block."""
    idx = list(range(len(prompts)))
    return dp.map(lambda mine: judge.score([prompts[i] for i in mine], [responses[i] for i in mine]), idx)


def rm_eval(judge, groups: Sequence[RankedPrompt], max_score: float = 5.0, dp: DataParallel = ONE) -> dict[str, Any]:
    """Reward-modelling metrics (Table 4) of a pointwise judge on human-ranked groups."""
    from pofe.evaluation.rm_metrics import RankedGroup, rm_metrics

    flat = [(g.prompt, r) for g in groups for r in g.responses]
    scores = score_all(judge, [x for x, _ in flat], [y for _, y in flat], dp)
    out, k = [], 0
    for g in groups:
        out.append(RankedGroup(g.ranks, tuple(s.score for s in scores[k:k + len(g.responses)])))
        k += len(g.responses)
    return rm_metrics(out, max_score=max_score)


def pick_checkpoint(options: Sequence[Any], respond: Callable[[Any], list[str]], judge, prompts: Sequence[str],
                    previous: Sequence[str], dp: DataParallel = ONE) -> tuple[int, list[dict[str, Any]]]:
    """The option (a DPO checkpoint) whose responses on the validation ``prompts`` have the
    best tie-adjusted win rate against ``previous`` (M_{t-1}'s responses); equal rates go to
    the later option. ``respond(option)`` gives that option's responses. Returns the index
    and one head-to-head result per option."""
    results = [head_to_head(judge, prompts, respond(o), previous, dp) for o in options]
    best = max(range(len(results)), key=lambda i: (results[i]["win_rate_adjusted"] or 0.0, i))
    return best, results


def measure_responses(prompts: Sequence[str], responses: Sequence[str], tokenizer, yardstick,
                      previous: Sequence[str] | None, dp: DataParallel = ONE) -> dict[str, Any]:
    """Step 7 numbers of one model's held-out responses: mean length (characters and
    tokens), mean score under the fixed yardstick judge (unscored ones counted, never given a
    value), and head-to-head against the previous iteration's responses."""
    m: dict[str, Any] = {"eval_prompts": len(responses)}
    if not responses:
        return m
    m["mean_length_chars"] = sum(len(r) for r in responses) / len(responses)
    m["mean_length_tokens"] = sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in responses) / len(responses)
    if yardstick is not None and has_capability(yardstick, Capability.POINTWISE):
        sc = [s.score for s in score_all(yardstick, prompts, responses, dp)]
        ok = [s for s in sc if s is not None]
        m["eval_mean_score"] = sum(ok) / len(ok) if ok else None
        m["eval_unscored"] = len(sc) - len(ok)
        m["eval_judge"] = getattr(yardstick, "id", None)
    if previous is not None and yardstick is not None:
        m["head_to_head_vs_prev"] = head_to_head(yardstick, prompts, responses, previous, dp)
    return m


def select_checkpoint(it_dir: Path, final: Path, cfg: SelectionSettings, *, load: Callable, respond: Callable,
                      judge, prompts: Sequence[str], previous: Sequence[str], dp: DataParallel = ONE) -> Path:
    """Step 6 ("Early stopping"): among the DPO checkpoints of ``it_dir/dpo`` and the final
    model, the one with the best tie-adjusted win rate against M_{t-1}'s ``previous``
    responses on the validation ``prompts`` (ties go to the later one) becomes
    ``it_dir/model``; the comparison is written to ``selection.json``. ``load(ckpt)`` gives a
    checkpoint's (model, tokenizer), ``load(None)`` the final model's; ``respond(model, tokenizer)`` its validation
    responses (a collective with ``dp``: every process answers its block, rank 0 writes)."""
    from pofe.runtime import final_complete, save_final

    model_dir = it_dir / "model"
    # rank 0's view of the folder it owns: every process takes the same branch
    done = dp.from_main((it_dir / "selection.json").exists() and final_complete(model_dir))
    if done:
        return model_dir  # finished; a model folder torn by a crash mid-copy is redone below
    ckpt_root = it_dir / "dpo" / "checkpoints"
    steps = dp.from_main(sorted(int(p.name.split("-", 1)[1]) for p in ckpt_root.glob("step-*"))
                         if ckpt_root.is_dir() else [])
    last = max(steps) if steps else None
    options: list[tuple[int | None, Path | None]] = [(s, ckpt_root / f"step-{s}") for s in steps if s != last]
    options.append((last, None))  # the final model (= the last checkpoint's weights)

    model_of = load  # load(None) = the final model
    if cfg.enabled and prompts and len(options) > 1:
        best, h2h = pick_checkpoint(options, lambda o: respond(*model_of(o[1])), judge, prompts, previous, dp)
        results = [{"step": s, "final": c is None, **h} for (s, c), h in zip(options, h2h)]
    else:
        best = len(options) - 1
        results = [{"step": last, "final": True, "note": "selection disabled or nothing to choose from"}]
    step, ckpt = options[best]
    if not dp.main:
        dp.wait()  # rank 0 writes the model and selection.json
        return model_dir
    from pofe.runs import check_run_path

    check_run_path(model_dir)  # a planted iter_t/model link must not receive the copy
    check_run_path(ckpt_root)  # nor a linked iter_t/dpo get its checkpoints pruned below
    if ckpt is None:
        shutil.copytree(final, model_dir, dirs_exist_ok=True)
    else:
        save_final(*model_of(ckpt), model_dir)
    from pofe.runs import atomic_write_text

    atomic_write_text(it_dir / "selection.json", json.dumps({"selected_step": step, "candidates": results}, indent=2))
    if not cfg.keep_checkpoints:
        shutil.rmtree(ckpt_root, ignore_errors=True)
    dp.wait()
    return model_dir
