"""``pofe cai revise``: stage 1 of Constitutional AI (SL-CAI), critique -> revision.

rlaif-constitutional-ai, "Stage 1: critique and revision": for each red-team prompt sample
a response, then R rounds (R = 1..4) in which the same model critiques its latest response
against a harm principle drawn at random from the constitution and rewrites it to address the
critique (:func:`pofe.generation.critique.critique_revise`). The final revisions paired with
their prompts are SFT data, mixed with helpfulness data (``data.helpful`` at
``data.helpful_ratio``) "so the model does not drift toward refusal"; ``pofe sft`` trains on
``sft.jsonl``. The (final revision > original) pairs are written too, as a preference set
(:mod:`pofe.data.cai_sets`).

One driver step revises one chunk of ``train.batch_size`` prompts -- the red-team prompts,
then a benign set run through the same process -- and appends every intermediate text to
``revisions.jsonl``. Refusals are counted on both sets (``summary.json: refusal``,
:mod:`pofe.evaluation.cai_stats`): a constitution that only teaches refusal shows up as the
benign rate climbing with the harmful one (seed, "Over-refusal or over-compliance").

The run folder, ``--resume``, checkpoints (every chunk by default) and metrics are the
driver's (:mod:`pofe.recipe`); each chunk's seed depends on its index only, so a resumed run
revises the remaining chunks exactly as the interrupted one would have.

Data parallel (``torchrun --nproc_per_node N``): each process revises its block of every chunk
(:meth:`~pofe.runtime.parallel.DataParallel.map`) and rank 0 writes the gathered traces in
input order. The principle draws and sampled texts of a block follow the block's own seed
(:func:`~pofe.runtime.seeds.block_seed`), so they depend on N; with one critique principle
and greedy decoding the rows are the one-process run's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.data.cai_sets import load_limited, mix_sft, preference_pairs, sft_set
from pofe.errors import DataError
from pofe.evaluation.cai_stats import chunk_metrics, refusal_summary, revision_stats
from pofe.generation import SamplingConfig
from pofe.generation.critique import Trace, critique_revise, load_cai_constitution
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime import ModelConfig
from pofe.runtime.guards import fault_point
from pofe.runtime.seeds import chunk_seed
from pofe.runtime.tracking import LogConfig

__all__ = ["CaiReviseConfig", "CaiReviseRecipe", "run", "mix_sft", "preference_pairs", "refusal_summary"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class RefusalTrackConfig(PofeConfig):
    """Refusal tracking of a CAI run (over-refusal next to refusal on harmful prompts)."""

    enabled: bool = True
    """Count refusals of the originals and the revisions."""
    benign: str | None = "xstest:safe"
    """Benign prompts run through the same critique-revise process (null: skip)."""
    n_benign: int = Field(16, ge=0)
    """How many benign prompts (each costs 1 + 2R generations)."""


class CaiDataConfig(PofeConfig):
    """The red-team prompts and the helpfulness examples mixed into the SFT set."""

    prompts: str = "advbench"
    """Red-team prompts: a file or advbench, xstest:unsafe, hh-rlhf:harmless (see pofe.data.io)."""
    max_prompts: int | None = Field(32, ge=1)
    """Use at most this many red-team prompts (null: all); a cut is logged and counted in
    the summary's ``input``."""
    helpful: str | None = None
    """Helpfulness SFT examples to mix in: a prompt/response jsonl or hh-rlhf:helpful (null: none)."""
    helpful_ratio: float = Field(0.5, ge=0.0, lt=1.0)
    """Share of the final SFT set that is helpfulness data (0.5 = one helpful example per revision)."""


class CaiTrainConfig(PofeConfig):
    """Chunk shape."""

    batch_size: int = Field(16, ge=1, le=MAX_BATCH_SIZE)
    """Prompts per chunk (one step: revised, written, logged and checkpointed before the next)."""


