"""The stages of ``pofe self-reward`` (Self-Rewarding LMs, Yuan et al. 2024, Sec. 3.4) and the
chain M1 -> M2 -> ... -> M_T they form.

Every stage writes its output under ``iter_t/`` (atomically, or appending per chunk) and is
skipped when that output is there, so a crash inside an iteration redoes only its unfinished
stages; ``iter_t/metrics.json`` marks the whole iteration finished. The run folder, resume
from the driver's checkpoints and ``metrics.jsonl`` are :mod:`pofe.recipe`'s; the algorithm
reads top to bottom in :mod:`pofe.loops.self_reward`. ``cfg`` is a ``SelfRewardConfig``.

Data-parallel (``torchrun``; ``dp`` a :class:`pofe.runtime.parallel.DataParallel`): every process
runs every stage; candidate generation and scoring, greedy responses and judging are split by
prompt block (``dp.map``: each process its contiguous block, results gathered in input order),
SFT and DPO shard their steps through the driver; only rank 0 writes a stage's file, and a
"skipped when present" test is rank 0's answer (``dp.from_main``), so every process takes the
same branch. Self-Instruct prompts and EFT justifications are written by rank 0 alone (the
others wait for its file). Sampled candidates depend on the number of processes (each block
draws from its own seed, :func:`pofe.runtime.seeds.block_seed`); greedy responses and a
deterministic judge's verdicts do not, and a resume with the same number of processes is the
uninterrupted run.

Fault points (``POFE_FAULT``, the crash/resume suite): ``sr{t}:after_prompts``,
``sr{t}:after_pairs``, ``sr{t}:after_dpo``, ``sr{t}:after_selection`` inside iteration t,
``sr{t}:after_iteration`` once its row and marker are written, and ``candidates:{start}`` once the
candidate chunk starting at prompt ``start`` is appended (:mod:`pofe.generation.candidates`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pofe.data.aift import score_stats
from pofe.data.eft import write_eft_files
from pofe.data.self_reward_inputs import Inputs
from pofe.evaluation.self_reward import measure_responses, rm_eval, select_checkpoint
from pofe.generation.candidates import first_responses, scored_candidates
from pofe.generation.self_instruct import completion_fn, generate_prompts
from pofe.judges.base import Capability, has_capability
from pofe.judges.registry import build_shared_judge
from pofe.runs import RunConfig, RunError, read_jsonl
from pofe.runtime.checkpoints import final_complete
from pofe.runtime.guards import fault_point
from pofe.runtime.model import ModelConfig
from pofe.runtime.parallel import DataParallel
from pofe.loops.self_reward.self_reward_variants import variant_pairs
from pofe.loops.self_reward.stages import StageClock, free, link_final, stage_seed, write_json, write_jsonl
from pofe.runtime.tracking import LogConfig

log = logging.getLogger(__name__)


# ============================================================================ models and judges

def judge_runtime(cfg, model, tok, tag: str, jcfg=None) -> dict[str, Any]:
    """``build_shared_judge`` keywords: an LLM judge (``jcfg``, default ``cfg.judge``) runs on
    ``model`` itself when ``judge_model`` is self (self-rewarding), else on its ``model`` as configured."""
    jcfg = cfg.judge if jcfg is None else jcfg
    if cfg.judge_model == "self" and has_capability(jcfg, Capability.SHARES_WEIGHTS):
        return {"model": model, "tokenizer": tok, "judge_id": f"self:{tag}:{jcfg.kind}:{jcfg.template}"}
    return {}


def load_stage_model(name: str, cfg):
    from pofe.models import load_model

    return load_model(name, dtype=cfg.model.dtype, device=cfg.model.device, trust_remote_code=cfg.model.trust_remote_code,
                      **stage_load_kwargs(cfg, name))


def stage_load_kwargs(cfg, name: str) -> dict[str, Any]:
    """``model.attn_implementation`` for every stage's model; ``model.revision`` only for M1 itself
    (the later models are folders of this run)."""
    kw = cfg.model.load_kwargs()
    if str(name) != cfg.model.name:
        kw.pop("revision", None)
    return kw


def checkpoint_policy(cfg, prev_model: str, ckpt: Path | None, final: Path):
    """The model of a DPO checkpoint (``None`` = the final one)."""
    from pofe.runtime.checkpoints import load_checkpoint
    from pofe.runtime.model import load_policy

    if ckpt is None:
        return load_stage_model(str(final), cfg)
    mcfg = ModelConfig(name=str(prev_model), dtype=cfg.model.dtype, device=cfg.model.device,
                       trust_remote_code=cfg.model.trust_remote_code, lora=cfg.model.lora,
                       **stage_load_kwargs(cfg, prev_model))
    model, tok = load_policy(mcfg)
    load_checkpoint(ckpt, model=model, restore_rng=False)
    model.eval()
    return model, tok


def yardstick_judge(cfg, m1: str):
    """The fixed judge of mean score and head-to-head: ``eval.judge``, else the training judge
    on M1 (fixed for the whole run, so iterations are compared on one scale)."""
    if cfg.eval.judge is not None:
        return build_shared_judge(cfg.eval.judge)
    own = has_capability(cfg.judge, Capability.SHARES_WEIGHTS) and cfg.judge_model == "self"
    ymodel, ytok = load_stage_model(m1, cfg) if own else (None, None)
    return build_shared_judge(cfg.judge, model=ymodel, tokenizer=ytok, judge_id="yardstick:M1")


# ============================================================================ stages

def seed_stage(cfg, inp: Inputs, it_dir: Path, dp: DataParallel = DataParallel()) -> tuple[str, dict[str, Any]]:
    """M1 ("Seed training data"): (IFT-only SFT baseline -> EFT data ->) SFT of the base model
    on IFT + EFT, through ``pofe sft``. Returns M1's path and counts."""
    from pofe.data.sft import SFTExample, load_examples
    from pofe.loops.sft import SFTConfig, SFTDataConfig, run as sft_run
    from pofe.recipe import CheckpointConfig

    s = cfg.seed_sft
    info: dict[str, Any] = {}
    if not s.enabled:
        return cfg.model.name, {"seed_sft": "disabled"}
    data_dir = it_dir / "data"
    if dp.main:
        data_dir.mkdir(parents=True, exist_ok=True)

    def sft_cfg(sub: str) -> SFTConfig:
        return SFTConfig(seed=cfg.seed, model=cfg.model, data=SFTDataConfig(max_length=s.max_length,
                                                                            eft_max_ratio=s.eft_max_ratio),
                         optim=s.optim, train=s.train, checkpoint=CheckpointConfig(every=50),
                         log=LogConfig(tensorboard=False, progress=cfg.log.progress),
                         run=RunConfig(output_dir=str(it_dir), name=sub))

    ift = load_examples(s.ift, "ift", s.limit)
    eft: list = []
    if s.eft and inp.ranked_build:
        eft_path = data_dir / "eft_train.jsonl"
        if not dp.from_main(eft_path.exists()):
            writer = cfg.model.name
            if s.eft_writer == "sft_baseline":  # the paper: EFT targets come from the IFT-only SFT baseline
                baseline = sft_run(sft_cfg("sft_baseline"), examples=ift, run_dir=it_dir / "sft_baseline")
                writer = dp.from_main(baseline)["final_model"]  # the driver's final/ is rank 0's
            if dp.main:  # one writer of the EFT files; the others wait for them
                model, tok = load_stage_model(writer, cfg)
                judge = build_shared_judge(cfg.judge, model=model, tokenizer=tok, judge_id=f"eft-writer:{Path(writer).name}")
                write_eft_files(data_dir, inp.ranked_build, inp.ranked_eval, judge,
                                rebalance_ratio=cfg.eft.rebalance_ratio, seed=cfg.seed)
                del model, judge
                free()
            dp.wait()
        info["eft"] = json.loads((data_dir / "eft_stats.json").read_text())
        eft = [SFTExample(r["prompt"], r["response"], "eft") for r in read_jsonl(eft_path)]
        if s.eft_max_ratio is not None and len(eft) > s.eft_max_ratio * len(ift):
            eft = random.Random(cfg.seed).sample(eft, int(s.eft_max_ratio * len(ift)))
    if dp.main and not (data_dir / "ift.jsonl").exists():
        write_jsonl(data_dir / "ift.jsonl", [{"prompt": e.prompt, "response": e.response} for e in ift])
    summary = dp.from_main(sft_run(sft_cfg("sft"), examples=ift + eft, run_dir=it_dir / "sft"))
    info["sft"] = {k: summary.get(k) for k in ("steps", "examples", "data", "dropped", "loss_first", "loss_last")}
    link = it_dir / "model"
    if dp.main and not link.exists():
        os.symlink(os.path.relpath(summary["final_model"], it_dir), link)  # iter_t/model is M_t in every iteration
    dp.wait()
    return str(link), info


