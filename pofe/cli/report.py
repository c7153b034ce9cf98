"""``pofe report RUN_DIR``: a self-contained HTML page of a run's plots, with the PNGs beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import JsonOpt, emit_json, fail


def register(app: typer.Typer) -> None:
    @app.command(help="Plot a run folder of any command (online, self-reward, label, rm, rl, cai revise; an audit "
                      "folder or audit.json) into RUN_DIR/report/report.html (images inline, opens offline) plus one "
                      "PNG per plot: rates with n and Wilson intervals, the judge's length unit, sample generations, "
                      "flags for KL jumps, top-of-scale judge scores and overconfident labels.")
    def report(
        run_dir: Path = typer.Argument(..., help="Run folder (or an audit.json report)."),
        out: Optional[Path] = typer.Option(None, "--output", "-o", help="Output folder (default RUN_DIR/report)."),
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.evaluation.report import load_run, write_report

        run = load_run(run_dir)
        if run.kind == "unknown" and run.config_text is None and run.summary is None and not run.metrics:
            # an empty report with exit 0 would look like a run that logged nothing
            fail(f"{run_dir}: not a pofe run folder (no config.yaml, summary.json, metrics.jsonl or audit report)")
        if out is not None:  # a user-given folder: never an input, never inside a live run
            from pofe.outputs import guard_outputs

            guard_outputs({"--output": out}, [run_dir], folders={"--output"})
        res = write_report(run_dir, out)
        if json_out:
            emit_json(res)
        else:
            typer.echo(f"wrote {res['html']} ({res['kind']} run) with {len(res['plots'])} plots "
                       f"({', '.join(res['plots']) or 'none'})")
            for f in res["flags"]:
                typer.echo(f"  flag: {f}")
