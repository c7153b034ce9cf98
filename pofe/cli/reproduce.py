"""``pofe reproduce``: the seeds' headline claims in miniature (:mod:`pofe.loops.reproduce`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import JsonOpt, emit_json


def register(app: typer.Typer) -> None:
    @app.command(help="Reproduce the seeds' headline claims in miniature (tiny policy, planted annotators, a "
                      "programmatic oracle as evaluator): each claim's paper number beside pofe's, and whether "
                      "the paper's direction holds. Exit 1 when one does not. --fast: the CI tier (minutes).")
    def reproduce(
        out: Path = typer.Option(Path("runs/reproduce"), "--output", "-o", help="Folder for the runs and reproduce.json."),
        fast: bool = typer.Option(False, "--fast", help="The CI tier: fewer steps and prompts, same claims."),
        claim: Optional[list[str]] = typer.Option(None, "--claim", help="Only this claim (repeatable)."),
        seed: int = typer.Option(0, "--seed", help="The one seed of every run."),
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.reproduce import reproduce as run, table

        result = run(out, fast=fast, only=claim, seed=seed)
        if json_out:
            emit_json(result)
        else:
            typer.echo(table(result))
            typer.echo(f"\n{result['tier']} tier, {result['seconds']} s; numbers in {Path(out) / 'reproduce.json'}")
        if not result["all_hold"]:
            raise typer.Exit(1)