def prompts_stage(cfg, inp: Inputs, policy, tok, machine: list[str], t: int,
                  it_dir: Path, dp: DataParallel = DataParallel()) -> tuple[list[str], dict[str, Any]]:
    """Step 1 ("Self-Instruction creation"): this iteration's prompts, by few-shot Self-Instruct
    on M_{t-1} (or a fixed generator model), or drawn from the ``data.prompts`` pool when one is given.
    Rank 0 makes them (one process, as without ``dp``) and every process gets its list."""
    path = it_dir / "data" / "prompts.json"
    if dp.main:
        made = _make_prompts(cfg, inp, policy, tok, machine, t, path)
    return dp.from_main(made if dp.main else None)


def _make_prompts(cfg, inp: Inputs, policy, tok, machine: list[str], t: int, path: Path) -> tuple[list[str], dict]:
    if path.exists():
        d = json.loads(path.read_text())
        return d["prompts"], d["stats"]
    if cfg.data.prompts is not None:
        start = (t - 2) * cfg.data.per_iteration
        kept = inp.train_pool[start:start + cfg.data.per_iteration]
        stats = {"source": "file", "kept": len(kept), "pool": len(inp.train_pool)}
    else:  # by M_{t-1}, or by a fixed generator model
        gen = load_stage_model(cfg.self_instruct.model, cfg) if cfg.self_instruct.model else (policy, tok)
        kept, stats = generate_prompts(completion_fn(*gen), inp.seeds, cfg.self_instruct, machine=machine,
                                       avoid=inp.eval_prompts + inp.val_prompts, seed=stage_seed(cfg.seed, "prompts", t))
        stats.update(source="self-instruct", generator=cfg.self_instruct.model or f"M{t - 1}")
        del gen
        free()
    write_json(path, {"prompts": kept, "stats": stats})
    return kept, stats


