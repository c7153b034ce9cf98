"""``pofe judge``: label a file of (prompt, response_a, response_b) rows with any judge.

Writes ``verdicts.jsonl`` (one verdict per row, with the prompt and responses it judged and
its provenance) and ``summary.json`` into a
run folder; ``--json`` prints the summary (n, mean_p, consistency_rate,
first_position_win_rate, parse_failures, cache_hits, cache_misses, judge_tokens, seconds,
model_calls). Pointwise kinds (rubric, expected-score) score ``response_a`` (or a
``response`` column) instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import (
    ConfigOpt,
    JsonOpt,
    PrintConfigOpt,
    SetOpt,
    emit_json,
    resolve_config,
)
from pofe.cli.helptext import judge_kinds_help
from pofe.loops.judge import JudgeCommandConfig, run_judge


def register(app: typer.Typer) -> None:
    @app.command(help="Label prompt/response_a/response_b rows with a judge; writes JSONL verdicts.")
    def judge(
        input: Optional[Path] = typer.Argument(None, help="JSONL (or any datasets-loadable file) of rows to label."),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="Verdicts JSONL (default: in the run folder)."),
        kind: Optional[str] = typer.Option(None, "--judge", help=judge_kinds_help()),
        model: Optional[str] = typer.Option(None, "--model", help="Judge model (default: embedded SmolLM2)."),
        template: Optional[str] = typer.Option(None, "--template", help="Template name or file."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N rows."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the judge cache."),
        skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Skip (and count) malformed input rows."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        extra = {"data.input": str(input) if input else None, "output": str(output) if output else None,
                 "judge.kind": kind, "judge.model": model, "judge.template": template, "data.limit": limit,
                 "judge.cache.enabled": False if no_cache else None,
                 "data.skip_bad_rows": True if skip_bad_rows else None}
        cfg = resolve_config(JudgeCommandConfig, config, set_, extra, print_config)
        summary = run_judge(cfg)
        if json_out:
            emit_json(summary)
        else:
            typer.echo(f"judged {summary['n']} rows in {summary['seconds']} s -> {summary['output']}")
            keys = ("mean_p", "consistency_rate", "first_position_win_rate", "parse_failures", "cache_hits", "cache_misses")
            typer.echo("  " + ", ".join(f"{k}={summary.get(k)}" for k in keys if k in summary))
