"""``pofe self-reward``: Self-Rewarding Language Models (Yuan et al. 2024, Sec. 3.4 onward).
One model is both the policy and its own judge; ``iter_t/`` holds how M_t was made and measured.

* ``iter_1`` -- the seed model M1: with ``seed_sft.enabled`` an IFT-only SFT baseline writes
  EFT data (rubric justifications whose scores agree with human rankings, rebalanced), then
  M1 = SFT of the base model on IFT + EFT ("Seed training data"); else M1 = ``model.name``.
* ``iter_t`` (t >= 2) -- AIFT(M_{t-1}), then DPO ("Self-Instruction creation", "Iterative DPO"):
  1. new prompts by few-shot Self-Instruct (6 seed + 2 earlier-iteration shots, T 0.6, top-p
     0.9, a raw completion prompt), filtered (:mod:`pofe.generation.self_instruct`);
  2-3. N = 4 candidates per prompt from M_{t-1} (T 0.7, top-p 0.9), each scored by M_{t-1}
     with the additive 5-point rubric, k = 3 samples averaged; unscored ones excluded and
     counted (:mod:`pofe.generation.candidates`);
  4. pair = highest vs lowest mean score; ties / fewer than two scores dropped and counted
     -> ``data/aift.jsonl`` (:mod:`pofe.data.aift`);
  5. M_t = DPO on AIFT(M_{t-1}) from M_{t-1}, reference M_{t-1} (beta 0.1, lr 1e-6 cosine to
     1e-7), through ``pofe online``'s offline mode (one DPO trainer);
  6. the DPO checkpoint with the best head-to-head win rate against M_{t-1} on validation
     prompts ("Early stopping").
* every iteration: held-out responses (mean length, mean score under a *fixed* judge),
  head-to-head vs the previous iteration (both orders; a disagreement is a tie), and M_t's
  reward-modelling metrics on the held-out human-ranked split (Table 4); see
  :mod:`pofe.evaluation.self_reward`.

Resumable (``--resume RUN_DIR`` with the run's own ``config.yaml``): each stage's output is
written atomically and skipped when present; candidates append per chunk; DPO / SFT resume
from step checkpoints. ``metrics.jsonl`` has one row per iteration; ``final/`` is M_T.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from pofe.config import PofeConfig
from pofe.data.aift import build_pairs, score_stats
from pofe.data.eft import EFTConfig, write_eft_files
from pofe.data.self_reward_inputs import Inputs, PromptSettings, load_inputs
from pofe.evaluation.self_reward import SelectionSettings, measure_responses, rm_eval, select_checkpoint
from pofe.generation import SamplingConfig
from pofe.generation.candidates import CandidateSettings, first_responses, scored_candidates
from pofe.generation.self_instruct import SelfInstructConfig, completion_fn, generate_prompts
from pofe.judges.base import Capability, has_capability, require_capability
from pofe.judges.config import JudgeConfig, RubricJudgeConfig
from pofe.judges.registry import build_shared_judge
from pofe.loops.sft import SFTTrainSettings
from pofe.runs import RunConfig, open_run, read_jsonl, write_config
from pofe.training.allocator import keep_freed_memory
from pofe.training import ModelConfig, OptimConfig, fault_point, final_complete, seed_everything
from pofe.training.metrics import iteration_row, truncate_metrics
from pofe.training.settings import CheckpointSettings
from pofe.training.stages import StageClock, free, link_final, stage_seed, write_json, write_jsonl
from pofe.training.tracking import LogConfig, MetricsSink, Progress

log = logging.getLogger(__name__)



# ============================================================================ config

class SeedSFTSettings(PofeConfig):
    """The seed stage (paper: M1 = SFT of the base model on 3,200 IFT + 1,630 EFT examples)."""

    enabled: bool = False
    """false: M1 is ``model.name`` as given."""
    ift: list[str] = []
    """IFT files (prompt/response, instruction/output, Self-Instruct seed tasks, messages)."""
    eft: bool = True
    """Build EFT data from ``eft.ranked`` and mix it into M1's SFT."""
    eft_writer: Literal["sft_baseline", "base"] = "sft_baseline"
    """Who writes EFT justifications: the IFT-only SFT baseline (the paper) or the base model."""
    eft_max_ratio: float | None = Field(None, ge=0)
    """Cap EFT examples at this multiple of the IFT count (null = all; paper: about 0.5)."""
    limit: int | None = Field(None, ge=1)
    """Use at most this many IFT examples per file."""
    max_length: int = Field(1024, ge=1)
    """Drop (and count) examples longer than this many tokens."""
    optim: OptimConfig = OptimConfig(lr=5.5e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.2)
    """Paper: 5.5e-6 cosine-decayed to 1.1e-6."""
    train: SFTTrainSettings = SFTTrainSettings()
    """Steps and batch sizes of both SFT runs (paper: 16 examples per step)."""


