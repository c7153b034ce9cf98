"""``pofe self-reward``: Self-Rewarding Language Models (Yuan et al. 2024; the explainer's
Sec. 3.4 onward). One model is both the policy and its own judge.

The chain, iteration by iteration (``iter_t/`` holds how M_t was made and how it measures):

* ``iter_1`` -- the seed model M1. With ``seed_sft.enabled``: an IFT-only SFT baseline
  writes EFT data (rubric justifications whose scores agree with human rankings,
  rebalanced), then M1 = SFT of the base model on IFT + EFT ("Seed training data").
  Otherwise M1 is ``model.name`` as given (e.g. the embedded instruction-tuned SmolLM2).
* ``iter_t`` (t >= 2) -- AIFT(M_{t-1}), then DPO (Self-Instruction creation, Steps 1-3, and
  "Iterative DPO"):

  1. new prompts by few-shot Self-Instruct (8 shots: 6 seed + 2 generated; T 0.6, top-p
     0.9), ROUGE-L / blocklist / length filtered (:mod:`pofe.generation.self_instruct`);
  2. N = 4 candidates per prompt from M_{t-1} (T 0.7, top-p 0.9);
  3. each scored by M_{t-1} itself with the additive 5-point rubric, k = 3 samples averaged;
     unscored candidates are excluded and counted;
  4. pair = highest vs lowest mean score; prompts whose scores tie or with fewer than two
     scored candidates are dropped and counted -> ``data/aift.jsonl``;
  5. M_t = DPO on AIFT(M_{t-1}) starting from M_{t-1} with reference M_{t-1} (beta 0.1,
     lr 1e-6 cosine to 1e-7), reusing ``pofe online``'s offline mode;
  6. checkpoint selection: the DPO checkpoint with the best head-to-head win rate against
     M_{t-1} on validation prompts ("Early stopping": the paper saves every 200 steps and
     picks the best against the previous model with an external judge).

* every iteration is evaluated: responses on held-out prompts (mean length, mean score
  under a *fixed* judge), head-to-head vs the previous iteration (both orders; a
  disagreement is a tie), and the reward-modelling metrics of M_t as a judge on the
  held-out human-ranked split (Table 4).

Resumable: each stage's output is written atomically and skipped when present
(iteration granularity); candidate scoring appends per chunk of prompts and DPO / SFT
resume from their step checkpoints (step granularity).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from pofe.config import PofeConfig
from pofe.data.eft import EFTConfig, RankedPrompt, build_eft, load_ranked, split_ranked
from pofe.data.prompts import DEFAULT_PROMPTS, load_prompts
from pofe.generation import SamplingConfig, generate
from pofe.generation.self_instruct import SelfInstructConfig, generate_prompts
from pofe.judges.registry import JudgeConfig, build_judge
from pofe.records import Judgment
from pofe.training.tracking import LogConfig
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, new_run_dir, read_jsonl, write_config
from pofe.training import ModelConfig, OptimConfig, seed_everything

log = logging.getLogger(__name__)

# Judge kinds that run an LLM and can therefore share M_t's weights (the "self" in self-rewarding).
LLM_JUDGE_KINDS = {"rubric", "expected-score", "llm", "vllm"}


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
    """Who writes the EFT justifications: the IFT-only SFT baseline (the paper) or the base model
    (saves one SFT run when the base is already instruction-tuned)."""
    eft_max_ratio: float | None = None
    limit: int | None = None
    max_length: int = 1024
    optim: OptimConfig = OptimConfig(lr=5.5e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.2)
    """Paper: 5.5e-6 cosine-decayed to 1.1e-6."""
    batch_size: int = 16
    micro_batch_size: int = 4
    epochs: float = 1.0
    max_steps: int | None = None


class PromptSettings(PofeConfig):
    """Where each iteration's training prompts come from."""

    source: Literal["self-instruct", "file"] = "self-instruct"
    """self-instruct: generated each iteration (the paper). file: drawn from ``train`` without
    replacement (how NeMo-Aligner runs it; useful for controlled experiments)."""
    seeds: str | None = None
    """Seed prompts for Self-Instruct demonstrations; None = the IFT prompts, else the
    built-in prompts (minus the held-out ones)."""
    seed_field: str | None = None
    train: str | None = None
    """source=file: the prompt pool."""
    per_iteration: int = 64
    """source=file: prompts drawn per iteration."""