def dpo_config(cfg, prev_model: str, aift_path: Path, n_pairs: int, t: int, it_dir: Path, labels: str = "hard",
               name: str = "dpo"):
    """Step 5's ``pofe online`` config (offline mode: the one DPO trainer): M_t = DPO on
    AIFT(M_{t-1}) from M_{t-1}, reference M_{t-1}, with ``selection.num_checkpoints``
    evenly spaced checkpoints to select from. ``labels``: soft when the pairs carry CREAM's
    consistency as their ``p`` (:mod:`pofe.loops.self_reward.self_reward_variants`). ``name``: the run
    folder under ``it_dir``; ``future`` is Temporal Self-Rewarding's one-step-ahead M_t' (the same
    DPO settings, its own seed, no checkpoints to select from)."""
    from pofe.loops import online
    from pofe.recipe import CheckpointConfig

    d = cfg.dpo
    steps = d.steps if d.steps is not None else max(1, math.ceil(d.epochs * n_pairs / (d.batch_size * d.grad_accum)))
    k = max(1, cfg.selection.num_checkpoints) if cfg.selection.enabled and name == "dpo" else 1
    return online.OnlineConfig(
        mode="offline", seed=stage_seed(cfg.seed, name, t),
        model=ModelConfig(name=str(prev_model), dtype=cfg.model.dtype, device=cfg.model.device,
                          trust_remote_code=cfg.model.trust_remote_code, **stage_load_kwargs(cfg, prev_model),
                          gradient_checkpointing=cfg.model.gradient_checkpointing, lora=cfg.model.lora),
        loss=online.LossSettings(name="dpo", beta=d.beta, labels=labels),
        optim=d.optim,
        train=online.TrainSettings(steps=steps, batch_size=d.batch_size, grad_accum=d.grad_accum),
        data=online.DataSettings(preferences=str(aift_path)),
        eval=online.EvalSettings(enabled=False),
        checkpoint=CheckpointConfig(every=max(1, math.ceil(steps / k)) if k > 1 else 0, keep_last=0),
        log=LogConfig(tensorboard=False, progress=cfg.log.progress),
        run=RunConfig(output_dir=str(it_dir), name=name),
    )


