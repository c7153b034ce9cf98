"""``pofe label``: stage 2 of Constitutional AI (RL-CAI), AI preference labels.

rlaif-constitutional-ai, "Stage 2: AI preference labels": sample two responses per prompt
from the (SL-CAI) policy at a temperature around 1.0, show both to a feedback model under one
principle sampled from the constitution, read P("A") vs P("B") in *both orders* and average
(``p = ½(p₁₂ + 1 − p₂₁)``), optionally with chain-of-thought and the clamp to [0.4, 0.6].
The judge (``pofe.judges``, kind ``llm`` with a constitution) does the reading, the
principle sampling and the caching; this command samples the pairs and calls it one batch
(``train.batch_size`` pairs) per driver step. It writes:

* ``pairs.jsonl`` -- the (prompt, response_a, response_b) triples, written before any
  judging, so ``--resume`` labels exactly the same pairs; ``input.json`` -- how many of the
  input's pairs or prompts were labelled (``data.max_prompts`` may cut them: the cut is logged
  and copied into the summary's ``input``);
* ``labels.jsonl`` -- one row per pair (:func:`~pofe.data.labelled_pairs.labelled_row`): p,
  per-order p_ab / p_ba, consistency, parse status, principle id, constitution version,
  template id and hash, judge id, whether it came from the cache, ``text_fallback`` (the
  verdict was read from generated text because the endpoint gave no log-probabilities: a hard
  0/1 label, not a probability) and ``dropped`` (the ``labels:`` policy's reason --
  ``unlabelled``, ``inconsistent``, ``low_margin`` -- or null);
* ``preferences.jsonl`` -- :class:`~pofe.records.PreferencePair` rows oriented so the
  judge's favourite is ``chosen`` and ``p = max(p, 1 − p)`` (what ``pofe rm`` and DPO read),
  the pairs the label policy kept; written at the end from labels.jsonl;
* ``metrics.jsonl`` -- one row per judged batch; ``summary.json`` -- the judge-fitness
  numbers the seed asks for before any reward model is trained ("Validate the judge before
  you validate anything else": :mod:`pofe.evaluation.label_stats`), throughput and cache
  hits/misses.

The run folder, ``--resume``, checkpoints (every batch by default: ``checkpoint.every: 1``)
and metrics are the driver's (:mod:`pofe.recipe`): a resumed run continues after the last
checkpointed batch, and the rows of a batch cut short are set aside and judged again as one
batch -- from the judge's SQLite cache, so redoing it is free.

Data parallel (``torchrun --nproc_per_node N``): each process samples its block of the prompts
and judges its block of every batch (:meth:`~pofe.runtime.parallel.DataParallel.map`); rank 0
writes the gathered rows in input order into the one run folder, so labels.jsonl is the
one-process run's row for row (sampled pairs depend on N, see
:func:`~pofe.runtime.seeds.block_seed`; pairs.jsonl fixes them for a resume).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.data.labelled_pairs import (DEFAULT_SAMPLED_PROMPTS, input_info, label_row, labelled_row, preferences_text,
                                      read_pairs, save_pairs, saved_pairs, to_preference)
from pofe.evaluation.label_stats import batch_metrics, cache_counts, drop_counts, label_stats
from pofe.generation import SamplingConfig
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.judges.usage import BudgetMeter, budget_of, usage_summary
from pofe.labels import LabelPolicy
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig
from pofe.runtime.guards import fault_point
from pofe.runtime.tracking import LogConfig

__all__ = ["LabelConfig", "LabelRecipe", "run", "label_row", "label_stats", "read_pairs", "to_preference"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class LabelDataConfig(PofeConfig):
    """What is labelled: existing pairs, or two samples of each prompt."""

    prompts: str = "hh-rlhf:harmless"
    """Prompt source: a file or advbench, xstest[:safe|:unsafe], hh-rlhf:harmless, hh-rlhf:helpful."""
    max_prompts: int | None = Field(None, ge=1)
    """Use at most this many prompts (or pairs with ``data.pairs``). null: every pair of
    ``data.pairs``, and the first 32 sampled prompts -- sampling is the costly part, so set a
    number to sample more. A cut is logged and counted in the summary's ``input``."""
    pairs: str | None = None
    """Label existing pairs instead of sampling: a jsonl with prompt, response_a, response_b
    (or prompt, chosen, rejected)."""


class LabelTrainConfig(PofeConfig):
    """Batch shape."""

    batch_size: int = Field(16, ge=1, le=MAX_BATCH_SIZE)
    """Pairs per judge call (one step: labelled, logged and checkpointed before the next)."""


