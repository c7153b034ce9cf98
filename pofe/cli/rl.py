"""``pofe rl``: KL-regularised RLOO / GRPO against a reward model, a judge's expected score or a programmatic reward."""

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
    @app.command(help="KL-regularised policy optimisation (RLOO or GRPO group baselines; KL in reward or loss) "
                      "against a reward model, a pointwise judge (direct RLAIF) or a programmatic reward.")
    def rl(
        config: Optional[Path] = ConfigOpt,
        model: Optional[str] = typer.Option(None, help="Policy name, id or path (default: embedded SmolLM2)."),
        prompts: Optional[str] = typer.Option(None, help="Prompt source."),
        reward: Optional[str] = typer.Option(None, help="programmatic, reward-model, judge (pointwise) or pairwise (a tournament of each prompt's samples)."),
        reward_model: Optional[str] = typer.Option(None, "--reward-model", help="pofe rm output (its final/ folder)."),
        algo: Optional[str] = typer.Option(None, help="rloo or grpo."),
        steps: Optional[int] = typer.Option(None, help="Optimiser steps (train.steps)."),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run folder from its latest checkpoint "
                                              "(its saved config.yaml is used; --config/--set are refused)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders."),
        name: Optional[str] = typer.Option(None, "--name", help="Run folder name."),
        require_audit: Optional[Path] = typer.Option(None, "--require-audit",
                                                     help="Refuse to train unless this `pofe audit` report passed for the reward's judge."),
        set_: Optional[list[str]] = SetOpt,
        push_to_hub: Optional[str] = PushToHubOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.rl import RLConfig, run

        extra = {"model.name": model, "data.prompts": prompts, "reward.kind": reward, "reward.model": reward_model,
                 "algo": algo, "train.steps": steps, "run.output_dir": output_dir, "run.name": name}
        if reward_model and not reward:
            extra["reward.kind"] = "reward-model"
        cfg = resolve_config(RLConfig, config, with_push(set_, push_to_hub), extra, print_config, resume=resume,
                             trust_run_config=trust_run_config)
        s = run(cfg, resume=resume, require_audit=require_audit)  # the audit gate runs before any model loads
        if json_out:
            emit_json(s)
            return
        b, a = s.get("eval_before") or {}, s.get("eval_after") or {}
        typer.echo(f"rl ({s['algo']}, KL in {s['kl_in']}, beta {s['beta']}): {s['steps']} steps, reward {s['reward']}")
        typer.echo(f"held-out reward {b.get('reward')} -> {a.get('reward')}; length {b.get('length')} -> {a.get('length')} tokens; "
                   f"KL (last 5 steps) {s['last5']['objective/kl']}")
        typer.echo(f"model: {s['final_model']}")
        if s.get("hub"):
            typer.echo(f"pushed to {s['hub']['url']}")
