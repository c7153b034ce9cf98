"""``pofe sim``: the labelling-chain simulation (rlaif-constitutional-ai "A toy run")."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, resolve_config


def register(app: typer.Typer) -> None:
    from pofe.evaluation.sim import SimConfig

    @app.command(help="Simulate what a judge's position and length biases do to a reward model "
                      "(the toy labelling chain of the RLAIF seed); runs in about a second.")
    def sim(
        seed: Optional[int] = typer.Option(None, help="Seed of the single numpy stream (default 0)."),
        position_bias: Optional[float] = typer.Option(None, help="Judge logit bonus for the first-shown response (0.6)."),
        length_weight: Optional[float] = typer.Option(None, help="Judge logit weight on the length difference (0.8)."),
        noise: Optional[float] = typer.Option(None, help="Judge per-query logit noise sd (0.6)."),
        dim: Optional[int] = typer.Option(None, help="Quality features per response (12)."),
        n_train: Optional[int] = typer.Option(None, help="Pairs per reward model (5000)."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        cfg = resolve_config(SimConfig, config, set_, {
            "seed": seed, "position_bias": position_bias, "length_weight": length_weight, "noise": noise,
            "dim": dim, "n_train": n_train}, print_config)
        from pofe.evaluation.sim import format_sim, run_sim

        result = run_sim(cfg)
        if json_out:
            emit_json(result)
        else:
            typer.echo(format_sim(result))