class LabelConfig(PofeConfig):
    """``pofe label`` (RL-CAI preference labels)."""

    model: ModelConfig = ModelConfig()
    """Model that samples the two responses (the SL-CAI model in the CAI pipeline); LoRA does not apply."""
    data: LabelDataConfig = LabelDataConfig()
    """The pairs or prompts to label."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=1.0)
    """Sampling of the two responses. Seed: "temperature around 1.0" so the two samples differ."""
    judge: JudgeConfig = LLMJudgeConfig(template="constitution", constitution="hhh")
    """The feedback model (any pairwise judge); default: RL-CAI's multiple-choice constitution
    template under one sampled principle of the shipped harmless + helpful + honest constitution."""
    train: LabelTrainConfig = LabelTrainConfig()
    """Pairs per judge call."""
    labels: LabelPolicy = LabelPolicy()
    """Label hygiene (which labelled pairs go to preferences.jsonl; all stay in labels.jsonl with
    the reason) and the audit's calibration map (the alternative to the CoT clamp,
    rlaif-constitutional-ai "Choices that matter"). Default: keep every parsed pair -- soft-label
    consumers already give a near-½ pair a near-zero target margin; hard-label consumers should
    set ``min_margin`` and/or ``drop_inconsistent``."""
    checkpoint: CheckpointConfig = CheckpointConfig(every=1)
    """Checkpoints for ``--resume`` (every batch: a crash costs at most one batch, redone from the cache)."""
    log: LogConfig = LogConfig()
    """metrics.jsonl per judged batch, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: Seed = 0
    """Seeds the sampling of the pairs."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @field_validator("model")
    @classmethod
    def _no_lora(cls, v: ModelConfig) -> ModelConfig:
        if v.lora.enabled:
            raise ValueError("model.lora: pofe label only samples from the model, LoRA settings do not apply")
        return v


# ----------------------------------------------------------------------------- the command

class LabelRecipe(Recipe):
    """pairs fixed in setup -> one judged batch per step -> preferences.jsonl and the judge-fitness summary."""

    command = "label"
    writes_final = False  # no weights: nothing for run.push_to_hub
    data_parallel = True
    outputs = ("labels.jsonl",)
    step_faults = ("after_batch",)
    show = (("mean_p", "p", "{:.2f}"), ("consistency_rate", "consistent", "{:.2f}"))

    def __init__(self, cfg: LabelConfig, *, resume: str | Path | None = None, policy=None, tokenizer=None, judge=None):
        super().__init__(cfg)
        self.resume, self.policy, self.tokenizer, self.judge = resume, policy, tokenizer, judge
        self.given: list | None = None  # the input pairs (None: sampled from self.prompts in setup)
        self.prompts: list[str] = []
        self.info: dict[str, Any] | None = None
        self.judgments: list = []
        self.rows: list[dict[str, Any]] = []
        self.judge_s = self.sample_s = 0.0
        self.writer = None

    def load_data(self) -> None:
        """The input pairs or prompts, cut to ``data.max_prompts`` (a bad file fails before any run
        folder exists); a resumed run that saved its pairs reads those in setup instead."""
        data = self.cfg.data
        if self.resume is not None and (Path(self.resume) / "pairs.jsonl").exists():
            return
        if data.pairs:
            given = read_pairs(data.pairs)
            self.given = given[: data.max_prompts]
            self.info = self._counted(input_info(data.pairs, len(given), len(self.given), data.max_prompts), "pairs")
        else:
            from pofe.data.prompts import load_prompt_texts

            given = load_prompt_texts(data.prompts)
            self.prompts = given[: data.max_prompts or DEFAULT_SAMPLED_PROMPTS]
            self.info = self._counted(input_info(data.prompts, len(given), len(self.prompts), data.max_prompts), "prompts")

    @staticmethod
    def _counted(info: dict[str, Any], what: str) -> dict[str, Any]:
        if info["limited"]:
            m = info["max_prompts"]
            why = f"max_prompts={m}" if m else f"max_prompts=null samples {DEFAULT_SAMPLED_PROMPTS}"
            log.warning("label: %s: labelling the first %d %s of %s; %d of %d left out (set data.max_prompts to "
                        "change it)", why, info["used"], what, info["source"], info["limited"], info["available"])
        return info

    def audit_identity(self):
        from pofe.evaluation.audit import judge_identity

        return judge_identity(self.cfg.judge)

    def setup(self, run: RunContext) -> None:
        from pofe.judges.registry import build_judge

        cfg = self.cfg
        self.run_dir, self.dp = run.dir, run.dp
        # every process its own judge (and its own connection to the WAL-mode cache file)
        self.judge = self.judge if self.judge is not None else build_judge(cfg.judge)
        t0 = time.perf_counter()
        saved = self.dp.from_main(saved_pairs(run.dir) if run.main else None)
        if saved is not None:
            pairs, self.info = saved
        else:
            pairs = self.given if self.given is not None else self.dp.map(self._sample, self.prompts)
            if run.main:
                save_pairs(run.dir, pairs, self.info)
        self.sample_s = time.perf_counter() - t0
        # Identical samples carry no preference (oat masks them out too): kept in pairs.jsonl, never judged.
        self.identical = sum(a.strip() == b.strip() for _, a, b in pairs)
        self.pairs = [(x, a, b) for x, a, b in pairs if a.strip() != b.strip()]
        self.total_steps = -(-len(self.pairs) // cfg.train.batch_size)
        run.restore_checkpoint()
        done = min(run.start * cfg.train.batch_size, len(self.pairs))
        self.resumed_after = done if run.resumed else None
        # tokens and cost per batch, the run's total across resumes, judge.budget's stop
        self.meter = BudgetMeter(budget_of(cfg.judge), [self.judge], dp=self.dp, state=run.state)
        run.meter(self.meter)
        self.writer = run.writer("labels.jsonl")  # rank 0 alone writes the run folder
        log.info("label: %d pairs (%d identical skipped, %d already labelled), judge %s", len(self.pairs),
                 self.identical, done, getattr(self.judge, "id", "?"))

    def _sample(self, prompts: list[str]) -> list[tuple[str, str, str]]:
        """This process's block of the prompts, two samples each."""
        from pofe.generation.pairs import sample_pairs
        from pofe.runtime.seeds import block_seed

        cfg = self.cfg
        if self.policy is None:
            from pofe.models import load_model

            self.policy, self.tokenizer = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device,
                                                     trust_remote_code=cfg.model.trust_remote_code,
                                                     **cfg.model.load_kwargs())
        return sample_pairs(self.policy, self.tokenizer, prompts, cfg.sampling, block_seed(cfg.seed, self.dp.rank))

    def step(self, step: int) -> dict[str, Any]:
        bs = self.cfg.train.batch_size
        chunk = self.pairs[(step - 1) * bs: step * bs]
        t0 = time.perf_counter()
        js = self.dp.map(lambda part: self.judge.judge([x for x, _, _ in part], [a for _, a, _ in part],
                                                        [b for _, _, b in part]), chunk)
        rows = []
        for (x, a, b), j in zip(chunk, js):
            rows.append(labelled_row(x, a, b, j, self.cfg.labels))
            if self.writer is not None:
                self.writer.write(rows[-1])
            fault_point(f"{step}:row_{len(rows)}")  # crash/resume suite: mid-batch
        self.judgments += js
        self.judge_s += time.perf_counter() - t0
        fault_point(f"{step}:before_metrics")  # crash/resume suite: rows written, metrics row not
        return {**batch_metrics(rows), **self.meter.row(step)}

    def checkpoint_state(self) -> dict[str, Any]:
        return self.meter.state()

    def save_final(self, out: Path) -> Path | None:
        """preferences.jsonl from every labels.jsonl row (a run without weights has no ``final/``)."""
        from pofe.runs import atomic_write_text, read_jsonl

        self.rows = read_jsonl(self.run_dir / "labels.jsonl") if (self.run_dir / "labels.jsonl").exists() else []
        atomic_write_text(self.run_dir / "preferences.jsonl", preferences_text(self.rows))
        return None

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        from pofe.judges.summary import summarize_judgments

        # rank 0 read labels.jsonl in save_final: every process returns the same summary
        self.rows = self.dp.from_main(self.rows)
        cfg, rows, d = self.cfg, self.rows, self.run_dir
        judge_summary = summarize_judgments(self.judgments, seconds=self.judge_s)
        return {
            "judge": getattr(self.judge, "id", cfg.judge.kind), **label_stats(rows), "input": self.info,
            "identical_dropped": self.identical,
            "filter": {"drop_inconsistent": cfg.labels.drop_inconsistent, "min_margin": cfg.labels.min_margin,
                       "dropped": drop_counts(rows)},
            "text_fallback_labels": sum(bool(r.get("text_fallback")) for r in rows),
            "preference_pairs": sum(r.get("dropped") is None for r in rows),
            "resumed_after": self.resumed_after, "cache": cache_counts(self.judgments, judge_summary),
            "judge_summary": judge_summary, "judge_usage": usage_summary(history),
            "phase_seconds": {"sample": round(self.sample_s, 3), "judge": round(self.judge_s, 3)},
            "labels_per_second": round(len(self.judgments) / self.judge_s, 3) if self.judge_s > 0 else None,
            "files": {"labels": str(d / "labels.jsonl"), "preferences": str(d / "preferences.jsonl"),
                      "pairs": str(d / "pairs.jsonl")},
        }


def run(cfg: LabelConfig, *, resume: str | Path | None = None, policy=None, tokenizer=None, judge=None,
        require_audit: str | Path | None = None) -> dict[str, Any]:
    """Sample (or read) the pairs -> label them batch by batch -> preferences.jsonl. Returns the
    summary (also ``summary.json``). ``resume``: a run folder to continue after its last
    checkpointed batch (``cfg`` is its saved config)."""
    recipe = LabelRecipe(cfg, resume=resume, policy=policy, tokenizer=tokenizer, judge=judge)
    return drive(recipe, resume=resume, require_audit=require_audit)