class DPOSettings(PofeConfig):
    """M_{t+1} = DPO on AIFT(M_t), from M_t, reference M_t ("Iterative DPO")."""

    beta: float = Field(0.1, gt=0)
    """DPO beta (paper: 0.1)."""
    optim: OptimConfig = OptimConfig(lr=1e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.1)
    """Paper: 1e-6 cosine-decayed to 1e-7."""
    batch_size: int = Field(4, ge=1)
    """Pairs per micro-batch."""
    grad_accum: int = Field(4, ge=1)
    """Pairs per optimiser step = batch_size x grad_accum (paper: 16)."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the AIFT pairs when ``steps`` is None."""
    steps: int | None = Field(None, ge=1)
    """Optimiser steps; None = from ``epochs``."""


class EvaluationSettings(PofeConfig):
    """How every iteration is measured."""

    num_prompts: int = Field(32, ge=0)
    """Held-out prompts for mean score, length and head-to-head (paper: 256)."""
    prompts: str | None = None
    """None = a seeded split of the built-in prompts."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=128)
    """Greedy: the comparison between iterations should not depend on sampling luck."""
    judge: JudgeConfig | None = None
    """A fixed yardstick for mean score and head-to-head; None = the training judge on M1."""
    rm_metrics: bool = True
    """Reward-modelling metrics of each M_t as a judge on the held-out ranked split."""


class SelfRewardConfig(PofeConfig):
    """``pofe self-reward``."""

    seed: int = 0
    """Seeds every stage (each stage derives its own seed from it)."""
    model: ModelConfig = ModelConfig()
    """The base model (M0 with seed SFT, else M1). LoRA settings apply to every training stage."""
    iterations: int = Field(3, ge=1)
    """Models M1..M_T (paper: 3, i.e. two DPO rounds)."""
    seed_sft: SeedSFTSettings = SeedSFTSettings()
    """How M1 is made."""
    eft: EFTConfig = EFTConfig()
    """EFT data from human-ranked responses."""
    prompts: PromptSettings = PromptSettings()
    """Where each iteration's prompts come from."""
    self_instruct: SelfInstructConfig = SelfInstructConfig()
    """Prompt generation and filters (source: self-instruct)."""
    candidates: CandidateSettings = CandidateSettings()
    """Candidates per prompt and their sampling."""
    judge: JudgeConfig = RubricJudgeConfig()
    """The reward: the additive rubric (paper). Any pointwise kind works (rubric,
    expected-score, reward-model, or a programmatic one such as length standing in as a judge
    with a known preference); a pairwise-only kind (llm, openai, llamacpp) cannot score one
    candidate on its own and is refused when the config is parsed."""
    judge_model: Literal["self", "fixed"] = "self"
    """self: LLM judges run on M_t (self-rewarding). fixed: ``judge.model`` as configured."""
    dpo: DPOSettings = DPOSettings()
    """The DPO stage."""
    selection: SelectionSettings = SelectionSettings()
    """Checkpoint selection."""
    evaluation: EvaluationSettings = EvaluationSettings()
    """Per-iteration evaluation."""
    log: LogConfig = LogConfig()
    """metrics.jsonl (one row per iteration), TensorBoard / W&B / MLflow, progress bars."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @field_validator("judge")
    @classmethod
    def _judge_is_pointwise(cls, v):
        # Step 3 scores each candidate on its own (Yuan et al. 2024, Sec. 2.2): a pairwise-only
        # judge has no score to give, so refuse it here, before any model loads.
        require_capability(v, Capability.POINTWISE, where="judge (self-reward scores each candidate on its own)")
        return v


# ============================================================================ stages

def _judge_runtime(cfg: SelfRewardConfig, model, tok, tag: str) -> dict[str, Any]:
    if cfg.judge_model == "self" and has_capability(cfg.judge, Capability.SHARES_WEIGHTS):
        return {"model": model, "tokenizer": tok, "judge_id": f"self:{tag}:{cfg.judge.kind}:{cfg.judge.template}"}
    return {}


def _load(name: str, cfg: SelfRewardConfig):
    from pofe.models import load_model

    return load_model(name, dtype=cfg.model.dtype, device=cfg.model.device, trust_remote_code=cfg.model.trust_remote_code)


def seed_stage(cfg: SelfRewardConfig, inp: Inputs, it_dir: Path) -> tuple[str, dict[str, Any]]:
    """M1: (SFT baseline -> EFT data ->) SFT on IFT + EFT. Returns M1's path and counts."""
    from pofe.data.sft import SFTExample, load_examples
    from pofe.loops.sft import SFTConfig, SFTDataConfig, run as sft_run

    s = cfg.seed_sft
    info: dict[str, Any] = {}
    if not s.enabled:
        return cfg.model.name, {"seed_sft": "disabled"}
    data_dir = it_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)

    def sft_cfg(sub: str) -> SFTConfig:
        return SFTConfig(seed=cfg.seed, model=cfg.model, data=SFTDataConfig(max_length=s.max_length,
                                                                            eft_max_ratio=s.eft_max_ratio),
                         optim=s.optim, train=s.train, checkpoint=CheckpointSettings(every=50), log=LogConfig(tensorboard=False, progress=cfg.log.progress),
                         run=RunConfig(output_dir=str(it_dir), name=sub))

    ift = load_examples(s.ift, "ift", s.limit)
    eft: list = []
    if s.eft and inp.ranked_build:
        eft_path = data_dir / "eft_train.jsonl"
        if not eft_path.exists():
            writer = cfg.model.name
            if s.eft_writer == "sft_baseline":  # the paper: EFT targets come from the IFT-only SFT baseline
                writer = sft_run(sft_cfg("sft_baseline"), examples=ift, run_dir=it_dir / "sft_baseline")["final_model"]
            model, tok = _load(writer, cfg)
            judge = build_shared_judge(cfg.judge, model=model, tokenizer=tok, judge_id=f"eft-writer:{Path(writer).name}")
            write_eft_files(data_dir, inp.ranked_build, inp.ranked_eval, judge, rebalance_ratio=cfg.eft.rebalance_ratio,
                            seed=cfg.seed)
            free(model, judge)
        info["eft"] = json.loads((data_dir / "eft_stats.json").read_text())
        eft = [SFTExample(r["prompt"], r["response"], "eft") for r in read_jsonl(eft_path)]
        if s.eft_max_ratio is not None and len(eft) > s.eft_max_ratio * len(ift):
            eft = random.Random(cfg.seed).sample(eft, int(s.eft_max_ratio * len(ift)))
    if not (data_dir / "ift.jsonl").exists():
        write_jsonl(data_dir / "ift.jsonl", [{"prompt": e.prompt, "response": e.response} for e in ift])
    summary = sft_run(sft_cfg("sft"), examples=ift + eft, run_dir=it_dir / "sft")
    info["sft"] = {k: summary.get(k) for k in ("steps", "examples", "data", "dropped", "loss_first", "loss_last")}
    link = it_dir / "model"
    if not link.exists():
        os.symlink(os.path.relpath(summary["final_model"], it_dir), link)  # iter_t/model is M_t in every iteration
    return str(link), info