class CandidateSettings(PofeConfig):
    n: int = 4
    """Candidates per prompt (paper: 4)."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=256, batch_size=8)
    chunk: int = 8
    """Prompts per generate+judge chunk; each finished chunk is appended to disk (resume point)."""


class DPOSettings(PofeConfig):
    """M_{t+1} = DPO on AIFT(M_t), from M_t, reference M_t ("Iterative DPO")."""

    beta: float = 0.1
    optim: OptimConfig = OptimConfig(lr=1e-6, warmup_steps=0, schedule="cosine", min_lr_ratio=0.1)
    """Paper: 1e-6 cosine-decayed to 1e-7."""
    batch_size: int = 4
    grad_accum: int = 4
    """Pairs per optimiser step = batch_size x grad_accum (paper: 16)."""
    epochs: float = 1.0
    max_steps: int | None = None


class SelectionSettings(PofeConfig):
    """Checkpoint selection by head-to-head win rate against the previous iteration."""

    enabled: bool = True
    num_checkpoints: int = 3
    """Evenly spaced DPO checkpoints compared (the last is always one of them)."""
    num_prompts: int = 16
    """Validation prompts (disjoint from the evaluation prompts; paper: 253)."""
    prompts: str | None = None
    judge: JudgeConfig | None = None
    """None = the training judge, fixed at M_{t-1} (the paper uses an external judge, Claude 2)."""
    keep_checkpoints: bool = False
    """Keep the DPO checkpoints after selection (they are full copies of the trainable weights)."""


class EvaluationSettings(PofeConfig):
    num_prompts: int = 32
    """Held-out prompts for mean score, length and head-to-head (paper: 256)."""
    prompts: str | None = None
    """None = a seeded split of the built-in prompts."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=128)
    """Greedy: the comparison between iterations should not depend on sampling luck."""
    judge: JudgeConfig | None = None
    """A fixed yardstick for the mean score and head-to-head across iterations; None = the
    training judge built on M1 (fixed for the whole run)."""
    rm_metrics: bool = True
    """Reward-modelling metrics of each M_t as a judge on the held-out ranked split."""


class SelfRewardConfig(PofeConfig):
    """``pofe self-reward``."""

    model: ModelConfig = ModelConfig()
    """The base model (M0 with seed SFT, else M1). LoRA settings apply to every training stage."""
    iterations: int = 3
    """Models M1..M_T (paper: 3, i.e. two DPO rounds)."""
    seed_sft: SeedSFTSettings = SeedSFTSettings()
    eft: EFTConfig = EFTConfig()
    prompts: PromptSettings = PromptSettings()
    self_instruct: SelfInstructConfig = SelfInstructConfig()
    candidates: CandidateSettings = CandidateSettings()
    judge: JudgeConfig = JudgeConfig(kind="rubric", template="rubric")
    """The reward: the additive rubric (paper). Any kind works; a programmatic one (e.g.
    length) stands in as a judge with a known preference."""
    judge_model: Literal["self", "fixed"] = "self"
    """self: LLM judges run on M_t (self-rewarding). fixed: ``judge.model`` as configured."""
    dpo: DPOSettings = DPOSettings()
    selection: SelectionSettings = SelectionSettings()
    evaluation: EvaluationSettings = EvaluationSettings()
    seed: int = 0
    run: RunConfig = RunConfig()
    resume: str | None = None
    """A run folder to continue (finished stages are skipped)."""


# ============================================================================ pairs (Step 4)

def build_pair(prompt: str, responses: Sequence[str], scores: Sequence[float | None]) -> tuple[dict | None, str]:
    """The (highest, lowest) mean-score pair of one prompt, or why there is none.

    Reasons: ``fewer_than_2_scored`` (unscored candidates are excluded, never given a value),
    ``tie`` (highest == lowest: "discard the prompt entirely"), ``identical_text`` (the best
    and worst are the same string sampled twice and scored differently: no preference
    between them, which llm-swarm's script would still train on). Among equal scores the
    first candidate wins (deterministic; the paper does not say).
    """
    scored = [(i, s) for i, s in enumerate(scores) if s is not None]
    if len(scored) < 2:
        return None, "fewer_than_2_scored"
    hi = max(s for _, s in scored)
    lo = min(s for _, s in scored)
    if hi == lo:
        return None, "tie"
    c = next(i for i, s in scored if s == hi)
    r = next(i for i, s in scored if s == lo)
    if responses[c] == responses[r]:
        return None, "identical_text"
    return {"prompt": prompt, "chosen": responses[c], "rejected": responses[r], "p": 1.0,
            "chosen_score": hi, "rejected_score": lo, "chosen_index": c, "rejected_index": r}, "kept"


