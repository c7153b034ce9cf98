"""``pofe report RUN_DIR``: a self-contained HTML page of a run's plots, with the PNGs beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import JsonOpt, emit_json, fail


def register(app: typer.Typer) -> None:
    @app.command(help="Plot a run folder (pofe online / self-reward) into RUN_DIR/report/report.html "
                      "(images inline, opens offline) plus one PNG per plot.")
    def report(
        run_dir: Path = typer.Argument(..., help="Run folder (config.yaml, metrics.jsonl, ledger.jsonl, iter_*/)."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default RUN_DIR/report)."),
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.evaluation.report import write_report

        try:
            res = write_report(run_dir, out)
        except FileNotFoundError as e:
            fail(str(e))
        if json_out:
            emit_json(res)
        else:
            typer.echo(f"wrote {res['html']} with {len(res['plots'])} plots ({', '.join(res['plots']) or 'none'})")
