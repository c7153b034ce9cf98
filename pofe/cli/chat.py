"""``pofe chat``: answer prompts with a model (a smoke test of the embedded default)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, resolve_config
from pofe.loops.chat import ChatConfig


def register(app: typer.Typer) -> None:
    @app.command(help="Answer prompts with a model (smoke test of a model and its chat template).")
    def chat(
        prompt: list[str] = typer.Argument(..., help="One or more prompts."),
        model: Optional[str] = typer.Option(None, help="Model name, id or path (default: embedded SmolLM2)."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        cfg = resolve_config(ChatConfig, config, set_, {"model.name": model}, print_config)
        from pofe.loops.chat import run

        out = run(cfg, list(prompt))
        rows, load_s, gen_s = out["responses"], out["load_seconds"], out["generate_seconds"]
        if json_out:
            emit_json(out)
        else:
            typer.echo(f"loaded {cfg.model.name} in {load_s:.2f} s; generated in {gen_s:.2f} s")
            for r in rows:
                typer.echo(f"\n> {r['prompt']}\n{r['response']}")