def build_pairs(rows: Sequence[dict]) -> tuple[list[dict], dict[str, int]]:
    """AIFT pairs from candidate rows ``{prompt, responses, scores}`` and the drop counts."""
    counts = {"prompts": len(rows), "kept": 0, "tie": 0, "fewer_than_2_scored": 0, "identical_text": 0}
    pairs = []
    for row in rows:
        pair, why = build_pair(row["prompt"], row["responses"], row["scores"])
        counts[why] += 1
        if pair is not None:
            pair["provenance"] = {"judge_id": row.get("judge_id"), "prompt_index": row.get("index")}
            pairs.append(pair)
    return pairs, counts


# ============================================================================ judges

class ScoresAsPairwise:
    """A pairwise view of a pointwise judge: A beats B when its score is higher (ties 0.5).
    Both "orders" are the same two scores, so the verdict is consistent by construction."""

    def __init__(self, inner):
        self.inner = inner
        self.id = f"pairwise({inner.id})"

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        sa = self.inner.score(list(prompts), list(responses_a))
        sb = self.inner.score(list(prompts), list(responses_b))
        out = []
        for a, b in zip(sa, sb):
            p = None if a.score is None or b.score is None else (1.0 if a.score > b.score else 0.0 if a.score < b.score else 0.5)
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=None if p is None else True, parse_ok=p is not None,
                                judge_id=self.id))
        return out


def as_pairwise(judge):
    return judge if hasattr(judge, "judge") else ScoresAsPairwise(judge)


def make_judge(jcfg: JudgeConfig, *, model=None, tokenizer=None, judge_id: str | None = None):
    """Build a judge; with ``model`` an LLM judge shares those weights (no cache: they change)."""
    if jcfg.kind in LLM_JUDGE_KINDS and model is not None:
        return build_judge(jcfg, model=model, tokenizer=tokenizer, cache=None, judge_id=judge_id)
    return build_judge(jcfg)


def head_to_head(judge, prompts: Sequence[str], a: Sequence[str], b: Sequence[str]) -> dict[str, Any]:
    """W/T/L of A vs B, both orders, a disagreement between orders = a tie (the paper's
    protocol; FastChat). Identical responses are ties without a judge call; pairs the judge
    could not read are dropped and counted."""
    from pofe.evaluation.eval import LOSS, TIE, WIN, judge_pairs, pair_outcome

    outcomes: list[int | None] = [TIE if x == y else None for x, y in zip(a, b)]
    todo = [i for i, o in enumerate(outcomes) if o is None]
    if todo:
        pj = as_pairwise(judge)
        pairs = judge_pairs(pj, [prompts[i] for i in todo], [a[i] for i in todo], [b[i] for i in todo])
        for i, (ab, ba) in zip(todo, pairs):
            outcomes[i] = pair_outcome(ab, ba)
    w = sum(o == WIN for o in outcomes)
    t = sum(o == TIE for o in outcomes)
    l_ = sum(o == LOSS for o in outcomes)
    n = w + t + l_
    return {"wins": w, "ties": t, "losses": l_, "n": n, "dropped_unparsed": len(outcomes) - n,
            "win_rate": w / n if n else None, "win_rate_adjusted": (w + 0.5 * t) / n if n else None}


def rm_eval(judge, groups: Sequence[RankedPrompt], max_score: float = 5.0) -> dict[str, Any]:
    """Reward-modelling metrics (Table 4) of a pointwise judge on human-ranked groups."""
    from pofe.evaluation.rm_metrics import RankedGroup, rm_metrics

    flat = [(g.prompt, r) for g in groups for r in g.responses]
    scores = judge.score([x for x, _ in flat], [y for _, y in flat]) if flat else []
    out, k = [], 0
    for g in groups:
        out.append(RankedGroup(g.ranks, tuple(s.score for s in scores[k:k + len(g.responses)])))
        k += len(g.responses)
    return rm_metrics(out, max_score=max_score)


# ============================================================================ inputs

@dataclass
class Inputs:
    seeds: list[str]
    eval_prompts: list[str]
    val_prompts: list[str]
    train_pool: list[str] = field(default_factory=list)
    ranked_build: list[RankedPrompt] = field(default_factory=list)
    ranked_eval: list[RankedPrompt] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)


