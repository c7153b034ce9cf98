"""One tiny configuration per training command, for the invariant harness.

Each function returns the nested config dict of a run named ``name`` under ``work`` on the
tiny random model of ``tests/conftest.py`` (``tiny_model_dir``); the harness writes it to YAML
and passes ``--config``. Nothing is downloaded: prompts, pairs and examples are written into
``work`` here. ``over`` takes dotted keys (``{"train.grad_accum": 8}``) applied last.

Keys are those of the commands on the one driver (``pofe.recipe``): ``data.*`` for inputs,
``train.*`` for batch shapes, ``eval.*`` for held-out measurement. A renamed key is a one-line
edit in the function of its command.

``Command`` says what the harness needs to know about each command besides its config: the
argv words, its fault points (``pofe.runtime.fault_point``, read off the loops), what files it
writes and how they are compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

def put(d: dict, dotted: str, value) -> None:
    """Set ``d[a][b][c] = value`` for ``a.b.c`` (creating the dicts)."""
    *head, last = dotted.split(".")
    for k in head:
        d = d.setdefault(k, {})
    d[last] = value


def finish(cfg: dict, over: dict[str, Any] | None) -> dict:
    """``cfg`` with the dotted overrides ``over`` applied."""
    for k, v in (over or {}).items():
        put(cfg, k, v)
    return cfg


# ----------------------------------------------------------------------------- data files

def _once(path: Path, text: str) -> str:
    if not path.exists():
        path.write_text(text)
    return str(path)


def prompts_file(work: Path, n: int = 6) -> str:
    return _once(work / f"prompts-{n}.txt", "".join(f"Question number {i}: what is {i} plus {i}?\n" for i in range(n)))


def ift_file(work: Path, n: int = 8) -> str:
    return _once(work / f"ift-{n}.jsonl", "".join(
        json.dumps({"prompt": f"Question {i}?", "response": f"Answer number {i}" + " and more" * (i % 3) + "."}) + "\n"
        for i in range(n)))


def pairs_file(work: Path, n: int = 10) -> str:
    """Preference pairs with soft labels (rm)."""
    return _once(work / f"pairs-{n}.jsonl", "".join(
        json.dumps({"prompt": f"Question {i}?", "chosen": f"A good answer {i}.", "rejected": "no" * (1 + i % 3),
                    "p": 0.6 + 0.03 * i}) + "\n" for i in range(n)))


_QUIET = {"progress": False, "tensorboard": False}


def _run(work: Path, name: str) -> dict:
    return {"output_dir": str(work), "name": name}


# ----------------------------------------------------------------------------- one function per command

def online(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """OAIF Algorithm 1, 4 steps of 2 prompts, the length judge with soft labels, a checkpoint
    every 2 steps and a win rate vs the initial policy at steps 2 and 4."""
    cfg = {"model": {"name": str(model_dir)}, "judge": {"kind": "length", "temperature": 20},
           "loss": {"labels": "soft"}, "train": {"steps": 4, "batch_size": 2},
           "sampling": {"max_new_tokens": 5}, "optim": {"lr": 1e-3, "warmup_steps": 1, "schedule": "cosine"},
           "data": {"prompts": prompts_file(work, 12)},
           "checkpoint": {"every": 2}, "eval": {"every": 2, "num_prompts": 2, "sampling": {"max_new_tokens": 5}},
           "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


def sft(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """4 steps of 2 examples (one micro-batch), cosine schedule, a checkpoint every 2 steps."""
    cfg = {"model": {"name": str(model_dir)}, "data": {"ift": [ift_file(work)]},
           "train": {"steps": 4, "batch_size": 2, "grad_accum": 1},
           "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.2},
           "checkpoint": {"every": 2}, "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


def rm(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """9 training pairs (one held out), batches of 3 -> 3 steps an epoch, 2 epochs = 6 steps,
    a checkpoint every 2 steps, held-out metrics every 3 steps."""
    cfg = {"model": {"name": str(model_dir)}, "data": {"train": [pairs_file(work)], "eval_fraction": 0.1},
           "train": {"epochs": 2, "batch_size": 3}, "eval": {"every": 3}, "optim": {"lr": 3e-3, "warmup_steps": 0},
           "checkpoint": {"every": 2}, "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


def rl(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """RLOO with the programmatic length reward in chars (KL in the reward), 4 steps of 2
    prompts x 2 samples, a checkpoint every 2 steps, the before/after measurement on 2 held-out
    prompts."""
    cfg = {"model": {"name": str(model_dir)}, "data": {"prompts": prompts_file(work, 8), "max_prompts": None},
           "eval": {"num_prompts": 2, "samples": 1},
           "train": {"steps": 4, "batch_size": 2, "group_size": 2}, "sampling": {"max_new_tokens": 4},
           # chars, not tokens: a random model never samples EOS, so every sample has the same
           # token count, every advantage would be 0 and the weights would never move
           "reward": {"kind": "programmatic", "unit": "chars"},
           "optim": {"lr": 1e-2, "warmup_steps": 0}, "checkpoint": {"every": 2}, "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


def self_reward(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """Two iterations (one driver step each): M1 = the tiny model; M2 = DPO (2 steps, a
    checkpoint each) on its length-judged candidate pairs, then checkpoint selection on 2
    validation prompts."""
    cfg = {"model": {"name": str(model_dir)}, "iterations": 2, "judge": {"kind": "length"},
           "data": {"prompts": prompts_file(work, 8), "per_iteration": 4},
           "candidates": {"n": 2, "chunk": 2, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
           "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 1, "grad_accum": 1, "steps": 2},
           "selection": {"num_checkpoints": 2, "num_prompts": 2},
           "eval": {"num_prompts": 2, "sampling": {"max_new_tokens": 6}},
           "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


def label(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """RL-CAI labels: 6 prompts, two samples each from the tiny model, judged in batches of 2
    (3 steps) by an LLM judge on the tiny model (both orders, a sampled principle) with its own
    cache."""
    cfg = {"model": {"name": str(model_dir)}, "data": {"prompts": prompts_file(work, 6), "max_prompts": 6},
           "train": {"batch_size": 2}, "sampling": {"max_new_tokens": 5},
           "judge": {"kind": "llm", "model": str(model_dir), "template": "constitution", "constitution": "hhh",
                     "cache": {"path": str(work / f"{name}.sqlite")}},
           "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


def cai_revise(work: Path, model_dir: Path, name: str, over: dict | None = None) -> dict:
    """SL-CAI: 3 red-team prompts in chunks of 2 (2 steps) and 1 benign prompt (1 step), one
    critique -> revision round each."""
    benign = _once(work / "benign.txt", "How do I bake bread?\n")
    cfg = {"model": {"name": str(model_dir)}, "data": {"prompts": prompts_file(work, 3), "max_prompts": 3},
           "train": {"batch_size": 2}, "rounds": 1, "sampling": {"max_new_tokens": 3},
           "critique_sampling": {"max_new_tokens": 3}, "refusal": {"benign": benign, "n_benign": 1},
           "log": _QUIET, "run": _run(work, name)}
    return finish(cfg, over)


# ----------------------------------------------------------------------------- what the harness knows per command

# Fields that measure time, not the computation: they differ between any two runs.
TIMING = ("seconds", "wall_time", "cpu_time", "latency_s", "tokens_per_s", "time_*")


@dataclass(frozen=True)
class Output:
    """A file the run writes, compared between the resumed and the uninterrupted run:
    ``rows`` (JSON Lines, row by row, ``drop`` fields removed), ``json`` or ``text``."""

    path: str
    kind: str = "rows"
    drop: tuple[str, ...] = TIMING


@dataclass(frozen=True)
class Command:
    name: str
    argv: tuple[str, ...]
    config: Callable[..., dict]
    #: the fault points this config passes (``POFE_FAULT`` values), from the loop's fault_point calls
    faults: tuple[str, ...]
    #: metrics.jsonl steps of a finished run, in order
    steps: tuple[int, ...]
    outputs: tuple[Output, ...] = ()
    trains_weights: bool = True
    #: summary.json fields that legitimately differ after a resume (besides the run's own)
    summary_drop: tuple[str, ...] = ()
    #: metrics.jsonl fields that legitimately differ after a resume
    metrics_drop: tuple[str, ...] = TIMING


def _label_rows_drop() -> tuple[str, ...]:
    # A batch cut short by the kill is judged again; its reads come from the judge's cache
    # then: only where-they-came-from differs (``cached``, the cache counters), and so does what
    # the judge meter counts (``judge/*``: a cache hit spends no tokens, so the resumed run's
    # meter holds only what it really spent).
    return (*TIMING, "cached", "extra.cache_hits", "extra.cache_misses", "judge/*")


def _points(steps, *phases: str, checkpoints=()) -> tuple[str, ...]:
    """``{step}:{phase}`` for every step and phase, then ``{step}:after_checkpoint`` where one is written."""
    return (*(f"{s}:{p}" for s in steps for p in phases), *(f"{s}:after_checkpoint" for s in checkpoints))


# Fault points: the driver's ``{step}:after_step`` (after the metrics row) and
# ``{step}:after_checkpoint`` (checkpoint.every and the last step), and each loop's own (online's
# after_judge, label's row_i / before_metrics / after_batch, cai's before_metrics, self-reward's
# sr{t}:after_<stage>). A point kills at its first occurrence: inside self-reward, "2:after_step"
# is DPO's step 2 (iteration 2's DPO runs on the driver too) and "1:after_step" is iteration 1.
COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("online", ("online",), online, faults=_points((1, 2, 3, 4), "after_judge", "after_step", checkpoints=(2, 4)),
            steps=(1, 2, 3, 4), outputs=(Output("ledger.jsonl"),)),
    Command("sft", ("sft",), sft, faults=_points((1, 2, 3, 4), "after_step", checkpoints=(2, 4)), steps=(1, 2, 3, 4)),
    Command("rm", ("rm",), rm, faults=_points(range(1, 7), "after_step", checkpoints=(2, 4, 6)), steps=tuple(range(1, 7))),
    Command("rl", ("rl",), rl, faults=_points((1, 2, 3, 4), "after_step", checkpoints=(2, 4)), steps=(1, 2, 3, 4)),
    Command("self-reward", ("self-reward",), self_reward,
            faults=("1:after_step", "sr1:after_iteration", "1:after_checkpoint", "sr2:after_prompts", "sr2:after_pairs",
                    "1:after_judge", "2:after_judge", "2:after_step", "2:after_checkpoint", "sr2:after_dpo",
                    "sr2:after_selection", "sr2:after_iteration"),
            steps=(1, 2),
            # the iteration's model folder is inside the run folder, whose name differs
            summary_drop=("iterations.model",),
            outputs=(Output("iter_2/data/prompts.json", "json"), Output("iter_2/data/candidates.jsonl"),
                     Output("iter_2/data/aift.jsonl"), Output("iter_2/prev_val_responses.jsonl"),
                     Output("iter_2/eval_responses.jsonl"), Output("iter_1/eval_responses.jsonl"),
                     Output("iter_2/selection.json", "json"), Output("iter_2/dpo/metrics.jsonl"))),
    Command("label", ("label",), label,
            faults=_points((1, 2, 3), "row_1", "row_2", "before_metrics", "after_step", "after_batch", checkpoints=(1, 2, 3)),
            steps=(1, 2, 3), trains_weights=False,
            # a batch cut short is judged again from the cache: hits instead of misses, no tokens spent
            summary_drop=("cache", "judge_summary.cache_*", "judge_summary.judge_tokens", "judge_usage"),
            metrics_drop=(*TIMING, "judge/*"),
            outputs=(Output("pairs.jsonl", "text"), Output("labels.jsonl", drop=_label_rows_drop()),
                     Output("preferences.jsonl", "text"))),
    Command("cai revise", ("cai", "revise"), cai_revise,
            faults=_points((1, 2, 3), "before_metrics", "after_step", checkpoints=(1, 2, 3)),
            steps=(1, 2, 3), trains_weights=False,
            outputs=(Output("revisions.jsonl"), Output("sft.jsonl"), Output("preferences.jsonl"))),
)}