def dpo_stage(cfg, prev_model: str, aift_path: Path, n_pairs: int, t: int, it_dir: Path,
              dp: DataParallel = DataParallel(), labels: str = "hard", name: str = "dpo") -> dict[str, Any]:
    """Step 5, through ``pofe online`` (data-parallel through its driver); a DPO folder already
    begun resumes from its checkpoints. Returns rank 0's summary (it alone saves ``final/``)."""
    from pofe.loops import online

    dpo_dir = it_dir / name
    resume = dpo_dir if dp.from_main((dpo_dir / "config.yaml").exists()) else None
    return dp.from_main(online.run(dpo_config(cfg, prev_model, aift_path, n_pairs, t, it_dir, labels, name),
                                   resume=resume))


def validation_baseline(cfg, inp: Inputs, model, tok, judge, it_dir: Path,
                        dp: DataParallel = DataParallel()) -> tuple[Any, list[str]]:
    """Step 6's yardstick: the selection judge and M_{t-1}'s validation responses (``None, []``
    without selection)."""
    if not (cfg.selection.enabled and inp.val_prompts):
        return None, []
    sel_judge = build_shared_judge(cfg.selection.judge) if cfg.selection.judge is not None else judge
    path = it_dir / "prev_val_responses.jsonl"
    if dp.from_main(path.exists()):
        return sel_judge, dp.from_main([r["response"] for r in read_jsonl(path)] if dp.main else None)
    prev_val = first_responses(model, tok, inp.val_prompts, cfg.eval.sampling, stage_seed(cfg.seed, "val"), dp)
    if dp.main:
        write_jsonl(path, [{"prompt": x, "response": y} for x, y in zip(inp.val_prompts, prev_val)])
    return sel_judge, prev_val


def train_and_select(cfg, inp: Inputs, prev_model: str, aift: Path, n_pairs: int, t: int, it_dir: Path,
                     sel_judge, prev_val: list[str], clock: StageClock,
                     dp: DataParallel = DataParallel(), labels: str = "hard") -> tuple[dict[str, Any], str]:
    """Steps 5-6: DPO, then the checkpoint with the best head-to-head win rate against M_{t-1}
    on validation prompts ("Early stopping") becomes ``iter_t/model``. Returns DPO's summary and M_t."""
    if not n_pairs:
        # Nothing to learn from (every prompt tied or went unscored): M_t = M_{t-1}, reported
        # rather than crashing three hours into a run.
        return {"skipped": "no preference pairs"}, prev_model
    dpo_summary = it_dir / "dpo" / "summary.json"
    if dp.from_main((it_dir / "selection.json").exists() and final_complete(it_dir / "model") and dpo_summary.exists()):
        # selection finished before a crash and pruned DPO's checkpoints: DPO is done, not redone
        dpo = json.loads(dpo_summary.read_text())
    else:
        dpo = dpo_stage(cfg, prev_model, aift, n_pairs, t, it_dir, dp, labels)
    clock.lap("dpo")
    fault_point(f"sr{t}:after_dpo")
    final = Path(dpo["final_model"])
    model_dir = select_checkpoint(
        it_dir, final, cfg.selection, load=lambda c: checkpoint_policy(cfg, prev_model, c, final),
        respond=lambda m, tk: first_responses(m, tk, inp.val_prompts, cfg.eval.sampling, stage_seed(cfg.seed, "val"), dp),
        judge=sel_judge, prompts=inp.val_prompts, previous=prev_val, dp=dp)
    return dpo, str(model_dir)