def load_inputs(cfg: SelfRewardConfig) -> Inputs:
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

    eval_prompts = take(cfg.evaluation.prompts, cfg.evaluation.num_prompts)
    val_prompts = take(cfg.selection.prompts, cfg.selection.num_prompts if cfg.selection.enabled else 0)
    if cfg.prompts.seeds:
        seeds = [p.text for p in load_prompts(cfg.prompts.seeds, field=cfg.prompts.seed_field)]
    elif cfg.seed_sft.ift:
        from pofe.loops.sft import load_examples

        seeds = [e.prompt for e in load_examples(cfg.seed_sft.ift, "ift", cfg.seed_sft.limit) if isinstance(e.prompt, str)]
    else:
        seeds = [p for p in builtin if p not in taken]
    seeds = [s for s in dict.fromkeys(seeds) if s not in taken]
    pool = [p.text for p in load_prompts(cfg.prompts.train)] if cfg.prompts.source == "file" and cfg.prompts.train else []
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


# ============================================================================ stages

def _load(name: str, cfg: SelfRewardConfig):
    from pofe.models import load_model

    return load_model(name, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)


def _free(*objs) -> None:
    """Collect after the caller dropped its references (models are large)."""
    del objs
    gc.collect()


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str))


def _write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _seed(cfg: SelfRewardConfig, *parts: Any) -> int:
    return random.Random("/".join(map(str, (cfg.seed, *parts)))).randrange(2**31)


def seed_stage(cfg: SelfRewardConfig, inp: Inputs, it_dir: Path) -> tuple[str, dict[str, Any]]:
    """M1: (SFT baseline -> EFT data ->) SFT on IFT + EFT. Returns M1's path and counts."""
    from pofe.loops.sft import SFTConfig, SFTDataConfig, load_examples, run as sft_run

    s = cfg.seed_sft
    info: dict[str, Any] = {}
    if not s.enabled:
        return cfg.model.name, {"seed_sft": "disabled"}
    data_dir = it_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)

    def sft_cfg(sub: str) -> SFTConfig:
        return SFTConfig(model=cfg.model, data=SFTDataConfig(max_length=s.max_length, eft_max_ratio=s.eft_max_ratio),
                         optim=s.optim, batch_size=s.batch_size, micro_batch_size=s.micro_batch_size, epochs=s.epochs,
                         max_steps=s.max_steps, checkpoint_every=50, seed=cfg.seed,
                         run=RunConfig(output_dir=str(it_dir), name=sub))

    ift = load_examples(s.ift, "ift", s.limit)
    eft: list = []
    if s.eft and inp.ranked_build:
        eft_path = data_dir / "eft_train.jsonl"
        if not eft_path.exists():
            writer = cfg.model.name
            if s.eft_writer == "sft_baseline":  # the paper: EFT targets come from the IFT-only SFT baseline
                writer = sft_run(sft_cfg("sft_baseline"), examples=ift, run_dir=it_dir / "sft_baseline")["model_dir"]
            model, tok = _load(writer, cfg)
            judge = make_judge(cfg.judge, model=model, tokenizer=tok, judge_id=f"eft-writer:{Path(writer).name}")
            render = _renderer(judge)
            rows, stats = build_eft(inp.ranked_build, judge, render, rebalance_ratio=cfg.eft.rebalance_ratio, seed=cfg.seed)
            _write_jsonl(data_dir / "rm_eval.jsonl", [g.to_dict() for g in inp.ranked_eval])
            _write_json(data_dir / "eft_stats.json", stats)
            _write_jsonl(eft_path, rows)
            _free(model, judge)
        info["eft"] = json.loads((data_dir / "eft_stats.json").read_text())
        from pofe.loops.sft import SFTExample

        eft = [SFTExample(r["prompt"], r["response"], "eft") for r in read_jsonl(eft_path)]
        if s.eft_max_ratio is not None and len(eft) > s.eft_max_ratio * len(ift):
            eft = random.Random(cfg.seed).sample(eft, int(s.eft_max_ratio * len(ift)))
    if not (data_dir / "ift.jsonl").exists():
        _write_jsonl(data_dir / "ift.jsonl", [{"prompt": e.prompt, "response": e.response} for e in ift])
    summary = sft_run(sft_cfg("sft"), examples=ift + eft, run_dir=it_dir / "sft")
    info["sft"] = {k: summary.get(k) for k in ("steps", "examples", "data", "dropped", "loss_first", "loss_last")}
    link = it_dir / "model"
    if not link.exists():
        os.symlink(os.path.relpath(summary["model_dir"], it_dir), link)  # iter_t/model is M_t in every iteration
    return str(link), info


