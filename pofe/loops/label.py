"""``pofe label``: stage 2 of Constitutional AI (RL-CAI), AI preference labels.

rlaif-constitutional-ai, "Stage 2: AI preference labels": sample two responses per prompt
from the (SL-CAI) policy at a temperature around 1.0, show both to a feedback model under one
principle sampled from the constitution, read P("A") vs P("B") in *both orders* and average
(``p = ½(p₁₂ + 1 − p₂₁)``), optionally with chain-of-thought and the clamp to [0.4, 0.6].
The judge (``pofe.judges``, kind ``llm`` with a constitution) does the reading, the
principle sampling and the caching; this loop samples the pairs, calls it in batches and
writes:

* ``pairs.jsonl`` -- the sampled (prompt, response_a, response_b) triples, written before any
  judging, so ``--resume`` labels exactly the same pairs;
* ``labels.jsonl`` -- one row per pair: prompt, both responses, p, per-order p_ab / p_ba,
  consistency, parse status, principle id, constitution version, template id and hash,
  judge id, whether it came from the cache, ``text_fallback`` (the verdict was read from
  generated text because the endpoint gave no log-probabilities: a hard 0/1 label, not a
  probability) and ``dropped`` (why the pair is not in preferences.jsonl, or null);
* ``preferences.jsonl`` -- :class:`~pofe.records.PreferencePair` rows oriented so the
  judge's favourite is ``chosen`` and ``p = max(p, 1 − p)`` (what ``pofe rm`` and DPO read),
  after the label filter (``filter:``, issue 13: order-inconsistent pairs and pairs with
  |p − ½| under a margin can be dropped; every drop is counted in the summary);
* ``input.json`` -- how many of the input's pairs or prompts were labelled (``max_prompts``
  may cut them: the cut is logged and copied into the summary's ``input``);
* ``metrics.jsonl`` -- one row per judged batch (``log:``; a progress bar shows the batches);
  a resume writes the row of a batch whose labels were written but whose metrics row was not;
* ``summary.json`` -- the judge-fitness numbers the seed asks for before any reward model
  is trained ("Validate the judge before you validate anything else"): position
  consistency, first-position win rate, correlation of p with the length difference, the
  histogram of p, throughput (labels/s) and cache hits/misses.

Re-running on the same inputs is free: every ordered read is in the judge's SQLite cache;
``--resume RUN_DIR`` continues an interrupted run after its last complete labels row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pofe.config import PofeConfig
from pofe.generation import SamplingConfig
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.records import Judgment, PreferencePair
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, open_run, read_jsonl, write_config
from pofe.training import ModelConfig, fault_point
from pofe.training.tracking import LogConfig, MetricsSink, Progress
from pofe.data.io import json_line

log = logging.getLogger(__name__)

DEFAULT_SAMPLED_PROMPTS = 32
"""Prompts sampled from when ``max_prompts`` is null (a given pair file is labelled whole)."""


class LabelFilterConfig(PofeConfig):
    """Which labelled pairs go to preferences.jsonl (issue 13, label hygiene). All pairs stay in
    labels.jsonl with the reason they were dropped; the summary counts every drop.

    Default: keep every parsed pair. Soft-label consumers (``pofe rm``, soft DPO) already give
    a near-½ pair a near-zero target margin, so dropping it would only remove the information
    "no clear preference"; hard-label consumers should set ``min_margin`` and/or
    ``drop_inconsistent`` (seed: "drop pairs where the two orders disagree ... if you need
    clean labels")."""

    drop_inconsistent: bool = False
    """Drop pairs whose two orders prefer different responses (position bias decided the label)."""
    min_margin: float = Field(0.0, ge=0.0, le=0.5)
    """Drop pairs with |p − ½| below this (0 keeps all; 0.1 keeps p ≤ 0.4 or p ≥ 0.6)."""


class LabelConfig(PofeConfig):
    """``pofe label`` (RL-CAI preference labels)."""

    model: ModelConfig = ModelConfig()
    """Model that samples the two responses (the SL-CAI model in the CAI pipeline); LoRA does not apply."""
    prompts: str = "hh-rlhf:harmless"
    """Prompt source: a file or advbench, xstest[:safe|:unsafe], hh-rlhf:harmless, hh-rlhf:helpful."""
    max_prompts: int | None = Field(None, ge=1)
    """Use at most this many prompts (or pairs with ``pairs``). null: every pair of ``pairs``,
    and the first :data:`DEFAULT_SAMPLED_PROMPTS` (32) sampled prompts -- sampling is the
    costly part, so set a number to sample more. A cut is logged and counted in
    ``summary.json: input``."""
    pairs: str | None = None
    """Label existing pairs instead of sampling: a jsonl with prompt, response_a, response_b
    (or prompt, chosen, rejected)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=1.0)
    """Sampling of the two responses. Seed: "temperature around 1.0" so the two samples differ."""
    judge: JudgeConfig = LLMJudgeConfig(template="constitution", constitution="hhh")
    """The feedback model (any pairwise judge); default: RL-CAI's multiple-choice constitution
    template under one sampled principle of the shipped harmless + helpful + honest constitution."""
    batch_size: int = Field(16, ge=1)
    """Pairs per judge call."""
    filter: LabelFilterConfig = LabelFilterConfig()
    """Label hygiene: which labelled pairs go to preferences.jsonl."""
    calibration: str | None = None
    """An audit report (``pofe audit`` output) whose fitted calibration map (temperature or
    isotonic) is applied to every label; ``p_raw`` keeps the judge's own p (the alternative to
    the CoT clamp, rlaif-constitutional-ai "Choices that matter")."""
    log: LogConfig = LogConfig()
    """metrics.jsonl per judged batch, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: int = 0
    """Seeds the sampling of the pairs."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""

    @field_validator("model")
    @classmethod
    def _no_lora(cls, v: ModelConfig) -> ModelConfig:
        if v.lora.enabled:
            raise ValueError("model.lora: pofe label only samples from the model, LoRA settings do not apply")
        return v


# ----------------------------------------------------------------------------- core logic

def label_row(prompt: str, a: str, b: str, j: Judgment) -> dict[str, Any]:
    """One labels.jsonl row (everything needed to trace the label back to its annotation)."""
    return {
        "prompt": prompt, "response_a": a, "response_b": b,
        "p": j.p, "p_ab": j.p_ab, "p_ba": j.p_ba, "consistent": j.consistent, "parse_ok": j.parse_ok,
        "principle_id": j.principle_id, "constitution_version": j.constitution_version,
        "template_id": j.template_id, "template_hash": j.template_hash, "judge_id": j.judge_id,
        "cached": j.cached, "text_fallback": j.hard_label_fallback,
        "raw": list(j.raw),  # per-order generated text (the reasoning, with chain-of-thought)
        "extra": {k: v for k, v in (j.extra or {}).items() if isinstance(v, (str, int, float, bool, list, type(None)))},
    }


def calibrated(p: float | None, calib: dict[str, Any]) -> dict[str, Any]:
    """The row fields of a calibrated label: ``p`` mapped by the audit's fitted map, the
    judge's own ``p_raw``, and where the map came from (unparsed stays unparsed)."""
    from pofe.evaluation.calibrate import apply_calibration

    return {"p": apply_calibration(p, calib), "p_raw": p,
            "calibration": {k: calib.get(k) for k in ("method", "source", "calibration_sha256")}}


