"""``pofe cai``: Constitutional AI stage 1. ``pofe cai revise`` writes the SL-CAI SFT set
(then ``pofe sft --ift <run>/sft.jsonl`` trains on it); ``pofe cai refusal`` measures
over-refusal next to refusal on harmful prompts for any model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import (
    ConfigOpt,
    JsonOpt,
    PrintConfigOpt,
    SetOpt,
    TrustRunConfigOpt,
    emit_json,
    resolve_config,
)

def register(app: typer.Typer) -> None:
    cai = typer.Typer(name="cai", help="Constitutional AI: critique-and-revise SFT data (SL-CAI) and refusal tracking.",
                      no_args_is_help=True)

    @cai.command(help="SL-CAI: sample, critique and revise under sampled principles (R rounds); writes sft.jsonl "
                      "(+ helpfulness mix), preferences.jsonl (revision > original) and refusal rates.")
    def revise(
        config: Optional[Path] = ConfigOpt,
        model: Optional[str] = typer.Option(None, help="Model name, id or path (default: embedded SmolLM2)."),
        prompts: Optional[str] = typer.Option(None, help="Red-team prompts: file, advbench, xstest:unsafe, hh-rlhf:harmless."),
        constitution: Optional[str] = typer.Option(None, help="Constitution name or path (YAML, or HF JSON)."),
        rounds: Optional[int] = typer.Option(None, help="Critique-revision rounds (1-4)."),
        max_prompts: Optional[int] = typer.Option(None, "--max-prompts"),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run folder after its last complete "
                                              "chunk (its saved config.yaml is used; --config/--set are refused)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders."),
        name: Optional[str] = typer.Option(None, "--name", help="Run folder name."),
        set_: Optional[list[str]] = SetOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.cai_revise import CaiReviseConfig, run

        cfg = resolve_config(CaiReviseConfig, config, set_, {
            "model.name": model, "data.prompts": prompts, "constitution": constitution, "rounds": rounds,
            "data.max_prompts": max_prompts, "run.output_dir": output_dir, "run.name": name}, print_config, resume=resume, trust_run_config=trust_run_config)
        s = run(cfg, resume=resume)
        if json_out:
            emit_json(s)
            return
        typer.echo(f"cai revise: {s['prompts']} prompts x {s['rounds']} round(s), constitution {s['constitution']} "
                   f"({s['constitution_version']}); {s['sft_examples']} SFT examples ({s['sft_helpful']} helpful), "
                   f"{s['preference_pairs']} revision>original pairs, {s['unchanged']} unchanged")
        typer.echo(f"critique principles ({len(s['critique_principles'])}): {', '.join(s['critique_principles'])}")
        ref = s.get("refusal")
        if ref:
            for k in ("original", "revised"):
                r = ref[k]
                typer.echo(f"refusal ({k}): harmful {_pct(r['harmful_refusal_rate'])}, benign (over-refusal) "
                           f"{_pct(r['over_refusal_rate'])}")
        typer.echo(f"next: pofe sft --ift {s['files']['sft']}")

    @cai.command(help="Refusal rate on benign prompts (over-refusal) next to harmful prompts (XSTest by default).")
    def refusal(
        config: Optional[Path] = ConfigOpt,
        model: Optional[str] = typer.Option(None, help="Model name, id or path."),
        n: Optional[int] = typer.Option(None, help="Prompts per set (data.max_prompts)."),
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.cai_refusal import RefusalEvalConfig, run

        cfg = resolve_config(RefusalEvalConfig, config, set_, {"model.name": model, "data.max_prompts": n}, print_config)
        rep = run(cfg)
        if json_out:
            emit_json(rep)
        else:
            typer.echo(f"{cfg.model.name}: over-refusal (benign) {_pct(rep['over_refusal_rate'])}, "
                       f"refusal on harmful {_pct(rep['harmful_refusal_rate'])}, gap {rep['gap']:+.3f}")

    app.add_typer(cai, name="cai")


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