def _renderer(judge):
    """The EFT input: the judge prompt exactly as the rubric judge renders it."""
    tmpl = getattr(judge, "template", None)
    if tmpl is None:
        raise ValueError("EFT data needs an LLM rubric judge (judge.kind: rubric); "
                         f"got {getattr(judge, 'id', judge)!r}")
    specials = getattr(getattr(judge, "backend", None), "special_strings", ())

    def render(prompt: str, response: str) -> str:
        r = tmpl.render({"prompt": prompt, "response": response}, special_strings=specials)
        return r.user
    return render


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
    else:
        gen_model, gen_tok, own = policy, tok, False
        if cfg.self_instruct.model:
            gen_model, gen_tok = _load(cfg.self_instruct.model, cfg)
            own = True

        def generate_fn(fewshot: list[str], sampling: SamplingConfig, seed: int) -> list[str]:
            return [g[0].text for g in generate(gen_model, gen_tok, fewshot, n=1, sampling=sampling, seed=seed)]

        kept, stats = generate_prompts(generate_fn, inp.seeds, cfg.self_instruct, machine=machine,
                                       avoid=inp.eval_prompts + inp.val_prompts, seed=_seed(cfg, "prompts", t))
        stats["source"] = "self-instruct"
        stats["generator"] = cfg.self_instruct.model or f"M{t - 1}"
        if own:
            _free(gen_model)
    _write_json(path, {"prompts": kept, "stats": stats})
    return kept, stats


def candidates_stage(cfg: SelfRewardConfig, prompts: list[str], policy, tok, judge, t: int, it_dir: Path) -> list[dict]:
    """Steps 2-3: N candidates per prompt from M_{t-1}, each scored by the judge (M_{t-1}'s
    rubric, k samples averaged). Appended per chunk: a crash resumes at the next chunk."""
    path = it_dir / "data" / "candidates.jsonl"
    done = read_jsonl(path) if path.exists() else []
    done = [r for r in done if r.get("index") is not None]
    if path.exists():
        _write_jsonl(path, done)  # drop a torn last line before appending
    c = cfg.candidates
    with JsonlWriter(path) as w:
        for start in range(len(done), len(prompts), c.chunk):
            chunk = prompts[start:start + c.chunk]
            groups = generate(policy, tok, chunk, n=c.n, sampling=c.sampling, seed=_seed(cfg, "cand", t, start))
            flat_x = [x for x, g in zip(chunk, groups) for _ in g]
            flat_y = [o.text for g in groups for o in g]
            scores = judge.score(flat_x, flat_y)
            for i, (x, g) in enumerate(zip(chunk, groups)):
                ss = scores[i * c.n:(i + 1) * c.n]
                row = {"index": start + i, "prompt": x, "responses": [o.text for o in g],
                       "scores": [s.score for s in ss], "samples": [list(s.samples) for s in ss],
                       "finished": [o.finished for o in g], "tokens": [o.num_tokens for o in g],
                       "judge_id": getattr(judge, "id", None)}
                w.write(row)
                done.append(row)
    return done


def dpo_stage(cfg: SelfRewardConfig, prev_model: str, aift_path: Path, n_pairs: int, t: int, it_dir: Path) -> dict:
    """Step 5: M_t = DPO on AIFT(M_{t-1}) from M_{t-1}, reference M_{t-1}, via ``pofe online``
    in offline mode (one DPO trainer in the code base). Resumes from its step checkpoints."""
    from pofe.loops import online

    d = cfg.dpo
    per_step = d.batch_size * d.grad_accum
    steps = d.max_steps if d.max_steps is not None else max(1, math.ceil(d.epochs * n_pairs / per_step))
    k = max(1, cfg.selection.num_checkpoints) if cfg.selection.enabled else 1
    every = max(1, math.ceil(steps / k)) if k > 1 else 0
    ocfg = online.OnlineConfig(
        mode="offline",
        model=ModelConfig(name=str(prev_model), dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code,
                          gradient_checkpointing=cfg.model.gradient_checkpointing, lora=cfg.model.lora),
        loss=online.LossSettings(name="dpo", beta=d.beta, labels="hard"),
        optim=d.optim,
        train=online.TrainSettings(steps=steps, batch_size=d.batch_size, grad_accum=d.grad_accum,
                                   seed=_seed(cfg, "dpo", t), device="cpu" if not _cuda() else "auto"),
        data=online.DataSettings(preferences=str(aift_path)),
        eval=online.EvalSettings(enabled=False),
        checkpoint=online.CheckpointSettings(every=every, keep_last=0),
        log=LogConfig(tensorboard=False, progress=False),
        run=RunConfig(output_dir=str(it_dir), name="dpo"),
    )
    dpo_dir = it_dir / "dpo"
    resume = dpo_dir if (dpo_dir / "config.yaml").exists() else None
    return online.run(ocfg, resume=resume)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _checkpoint_policy(cfg: SelfRewardConfig, prev_model: str, ckpt: Path | None, final: Path):
    """The model of a DPO checkpoint (``None`` = the final one)."""
    from pofe.training import load_checkpoint, load_policy

    if ckpt is None:
        return _load(str(final), cfg)
    mcfg = ModelConfig(name=str(prev_model), dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code,
                       lora=cfg.model.lora)
    model, tok = load_policy(mcfg)
    load_checkpoint(ckpt, model=model, restore_rng=False)
    model.eval()
    return model, tok


