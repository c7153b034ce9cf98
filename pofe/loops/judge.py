"""``pofe judge``: label a file of (prompt, response_a, response_b) rows with any judge (its
config and run; the CLI in :mod:`pofe.cli.judge` maps options to keys and prints).

Writes ``verdicts.jsonl`` (one verdict per row, with the prompt and responses it judged and
its provenance) and ``summary.json`` into a run folder. Pointwise kinds (rubric,
expected-score) score ``response_a`` (or a ``response`` column) instead.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from pofe.config import PofeConfig
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, open_run, write_config

log = logging.getLogger(__name__)


class JudgeCommandConfig(PofeConfig):
    input: str | None = None
    """Rows to label: any source the data layer reads (JSONL / JSON / CSV / Parquet / Arrow,
    ``.gz``, a ``save_to_disk`` folder, a named source, a Hub id)."""
    output: str | None = None
    """Verdicts file; default ``<run folder>/verdicts.jsonl``. Never the input file."""
    prompt_field: str = "prompt"
    """A string, or chat messages (judged as their transcript, every turn kept)."""
    a_field: str = "response_a"
    b_field: str = "response_b"
    reference_field: str = "reference"
    """Optional column with a reference answer (reference-overlap judge)."""
    limit: Annotated[int, Field(ge=0)] | None = None
    """Label only the first N rows."""
    chunk_size: Annotated[int, Field(ge=1)] = 64
    """Rows per judge call (verdicts are written after each chunk)."""
    skip_bad_rows: bool = False
    """Skip (and count) malformed input rows instead of stopping at the first one."""
    judge: JudgeConfig = LLMJudgeConfig()
    run: RunConfig = RunConfig()


def load_rows(cfg: JudgeCommandConfig, pointwise: bool) -> list[dict[str, Any]]:
    """The rows to judge as ``{prompt, response_a[, response_b], reference, id}``, read by the
    data layer; a missing field or a bad row is a located error (or, with ``skip_bad_rows``,
    counted)."""
    from pofe.data.io import DataError, read_located
    from pofe.data.prompts import to_prompt

    def to_row(r: dict[str, Any], where: str) -> dict[str, Any]:
        a_field = cfg.a_field if (cfg.a_field in r or not pointwise) else "response"
        need = [a_field] + ([] if pointwise else [cfg.b_field])
        missing = [k for k in [cfg.prompt_field, *need] if k not in r]
        if missing:
            raise DataError(f"{where}: missing field(s) {missing} (fields: {sorted(r)}); "
                            "set --set prompt_field=... / a_field=... / b_field=...")
        for k in need:
            if not isinstance(r[k], str):
                raise DataError(f"{where}: {k!r} must be a string, got {type(r[k]).__name__}")
        row = {"prompt": to_prompt(r, where, cfg.prompt_field).text, "response_a": r[a_field],
               "reference": r.get(cfg.reference_field) if isinstance(r.get(cfg.reference_field), str) else None}
        if not pointwise:
            row["response_b"] = r[cfg.b_field]
        if "id" in r:
            row["id"] = r["id"]
        return row

    rows = read_located(cfg.input, skip_bad_rows=cfg.skip_bad_rows).map(to_row, limit=cfg.limit)
    if not rows and cfg.limit != 0:  # judging nothing is never a silent success
        raise DataError(f"{cfg.input}: no rows to judge")
    return rows


def run_judge(cfg: JudgeCommandConfig, **runtime) -> dict[str, Any]:
    """Setup -> label in chunks -> save. Returns the summary."""
    from pofe.judges import build_judge, summarize_judgments, summarize_scores
    from pofe.judges.base import Capability, has_capability

    if not cfg.input:
        raise ValueError("no input file: pofe judge FILE")
    from pofe.outputs import guard_outputs, judge_inputs

    guard_outputs({"-o": cfg.output}, [cfg.input, *judge_inputs(cfg.judge)])
    pointwise = not has_capability(cfg.judge, Capability.PAIRWISE)
    rows = load_rows(cfg, pointwise)
    run_dir = open_run(cfg.run, "judge")
    write_config(run_dir, cfg)
    out_path = Path(cfg.output) if cfg.output else run_dir / "verdicts.jsonl"
    if out_path.exists():
        out_path.unlink()  # a verdicts file is one run's output, never appended to (never an input: checked above)
    t0 = time.perf_counter()
    judge = build_judge(cfg.judge, **runtime)
    verdicts = []
    try:
        with JsonlWriter(out_path) as w:
            for s in range(0, len(rows), cfg.chunk_size):
                chunk = rows[s:s + cfg.chunk_size]
                prompts = [r["prompt"] for r in chunk]
                refs = [r["reference"] for r in chunk]
                if pointwise:
                    res = judge.score(prompts, [r["response_a"] for r in chunk], references=refs)
                else:
                    res = judge.judge(prompts, [r["response_a"] for r in chunk], [r["response_b"] for r in chunk],
                                      references=refs)
                for k, (r, v) in enumerate(zip(chunk, res)):
                    # The judged texts travel with the verdict, so verdicts.jsonl is itself a
                    # labelled pair file (pofe export, pofe online mode=offline read it).
                    row = {"index": s + k, **({"id": r["id"]} if "id" in r else {}), "prompt": r["prompt"],
                           "response_a": r["response_a"], **({"response_b": r["response_b"]} if not pointwise else {})}
                    w.write({**row, **v.to_dict()})
                verdicts.extend(res)
                log.info("judged %d/%d rows", min(s + len(chunk), len(rows)), len(rows))
    finally:
        calls = getattr(getattr(getattr(judge, "backend", None), "stats", None), "calls", 0)
        close = getattr(judge, "close", None)
        if close:
            close()
    seconds = time.perf_counter() - t0
    summarize = summarize_scores if pointwise else summarize_judgments
    summary = summarize(verdicts, seconds=round(seconds, 3), model_calls=calls)
    summary.update(judge_id=getattr(judge, "id", cfg.judge.kind), kind=cfg.judge.kind,
                   template_hash=getattr(getattr(judge, "template", None), "hash", None),
                   items_per_s=round(len(rows) / seconds, 3) if seconds > 0 else None,
                   run_dir=str(run_dir), output=str(out_path))
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    return summary
