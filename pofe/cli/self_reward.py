"""``pofe self-reward``: Self-Rewarding LMs -- seed SFT (+EFT), self-instruct prompts, self-judged
pairs, iterative DPO M1 -> M2 -> M3, reward-modelling metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

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
    @app.command("self-reward", help="Self-Rewarding LMs: the model writes prompts, answers them, judges its answers "
                                     "with the additive rubric and trains on its own preferences (iterative DPO).")
    def self_reward(
        config: Optional[Path] = ConfigOpt,
        iterations: Optional[int] = typer.Option(None, "--iterations", "-n", help="Models M1..M_T (paper: 3)."),
        model: Optional[str] = typer.Option(None, help="Base model name, id or path (default: embedded SmolLM2)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders."),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue RUN_DIR with its own config.yaml "
                                                                     "(finished stages are skipped)."),
        require_audit: Optional[Path] = typer.Option(
            None, "--require-audit",
            help="Refuse to start unless this `pofe audit` report passed (audit M1 as a judge first)."),
        set_: Optional[list[str]] = SetOpt,
        push_to_hub: Optional[str] = PushToHubOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.self_reward import SelfRewardConfig

        extra = {"iterations": iterations, "model.name": model, "run.output_dir": output_dir}
        cfg = resolve_config(SelfRewardConfig, config, with_push(set_, push_to_hub), extra, print_config, resume=resume,
                             trust_run_config=trust_run_config)
        from pofe.loops.self_reward import run

        # --require-audit: the driver checks the report before any model loads
        summary = run(cfg, resume=resume, require_audit=require_audit)
        rows = compact(summary)
        if json_out:
            emit_json({"run_dir": summary["run_dir"], "final_model": summary["final_model"], "seconds": summary["seconds"],
                       "iterations": rows})
            return
        typer.echo(f"run: {summary['run_dir']}  ({summary['seconds']} s); final model (M{len(rows)}): {summary['final_model']}")
        if summary.get("hub"):
            typer.echo(f"pushed to {summary['hub']['url']}")
        for r in rows:
            h = r.get("head_to_head_vs_prev") or {}
            rm = r.get("rm_metrics") or {}
            typer.echo(
                f"M{r['iteration']}: prompts kept {r['prompts_kept']} of {r['prompts_generated']}, "
                f"pairs {r['pairs_kept']} (dropped {r['pairs_dropped']}), mean score {_f(r['mean_score'])}, "
                f"eval score {_f(r['eval_mean_score'])}, length {_f(r['mean_length_chars'])} chars, "
                f"RM pairwise acc {_f(rm.get('pairwise_accuracy'))}, "
                f"vs prev W/T/L {h.get('wins', '-')}/{h.get('ties', '-')}/{h.get('losses', '-')}")


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def compact(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-iteration line ``--json`` prints: prompts generated/kept, pairs kept/dropped,
    mean score, RM metrics, head-to-head vs the previous iteration, mean length."""
    out = []
    for m in summary["iterations"]:
        p = m.get("prompts") or {}
        pc = m.get("pairs") or {}
        rm = m.get("rm_metrics") or {}
        out.append({
            "iteration": m["iteration"], "model": m.get("model"),
            "prompts_generated": p.get("candidates", p.get("pool")), "prompts_kept": p.get("kept"),
            "prompts_rejected": p.get("rejected"),
            "pairs_kept": pc.get("kept"),
            "pairs_dropped": {k: v for k, v in pc.items() if k not in ("kept", "prompts")} or None,
            "unscored_candidates": m.get("unscored_candidates"),
            "mean_score": m.get("mean_score"), "eval_mean_score": m.get("eval_mean_score"),
            "mean_length_chars": m.get("mean_length_chars"),
            "rm_metrics": {k: rm.get(k) for k in ("pairwise_accuracy", "exact_match", "spearman", "kendall_tau",
                                                  "five_best_share", "n_pairs")} if rm else None,
            "head_to_head_vs_prev": m.get("head_to_head_vs_prev"), "selected_step": m.get("selected_step"),
        })
    return out