def _responses(model, tok, prompts: Sequence[str], sampling: SamplingConfig, seed: int) -> list[str]:
    if not prompts:
        return []
    return [g[0].text for g in generate(model, tok, list(prompts), n=1, sampling=sampling, seed=seed)]


def select_stage(cfg: SelfRewardConfig, inp: Inputs, prev_model: str, prev_val: list[str], sel_judge, dpo: dict,
                 t: int, it_dir: Path) -> str:
    """Step 6: pick the DPO checkpoint with the best tie-adjusted win rate against M_{t-1} on
    the validation prompts (ties go to the later checkpoint), save it as ``iter_t/model``."""
    from pofe.training import save_final

    model_dir = it_dir / "model"
    if (model_dir / "config.json").exists():
        return str(model_dir)
    final = Path(dpo["final_model"])
    ckpt_root = it_dir / "dpo" / "checkpoints"
    steps = sorted(int(p.name.split("-", 1)[1]) for p in ckpt_root.glob("step-*")) if ckpt_root.is_dir() else []
    last = max(steps) if steps else None
    options: list[tuple[int | None, Path | None]] = [(s, ckpt_root / f"step-{s}") for s in steps if s != last]
    options.append((last, None))  # the final model (= the last checkpoint's weights)
    results = []
    if cfg.selection.enabled and inp.val_prompts and len(options) > 1:
        for step, ckpt in options:
            model, tok = _checkpoint_policy(cfg, prev_model, ckpt, final)
            val = _responses(model, tok, inp.val_prompts, cfg.evaluation.sampling, _seed(cfg, "val"))
            h2h = head_to_head(sel_judge, inp.val_prompts, val, prev_val)
            results.append({"step": step, "final": ckpt is None, **h2h})
            _free(model)
        best = max(range(len(results)), key=lambda i: (results[i]["win_rate_adjusted"] or 0.0, i))
    else:
        best = len(options) - 1
        results.append({"step": last, "final": True, "note": "selection disabled or nothing to choose from"})
    step, ckpt = options[best]
    if ckpt is None:
        shutil.copytree(final, model_dir, dirs_exist_ok=True)
    else:
        model, tok = _checkpoint_policy(cfg, prev_model, ckpt, final)
        save_final(model, tok, model_dir)
        _free(model)
    _write_json(it_dir / "selection.json", {"selected_step": step, "candidates": results})
    if not cfg.selection.keep_checkpoints:
        shutil.rmtree(ckpt_root, ignore_errors=True)
    return str(model_dir)