def to_preference(row: dict[str, Any]) -> PreferencePair | None:
    """Orient a labelled pair so ``chosen`` is the judge's favourite and ``p = max(p, 1 − p)``.

    Soft losses do not care about orientation (BCE(Δ, p) = BCE(−Δ, 1 − p)); hard-label
    consumers (accuracy, DPO with p = 1) then read the judge's verdict directly.
    Unparsed rows (p is None) give no pair: a judge never invents a label.
    """
    p = row["p"]
    if p is None:
        return None
    a, b = row["response_a"], row["response_b"]
    chosen, rejected, q = (a, b, p) if p >= 0.5 else (b, a, 1.0 - p)
    prov = {k: row.get(k) for k in ("judge_id", "principle_id", "constitution_version", "template_id", "template_hash",
                                    "p_ab", "p_ba", "consistent", "text_fallback")}
    prov["source"] = "pofe-label"
    prov["swapped"] = p < 0.5
    return PreferencePair(prompt=row["prompt"], chosen=chosen, rejected=rejected, p=float(q), provenance=prov)


def drop_reason(row: dict[str, Any], filt: LabelFilterConfig) -> str | None:
    """Why a labelled row stays out of preferences.jsonl: ``unparsed`` (no label: never
    invented), ``inconsistent`` (the two orders disagree, with ``filter.drop_inconsistent``)
    or ``margin`` (|p − ½| < ``filter.min_margin``); None keeps it."""
    if row["p"] is None:
        return "unparsed"
    if filt.drop_inconsistent and row["consistent"] is False:
        return "inconsistent"
    if round(abs(row["p"] - 0.5), 9) < filt.min_margin:  # rounded: 0.5 - 0.4 is 0.0999... in floats
        return "margin"
    return None


