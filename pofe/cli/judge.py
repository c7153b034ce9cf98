"""``pofe judge``: label a file of (prompt, response_a, response_b) rows with any judge.

Writes ``verdicts.jsonl`` (one verdict per row, with provenance) and ``summary.json`` into a
run folder; ``--json`` prints the summary (n, mean_p, consistency_rate,
first_position_win_rate, parse_failures, cache_hits, cache_misses, judge_tokens, seconds,
model_calls). Pointwise kinds (rubric, expected-score) score ``response_a`` (or a
``response`` column) instead.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, fail, resolve_config
from pofe.config import PofeConfig
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.runs import JsonlWriter, RunConfig, atomic_write_text, new_run_dir, read_jsonl, write_config

log = logging.getLogger(__name__)


class JudgeCommandConfig(PofeConfig):
    input: str | None = None
    """JSONL / JSON / CSV / Parquet file (anything ``datasets`` can load)."""
    output: str | None = None
    """Verdicts file; default ``<run folder>/verdicts.jsonl``."""
    prompt_field: str = "prompt"
    a_field: str = "response_a"
    b_field: str = "response_b"
    reference_field: str = "reference"
    """Optional column with a reference answer (reference-overlap judge)."""
    limit: int | None = None
    """Label only the first N rows."""
    chunk_size: int = 64
    """Rows per judge call (verdicts are written after each chunk)."""
    judge: JudgeConfig = LLMJudgeConfig()
    run: RunConfig = RunConfig()


def load_rows(path: str) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"input file not found: {p}")
    if p.suffix == ".jsonl":
        return read_jsonl(p)
    if p.suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, list):
            return data
    from datasets import load_dataset

    fmt = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".json": "json", ".gz": "json"}.get(p.suffix)
    if fmt is None:
        raise ValueError(f"cannot read {p}: use .jsonl, .json, .csv or .parquet")
    kw = {"delimiter": "\t"} if p.suffix == ".tsv" else {}
    return list(load_dataset(fmt, data_files=str(p), split="train", **kw))


def run_judge(cfg: JudgeCommandConfig, **runtime) -> dict[str, Any]:
    """Setup -> label in chunks -> save. Returns the summary."""
    from pofe.judges import build_judge, summarize_judgments, summarize_scores
    from pofe.judges.base import Capability, has_capability

    if not cfg.input:
        raise ValueError("no input file: pofe judge FILE")
    rows = load_rows(cfg.input)
    if cfg.limit is not None:
        rows = rows[: cfg.limit]
    pointwise = not has_capability(cfg.judge, Capability.PAIRWISE)
    need = [cfg.prompt_field] + ([] if pointwise else [cfg.a_field, cfg.b_field])
    for i, r in enumerate(rows):
        missing = [k for k in need if k not in r]
        if pointwise and cfg.a_field not in r and "response" not in r:
            missing.append(f"{cfg.a_field} (or response)")
        if missing:
            raise ValueError(f"{cfg.input}: row {i + 1} lacks {missing}; set --set prompt_field=... etc.")
    run_dir = new_run_dir(cfg.run, "judge")
    write_config(run_dir, cfg)
    out_path = Path(cfg.output) if cfg.output else run_dir / "verdicts.jsonl"
    if out_path.exists():
        out_path.unlink()  # a verdicts file is one run's output, never appended to
    t0 = time.perf_counter()
    judge = build_judge(cfg.judge, **runtime)
    verdicts = []
    try:
        with JsonlWriter(out_path) as w:
            for s in range(0, len(rows), max(1, cfg.chunk_size)):
                chunk = rows[s:s + cfg.chunk_size]
                prompts = [str(r[cfg.prompt_field]) for r in chunk]
                refs = [r.get(cfg.reference_field) for r in chunk]
                if pointwise:
                    ys = [str(r.get(cfg.a_field, r.get("response"))) for r in chunk]
                    res = judge.score(prompts, ys, references=refs)
                else:
                    res = judge.judge(prompts, [str(r[cfg.a_field]) for r in chunk], [str(r[cfg.b_field]) for r in chunk],
                                      references=refs)
                for k, (r, v) in enumerate(zip(chunk, res)):
                    row = {"index": s + k}
                    if "id" in r:
                        row["id"] = r["id"]
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


def register(app: typer.Typer) -> None:
    @app.command(help="Label prompt/response_a/response_b rows with a judge; writes JSONL verdicts.")
    def judge(
        input: Optional[Path] = typer.Argument(None, help="JSONL (or any datasets-loadable file) of rows to label."),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="Verdicts JSONL (default: in the run folder)."),
        kind: Optional[str] = typer.Option(None, "--kind", help="Judge kind: llm, llamacpp, openai, rubric, expected-score, length, ..."),
        model: Optional[str] = typer.Option(None, "--model", help="Judge model (default: embedded SmolLM2)."),
        template: Optional[str] = typer.Option(None, "--template", help="Template name or file."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N rows."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the judge cache."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        extra = {"input": str(input) if input else None, "output": str(output) if output else None, "judge.kind": kind,
                 "judge.model": model, "judge.template": template, "limit": limit,
                 "judge.cache.enabled": False if no_cache else None}
        cfg = resolve_config(JudgeCommandConfig, config, set_, extra, print_config)
        from pofe.judges.base import EndpointError

        try:
            summary = run_judge(cfg)
        except EndpointError as e:  # unreachable judge: infrastructure failure, not bad input
            fail(str(e), code=1)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        if json_out:
            emit_json(summary)
        else:
            typer.echo(f"judged {summary['n']} rows in {summary['seconds']} s -> {summary['output']}")
            keys = ("mean_p", "consistency_rate", "first_position_win_rate", "parse_failures", "cache_hits", "cache_misses")
            typer.echo("  " + ", ".join(f"{k}={summary.get(k)}" for k in keys if k in summary))