class CaiReviseConfig(PofeConfig):
    """``pofe cai revise`` (SL-CAI)."""

    model: ModelConfig = ModelConfig()
    """The helpful model to critique and revise with (it also writes the first response); LoRA does not apply."""
    data: CaiDataConfig = CaiDataConfig()
    """Red-team prompts and helpfulness data."""
    constitution: str = "hhh"
    """Shipped constitution name (pofe/constitutions/<name>.yaml) or a path (YAML, or the HF JSON critic/revision format)."""
    principles: list[str] | None = None
    """Critique with these principle ids (default: the constitution's harm principles, ``harm: true``, as in Bai et al.)."""
    rounds: int = Field(1, ge=1, le=4)
    """Critique -> revision rounds per prompt, each with a freshly sampled principle (seed: R = 1 to 4)."""
    few_shot: bool = True
    """Prepend one worked critique/revision exchange (small models follow the format far better with it)."""
    train: CaiTrainConfig = CaiTrainConfig()
    """Prompts per chunk."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=96, temperature=0.7)
    """Initial responses and revisions."""
    critique_sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.7)
    """Critiques."""
    refusal: RefusalTrackConfig = RefusalTrackConfig()
    """Refusal tracking."""
    checkpoint: CheckpointConfig = CheckpointConfig(every=1)
    """Checkpoints for ``--resume`` (every chunk: a crash costs at most one chunk)."""
    log: LogConfig = LogConfig()
    """metrics.jsonl per chunk, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: Seed = 0
    """Seeds sampling and principle draws."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @field_validator("model")
    @classmethod
    def _no_lora(cls, v: ModelConfig) -> ModelConfig:
        if v.lora.enabled:
            raise ValueError("model.lora: pofe cai revise only generates with the model, LoRA settings do not apply")
        return v


# ----------------------------------------------------------------------------- the command

class CaiReviseRecipe(Recipe):
    """chunks of prompts -> one critique_revise per step -> sft.jsonl, preferences.jsonl and refusal rates."""

    command = "cai-revise"
    writes_final = False  # no weights: nothing for run.push_to_hub
    data_parallel = True
    outputs = ("revisions.jsonl",)
    show = (("unchanged", "unchanged", "{:d}"),)

    def __init__(self, cfg: CaiReviseConfig, *, model=None, tokenizer=None, generate_fn=None):
        super().__init__(cfg)
        self.policy, self.tokenizer, self.generate_fn = model, tokenizer, generate_fn
        self.writer = None
        self.traces: list[Trace] = []
        self.benign_traces: list[Trace] = []
        self.sft: list[dict[str, Any]] = []
        self.pairs: list = []

    def load_data(self) -> None:
        """Constitution and prompts (a bad file fails before any run folder exists), cut into chunks
        of (set, seed, prompts): the red-team prompts, then the benign ones. Each chunk's seed
        depends on its index only."""
        cfg = self.cfg
        self.constitution = load_cai_constitution(cfg.constitution)
        self.constitution.critique_pool(cfg.principles)  # no usable critique principle: fail now
        prompts, self.input_info = load_limited(cfg.data.prompts, cfg.data.max_prompts, "max_prompts")
        if not prompts:
            raise DataError(f"cai revise: no prompts in {cfg.data.prompts!r}")
        benign, self.benign_info = [], None
        if cfg.refusal.enabled and cfg.refusal.benign and cfg.refusal.n_benign:
            try:
                benign, self.benign_info = load_limited(cfg.refusal.benign, cfg.refusal.n_benign, "n_benign")
            except FileNotFoundError as e:
                log.warning("refusal tracking: benign prompts unavailable (%s)", e)
        bs = cfg.train.batch_size
        self.chunks = [("red-team", chunk_seed(cfg.seed, i), prompts[s:s + bs]) for i, s in enumerate(range(0, len(prompts), bs))]
        self.chunks += [("benign", chunk_seed(cfg.seed, i, stream=1), benign[s:s + bs]) for i, s in enumerate(range(0, len(benign), bs))]
        self.n_prompts, self.n_benign = len(prompts), len(benign)

    def setup(self, run: RunContext) -> None:
        c = self.constitution
        self.run_dir, self.dp = run.dir, run.dp
        self.total_steps = len(self.chunks)
        run.restore_checkpoint()
        self.resumed_after_chunks = run.start if run.resumed else None
        self.writer = run.writer("revisions.jsonl")  # rank 0 alone writes the run folder
        log.info("cai revise: %d red-team + %d benign prompts, %d round(s), constitution %s (%s), %d/%d chunks done",
                 self.n_prompts, self.n_benign, self.cfg.rounds, c.name, c.version, run.start, len(self.chunks))

    def step(self, step: int) -> dict[str, Any]:
        c = self.constitution
        which, seed, chunk = self.chunks[step - 1]
        traces = self.dp.map(lambda part: self._revise(part, seed), chunk)
        for k, t in enumerate(traces):
            if self.writer is not None:
                self.writer.write({**t.to_dict(), "set": which, "constitution_version": c.version, "chunk": step - 1,
                                   "chunk_complete": k == len(traces) - 1})
        fault_point(f"{step}:before_metrics")  # crash/resume suite: revisions written, metrics row not
        return chunk_metrics(which, traces)

    def _revise(self, prompts: list[str], seed: int) -> list[Trace]:
        """This process's block of a chunk, critiqued and revised under the block's seed."""
        from pofe.runtime.seeds import block_seed

        cfg = self.cfg
        if self.policy is None and self.generate_fn is None:  # loaded on the first chunk: a finished run never loads it
            from pofe.models import load_model

            self.policy, self.tokenizer = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device,
                                                     trust_remote_code=cfg.model.trust_remote_code,
                                                     **cfg.model.load_kwargs())
        return critique_revise(self.policy, self.tokenizer, prompts, self.constitution, seed=block_seed(seed, self.dp.rank),
                               rounds=cfg.rounds, sampling=cfg.sampling, critique_sampling=cfg.critique_sampling,
                               few_shot=cfg.few_shot, principle_ids=cfg.principles, generate_fn=self.generate_fn)

    def save_final(self, out: Path) -> Path | None:
        """sft.jsonl and preferences.jsonl from every revisions.jsonl row (no weights, no ``final/``)."""
        from pofe.jsonl import json_line
        from pofe.runs import atomic_write_text, read_jsonl

        cfg, d = self.cfg, self.run_dir
        rows = read_jsonl(d / "revisions.jsonl") if (d / "revisions.jsonl").exists() else []
        self.traces = [Trace.from_dict(r) for r in rows if r["set"] == "red-team"]
        self.benign_traces = [Trace.from_dict(r) for r in rows if r["set"] == "benign"]
        self.sft = sft_set(self.traces, self.constitution.version, cfg.data.helpful, cfg.data.helpful_ratio, seed=cfg.seed)
        atomic_write_text(d / "sft.jsonl", "".join(json_line(r) + "\n" for r in self.sft))
        self.pairs = preference_pairs(self.traces, self.constitution)
        atomic_write_text(d / "preferences.jsonl", "".join(json_line(p.to_dict()) + "\n" for p in self.pairs))
        return None

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        # rank 0 read revisions.jsonl in save_final: every process returns the same summary
        sets = (self.traces, self.benign_traces, self.sft, self.pairs) if self.dp.main else None
        self.traces, self.benign_traces, self.sft, self.pairs = self.dp.from_main(sets)
        cfg, c, d, sft = self.cfg, self.constitution, self.run_dir, self.sft
        return {
            "constitution": c.name, "constitution_version": c.version,
            "critique_principles": [p.id for p in c.critique_pool(cfg.principles)],
            "prompts": len(self.traces), "input": self.input_info,
            **({"benign_input": self.benign_info} if self.benign_info is not None else {}),
            "rounds": cfg.rounds, "sft_examples": len(sft), "sft_cai": sum(r["source"] == "cai-revision" for r in sft),
            "sft_helpful": sum(r["source"] == "helpful" for r in sft), "preference_pairs": len(self.pairs),
            **revision_stats(self.traces),
            "refusal": refusal_summary(self.traces, self.benign_traces) if cfg.refusal.enabled else None,
            "resumed_after_chunks": self.resumed_after_chunks,
            "files": {"sft": str(d / "sft.jsonl"), "preferences": str(d / "preferences.jsonl"),
                      "revisions": str(d / "revisions.jsonl")},
        }


def run(cfg: CaiReviseConfig, *, resume: str | Path | None = None, model=None, tokenizer=None,
        generate_fn=None) -> dict[str, Any]:
    """Critique/revise chunk by chunk -> sft.jsonl, preferences.jsonl. Returns the summary (also in
    ``summary.json``). ``resume``: a run folder to continue after its last checkpointed chunk
    (``cfg`` is its saved config)."""
    return drive(CaiReviseRecipe(cfg, model=model, tokenizer=tokenizer, generate_fn=generate_fn), resume=resume)