def evaluate_stage(cfg, inp: Inputs, model, tok, t: int, it_dir: Path, yardstick,
                   prev_eval: list[str] | None, dp: DataParallel = DataParallel()) -> tuple[dict[str, Any], list[str]]:
    """Step 7: M_t's held-out responses, their mean length and mean score under the fixed
    yardstick judge, head-to-head vs M_{t-1}, and M_t's reward-modelling metrics (Table 4)."""
    path = it_dir / "eval_responses.jsonl"
    if dp.from_main(path.exists()):
        resp = dp.from_main([r["response"] for r in read_jsonl(path)] if dp.main else None)
    else:
        resp = first_responses(model, tok, inp.eval_prompts, cfg.eval.sampling, stage_seed(cfg.seed, "eval"), dp)
        if dp.main:
            write_jsonl(path, [{"prompt": x, "response": y} for x, y in zip(inp.eval_prompts, resp)])
    m = measure_responses(inp.eval_prompts, resp, tok, yardstick, prev_eval, dp)
    if cfg.eval.rm_metrics and inp.ranked_eval:
        judge = build_shared_judge(cfg.judge, **judge_runtime(cfg, model, tok, f"M{t}"))
        if has_capability(judge, Capability.POINTWISE):
            # the "perfect" score: 5 on the rubric; 1.0 for the [0, 1]-normalised expected score
            rubric = getattr(cfg.judge, "rubric", None)  # only the rubric kind has a score range
            hi = float(rubric.score_range[1]) if rubric is not None else {"expected-score": 1.0}.get(cfg.judge.kind, 5.0)
            m["rm_metrics"] = rm_eval(judge, inp.ranked_eval, max_score=hi, dp=dp)
            m["rm_judge"] = getattr(judge, "id", None)
    return m, resp


# ============================================================================ the chain

DPO_KEYS = ("skipped", "run_dir", "steps", "trained_pairs", "loss_first", "loss_last", "seconds_per_step", "resumed_from")


