"""``pofe sft``: supervised fine-tuning, loss on response tokens only (IFT, optionally + EFT)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import (
    ConfigOpt,
    JsonOpt,
    PrintConfigOpt,
    PushToHubOpt,
    SetOpt,
    TrustRunConfigOpt,
    emit_json,
    resolve_config,
    with_push,
)


def register(app: typer.Typer) -> None:
    @app.command(help="Supervised fine-tuning on (prompt, response) data; loss on response tokens only, "
                      "cosine schedule, LoRA or full (Self-Rewarding LMs seed SFT; SL-CAI).")
    def sft(
        config: Optional[Path] = ConfigOpt,
        ift: Optional[list[str]] = typer.Option(None, "--ift", help="IFT data file (data.ift, repeatable)."),
        eft: Optional[list[str]] = typer.Option(None, "--eft", help="EFT data file (data.eft, repeatable)."),
        model: Optional[str] = typer.Option(None, help="Model (model.name): name, id or path (default: embedded SmolLM2)."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Optimiser steps (train.steps; default: epochs)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders (run.output_dir)."),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue RUN_DIR with its own config.yaml "
                                                                     "from its latest checkpoint."),
        set_: Optional[list[str]] = SetOpt,
        push_to_hub: Optional[str] = PushToHubOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.sft import SFTConfig

        extra = {"data.ift": ift or None, "data.eft": eft or None, "model.name": model, "train.steps": steps,
                 "run.output_dir": output_dir}
        cfg = resolve_config(SFTConfig, config, with_push(set_, push_to_hub), extra, print_config, resume=resume, trust_run_config=trust_run_config)
        from pofe.loops.sft import run

        summary = run(cfg, resume=resume)
        if json_out:
            emit_json(summary)
        else:
            typer.echo(f"sft: {summary['steps']} steps on {summary['examples']} examples "
                       f"(dropped {summary['dropped']}); loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}")
            typer.echo(f"model: {summary['final_model']}")
            if summary.get("hub"):
                typer.echo(f"pushed to {summary['hub']['url']}")
