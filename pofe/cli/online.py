"""``pofe online``: direct alignment from Online AI Feedback (OAIF Algorithm 1)."""

from __future__ import annotations

import os
import time
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


def _interval(ci) -> str:
    """`` [lo, hi] 95%`` of a win rate against the initial policy and whether it excludes 0.5,
    the rate of a policy that has not changed (every pair a tie, or wins and losses even)."""
    if not ci or ci[0] is None:
        return ""
    lo, hi = ci
    where = "excludes" if lo > 0.5 or hi < 0.5 else "includes"
    return f" [{lo:.2f}, {hi:.2f}] 95% Wilson, {where} 0.5 = no change"


def describe(summary: dict[str, Any], cfg) -> str:
    """What the run did, in a few plain lines."""
    s = summary
    lines = []
    what = "offline DAP on a fixed preference file" if s["mode"] == "offline" else \
        f"{s['mode']} AI feedback from {s['judge']} (template {cfg.judge.template})" if hasattr(cfg.judge, "template") \
        else f"{s['mode']} AI feedback from {s['judge']}"
    lines.append(f"pofe online: {s['steps']} steps of {s['loss'].upper()} (beta {s['beta']:g}, {s['labels']} labels), {what}")
    if s["mode"] != "offline":
        lines.append(f"  annotations: {s['annotations']} judged pairs -> {s['trained_pairs']} trained, "
                     f"{s['identical_pairs']} identical (masked), {s['tie_pairs']} ties, {s['unlabelled_pairs']} unlabelled (skipped)")
        lf = s.get("label_filter") or {}
        lines.append(f"  label filter: drop inconsistent orders {'on' if lf.get('drop_inconsistent') else 'off'} "
                     f"({s.get('inconsistent_pairs', 0)} dropped), min |p - 1/2| {lf.get('min_margin', 0):g} "
                     f"({s.get('low_margin_pairs', 0)} dropped); {s.get('text_fallback_labels', 0)} text-fallback labels")
        if s.get("mean_len_first") is not None and s.get("mean_len_last") is not None and s["mean_len_first"]:
            ch = 100 * (s["mean_len_last"] - s["mean_len_first"]) / s["mean_len_first"]
            lines.append(f"  mean response length: {s['mean_len_first']:.1f} -> {s['mean_len_last']:.1f} tokens ({ch:+.0f}%; "
                         f"first/last {s['mean_len_window']} step(s))")
    else:
        lines.append(f"  trained pairs: {s['trained_pairs']}")
    ev = s.get("eval")
    if ev and ev.get("winrate_vs_init") is not None:
        lines.append(f"  win rate vs the initial policy: {ev['winrate_vs_init']:.2f}{_interval(ev.get('winrate_vs_init_ci95'))} "
                     f"({ev['eval_wins']} wins, {ev['eval_ties']} ties, "
                     f"{ev['eval_losses']} losses, {ev['eval_unlabelled']} unlabelled; held-out prompts, both judge orders)")
    if s.get("seconds_per_step"):
        split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in s["time_split"].items() if v)
        lines.append(f"  speed: {s['seconds_per_step']:.2f} s/step (median) — {split}")
    if not s.get("trained_pairs"):
        lines.append("  warning: no pair was trained (the policy is unchanged); see the counts above")
    lines.append(f"  run folder: {s['run_dir']} (config.yaml, metrics.jsonl, ledger.jsonl, checkpoints/, final/)")
    if s.get("hub"):
        lines.append(f"  pushed to {s['hub']['url']}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command(help="Online AI feedback (OAIF): sample 2 responses from the current policy, let a judge pick, "
                      "update with DPO/IPO/SLiC. Also mode=offline (fixed pairs) and mode=iterative.")
    def online(
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        push_to_hub: Optional[str] = PushToHubOpt,
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue RUN_DIR from its latest checkpoint."),
        steps: Optional[int] = typer.Option(None, help="Optimiser steps (train.steps)."),
        mode: Optional[str] = typer.Option(None, help="online | async | iterative | offline (mode)."),
        judge: Optional[str] = typer.Option(None, help="Judge kind (judge.kind), e.g. llm, length, reward-model."),
        template: Optional[str] = typer.Option(None, help="Judge template (judge.template), e.g. helpful-short."),
        model: Optional[str] = typer.Option(None, help="Policy (model.name): embedded name, hub id or local dir."),
        require_audit: Optional[Path] = typer.Option(None, "--require-audit",
                                                     help="Refuse to train unless this judge audit passed."),
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.online import OnlineConfig

        extra = {"train.steps": steps, "mode": mode, "judge.kind": judge, "judge.template": template, "model.name": model}
        cfg = resolve_config(OnlineConfig, config, with_push(set_, push_to_hub), extra, print_config,
                             resume=resume, trust_run_config=trust_run_config)
        from pofe.loops.online import run

        t0 = time.perf_counter()
        summary = run(cfg, resume=resume, require_audit=require_audit)
        summary["wall_seconds"] = round(time.perf_counter() - t0, 1)
        if int(os.environ.get("RANK", "0")) != 0:  # data-parallel: the main process reports
            return
        if json_out:
            emit_json(summary)
        else:
            typer.echo(describe(summary, cfg))
            typer.echo(f"  wall time: {summary['wall_seconds']:.0f} s")