@dataclass
class Chain:
    """What iteration t needs from iterations 1..t-1: the records so far, M_{t-1} (its path, and
    its weights while they are in memory), its held-out responses (head-to-head), the prompts
    generated so far (Self-Instruct's machine shots) and the fixed yardstick judge."""

    cfg: Any
    inp: Inputs
    run_dir: Path
    iterations: list[dict[str, Any]] = field(default_factory=list)
    machine: list[str] = field(default_factory=list)
    prev_model: str | None = None
    prev_eval: list[str] | None = None
    policy: tuple[Any, Any] | None = None
    """M_{t-1}'s (model, tokenizer), carried from its evaluation into iteration t."""
    dp: DataParallel = field(default_factory=DataParallel)
    """This process's part of the run (rank 0 writes every file)."""
    _yardstick: Any = None
    _done: dict[int, dict[str, Any]] = field(default_factory=dict)

    def it_dir(self, t: int) -> Path:
        return self.run_dir / f"iter_{t}"

    def marker(self, t: int) -> Path:
        return self.it_dir(t) / "metrics.json"

    # -- resume
    def reload(self, done: int) -> None:
        """Iterations 1..``done`` (the driver's checkpoint) from their ``iter_t/`` files."""
        for t in range(1, done + 1):
            if not self.marker(t).exists():
                raise RunError(f"{self.marker(t)}: missing, but the run's checkpoint says iteration {t} finished")
            self.advance(t, json.loads(self.marker(t).read_text()))

    def advance(self, t: int, m: dict[str, Any]) -> None:
        """Take iteration ``t``'s record as the chain's newest link."""
        self.iterations.append(m)
        if t >= 2:
            self.machine += json.loads((self.it_dir(t) / "data" / "prompts.json").read_text())["prompts"]
        self.prev_eval = [r["response"] for r in read_jsonl(self.it_dir(t) / "eval_responses.jsonl")]
        self.prev_model = m["model"]

    # -- one iteration
    def iteration(self, t: int) -> dict[str, Any]:
        """Iteration ``t``'s record: made by its stages, or read back when its marker is there (a
        crash after the marker, before the driver's checkpoint)."""
        if self.dp.from_main(self.marker(t).exists()):
            m = json.loads(self.marker(t).read_text())
            self.drop_policy()
        else:
            m = self.seed_iteration() if t == 1 else self.aift_iteration(t)
        self.dp.wait()  # advance() reads the files rank 0 wrote
        self.advance(t, m)
        self._done[t] = m
        return m

    def after_row(self, t: int) -> None:
        """After iteration ``t``'s ``metrics.jsonl`` row (the driver's meters): write its marker,
        never without the row. Never a stop."""
        m = self._done.pop(t)
        if self.dp.main:
            write_json(self.marker(t), m)
        fault_point(f"sr{t}:after_iteration")

    def seed_iteration(self) -> dict[str, Any]:
        cfg, it_dir = self.cfg, self.it_dir(1)
        it_dir.mkdir(exist_ok=True)
        m1, seed_info = seed_stage(cfg, self.inp, it_dir, self.dp)
        self.policy = load_stage_model(m1, cfg)
        ev, _ = evaluate_stage(cfg, self.inp, *self.policy, 1, it_dir, self.yardstick(m1), None, self.dp)
        return {"iteration": 1, "model": m1, **seed_info, **ev}

    def aift_iteration(self, t: int) -> dict[str, Any]:
        """AIFT(M_{t-1}) -> DPO -> selection -> evaluation of M_t (steps 1-7 of the module docstring
        of :mod:`pofe.loops.self_reward`)."""
        cfg, inp, it_dir = self.cfg, self.inp, self.it_dir(t)
        (it_dir / "data").mkdir(parents=True, exist_ok=True)
        model, tok = self.policy or load_stage_model(self.prev_model, cfg)
        self.policy = None
        judge = build_shared_judge(cfg.judge, **judge_runtime(cfg, model, tok, f"M{t - 1}"))
        clock = StageClock()
        # 1. prompts; 2-3. candidates scored by M_{t-1}; 4. pairs
        dp = self.dp
        prompts, p_stats = prompts_stage(cfg, inp, model, tok, self.machine, t, it_dir, dp)
        clock.lap("prompts")
        fault_point(f"sr{t}:after_prompts")
        rows = scored_candidates(it_dir / "data" / "candidates.jsonl", prompts, model, tok, judge, cfg.candidates,
                                 seed=lambda start: stage_seed(cfg.seed, "cand", t, start), dp=dp)
        clock.lap("candidates_and_judging")
        # 4. pairs (best vs worst, or with the configured variants: CREAM, anchored rejection)
        pairs, pair_counts, variants = variant_pairs(
            cfg, rows, t=t, it_dir=it_dir, dp=dp, prev_judge=lambda: self.previous_judge(t),
            # partial binds the judge now: the name is deleted below, after the pairs are built
            anchor_rows=(lambda: rows) if t == 2 else partial(self.anchor_candidates, t, prompts, judge),
            meta_roles=partial(self.meta_roles, t, model, tok), future=partial(self.future_chosen, t, judge))
        aift = it_dir / "data" / "aift.jsonl"
        if dp.main:
            write_jsonl(aift, pairs)
        dp.wait()  # DPO reads it on every process
        fault_point(f"sr{t}:after_pairs")
        gen_stats = score_stats(rows, [p for p in pairs if p.get("role") != "judge"])  # one scale: the actor's
        # 5. DPO from M_{t-1} with reference M_{t-1}; 6. checkpoint selection
        sel_judge, prev_val = validation_baseline(cfg, inp, model, tok, judge, it_dir, dp)
        del model
        free()  # (a self-judge keeps M_{t-1}'s weights alive through DPO: it selects checkpoints next)
        clock.lap("validation_baseline")
        if not pairs:
            log.warning("iteration %d: no preference pairs (%s); M%d = M%d", t, pair_counts, t, t - 1)
        labels = (variants.get("cream") or {}).get("labels", "hard")
        dpo, model_dir = train_and_select(cfg, inp, self.prev_model, aift, len(pairs), t, it_dir, sel_judge, prev_val,
                                          clock, dp, labels)
        sel = dp.from_main(json.loads((it_dir / "selection.json").read_text())
                           if dp.main and (it_dir / "selection.json").exists() else {})
        del judge, sel_judge
        free()
        clock.lap("selection")
        fault_point(f"sr{t}:after_selection")
        # 7. evaluation of M_t
        self.policy = load_stage_model(model_dir, cfg)
        ev, _ = evaluate_stage(cfg, inp, *self.policy, t, it_dir, self.yardstick(), self.prev_eval, dp)
        clock.lap("evaluation")
        return {"iteration": t, "model": model_dir, "prompts": p_stats, "pairs": pair_counts, **gen_stats, **variants,
                "dpo": {k: dpo.get(k) for k in DPO_KEYS if k in dpo}, "dpo_steps": dpo.get("steps", None),
                "selected_step": sel.get("selected_step"), "selection": sel.get("candidates"), **ev,
                "seconds": clock.laps}

    def previous_judge(self, t: int):
        """CREAM's second judge in iteration ``t``: the training judge on M_{t-2} (None for t = 2:
        M1 has no previous self-rewarding iteration). A judge that does not run on the policy's
        weights (a fixed or programmatic one) is the same judge built again."""
        if t < 3:
            return None
        ref = self.iterations[t - 3]["model"]
        own = self.cfg.judge_model == "self" and has_capability(self.cfg.judge, Capability.SHARES_WEIGHTS)
        model, tok = load_stage_model(ref, self.cfg) if own else (None, None)
        return build_shared_judge(self.cfg.judge, **judge_runtime(self.cfg, model, tok, f"M{t - 2}"))

    def meta_roles(self, t: int, model, tok) -> tuple[Any, Any]:
        """Meta-Rewarding's judge and meta-judge in iteration ``t``: M_{t-1} (``model``) writing
        judgments and comparing them (with ``judge_model: self``)."""
        m = self.cfg.meta_judge
        return (build_shared_judge(m.judge, **judge_runtime(self.cfg, model, tok, f"M{t - 1}", m.judge)),
                build_shared_judge(m.meta, **judge_runtime(self.cfg, model, tok, f"M{t - 1}", m.meta)))

    def future_chosen(self, t: int, judge, pairs: list[dict]) -> tuple[list[dict], dict[str, Any]]:
        """Temporal Self-Rewarding's future-guided chosen in iteration ``t``: M_t' = DPO from
        M_{t-1} on the anchored ``pairs`` (``iter_t/future/``), its N candidates per pair scored by
        the current ``judge`` (``data/future_candidates.jsonl``), each chosen replaced by the best
        of them when it scores higher (:func:`pofe.loops.self_reward.self_reward_variants.replace_chosen`)."""
        from pofe.loops.self_reward.self_reward_variants import replace_chosen

        cfg, it_dir, dp = self.cfg, self.it_dir(t), self.dp
        if not pairs:
            return pairs, {"enabled": True, "skipped": "no anchored pairs", "replaced": 0}
        anchored = it_dir / "data" / "anchored_pairs.jsonl"  # M_t''s training data, as built
        if dp.main and not anchored.exists():
            write_jsonl(anchored, pairs)
        dp.wait()
        summary = it_dir / "future" / "summary.json"
        if dp.from_main(summary.exists() and final_complete(it_dir / "future" / "final")):
            dpo = json.loads(summary.read_text())
        else:
            dpo = dpo_stage(cfg, self.prev_model, anchored, len(pairs), t, it_dir, dp, name="future")
        fault_point(f"sr{t}:after_future_dpo")
        ahead = load_stage_model(dpo["final_model"], cfg)
        rows = scored_candidates(it_dir / "data" / "future_candidates.jsonl", [p["prompt"] for p in pairs], *ahead,
                                 judge, cfg.candidates, seed=lambda start: stage_seed(cfg.seed, "future", t, start), dp=dp)
        del ahead
        free()
        out, counts = replace_chosen(pairs, rows, f"M{t}'")
        return out, {"enabled": True, "model": f"M{t}'", "dpo_steps": dpo.get("steps"), **counts}

    def anchor_candidates(self, t: int, prompts: list[str], judge) -> list[dict]:
        """Anchored rejection's candidate set in iteration ``t`` >= 3: M1's N candidates for this
        iteration's prompts (sampled as the current model's are), scored by the current judge."""
        m1 = load_stage_model(self.iterations[0]["model"], self.cfg)
        rows = scored_candidates(self.it_dir(t) / "data" / "anchor_candidates.jsonl", prompts, *m1, judge,
                                 self.cfg.candidates, seed=lambda start: stage_seed(self.cfg.seed, "anchor", t, start),
                                 dp=self.dp)
        del m1
        free()
        return rows

    def final(self, out: Path) -> Path:
        """``out`` (``final/``) = M_T: a link to ``iter_T/model`` (a copy when M_T is not a folder
        of this run, e.g. M1 given by name)."""
        model = self.prev_model
        return link_final(out, model, lambda: load_stage_model(model, self.cfg))

    # -- models
    def yardstick(self, m1: str | None = None):
        if self._yardstick is None:
            self._yardstick = yardstick_judge(self.cfg, m1 or self.iterations[0]["model"])
        return self._yardstick

    def drop_policy(self) -> None:
        self.policy = None
        free()

    def close(self) -> None:
        self.policy = self._yardstick = None
        free()
