"""``pofe rm``: Bradley-Terry reward model on soft (AI) or hard (human) labels."""

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
    @app.command(help="Train a reward model (score head on a causal LM, LoRA or full) with the soft Bradley-Terry "
                      "loss; reports held-out accuracy, calibration (ECE) and margins; saves <run>/final.")
    def rm(
        config: Optional[Path] = ConfigOpt,
        train: Optional[list[str]] = typer.Option(None, "--train", help="Pair source (repeatable): preferences jsonl or hh-rlhf:helpful."),
        model: Optional[str] = typer.Option(None, help="Base model name, id or path (default: embedded SmolLM2)."),
        labels: Optional[str] = typer.Option(None, help="soft (default) or hard."),
        epochs: Optional[int] = typer.Option(None, help="Passes over the pairs (train.epochs)."),
        steps: Optional[int] = typer.Option(None, help="Stop after this many optimiser steps (train.steps)."),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run folder from its latest checkpoint "
                                              "(its saved config.yaml is used; --config/--set are refused)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders."),
        name: Optional[str] = typer.Option(None, "--name", help="Run folder name."),
        require_audit: Optional[Path] = typer.Option(None, "--require-audit",
                                                     help="Refuse to train unless this `pofe audit` report passed for the judge that labelled --train."),
        set_: Optional[list[str]] = SetOpt,
        push_to_hub: Optional[str] = PushToHubOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.rm import RMConfig, run

        cfg = resolve_config(RMConfig, config, with_push(set_, push_to_hub), {
            "data.train": train or None, "model.name": model, "data.labels": labels, "train.epochs": epochs,
            "train.steps": steps, "run.output_dir": output_dir, "run.name": name}, print_config, resume=resume, trust_run_config=trust_run_config)
        s = run(cfg, resume=resume, require_audit=require_audit)  # the audit gate runs before any model loads
        if json_out:
            emit_json(s)
            return
        ev = s["eval"] or {}
        m = ev.get("margin", {})
        typer.echo(f"rm: {s['steps']} steps on {s['train_pairs']} pairs ({s['labels']} labels); held-out "
                   f"accuracy {ev.get('accuracy')}, ECE {ev.get('ece')}, mean margin {m.get('mean')} "
                   f"(labels imply {m.get('label_implied_mean')})")
        typer.echo(f"model: {s['final_model']}  (use as judge: --set judge.kind=reward-model "
                   f"--set judge.reward_model={s['final_model']})")
        if s.get("hub"):
            typer.echo(f"pushed to {s['hub']['url']}")