def prompts_stage(cfg: SelfRewardConfig, inp: Inputs, policy, tok, machine: list[str], t: int,
                  it_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """Step 1: this iteration's prompts (Self-Instruct by M_{t-1} or a fixed model, or drawn
    from a file)."""
    path = it_dir / "data" / "prompts.json"
    if path.exists():
        d = json.loads(path.read_text())
        return d["prompts"], d["stats"]
    if cfg.prompts.source == "file":
        start = (t - 2) * cfg.prompts.per_iteration
        kept = inp.train_pool[start:start + cfg.prompts.per_iteration]
        stats = {"source": "file", "kept": len(kept), "pool": len(inp.train_pool)}
    else:  # by M_{t-1}, or by a fixed generator model
        gen = _load(cfg.self_instruct.model, cfg) if cfg.self_instruct.model else (policy, tok)
        kept, stats = generate_prompts(completion_fn(*gen), inp.seeds, cfg.self_instruct, machine=machine,
                                       avoid=inp.eval_prompts + inp.val_prompts, seed=stage_seed(cfg.seed, "prompts", t))
        stats.update(source="self-instruct", generator=cfg.self_instruct.model or f"M{t - 1}")
        free(gen)
    write_json(path, {"prompts": kept, "stats": stats})
    return kept, stats


def dpo_stage(cfg: SelfRewardConfig, prev_model: str, aift_path: Path, n_pairs: int, t: int, it_dir: Path) -> dict:
    """Step 5: M_t = DPO on AIFT(M_{t-1}) from M_{t-1}, reference M_{t-1}, via ``pofe online``
    in offline mode (one DPO trainer in the code base). Resumes from its step checkpoints."""
    from pofe.loops import online

    d = cfg.dpo
    per_step = d.batch_size * d.grad_accum
    steps = d.steps if d.steps is not None else max(1, math.ceil(d.epochs * n_pairs / per_step))
    k = max(1, cfg.selection.num_checkpoints) if cfg.selection.enabled else 1
    every = max(1, math.ceil(steps / k)) if k > 1 else 0
    ocfg = online.OnlineConfig(
        mode="offline", seed=stage_seed(cfg.seed, "dpo", t),
        model=ModelConfig(name=str(prev_model), dtype=cfg.model.dtype, device=cfg.model.device,
                          trust_remote_code=cfg.model.trust_remote_code,
                          gradient_checkpointing=cfg.model.gradient_checkpointing, lora=cfg.model.lora),
        loss=online.LossSettings(name="dpo", beta=d.beta, labels="hard"),
        optim=d.optim,
        train=online.TrainSettings(steps=steps, batch_size=d.batch_size, grad_accum=d.grad_accum),
        data=online.DataSettings(preferences=str(aift_path)),
        eval=online.EvalSettings(enabled=False),
        checkpoint=CheckpointSettings(every=every, keep_last=0),
        log=LogConfig(tensorboard=False, progress=cfg.log.progress),
        run=RunConfig(output_dir=str(it_dir), name="dpo"),
    )
    dpo_dir = it_dir / "dpo"
    resume = dpo_dir if (dpo_dir / "config.yaml").exists() else None
    return online.run(ocfg, resume=resume)


def _checkpoint_policy(cfg: SelfRewardConfig, prev_model: str, ckpt: Path | None, final: Path):
    """The model of a DPO checkpoint (``None`` = the final one)."""
    from pofe.training import load_checkpoint, load_policy

    if ckpt is None:
        return _load(str(final), cfg)
    mcfg = ModelConfig(name=str(prev_model), dtype=cfg.model.dtype, device=cfg.model.device,
                       trust_remote_code=cfg.model.trust_remote_code, lora=cfg.model.lora)
    model, tok = load_policy(mcfg)
    load_checkpoint(ckpt, model=model, restore_rng=False)
    model.eval()
    return model, tok


def evaluate_stage(cfg: SelfRewardConfig, inp: Inputs, model, tok, t: int, it_dir: Path, yardstick,
                   prev_eval: list[str] | None) -> tuple[dict[str, Any], list[str]]:
    """Step 7: M_t's held-out responses, their mean length and mean score under the fixed
    yardstick judge, head-to-head vs M_{t-1}, and M_t's reward-modelling metrics."""
    path = it_dir / "eval_responses.jsonl"
    if path.exists():
        resp = [r["response"] for r in read_jsonl(path)]
    else:
        resp = first_responses(model, tok, inp.eval_prompts, cfg.evaluation.sampling, stage_seed(cfg.seed, "eval"))
        write_jsonl(path, [{"prompt": x, "response": y} for x, y in zip(inp.eval_prompts, resp)])
    m = measure_responses(inp.eval_prompts, resp, tok, yardstick, prev_eval)
    if cfg.evaluation.rm_metrics and inp.ranked_eval:
        judge = build_shared_judge(cfg.judge, **_judge_runtime(cfg, model, tok, f"M{t}"))
        if has_capability(judge, Capability.POINTWISE):
            # the "perfect" score: 5 on the rubric; 1.0 for the [0, 1]-normalised expected score
            rubric = getattr(cfg.judge, "rubric", None)  # only the rubric kind has a score range
            hi = float(rubric.score_range[1]) if rubric is not None else {"expected-score": 1.0}.get(cfg.judge.kind, 5.0)
            m["rm_metrics"] = rm_eval(judge, inp.ranked_eval, max_score=hi)
            m["rm_judge"] = getattr(judge, "id", None)
    return m, resp


# ============================================================================ the chain

def run(cfg: SelfRewardConfig, *, resume: str | Path | None = None) -> dict[str, Any]:
    """Run M1 -> M2 -> ... -> M_T; returns the per-iteration summary (also ``summary.json``).
    ``resume``: a run folder to continue (the CLI reads its config); finished stages are skipped."""
    t0 = time.time()
    # ------------------------------------------------------------------ setup
    run_dir = open_run(cfg.run, "self-reward", resume=resume)
    write_config(run_dir, cfg)
    keep_freed_memory()  # glibc: reuse freed buffers instead of page-faulting them in every step
    seed_everything(cfg.seed)
    inp = load_inputs(cfg)
    write_json(run_dir / "inputs.json", {"counts": inp.counts, "eval_prompts": inp.eval_prompts,
                                          "val_prompts": inp.val_prompts})
    iterations: list[dict[str, Any]] = []
    done = sum((run_dir / f"iter_{t}" / "metrics.json").exists() for t in range(1, cfg.iterations + 1))
    truncate_metrics(run_dir, done)  # one metrics.jsonl row per finished iteration, never two
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json"))
    bar = Progress(cfg.log, total=cfg.iterations, initial=done, desc="pofe self-reward",
                   show=(("mean_score", "score", "{:.3f}"), ("eval_mean_score", "eval", "{:.3f}")))

    def finished(m: dict[str, Any]) -> None:  # an iteration's metrics: in the sink, on the bar, on disk
        row = iteration_row(m)
        sink.write(row)
        bar.update(row)
        # metrics.json is the "iteration finished" marker, so it is written last: a crash
        # between the two writes then redoes the iteration (its metrics row is rewound above)
        # instead of skipping it with its metrics.jsonl row lost.
        write_json(run_dir / f"iter_{m['iteration']}" / "metrics.json", m)
        fault_point(f"sr{m['iteration']}:after_iteration")  # crash/resume suite (POFE_FAULT)

    # ------------------------------------------------------------------ M1
    it_dir = run_dir / "iter_1"
    it_dir.mkdir(exist_ok=True)
    m1, seed_info = seed_stage(cfg, inp, it_dir)
    model, tok = _load(m1, cfg)
    # The fixed yardstick for mean score / head-to-head: evaluation.judge, else the training
    # judge on M1 (fixed for the whole run, so iterations are compared on one scale).
    if cfg.evaluation.judge is not None:
        yardstick = build_shared_judge(cfg.evaluation.judge)
    else:
        ymodel, ytok = (_load(m1, cfg) if has_capability(cfg.judge, Capability.SHARES_WEIGHTS)
                        and cfg.judge_model == "self" else (None, None))
        yardstick = build_shared_judge(cfg.judge, model=ymodel, tokenizer=ytok, judge_id="yardstick:M1")
    metrics_path = it_dir / "metrics.json"
    if metrics_path.exists():
        m = json.loads(metrics_path.read_text())
        prev_eval = [r["response"] for r in read_jsonl(it_dir / "eval_responses.jsonl")]
    else:
        ev, prev_eval = evaluate_stage(cfg, inp, model, tok, 1, it_dir, yardstick, None)
        m = {"iteration": 1, "model": m1, **seed_info, **ev}
        finished(m)
    iterations.append(m)
    machine: list[str] = []
    prev_model = m1

    # ------------------------------------------------------------------ M2 .. M_T
    for t in range(2, cfg.iterations + 1):
        it_dir = run_dir / f"iter_{t}"
        (it_dir / "data").mkdir(parents=True, exist_ok=True)
        metrics_path = it_dir / "metrics.json"
        if metrics_path.exists():  # finished earlier: reload what later iterations need
            m = json.loads(metrics_path.read_text())
            iterations.append(m)
            machine += json.loads((it_dir / "data" / "prompts.json").read_text())["prompts"]
            prev_eval = [r["response"] for r in read_jsonl(it_dir / "eval_responses.jsonl")]
            prev_model = m["model"]
            model = None
            continue
        if model is None:
            model, tok = _load(prev_model, cfg)
        judge = build_shared_judge(cfg.judge, **_judge_runtime(cfg, model, tok, f"M{t - 1}"))
        clock = StageClock()

        # 1. prompts; 2-3. candidates scored by M_{t-1}; 4. pairs
        prompts, p_stats = prompts_stage(cfg, inp, model, tok, machine, t, it_dir)
        clock.lap("prompts")
        fault_point(f"sr{t}:after_prompts")
        machine += prompts
        rows = scored_candidates(it_dir / "data" / "candidates.jsonl", prompts, model, tok, judge, cfg.candidates,
                                 seed=lambda start: stage_seed(cfg.seed, "cand", t, start))
        clock.lap("candidates_and_judging")
        pairs, pair_counts = build_pairs(rows)
        aift = it_dir / "data" / "aift.jsonl"
        write_jsonl(aift, pairs)
        fault_point(f"sr{t}:after_pairs")
        gen_stats = score_stats(rows, pairs)

        # 5. DPO from M_{t-1} with reference M_{t-1}; 6. checkpoint selection
        sel_judge = None
        prev_val: list[str] = []
        if cfg.selection.enabled and inp.val_prompts:
            sel_judge = (build_shared_judge(cfg.selection.judge) if cfg.selection.judge is not None else judge)
            vpath = it_dir / "prev_val_responses.jsonl"
            if vpath.exists():
                prev_val = [r["response"] for r in read_jsonl(vpath)]
            else:
                prev_val = first_responses(model, tok, inp.val_prompts, cfg.evaluation.sampling, stage_seed(cfg.seed, "val"))
                write_jsonl(vpath, [{"prompt": x, "response": y} for x, y in zip(inp.val_prompts, prev_val)])
        free(model)
        model = None
        clock.lap("validation_baseline")
        if pairs:
            # (A self-judge keeps M_{t-1}'s weights alive through DPO: it selects checkpoints next.)
            dpo_summary = it_dir / "dpo" / "summary.json"
            if (it_dir / "selection.json").exists() and final_complete(it_dir / "model") and dpo_summary.exists():
                # selection finished before a crash and pruned DPO's checkpoints: DPO is done, not redone
                dpo = json.loads(dpo_summary.read_text())
            else:
                dpo = dpo_stage(cfg, prev_model, aift, len(pairs), t, it_dir)
            clock.lap("dpo")
            fault_point(f"sr{t}:after_dpo")
            model_dir = str(select_checkpoint(
                it_dir, Path(dpo["final_model"]), cfg.selection, load=lambda c: _checkpoint_policy(cfg, prev_model, c, Path(dpo["final_model"])),
                respond=lambda m, tk: first_responses(m, tk, inp.val_prompts, cfg.evaluation.sampling,
                                                      stage_seed(cfg.seed, "val")),
                judge=sel_judge, prompts=inp.val_prompts, previous=prev_val))
        else:
            # Nothing to learn from (every prompt tied or went unscored): M_t = M_{t-1},
            # reported rather than crashing three hours into a run.
            log.warning("iteration %d: no preference pairs (%s); M%d = M%d", t, pair_counts, t, t - 1)
            dpo, model_dir = {"skipped": "no preference pairs"}, prev_model
        sel = json.loads((it_dir / "selection.json").read_text()) if (it_dir / "selection.json").exists() else {}
        free(judge, sel_judge)
        clock.lap("selection")
        fault_point(f"sr{t}:after_selection")

        # 7. evaluation of M_t
        model, tok = _load(model_dir, cfg)
        ev, eval_resp = evaluate_stage(cfg, inp, model, tok, t, it_dir, yardstick, prev_eval)
        clock.lap("evaluation")
        m = {"iteration": t, "model": model_dir, "prompts": p_stats, "pairs": pair_counts, **gen_stats,
             "dpo": {k: dpo.get(k) for k in ("skipped", "run_dir", "steps", "trained_pairs", "loss_first", "loss_last",
                                                       "seconds_per_step", "resumed_from") if k in dpo},
             "dpo_steps": dpo.get("steps", None), "selected_step": sel.get("selected_step"),
             "selection": sel.get("candidates"), **ev, "seconds": clock.laps}
        finished(m)
        iterations.append(m)
        prev_eval, prev_model = eval_resp, model_dir

    # ------------------------------------------------------------------ save: final/ = M_T
    bar.close()
    sink.close()
    final = link_final(run_dir, prev_model, lambda: _load(prev_model, cfg))
    summary = {"run_dir": str(run_dir), "final_model": str(final), "iterations": iterations, "inputs": inp.counts,
               "seconds": round(time.time() - t0, 1)}
    write_json(run_dir / "summary.json", summary)
    return summary


