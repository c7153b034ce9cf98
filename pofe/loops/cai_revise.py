"""``pofe cai revise``: stage 1 of Constitutional AI (SL-CAI), critique -> revision.

rlaif-constitutional-ai, "Stage 1: critique and revision": for each red-team prompt sample
a response, then R rounds (R = 1..4) in which the same model critiques its latest response
against a harm principle drawn at random from the constitution and rewrites it to address the
critique (:mod:`pofe.generation.critique`). The final revisions paired with their prompts are
SFT data, mixed with helpfulness data "so the model does not drift toward refusal"; ``pofe
sft`` trains on ``sft.jsonl``. The (final revision > original) pairs are written too, as a
preference set (the alignment-handbook CAI recipe trains DPO on exactly these).

Every intermediate text is kept (``revisions.jsonl``, written chunk by chunk; ``--resume
RUN_DIR`` continues after the last complete chunk), and refusals are counted on the red-team
prompts and on a benign set run through the same critique-revise process (``summary.json:
refusal``): a constitution that only teaches refusal shows up as the benign rate climbing
with the harmful one (seed, "Over-refusal or over-compliance").

Readable top to bottom: setup -> loop -> save. The logic lives in
:func:`~pofe.generation.critique.critique_revise`, :func:`mix_sft` and
:func:`preference_pairs`, which the tests call directly.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pofe.config import PofeConfig
from pofe.generation import SamplingConfig
from pofe.generation.critique import CaiConstitution, Trace, critique_revise, load_cai_constitution
from pofe.records import PreferencePair
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, open_run, read_jsonl, write_config
from pofe.training import ModelConfig, fault_point
from pofe.training.tracking import LogConfig, MetricsSink, Progress
from pofe.data.io import json_line

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


class CaiReviseConfig(PofeConfig):
    """``pofe cai revise`` (SL-CAI)."""

    model: ModelConfig = ModelConfig()
    """The helpful model to critique and revise with (it also writes the first response); LoRA does not apply."""
    prompts: str = "advbench"
    """Red-team prompts: a file or advbench, xstest:unsafe, hh-rlhf:harmless (see pofe.data.io)."""
    max_prompts: int | None = Field(32, ge=1)
    """Use at most this many red-team prompts (null: all); a cut is logged and counted in
    ``summary.json: input``."""
    constitution: str = "hhh"
    """Shipped constitution name (pofe/constitutions/<name>.yaml) or a path (YAML, or the HF JSON critic/revision format)."""
    principles: list[str] | None = None
    """Critique with these principle ids (default: the constitution's harm principles, ``harm: true``, as in Bai et al.)."""
    rounds: int = Field(1, ge=1, le=4)
    """Critique -> revision rounds per prompt, each with a freshly sampled principle (seed: R = 1 to 4)."""
    few_shot: bool = True
    """Prepend one worked critique/revision exchange (small models follow the format far better with it)."""
    batch_size: int = Field(16, ge=1)
    """Prompts per chunk: each chunk is revised, written to revisions.jsonl and logged before the next."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=96, temperature=0.7)
    """Initial responses and revisions."""
    critique_sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.7)
    """Critiques."""
    helpful_data: str | None = None
    """Helpfulness SFT examples to mix in: a prompt/response jsonl or hh-rlhf:helpful (null: none)."""
    helpful_ratio: float = Field(0.5, ge=0.0, lt=1.0)
    """Share of the final SFT set that is helpfulness data (0.5 = one helpful example per revision)."""
    refusal: RefusalTrackConfig = RefusalTrackConfig()
    """Refusal tracking."""
    log: LogConfig = LogConfig()
    """metrics.jsonl per chunk, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: int = 0
    """Seeds sampling and principle draws."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @field_validator("model")
    @classmethod
    def _no_lora(cls, v: ModelConfig) -> ModelConfig:
        if v.lora.enabled:
            raise ValueError("model.lora: pofe cai revise only generates with the model, LoRA settings do not apply")
        return v


# ----------------------------------------------------------------------------- datasets from traces

def mix_sft(cai_rows: list[dict[str, Any]], helpful_rows: list[dict[str, Any]], ratio: float, *, seed: int = 0) -> list[dict[str, Any]]:
    """CAI rows plus helpfulness rows so that helpful / total = ``ratio`` (as close as the
    available helpful rows allow), shuffled with ``seed``.

    n_helpful = round(n_cai * ratio / (1 - ratio)); e.g. 30 revisions at ratio 0.25 -> 10.
    """
    if not 0 <= ratio < 1:
        raise ValueError(f"helpful ratio must be in [0, 1), got {ratio}")
    want = round(len(cai_rows) * ratio / (1 - ratio)) if ratio > 0 else 0
    rng = random.Random(seed)
    helpful = list(helpful_rows)
    rng.shuffle(helpful)
    rows = list(cai_rows) + helpful[:want]
    rng.shuffle(rows)
    return rows


def preference_pairs(traces: Sequence[Trace], constitution: CaiConstitution) -> list[PreferencePair]:
    """(final revision > original) pairs, p = 1; identical texts carry no preference and are skipped."""
    out = []
    for t in traces:
        if t.final.strip() and t.final.strip() != t.original.strip():
            out.append(PreferencePair(prompt=t.prompt, chosen=t.final, rejected=t.original, p=1.0, provenance={
                "source": "cai-revise", "constitution": constitution.name, "constitution_version": constitution.version,
                "principle_ids": [r["principle_id"] for r in t.rounds], "rounds": len(t.rounds)}))
    return out


def refusal_summary(harmful: Sequence[Trace], benign: Sequence[Trace]) -> dict[str, Any]:
    """Refusal rates of the original responses and the final revisions, harmful and benign."""
    from pofe.evaluation.refusal import refusal_report

    def rep(which: str) -> dict[str, Any]:
        pick = (lambda t: t.original) if which == "original" else (lambda t: t.final)
        r = refusal_report(([t.prompt for t in benign], [pick(t) for t in benign]) if benign else None,
                           ([t.prompt for t in harmful], [pick(t) for t in harmful]) if harmful else None)
        return {k: r[k] for k in ("over_refusal_rate", "harmful_refusal_rate", "gap")}

    return {"original": rep("original"), "revised": rep("final"), "detector": "patterns"}


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def chunk_metrics(step: int, which: str, traces: Sequence[Trace]) -> dict[str, Any]:
    """One metrics.jsonl row for a revised chunk, from its traces alone (so a resume can write
    the row of a chunk whose revisions were written before a crash took its metrics row)."""
    return {"step": step, "set": which, "prompts": len(traces),
            "unchanged": sum(t.final.strip() == t.original.strip() for t in traces),
            "empty_revisions": sum(t.empty_revisions for t in traces),
            "chars_original": _mean([len(t.original) for t in traces]),
            "chars_revised": _mean([len(t.final) for t in traces])}


def load_limited(source: str, limit: int | None, key: str) -> tuple[list[str], dict[str, Any]]:
    """The first ``limit`` prompts of ``source`` and how many the limit left out (logged when
    it cut any: a default cap must never drop prompts unseen)."""
    from pofe.data.prompts import load_prompt_texts as load_prompts

    given = load_prompts(source)
    used = given[:limit]
    info = {"source": str(source), "available": len(given), "used": len(used), "limited": len(given) - len(used),
            key: limit}
    if info["limited"]:
        log.warning("cai revise: %s=%s: using the first %d of %d prompts of %s; %d of %d left out",
                    key, limit, len(used), len(given), source, info["limited"], len(given))
    return used, info


# ----------------------------------------------------------------------------- the command

def run(cfg: CaiReviseConfig, *, resume: str | Path | None = None, model=None, tokenizer=None,
        generate_fn=None) -> dict[str, Any]:
    """Setup -> critique/revise loop -> save. Returns the summary (also in ``summary.json``).

    ``resume``: a run folder to continue after its last complete chunk (``cfg`` is its saved config)."""
    from pofe.data.sft import load_examples
    from pofe.loops.label import repair_metrics
    from pofe.training import seed_everything

    # --- setup: constitution and prompts first (a bad file fails before any run folder exists)
    constitution = load_cai_constitution(cfg.constitution)
    constitution.critique_pool(cfg.principles)  # no usable critique principle: fail now
    prompts, input_info = load_limited(cfg.prompts, cfg.max_prompts, "max_prompts")
    if not prompts:
        raise ValueError(f"no prompts in {cfg.prompts!r}")
    benign: list[str] = []
    benign_info = None
    if cfg.refusal.enabled and cfg.refusal.benign and cfg.refusal.n_benign:
        try:
            benign, benign_info = load_limited(cfg.refusal.benign, cfg.refusal.n_benign, "n_benign")
        except FileNotFoundError as e:
            log.warning("refusal tracking: benign prompts unavailable (%s)", e)
    run_dir = open_run(cfg.run, "cai-revise", resume=resume)
    if resume is None:
        write_config(run_dir, cfg)
    seed_everything(cfg.seed)
    # Chunks of (set, seed, prompts): the red-team prompts, then the benign ones. Each chunk's
    # seed depends on its index only, so a resumed run revises the remaining chunks exactly
    # as the interrupted one would have.
    chunks = [("red-team", cfg.seed + 7919 * i, prompts[s:s + cfg.batch_size])
              for i, s in enumerate(range(0, len(prompts), cfg.batch_size))]
    chunks += [("benign", cfg.seed + 1 + 7919 * i, benign[s:s + cfg.batch_size])
               for i, s in enumerate(range(0, len(benign), cfg.batch_size))]
    rows = read_jsonl(run_dir / "revisions.jsonl") if resume is not None and (run_dir / "revisions.jsonl").exists() else []
    done_chunks = len({r["chunk"] for r in rows if r.get("chunk_complete")})
    rows = [r for r in rows if r["chunk"] < done_chunks]  # a partly written chunk is redone
    atomic_write_text(run_dir / "revisions.jsonl", "".join(json_line(r) + "\n" for r in rows))
    # Every complete chunk gets its metrics row exactly once: a kill between a chunk's last
    # revision and its metrics row would otherwise lose that row for good.
    repair_metrics(run_dir / "metrics.jsonl",
                   [(i + 1, (chunks[i][0], [Trace.from_dict(r) for r in rows if r["chunk"] == i])) for i in range(done_chunks)],
                   lambda step, data: chunk_metrics(step, *data))
    if model is None and generate_fn is None and done_chunks < len(chunks):
        from pofe.models import load_model

        model, tokenizer = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device, trust_remote_code=cfg.model.trust_remote_code)
    log.info("cai revise: %d red-team + %d benign prompts, %d round(s), constitution %s (%s), %d/%d chunks done",
             len(prompts), len(benign), cfg.rounds, constitution.name, constitution.version, done_chunks, len(chunks))

    # --- loop: one chunk of prompts at a time, written as it completes
    t0 = time.perf_counter()
    kw = dict(rounds=cfg.rounds, sampling=cfg.sampling, critique_sampling=cfg.critique_sampling, few_shot=cfg.few_shot,
              principle_ids=cfg.principles, generate_fn=generate_fn)
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json"))
    bar = Progress(cfg.log, total=len(chunks), initial=done_chunks, desc="pofe cai revise",
                   show=(("unchanged", "unchanged", "{:d}"),))
    try:
        with JsonlWriter(run_dir / "revisions.jsonl") as w:
            for i in range(done_chunks, len(chunks)):
                which, seed, chunk = chunks[i]
                traces = critique_revise(model, tokenizer, chunk, constitution, seed=seed, **kw)
                for k, t in enumerate(traces):
                    row = {**t.to_dict(), "set": which, "constitution_version": constitution.version, "chunk": i,
                           "chunk_complete": k == len(traces) - 1}
                    w.write(row)
                    rows.append(row)
                m = chunk_metrics(i + 1, which, traces)
                fault_point(f"{i + 1}:before_metrics")  # crash/resume suite: revisions written, metrics row not
                sink.write(m)
                bar.update(m)
    finally:
        bar.close()
        sink.close()
    seconds = time.perf_counter() - t0
    traces = [Trace.from_dict(r) for r in rows if r["set"] == "red-team"]
    benign_traces = [Trace.from_dict(r) for r in rows if r["set"] == "benign"]

    # --- save
    cai_rows = [{"prompt": t.prompt, "response": t.final, "source": "cai-revision",
                 "constitution_version": constitution.version} for t in traces if t.final.strip()]
    helpful_rows = []
    if cfg.helpful_data and cfg.helpful_ratio > 0:
        want = round(len(cai_rows) * cfg.helpful_ratio / (1 - cfg.helpful_ratio))
        helpful_rows = [{"prompt": e.prompt if isinstance(e.prompt, str) else list(e.prompt), "response": e.response,
                         "source": "helpful"} for e in load_examples(cfg.helpful_data, limit=max(4 * want, want))]
    sft = mix_sft(cai_rows, helpful_rows, cfg.helpful_ratio if helpful_rows else 0.0, seed=cfg.seed)
    atomic_write_text(run_dir / "sft.jsonl", "".join(json_line(r) + "\n" for r in sft))
    pairs = preference_pairs(traces, constitution)
    atomic_write_text(run_dir / "preferences.jsonl", "".join(json_line(p.to_dict()) + "\n" for p in pairs))
    principle_counts: dict[str, int] = {}
    for t in traces:
        for r in t.rounds:
            principle_counts[r["principle_id"]] = principle_counts.get(r["principle_id"], 0) + 1
    summary = {
        "run_dir": str(run_dir),
        "constitution": constitution.name,
        "constitution_version": constitution.version,
        "critique_principles": [p.id for p in constitution.critique_pool(cfg.principles)],
        "prompts": len(traces),
        "input": input_info,
        **({"benign_input": benign_info} if benign_info is not None else {}),
        "rounds": cfg.rounds,
        "sft_examples": len(sft),
        "sft_cai": sum(r["source"] == "cai-revision" for r in sft),
        "sft_helpful": sum(r["source"] == "helpful" for r in sft),
        "preference_pairs": len(pairs),
        "unchanged": sum(t.final.strip() == t.original.strip() for t in traces),
        "empty_revisions": sum(t.empty_revisions for t in traces),
        "principle_counts": principle_counts,
        "mean_chars": {"original": _mean([len(t.original) for t in traces]), "revised": _mean([len(t.final) for t in traces])},
        "refusal": refusal_summary(traces, benign_traces) if cfg.refusal.enabled else None,
        "resumed_after_chunks": done_chunks if resume is not None else None,
        "seconds": round(seconds, 2),
        "files": {"sft": str(run_dir / "sft.jsonl"), "preferences": str(run_dir / "preferences.jsonl"),
                  "revisions": str(run_dir / "revisions.jsonl")},
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