def evaluate_stage(cfg: SelfRewardConfig, inp: Inputs, model, tok, t: int, it_dir: Path, yardstick,
                   prev_eval: list[str] | None) -> tuple[dict[str, Any], list[str]]:
    """Step 7: M_t's held-out responses, their mean length and mean score under the fixed
    yardstick judge, head-to-head vs M_{t-1}, and M_t's reward-modelling metrics."""
    path = it_dir / "eval_responses.jsonl"
    if path.exists():
        resp = [r["response"] for r in read_jsonl(path)]
    else:
        resp = _responses(model, tok, inp.eval_prompts, cfg.evaluation.sampling, _seed(cfg, "eval"))
        _write_jsonl(path, [{"prompt": x, "response": y} for x, y in zip(inp.eval_prompts, resp)])
    m: dict[str, Any] = {"eval_prompts": len(resp)}
    if resp:
        m["mean_length_chars"] = sum(len(r) for r in resp) / len(resp)
        m["mean_length_tokens"] = sum(len(tok(r, add_special_tokens=False)["input_ids"]) for r in resp) / len(resp)
    if resp and yardstick is not None and hasattr(yardstick, "score"):
        sc = [s.score for s in yardstick.score(inp.eval_prompts, resp)]
        ok = [s for s in sc if s is not None]
        m["eval_mean_score"] = sum(ok) / len(ok) if ok else None
        m["eval_unscored"] = len(sc) - len(ok)
        m["eval_judge"] = getattr(yardstick, "id", None)
    if prev_eval is not None and resp and yardstick is not None:
        m["head_to_head_vs_prev"] = head_to_head(yardstick, inp.eval_prompts, resp, prev_eval)
    if cfg.evaluation.rm_metrics and inp.ranked_eval:
        judge = make_judge(cfg.judge, **_judge_runtime(cfg, model, tok, f"M{t}"))
        if hasattr(judge, "score"):
            # the "perfect" score: 5 on the rubric; 1.0 for the [0, 1]-normalised expected score
            hi = {"rubric": float(cfg.judge.rubric.score_range[1]), "expected-score": 1.0}.get(cfg.judge.kind, 5.0)
            m["rm_metrics"] = rm_eval(judge, inp.ranked_eval, max_score=hi)
            m["rm_judge"] = getattr(judge, "id", None)
    return m, resp


def _judge_runtime(cfg: SelfRewardConfig, model, tok, tag: str) -> dict[str, Any]:
    if cfg.judge_model == "self" and cfg.judge.kind in LLM_JUDGE_KINDS:
        return {"model": model, "tokenizer": tok, "judge_id": f"self:{tag}:{cfg.judge.kind}:{cfg.judge.template}"}
    return {}


# ============================================================================ the chain

class _Clock:
    """Seconds per stage (reported per iteration: where the time goes)."""

    def __init__(self):
        self.t = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.t, 2)
        self.t = now


