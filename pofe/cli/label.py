"""``pofe label``: RL-CAI AI preference labels (soft p, both orders, sampled principle)."""

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
    @app.command(help="Sample two responses per prompt and label them with a pairwise judge under a sampled "
                      "principle, both orders (RL-CAI); writes a soft-labelled preference set. Cached: re-labelling is free.")
    def label(
        config: Optional[Path] = ConfigOpt,
        model: Optional[str] = typer.Option(None, help="Model that samples the pair (default: embedded SmolLM2)."),
        prompts: Optional[str] = typer.Option(None, help="Prompt source: file, advbench, xstest[:safe|:unsafe], hh-rlhf:harmless."),
        pairs: Optional[str] = typer.Option(None, help="Label existing pairs (jsonl prompt/response_a/response_b) instead of sampling."),
        max_prompts: Optional[int] = typer.Option(None, "--max-prompts"),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run folder after its last checkpointed batch "
                                              "(its saved config.yaml is used; --config/--set are refused)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders."),
        name: Optional[str] = typer.Option(None, "--name", help="Run folder name."),
        require_audit: Optional[Path] = typer.Option(None, "--require-audit",
                                                     help="Refuse to label unless this `pofe audit` report passed for this judge."),
        set_: Optional[list[str]] = SetOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.label import LabelConfig, run

        cfg = resolve_config(LabelConfig, config, set_, {
            "model.name": model, "data.prompts": prompts, "data.pairs": pairs, "data.max_prompts": max_prompts,
            "run.output_dir": output_dir, "run.name": name}, print_config, resume=resume, trust_run_config=trust_run_config)
        s = run(cfg, resume=resume, require_audit=require_audit)  # the audit gate runs before any model loads
        if json_out:
            emit_json(s)
            return
        cons = s["consistency_rate"]
        typer.echo(f"label: {s['parsed']}/{s['pairs']} pairs labelled by {s['judge']} "
                   f"({s['labels_per_second']} labels/s); consistency {'n/a' if cons is None else f'{cons:.2f}'}; "
                   f"cache {s['cache']}")
        typer.echo(f"p histogram {s['p_histogram']['counts']}")
        f = s["filter"]
        typer.echo(f"filter (drop_inconsistent={f['drop_inconsistent']}, min_margin={f['min_margin']}): "
                   f"{s['preference_pairs']} pairs kept, dropped {f['dropped']}; "
                   f"{s['text_fallback_labels']} text-fallback (no log-prob) labels")
        typer.echo(f"preferences: {s['files']['preferences']}")
