"""``pofe export``: a run's labelled pairs as TRL / alpaca_eval / ``datasets`` data.

The library code is :mod:`pofe.data.export`."""

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
    fail,
    resolve_config,
)
from pofe.loops.export import ExportConfig


def register(app: typer.Typer) -> None:
    @app.command(help="Export a run's labelled pairs for TRL (DPOTrainer/RewardTrainer), alpaca_eval or datasets.")
    def export(
        source: Optional[Path] = typer.Argument(None, help="Run folder or pair file."),
        format: Optional[str] = typer.Option(None, "--format", "-f", help="trl, trl-conversational, alpaca_eval or datasets."),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output file (a folder for datasets)."),
        include: Optional[str] = typer.Option(None, "--include", metavar="trained|all",
                                            help="trained (default): the pairs the run trained on; all: every judged "
                                                 "pair. Ties (p = 0.5) are left out of the pair formats."),
        push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", metavar="REPO",
                                                  help="Upload the export to this Hugging Face dataset repo "
                                                       "(token from HF_TOKEN or `hf auth login`)."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        cfg = resolve_config(ExportConfig, config, set_, {"source": str(source) if source else None, "format": format,
                                                          "output": str(output) if output else None,
                                                          "include": include, "push_to_hub": push_to_hub}, print_config)
        if not cfg.source or not cfg.output:
            fail("pofe export RUN_DIR --format FORMAT -o OUT: a source and -o are required")
        from pofe.data.export import export_pairs

        if cfg.push_to_hub:
            from pofe.hub import check_push

            check_push(cfg.push_to_hub, "push_to_hub")  # offline or no token: refused before the export
        s = export_pairs(cfg.source, cfg.format, cfg.output, cfg.include)
        if cfg.push_to_hub:
            from pofe.hub import push

            s["hub"] = push(cfg.output, cfg.push_to_hub, repo_type="dataset", message=f"pofe export ({cfg.format})")
        if json_out:
            emit_json(s)
        else:
            why = ", ".join(f"{n} {reason}" for reason, n in s["skipped"].items())
            left = f"; left out {s['left_out']} rows ({why})" if s["skipped"] else ""
            typer.echo(f"exported {s['pairs']} pairs from {s['input']} as {s['format']} -> {s['output']}"
                       f"{left}")
            if s.get("hub"):
                typer.echo(f"pushed to {s['hub']['url']}")
