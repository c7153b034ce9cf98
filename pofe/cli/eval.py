"""``pofe eval``: win rates of policy A against policy B under a judge, both orders, length-controlled;
3+ policies give a win matrix and Bradley-Terry ratings; an MT-Bench question.jsonl gives two-turn evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, emit_json, fail, resolve_config
from pofe.cli.helptext import judge_kinds_help


def register(app: typer.Typer) -> None:
    from pofe.evaluation.eval import EvalConfig

    @app.command("eval", help="Compare two policies (model names/paths, run folders or JSONL files of "
                              "{prompt, response}) on a prompt set: both-order judging, W/T/L, tie-adjusted win "
                              "rate with a Wilson 95% interval, win rate by length bucket, AlpacaEval-2 length-"
                              "controlled win rate. Three or more policies: pairwise win matrix and Bradley-Terry "
                              "ratings with intervals. A FastChat MT-Bench question.jsonl (--prompts) runs two turns.")
    def eval_(
        policies: Optional[list[str]] = typer.Argument(
            None, help="Policies: model, run folder or responses file each. Two: A vs B (baseline); 3+: all pairs."),
        prompts: Optional[str] = typer.Option(None, "--prompts", "-p", help="Prompt file (.txt/.json/.jsonl)."),
        judge: Optional[str] = typer.Option(None, "--judge", help=judge_kinds_help()),
        limit: Optional[int] = typer.Option(None, help="Only the first N prompts."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Write per-pair rows to this JSONL file."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        given = list(policies or [])
        two = {"policy_a": given[0], "policy_b": given[1]} if len(given) == 2 else {}
        if len(given) == 1:
            fail("eval: give two policies (A and the baseline B), or three or more to compare")
        cfg = resolve_config(EvalConfig, config, set_, {
            **two, "policies": given if len(given) > 2 else None, "data.prompts": prompts, "judge.kind": judge,
            "data.max_prompts": limit, "output": output}, print_config)
        from pofe.evaluation.eval import format_eval, run_eval

        res = run_eval(cfg)
        if json_out:
            emit_json(res)
        else:
            typer.echo(format_eval(res))