def label_stats(rows: Sequence[dict[str, Any]], *, bins: int = 10) -> dict[str, Any]:
    """Judge-fitness statistics over labelled rows (seed, "Validate the judge ...").

    * consistency_rate: share of both-order-parsed pairs whose two orders agree;
    * first_position_win_rate: mean over pairs of ½(p_ab + 1 − p_ba) = P(first-shown wins),
      0.5 for a judge without position bias;
    * length_correlation: Pearson r between p − ½ and len(A) − len(B) in characters
      (positive = longer wins);
    * p_histogram: counts of p in ``bins`` equal bins over [0, 1] (piled at 0 and 1 =
      overconfident labels, seed "Overconfident labels"); mean |p − ½| as one number.
    """
    from pofe.evaluation.stats import pearson

    parsed = [r for r in rows if r["p"] is not None]
    both = [r for r in parsed if r["p_ab"] is not None and r["p_ba"] is not None]
    hist = [0] * bins
    for r in parsed:
        hist[min(int(r["p"] * bins), bins - 1)] += 1
    cons = [r["consistent"] for r in both if r["consistent"] is not None]
    principles: dict[str, int] = {}
    for r in parsed:
        k = str(r.get("principle_id"))
        principles[k] = principles.get(k, 0) + 1
    return {
        "pairs": len(rows),
        "parsed": len(parsed),
        "parse_failures": len(rows) - len(parsed),
        "consistency_rate": sum(cons) / len(cons) if cons else None,
        "first_position_win_rate": (sum(0.5 * (r["p_ab"] + 1 - r["p_ba"]) for r in both) / len(both)) if both else None,
        "length_correlation": pearson([r["p"] - 0.5 for r in parsed],
                                      [len(r["response_a"]) - len(r["response_b"]) for r in parsed]) if len(parsed) > 2 else None,
        "mean_p": sum(r["p"] for r in parsed) / len(parsed) if parsed else None,
        "mean_confidence": sum(abs(r["p"] - 0.5) for r in parsed) / len(parsed) if parsed else None,
        "p_histogram": {"edges": [round(i / bins, 3) for i in range(bins + 1)], "counts": hist},
        "principle_counts": principles,
    }


def sample_pairs(model, tokenizer, prompts: Sequence[str], sampling: SamplingConfig, seed: int) -> list[tuple[str, str, str]]:
    """Two samples per prompt (one ``generate`` call with n=2 per batch, KV cache shared)."""
    from pofe.generation import generate

    outs = generate(model, tokenizer, list(prompts), n=2, sampling=sampling, seed=seed)
    return [(x, g[0].text, g[1].text) for x, g in zip(prompts, outs)]


def read_pairs(path: str | Path) -> list[tuple[str, str, str]]:
    """Pairs to label, read strictly by the data layer (a bad row anywhere is a located error)."""
    from pofe.data.preferences import load_unlabelled_pairs

    return load_unlabelled_pairs(path)


def cache_counts(judgments: Sequence[Judgment], judge_summary: dict[str, Any]) -> dict[str, Any]:
    """Cache hits/misses of this run: ordered reads (from the shared Judgment summary, which
    reads each judgment's per-order counts) and whole judgments served from the cache."""
    return {"judgments": len(judgments), "judgments_cached": sum(bool(j.cached) for j in judgments),
            "hits": judge_summary.get("cache_hits", 0), "misses": judge_summary.get("cache_misses", 0),
            "hit_rate": judge_summary.get("cache_hit_rate")}


# ----------------------------------------------------------------------------- the command

INPUT_FILE = "input.json"


def record_input(run_dir: Path, source: str, available: int, used: int, max_prompts: int | None, what: str) -> dict:
    """How much of the input the run labels (``summary.json: input``), saved beside
    ``pairs.jsonl`` so a resumed run reports the same counts; a cut is logged."""
    info = {"source": str(source), "available": available, "used": used, "limited": available - used,
            "max_prompts": max_prompts}
    if available > used:
        why = f"max_prompts={max_prompts}" if max_prompts else f"max_prompts=null samples {DEFAULT_SAMPLED_PROMPTS}"
        log.warning("label: %s: labelling the first %d %s of %s; %d of %d left out (set max_prompts to change it)",
                    why, used, what, source, available - used, available)
    atomic_write_text(run_dir / INPUT_FILE, json.dumps(info, indent=2) + "\n")
    return info


