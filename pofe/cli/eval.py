"""``pofe eval``: win rates of policy A against policy B under a judge, both orders, length-controlled."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, fail, resolve_config


def register(app: typer.Typer) -> None:
    from pofe.evaluation.eval import EvalConfig

    @app.command("eval", help="Compare two policies (model names/paths, run folders or JSONL files of "
                              "{prompt, response}) on a prompt set: both-order judging, W/T/L, tie-adjusted win "
                              "rate with a bootstrap 95% interval, win rate by length bucket, length-controlled win rate.")
    def eval_(
        policy_a: Optional[str] = typer.Argument(None, help="Policy A: model, run folder or responses file."),
        policy_b: Optional[str] = typer.Argument(None, help="Policy B (baseline)."),
        prompts: Optional[str] = typer.Option(None, "--prompts", "-p", help="Prompt file (.txt/.json/.jsonl)."),
        judge: Optional[str] = typer.Option(None, "--judge", help="Judge kind (see pofe.judges.registry.JUDGES)."),
        limit: Optional[int] = typer.Option(None, help="Only the first N prompts."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Write per-pair rows to this JSONL file."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        cfg = resolve_config(EvalConfig, config, set_, {
            "policy_a": policy_a, "policy_b": policy_b, "prompts": prompts, "judge.kind": judge, "limit": limit,
            "output": output}, print_config)
        from pofe.evaluation.eval import format_eval, run_eval

        try:
            res = run_eval(cfg)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        if json_out:
            emit_json(res)
        else:
            typer.echo(format_eval(res))