def run(cfg: SelfRewardConfig) -> dict[str, Any]:
    """Run M1 -> M2 -> ... -> M_T; returns the per-iteration summary (also ``summary.json``)."""
    t0 = time.time()
    # ------------------------------------------------------------------ setup
    run_dir = Path(cfg.resume) if cfg.resume else new_run_dir(cfg.run, "self-reward")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, cfg)
    seed_everything(cfg.seed)
    inp = load_inputs(cfg)
    _write_json(run_dir / "inputs.json", {"counts": inp.counts, "eval_prompts": inp.eval_prompts,
                                          "val_prompts": inp.val_prompts})
    iterations: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ M1
    it_dir = run_dir / "iter_1"
    it_dir.mkdir(exist_ok=True)
    m1, seed_info = seed_stage(cfg, inp, it_dir)
    model, tok = _load(m1, cfg)
    # The fixed yardstick for mean score / head-to-head: evaluation.judge, else the training
    # judge on M1 (fixed for the whole run, so iterations are compared on one scale).
    if cfg.evaluation.judge is not None:
        yardstick = make_judge(cfg.evaluation.judge)
    else:
        ymodel, ytok = (_load(m1, cfg) if cfg.judge.kind in LLM_JUDGE_KINDS and cfg.judge_model == "self" else (None, None))
        yardstick = make_judge(cfg.judge, model=ymodel, tokenizer=ytok, judge_id="yardstick:M1")
    metrics_path = it_dir / "metrics.json"
    if metrics_path.exists():
        m = json.loads(metrics_path.read_text())
        prev_eval = [r["response"] for r in read_jsonl(it_dir / "eval_responses.jsonl")]
    else:
        ev, prev_eval = evaluate_stage(cfg, inp, model, tok, 1, it_dir, yardstick, None)
        m = {"iteration": 1, "model": m1, **seed_info, **ev}
        _write_json(metrics_path, m)
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
        judge = make_judge(cfg.judge, **_judge_runtime(cfg, model, tok, f"M{t - 1}"))
        clock = _Clock()

        # 1. prompts; 2-3. candidates scored by M_{t-1}; 4. pairs
        prompts, p_stats = prompts_stage(cfg, inp, model, tok, machine, t, it_dir)
        clock.lap("prompts")
        machine += prompts
        rows = candidates_stage(cfg, prompts, model, tok, judge, t, it_dir)
        clock.lap("candidates_and_judging")
        pairs, pair_counts = build_pairs(rows)
        aift = it_dir / "data" / "aift.jsonl"
        _write_jsonl(aift, pairs)
        all_scores = [s for r in rows for s in r["scores"]]
        scored = [s for s in all_scores if s is not None]
        gen_stats = {"candidates": len(all_scores), "unscored_candidates": len(all_scores) - len(scored),
                     "mean_score": sum(scored) / len(scored) if scored else None,
                     "pair_margin_mean": (sum(p["chosen_score"] - p["rejected_score"] for p in pairs) / len(pairs)
                                          if pairs else None)}

        # 5. DPO from M_{t-1} with reference M_{t-1}; 6. checkpoint selection
        sel_judge = None
        prev_val: list[str] = []
        if cfg.selection.enabled and inp.val_prompts:
            sel_judge = (make_judge(cfg.selection.judge) if cfg.selection.judge is not None else judge)
            vpath = it_dir / "prev_val_responses.jsonl"
            if vpath.exists():
                prev_val = [r["response"] for r in read_jsonl(vpath)]
            else:
                prev_val = _responses(model, tok, inp.val_prompts, cfg.evaluation.sampling, _seed(cfg, "val"))
                _write_jsonl(vpath, [{"prompt": x, "response": y} for x, y in zip(inp.val_prompts, prev_val)])
        _free(model)
        model = None
        clock.lap("validation_baseline")
        if pairs:
            # (A self-judge keeps M_{t-1}'s weights alive through DPO: it selects checkpoints next.)
            dpo = dpo_stage(cfg, prev_model, aift, len(pairs), t, it_dir)
            clock.lap("dpo")
            model_dir = select_stage(cfg, inp, prev_model, prev_val, sel_judge, dpo, t, it_dir)
        else:
            # Nothing to learn from (every prompt tied or went unscored): M_t = M_{t-1},
            # reported rather than crashing three hours into a run.
            log.warning("iteration %d: no preference pairs (%s); M%d = M%d", t, pair_counts, t, t - 1)
            dpo, model_dir = {"skipped": "no preference pairs"}, prev_model
        sel = json.loads((it_dir / "selection.json").read_text()) if (it_dir / "selection.json").exists() else {}
        _free(judge, sel_judge)
        clock.lap("selection")

        # 7. evaluation of M_t
        model, tok = _load(model_dir, cfg)
        ev, eval_resp = evaluate_stage(cfg, inp, model, tok, t, it_dir, yardstick, prev_eval)
        clock.lap("evaluation")
        m = {"iteration": t, "model": model_dir, "prompts": p_stats, "pairs": pair_counts, **gen_stats,
             "dpo": {k: dpo.get(k) for k in ("skipped", "run_dir", "steps", "trained_pairs", "loss_first", "loss_last",
                                                       "seconds_per_step", "resumed_from") if k in dpo},
             "dpo_steps": dpo.get("steps", None), "selected_step": sel.get("selected_step"),
             "selection": sel.get("candidates"), **ev, "seconds": clock.laps}
        _write_json(metrics_path, m)
        iterations.append(m)
        prev_eval, prev_model = eval_resp, model_dir

    summary = {"run_dir": str(run_dir), "iterations": iterations, "inputs": inp.counts,
               "seconds": round(time.time() - t0, 1)}
    _write_json(run_dir / "summary.json", summary)
    return summary


def compact(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-iteration line ``--json`` prints: prompts generated/kept, pairs kept/dropped,
    mean score, RM metrics, head-to-head vs the previous iteration, mean length."""
    out = []
    for m in summary["iterations"]:
        p = m.get("prompts") or {}
        pc = m.get("pairs") or {}
        rm = m.get("rm_metrics") or {}
        out.append({
            "iteration": m["iteration"], "model": m.get("model"),
            "prompts_generated": p.get("candidates", p.get("pool")), "prompts_kept": p.get("kept"),
            "prompts_rejected": p.get("rejected"),
            "pairs_kept": pc.get("kept"),
            "pairs_dropped": {k: v for k, v in pc.items() if k not in ("kept", "prompts")} or None,
            "unscored_candidates": m.get("unscored_candidates"),
            "mean_score": m.get("mean_score"), "eval_mean_score": m.get("eval_mean_score"),
            "mean_length_chars": m.get("mean_length_chars"),
            "rm_metrics": {k: rm.get(k) for k in ("pairwise_accuracy", "exact_match", "spearman", "kendall_tau",
                                                  "five_best_share", "n_pairs")} if rm else None,
            "head_to_head_vs_prev": m.get("head_to_head_vs_prev"), "selected_step": m.get("selected_step"),
        })
    return out
