"""``pofe sft``: supervised fine-tuning, loss on response tokens only (IFT, optionally + EFT)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, fail, resolve_config


def register(app: typer.Typer) -> None:
    @app.command(help="Supervised fine-tuning on (prompt, response) data; loss on response tokens only, "
                      "cosine schedule, LoRA or full (Self-Rewarding LMs seed SFT; SL-CAI).")
    def sft(
        config: Optional[Path] = ConfigOpt,
        ift: Optional[list[str]] = typer.Option(None, "--ift", help="IFT data file (repeatable)."),
        eft: Optional[list[str]] = typer.Option(None, "--eft", help="EFT data file (repeatable)."),
        model: Optional[str] = typer.Option(None, help="Model name, id or path (default: embedded SmolLM2)."),
        max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimiser steps (overrides epochs)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders."),
        resume: Optional[str] = typer.Option(None, "--resume", help="Run folder to resume."),
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.sft import SFTConfig

        extra = {"data.ift": ift or None, "data.eft": eft or None, "model.name": model, "max_steps": max_steps,
                 "run.output_dir": output_dir, "resume": resume}
        cfg = resolve_config(SFTConfig, config, set_, extra, print_config)
        from pofe.data.prompts import DataError
        from pofe.loops.sft import run

        try:
            summary = run(cfg)
        except DataError as e:
            fail(str(e))
        if json_out:
            emit_json(summary)
        else:
            typer.echo(f"sft: {summary['steps']} steps on {summary['examples']} examples "
                       f"(dropped {summary['dropped']}); loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}")
            typer.echo(f"model: {summary['model_dir']}")
