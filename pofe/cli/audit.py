"""``pofe audit``: validate a judge on human-labelled pairs; pass/fail against thresholds."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, resolve_config
from pofe.cli.helptext import judge_kinds_help


def register(app: typer.Typer) -> None:
    from pofe.evaluation.audit import AuditConfig

    @app.command(help="Validate a judge on human-labelled pairs (pofe JSONL, `pofe annotate` output, HH-RLHF, "
                      "LLMBar): agreement, position "
                      "consistency, first-position win rate, length bias, p histogram, parse failures, contrast "
                      "pairs. Exit status 1 when a threshold check fails; --output writes the report that "
                      "`--require-audit` reads.")
    def audit(
        paths: Optional[list[str]] = typer.Argument(None, metavar="[CALIBRATION]...", help="Calibration files or folders."),
        calibration: Optional[list[str]] = typer.Option(
            None, "--calibration", help="A calibration file or folder, e.g. a `pofe annotate` output (repeatable; "
                                        "the same as giving it as an argument)."),
        judge: Optional[str] = typer.Option(None, "--judge", help=judge_kinds_help()),
        limit: Optional[int] = typer.Option(None, help="Seeded random subset of N items in all (each file gives its share)."),
        contrast_limit: Optional[int] = typer.Option(None, help="Items each contrast kind is built from (50)."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the report JSON here."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        cfg = resolve_config(AuditConfig, config, set_, {
            "data.calibration": [*(paths or []), *(calibration or [])] or None, "judge.kind": judge,
            "data.limit": limit, "contrast_limit": contrast_limit, "output": output}, print_config)
        from pofe.evaluation.audit import audit_from_config, format_audit

        report = audit_from_config(cfg)
        if json_out:
            emit_json(report)
        else:
            typer.echo(format_audit(report))
        raise typer.Exit(0 if report["passed"] else 1)