def read_input(run_dir: Path) -> dict | None:
    path = run_dir / INPUT_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def batch_metrics(step: int, batch_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One metrics.jsonl row for a judged batch, from its labels rows alone (so a resume can
    write the row of a batch whose rows were written before a crash took its metrics row)."""
    st = label_stats(batch_rows)
    return {"step": step, "pairs": len(batch_rows), "parsed": st["parsed"], "mean_p": st["mean_p"],
            "consistency_rate": st["consistency_rate"], "dropped": sum(r["dropped"] is not None for r in batch_rows),
            "text_fallback": sum(bool(r["text_fallback"]) for r in batch_rows)}


def repair_metrics(path: Path, batches: Sequence[tuple[int, Any]], make_row) -> list[int]:
    """Make ``path`` hold exactly one metrics row per completed batch, in step order:
    ``batches`` are ``(step, data)`` of the batches whose rows are all written; rows of later
    steps go (they are redone), a repeated step keeps its first row, and a missing step's row
    is rebuilt with ``make_row(step, data)``. Returns the steps rebuilt."""
    from pofe.runs import read_jsonl

    old = read_jsonl(path) if path.exists() else []
    want = dict(batches)
    kept: dict[int, dict[str, Any]] = {}
    for r in old:
        step = int(r.get("step", 0))
        if step in want and step not in kept:
            kept[step] = r
    rebuilt = [s for s in want if s not in kept]
    for s in rebuilt:
        kept[s] = make_row(s, want[s])
    rows = [kept[s] for s in sorted(kept)]
    if rows != old or (path.exists() and path.read_bytes()[-1:] not in (b"\n", b"")):
        atomic_write_text(path, "".join(json_line(r) + "\n" for r in rows))
    if rebuilt:
        log.info("%s: wrote the metrics row of step(s) %s, whose rows were written before the run stopped",
                 path, ", ".join(map(str, rebuilt)))
    return rebuilt


def prepare_pairs(cfg: LabelConfig, run_dir: Path, *, policy=None, tokenizer=None) -> list[tuple[str, str, str]]:
    """The pairs to label, saved to ``pairs.jsonl`` once (a resumed run reads them back instead
    of sampling again). Identical samples carry no preference (oat masks them out too): they
    are kept in pairs.jsonl and skipped by the loop."""
    saved = run_dir / "pairs.jsonl"
    if saved.exists():
        return read_pairs(saved)
    if cfg.pairs:
        given = read_pairs(cfg.pairs)
        pairs = given[: cfg.max_prompts]
        record_input(run_dir, cfg.pairs, len(given), len(pairs), cfg.max_prompts, "pairs")
    else:
        from pofe.data.prompts import load_prompt_texts as load_prompts

        given = load_prompts(cfg.prompts)
        prompts = given[: cfg.max_prompts or DEFAULT_SAMPLED_PROMPTS]
        record_input(run_dir, cfg.prompts, len(given), len(prompts), cfg.max_prompts, "prompts")
        if policy is None:
            from pofe.models import load_model

            policy, tokenizer = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device, trust_remote_code=cfg.model.trust_remote_code)
        pairs = sample_pairs(policy, tokenizer, prompts, cfg.sampling, cfg.seed)
    atomic_write_text(saved, "".join(json_line({"prompt": x, "response_a": a, "response_b": b}) + "\n"
                                     for x, a, b in pairs))
    return pairs


def run(cfg: LabelConfig, *, resume: str | Path | None = None, policy=None, tokenizer=None, judge=None) -> dict[str, Any]:
    """Setup -> sample + label loop -> save. Returns the summary (also ``summary.json``).

    ``resume``: a run folder to continue after its last complete labels row (``cfg`` is its saved config)."""
    from pofe.judges.registry import build_judge
    from pofe.training import seed_everything

    # --- setup
    if cfg.pairs and resume is None:
        read_pairs(cfg.pairs)  # a bad pairs file fails before any run folder exists
    calib = None
    if cfg.calibration:  # a bad report fails before any run folder exists
        from pofe.evaluation.calibrate import load_calibration_map

        calib = load_calibration_map(cfg.calibration)
    run_dir = open_run(cfg.run, "label", resume=resume)
    if resume is None:
        write_config(run_dir, cfg)
    seed_everything(cfg.seed)
    judge = judge if judge is not None else build_judge(cfg.judge)
    t0 = time.perf_counter()
    pairs = prepare_pairs(cfg, run_dir, policy=policy, tokenizer=tokenizer)
    sample_s = time.perf_counter() - t0
    identical = sum(a.strip() == b.strip() for _, a, b in pairs)
    pairs = [(x, a, b) for x, a, b in pairs if a.strip() != b.strip()]
    # Resume: the labels rows already written (a torn last line is dropped) are kept, and
    # preferences.jsonl is rebuilt from them, so no pair is labelled or written twice.
    labels_file = run_dir / "labels.jsonl"
    rows: list[dict[str, Any]] = read_jsonl(labels_file) if resume is not None and labels_file.exists() else []
    # Only whole batches are kept: a batch cut short by a crash is judged again as one batch,
    # so batch boundaries, metrics rows and batched reads are those of an uninterrupted run.
    if len(rows) < len(pairs):
        rows = rows[: len(rows) // cfg.batch_size * cfg.batch_size]
    done = len(rows)
    atomic_write_text(run_dir / "labels.jsonl", "".join(json_line(r) + "\n" for r in rows))
    prefs = [to_preference(r) for r in rows if r.get("dropped") is None]
    atomic_write_text(run_dir / "preferences.jsonl", "".join(json_line(q.to_dict()) + "\n"
                                                             for q in prefs if q is not None))
    n_batches = -(-len(pairs) // cfg.batch_size)
    # Every batch whose rows are all written gets its metrics row exactly once: a kill between
    # a batch's last row and its metrics row would otherwise lose that row for good.
    complete = -(-done // cfg.batch_size) if done >= len(pairs) else done // cfg.batch_size
    repair_metrics(run_dir / "metrics.jsonl",
                   [(k + 1, rows[k * cfg.batch_size:(k + 1) * cfg.batch_size]) for k in range(complete)], batch_metrics)
    log.info("label: %d pairs (%d identical skipped, %d already labelled), judge %s", len(pairs), identical, done,
             getattr(judge, "id", "?"))

    # --- loop: judge in batches, write as we go
    judgments: list[Judgment] = []
    t1 = time.perf_counter()
    sink = MetricsSink(run_dir, cfg.log, config=cfg.model_dump(mode="json"))
    bar = Progress(cfg.log, total=n_batches, initial=complete, desc="pofe label",
                   show=(("mean_p", "p", "{:.2f}"), ("consistency_rate", "consistent", "{:.2f}")))
    try:
        with JsonlWriter(run_dir / "labels.jsonl") as lw, JsonlWriter(run_dir / "preferences.jsonl") as pw:
            for start in range(done, len(pairs), cfg.batch_size):
                chunk = pairs[start : start + cfg.batch_size]
                js = judge.judge([x for x, _, _ in chunk], [a for _, a, _ in chunk], [b for _, _, b in chunk])
                batch_rows = []
                for (x, a, b), j in zip(chunk, js):
                    row = label_row(x, a, b, j)
                    if calib is not None:
                        row.update(calibrated(row["p"], calib))
                    row["dropped"] = drop_reason(row, cfg.filter)
                    batch_rows.append(row)
                    judgments.append(j)
                    lw.write(row)
                    if row["dropped"] is None:
                        pw.write(to_preference(row).to_dict())
                    fault_point(f"{start // cfg.batch_size + 1}:row_{len(batch_rows)}")  # crash/resume suite: mid-batch
                rows += batch_rows
                m = batch_metrics(start // cfg.batch_size + 1, batch_rows)
                fault_point(f"{m['step']}:before_metrics")  # crash/resume suite: rows written, metrics row not
                sink.write(m)
                bar.update(m)
                fault_point(f"{m['step']}:after_batch")  # crash/resume suite: a judged batch written
    finally:
        bar.close()
        sink.close()
    judge_s = time.perf_counter() - t1

    # --- save
    stats = label_stats(rows)
    from pofe.judges.summary import summarize_judgments

    judge_summary = summarize_judgments(judgments, seconds=judge_s)
    dropped = {k: sum(r.get("dropped") == k for r in rows) for k in ("unparsed", "inconsistent", "margin")}
    summary = {
        "run_dir": str(run_dir),
        "judge": getattr(judge, "id", cfg.judge.kind),
        **stats,
        "input": read_input(run_dir),
        "identical_dropped": identical,
        "filter": {**cfg.filter.model_dump(), "dropped": dropped},
        "text_fallback_labels": sum(bool(r.get("text_fallback")) for r in rows),
        "preference_pairs": sum(r.get("dropped") is None for r in rows),
        "resumed_after": done if resume is not None else None,
        "cache": cache_counts(judgments, judge_summary),
        "judge_summary": judge_summary,
        "seconds": {"sample": round(sample_s, 3), "judge": round(judge_s, 3)},
        "labels_per_second": round(len(judgments) / judge_s, 3) if judge_s > 0 else None,
        "files": {"labels": str(run_dir / "labels.jsonl"), "preferences": str(run_dir / "preferences.jsonl"),
                  "pairs": str(run_dir / "pairs.jsonl")},
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary
