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
     -> ``data/aift.jsonl`` (:mod:`pofe.data.aift`); optionally (off by default, see
     :mod:`pofe.loops.self_reward.self_reward_variants`) the rejected from the seed model M1's candidates
     (``temporal.anchor: m1``, Temporal Self-Rewarding; with ``temporal.future`` the chosen from
     a model DPO-trained one step ahead), Meta-Rewarding's length-controlled actor pairs plus
     judge pairs from the model's judgments of its own judgments (``meta_judge.enabled``,
     :mod:`pofe.loops.self_reward.meta_rewarding`), and/or the label softened to CREAM's consistency C
     between the judgments of M_{t-1} and M_{t-2} (``cream.enabled``);
  5. M_t = DPO on AIFT(M_{t-1}) from M_{t-1}, reference M_{t-1} (beta 0.1, lr 1e-6 cosine to
     1e-7), through ``pofe online``'s offline mode (one DPO trainer);
  6. the DPO checkpoint with the best head-to-head win rate against M_{t-1} on validation
     prompts ("Early stopping").
* every iteration: held-out responses (mean length, mean score under a *fixed* judge),
  head-to-head vs the previous iteration (both orders; a disagreement is a tie), and M_t's
  reward-modelling metrics on the held-out human-ranked split (Table 4); see
  :mod:`pofe.evaluation.self_reward`.

The run folder, ``--resume``, ``metrics.jsonl`` (one row per iteration) and ``summary.json``
are the driver's (:mod:`pofe.recipe`): one driver step is one iteration (step 1 = M1, step t =
iteration t), checkpointed (its small state only: no weights at this level) once its row and
``iter_t/metrics.json`` are written. Inside an iteration every stage's output is a file,
skipped when present (candidates append per chunk; DPO / SFT resume from their own step
checkpoints), so a crash mid-iteration redoes only its unfinished stages
(:mod:`pofe.loops.self_reward.self_reward_stages`). ``final/`` is M_T: a link to ``iter_T/model``.

Data-parallel under ``torchrun``: candidates, their scores, greedy responses and judging are
split by prompt block over the processes, SFT and DPO shard their steps, rank 0 writes every
file of the one run folder. Sampled candidates (and so the pairs and what DPO learns) depend on
the number of processes, as for ``pofe label``; greedy responses and a deterministic judge's
verdicts do not, and a resume with the same number of processes equals the uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.data.eft import EFTConfig
from pofe.data.self_reward_inputs import SelfRewardDataConfig, load_inputs
from pofe.evaluation.self_reward import SelectionSettings
from pofe.generation import SamplingConfig
from pofe.generation.candidates import CandidateSettings
from pofe.generation.self_instruct import SelfInstructConfig
from pofe.judges.base import Capability, has_capability, require_capability
from pofe.judges.config import JudgeConfig, RubricJudgeConfig
from pofe.loops.sft import SFTTrainSettings
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig, OptimConfig
from pofe.loops.online.metrics import iteration_row
from pofe.loops.self_reward.meta_rewarding import MetaJudgeSettings
from pofe.loops.self_reward.self_reward_stages import Chain
from pofe.loops.self_reward.self_reward_variants import CreamSettings, TemporalSettings
from pofe.loops.self_reward.stages import write_json
from pofe.runtime.tracking import LogConfig

__all__ = ["SelfRewardConfig", "SelfRewardRecipe", "run", "load_inputs"]


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
    batch_size: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    """Pairs per micro-batch."""
    grad_accum: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    """Pairs per optimiser step = batch_size x grad_accum (paper: 16)."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the AIFT pairs when ``steps`` is None."""
    steps: int | None = Field(None, ge=1)
    """Optimiser steps; None = from ``epochs``."""


class SelfRewardEvalConfig(PofeConfig):
    """How every iteration is measured (``eval``)."""

    num_prompts: int = Field(32, ge=0)
    """Held-out prompts for mean score, length and head-to-head (paper: 256)."""
    prompts: str | None = None
    """Held-out prompt file; None = a seeded split of the built-in prompts."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=128)
    """Greedy: the comparison between iterations should not depend on sampling luck."""
    judge: JudgeConfig | None = None
    """A fixed yardstick for mean score and head-to-head; None = the training judge on M1."""
    rm_metrics: bool = True
    """Reward-modelling metrics of each M_t as a judge on the held-out ranked split."""


class SelfRewardConfig(PofeConfig):
    """``pofe self-reward``."""

    seed: Seed = 0
    """Seeds every stage (each stage derives its own seed from it)."""
    model: ModelConfig = ModelConfig()
    """The base model (M0 with seed SFT, else M1). LoRA settings apply to every training stage."""
    iterations: int = Field(3, ge=1)
    """Models M1..M_T (paper: 3, i.e. two DPO rounds)."""
    seed_sft: SeedSFTSettings = SeedSFTSettings()
    """How M1 is made."""
    eft: EFTConfig = EFTConfig()
    """EFT data from human-ranked responses."""
    data: SelfRewardDataConfig = SelfRewardDataConfig()
    """Where each iteration's prompts come from (``data.prompts``: null = Self-Instruct, else a pool)."""
    self_instruct: SelfInstructConfig = SelfInstructConfig()
    """Prompt generation and filters (when ``data.prompts`` is null)."""
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
    cream: CreamSettings = CreamSettings()
    """CREAM (Wang et al. 2024): the previous iteration's model judges the same candidates and
    the rankings' consistency C becomes DPO's soft label (from iteration 3)."""
    temporal: TemporalSettings = TemporalSettings()
    """Temporal Self-Rewarding: anchored rejection (rejected from M1's candidates) and future-guided
    chosen (chosen from a model trained one DPO step ahead)."""
    meta_judge: MetaJudgeSettings = MetaJudgeSettings()
    """Meta-Rewarding (Wu et al. 2024): the model also judges its own judgments; DPO trains on
    length-controlled actor pairs and meta-judged judge pairs together."""
    selection: SelectionSettings = SelectionSettings()
    """Checkpoint selection."""
    eval: SelfRewardEvalConfig = SelfRewardEvalConfig()
    """Per-iteration evaluation."""
    checkpoint: CheckpointConfig = CheckpointConfig(every=1)
    """The driver's checkpoints (every 1 = after each iteration; its small state, no weights):
    ``--resume`` continues after the latest."""
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
        if getattr(v, "budget", None) is not None:  # nothing here meters the self-judge yet: a budget would be ignored
            raise ValueError("judge.budget is not read by pofe self-reward (its judge is not metered); remove it")
        return v

    @field_validator("meta_judge")
    @classmethod
    def _meta_judge_fits(cls, m, info):
        # a field validator (fields before it are in info.data) so the error names meta_judge alone
        if not m.enabled:
            return m
        temporal, judge_model = info.data.get("temporal"), info.data.get("judge_model")
        if temporal is not None and temporal.anchor == "m1":  # two rules for the rejected: refuse, never pick one
            raise ValueError("meta_judge.enabled: Meta-Rewarding's length-controlled actor pairs and temporal.anchor: m1 "
                             "choose the rejected differently; use one of them")
        if judge_model == "self":  # the three roles are the policy's own (Wu et al. 2024, Sec. 2)
            for key, j in (("meta_judge.judge", m.judge), ("meta_judge.meta", m.meta)):
                if not has_capability(j, Capability.SHARES_WEIGHTS):
                    raise ValueError(f"{key}: with judge_model: self it must run on the policy's weights "
                                     f"(kind {j.kind} cannot); use backend transformers or vllm")
        return m


# ============================================================================ the command

class SelfRewardRecipe(Recipe):
    """One driver step = one iteration: step 1 makes and measures M1, step t >= 2 makes M_t from
    M_{t-1} (:class:`pofe.loops.self_reward.self_reward_stages.Chain`); ``final/`` = M_T."""

    command = "self-reward"
    data_parallel = True
    show = (("mean_score", "score", "{:.3f}"), ("eval_mean_score", "eval", "{:.3f}"))

    def load_data(self) -> None:
        self.inp = load_inputs(self.cfg)  # held-out / validation / seed prompts, the ranked split

    def audit_identity(self) -> dict[str, Any]:
        # The self-rewarding judge is the policy itself and changes every iteration: the gate
        # names the starting model and the judge template (audit M1 as a judge first).
        from pofe.evaluation.audit import self_reward_identity

        return self_reward_identity(self.cfg.judge, self.cfg.model.name)

    def setup(self, run: RunContext) -> None:
        inp = self.inp
        if run.main:
            write_json(run.dir / "inputs.json", {"counts": inp.counts, "eval_prompts": inp.eval_prompts,
                                                  "val_prompts": inp.val_prompts})
        self.chain = Chain(self.cfg, inp, run.dir, dp=run.dp)
        run.on_close(self.chain.close)
        self.total_steps = self.cfg.iterations
        run.restore_checkpoint()
        self.chain.reload(run.start)  # M1..M_start from their iter_t/ files
        run.meter(self.chain)  # iter_t/metrics.json marks the iteration finished, so it follows its row

    def step(self, step: int) -> dict[str, Any]:
        m = self.chain.iteration(step)
        row = iteration_row(m)
        row.pop("step")
        cream = m.get("cream") or {}
        row.update({f"cream/{k}": cream[k] for k in ("tau_mean", "C") if cream.get(k) is not None})
        if cream:
            row["cream/applied"] = int(cream["applied"])
        meta = m.get("meta_judge") or {}
        row.update({f"meta_judge/{k}": meta[k] for k in ("actor_pairs", "judge_pairs", "meta_unreadable") if k in meta})
        future = (m.get("temporal") or {}).get("future") or {}
        if future.get("enabled"):
            row["temporal/replaced_chosen"] = future.get("replaced", 0)
        return row

    def checkpoint_state(self) -> dict[str, Any]:
        return {"model": self.chain.prev_model}

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {"iterations": self.chain.iterations, "inputs": self.inp.counts,
                "variants": {"cream": self.cfg.cream.enabled, "temporal_anchor": self.cfg.temporal.anchor,
                             "temporal_future": self.cfg.temporal.future, "meta_judge": self.cfg.meta_judge.enabled}}

    def save_final(self, out: Path) -> Path:
        return self.chain.final(out)  # final/ = M_T


def run(cfg: SelfRewardConfig, *, resume: str | Path | None = None,
        require_audit: str | Path | None = None) -> dict[str, Any]:
    """Run M1 -> M2 -> ... -> M_T; returns the summary (also ``summary.json``) with one record
    per iteration. ``resume``: a run folder to continue (the CLI reads its config)."""
    return drive(SelfRewardRecipe(cfg), resume=resume, require_audit=require_audit)
