"""Seconds per ``pofe online`` step at a fixed config (paired with TRL in ../shared/anchors/trl/).

Config: the embedded SmolLM2-135M-Instruct policy, full fine-tuning in fp32 on CPU,
4 prompts x 2 samples per step, 48 new tokens, temperature 0.9, DPO beta 0.1, AdamW
lr 5e-7 (no warm-up effect on speed), no evaluation, judge cache off. ``--judge llm``: the
embedded SmolLM2 as pairwise annotator (token probabilities), both orders in one batch;
``--judge length``: the programmatic length judge (isolates the training side).

``--engine vllm``: sampling on the in-process vLLM engine (bf16), weights synced after every
optimiser step; ``--judge vllm`` reads both judge orders on a vLLM engine too (one prefill
batch; with ``--lora`` it shares the policy's engine only under ``--lora-sync adapter``).

Prints the median seconds per step excluding the first (wall clock between steps), the
time split (generate / judge / sync / reference / policy forward+backward / optimiser,
medians) and the peak RSS of the process (vLLM's KV cache included).

Anchor on this 2-core machine (shared/docs/anchor-trl.md): TRL 1.16 OnlineDPOTrainer at
this config, judge scoring one order, gradient checkpointing off: 23.3 s/step.

    python benchmarks/online_step.py --judge llm --steps 6 [--engine hf|vllm] [--json] [--prompts FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=None, help="Prompt file (default: pofe's built-in prompts).")
    ap.add_argument("--judge", choices=["llm", "vllm", "length"], default="llm")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="policy (and llm/vllm judge) model")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="policy weights")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="sampling engine")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="train.precision: bf16 autocast of the policy and reference passes (fp32 master weights)")
    ap.add_argument("--judge-dtype", choices=["float32", "bfloat16"], default="float32", help="llm judge weights")
    ap.add_argument("--vllm-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--lora-sync", choices=["auto", "adapter", "merged"], default="auto")
    ap.add_argument("--mode", choices=["online", "async"], default="online",
                    help="async: step t+1 sampled and judged in a background thread while step t trains (needs --engine vllm)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lora", action="store_true", help="LoRA r=16 instead of full fine-tuning.")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's). With 1, CPU seconds per step ~ idle wall time on one core, "
                         "a number that other processes on the machine barely disturb.")
    ap.add_argument("--compile", action="store_true",
                    help="vLLM engines (generator and judge) with enforce_eager=false: torch.compile'd forward")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="any other pofe online config override, after the benchmark's own (repeatable)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep-run", action="store_true",
                    help="keep the run folder (checkpoints, metrics); by default it is deleted after its metrics are read")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model, 2 steps of 2 prompts x 4 new tokens: the script runs, in seconds")
    args = ap.parse_args(argv)
    from pofe.preload import allocator, restart_with_tcmalloc

    if argv is None:  # run as a script: on tcmalloc when installed, as `pofe online` runs (POFE_TCMALLOC=0: glibc)
        restart_with_tcmalloc("online")
    if args.smoke:
        from machine import smoke_model

        args.model, args.steps = smoke_model(), 2
        args.sets = ["train.batch_size=2", "sampling.max_new_tokens=4", *args.sets]  # after the bar's, so they win

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from pofe.config import load_config
    from pofe.loops.online import OnlineConfig, run
    from pofe.runs import read_jsonl

    out = tempfile.mkdtemp(prefix="pofe-bench-")
    sets = [f"judge.kind={args.judge}", f"train.steps={args.steps}", f"mode={args.mode}",
            "train.batch_size=4", "train.samples_per_prompt=2", "sampling.max_new_tokens=48",
            "sampling.temperature=0.9", "loss.name=dpo", "loss.beta=0.1", "optim.name=adamw", "optim.lr=5e-7",
            f"model.dtype={args.dtype}", f"model.device={args.device}", f"train.precision={args.precision}",
            f"model.name={args.model}", "eval.enabled=false", f"run.output_dir={out}",
            "log.tensorboard=false", f"model.lora.enabled={str(args.lora).lower()}"]
    if args.judge != "length":  # the programmatic judge has no model and no cache
        sets += [f"judge.model={args.model}", "judge.cache.enabled=false"]
    if args.prompts:
        sets.append(f"data.prompts={args.prompts}")
    if args.engine == "vllm":
        sets += ["sampling.engine=vllm", f"sampling.vllm.dtype={args.vllm_dtype}", "sampling.vllm.max_model_len=1024"]
        if args.compile:
            sets.append("sampling.vllm.enforce_eager=false")
        if args.lora_sync != "auto":
            sets.append(f"sampling.vllm.lora_sync={args.lora_sync}")
    if args.judge == "llm":
        sets.append(f"judge.dtype={args.judge_dtype}")
    if args.judge == "vllm":
        sets += [f"judge.vllm.dtype={args.vllm_dtype}", "judge.vllm.max_model_len=2048"]
        if args.compile:
            sets.append("judge.vllm.enforce_eager=false")
    cfg = load_config(OnlineConfig, None, sets + args.sets)  # later --set wins
    t0 = time.perf_counter()
    try:
        summary = run(cfg)
        total = time.perf_counter() - t0
        rows = read_jsonl(f"{summary['run_dir']}/metrics.jsonl")
    finally:
        if not args.keep_run:  # a run folder holds a full checkpoint (~2 GB on the embedded model)
            shutil.rmtree(out, ignore_errors=True)
    walls = [b["wall_time"] - a["wall_time"] for a, b in zip(rows, rows[1:])]  # excludes step 1
    cpus = [b["cpu_time"] - a["cpu_time"] for a, b in zip(rows, rows[1:])]
    med = lambda k: statistics.median(r[k] for r in rows[1:]) if len(rows) > 1 else rows[0][k]  # noqa: E731
    split = {"generate": med("time_generate"), "judge": med("time_judge"), "sync": med("time_sync"),
             "reference": med("time_reference"),
             "policy_fwd_bwd": med("time_policy"), "optimizer": med("time_optimizer")}
    if args.mode == "async":  # generate and judge overlap the step: what the step waited for them
        split["wait"] = med("time_wait")
    result = {
        "engine": args.engine, "mode": args.mode, "compile": args.compile, "precision": args.precision, "judge_dtype": args.judge_dtype, "judge": args.judge, "lora": args.lora, "steps": len(rows),
        "engine_syncs": summary.get("engine_syncs"),
        "seconds_per_step": round(statistics.median(walls), 2) if walls else None,
        "seconds_per_step_in_loop": round(med("time_step"), 2),
        "cpu_seconds_per_step": round(statistics.median(cpus), 2) if cpus else None,
        "threads": torch.get_num_threads(),
        "allocator": allocator(),
        "time_split_s": {k: round(v, 2) for k, v in split.items()},
        "time_split_pct": {k: round(100 * v / sum(split.values()), 1) for k, v in split.items()},
        "gen_tokens_per_step": med("gen_tokens"),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 2),
        "total_seconds": round(total, 1), "run_dir": summary["run_dir"] if args.keep_run else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"engine={args.engine} judge={args.judge} ({'LoRA' if args.lora else 'full fine-tuning'}, {result['threads']} threads): "
              f"{result['seconds_per_step']} s/step wall, {result['cpu_seconds_per_step']} CPU s/step "
              f"(medians of steps 2..{len(rows)}), peak RSS {result['peak_rss_gb']} GB")
        print("  split: " + ", ".join(f"{k} {v:.2f} s ({result['time_split_pct'][k]:.0f}%)" for k, v in split.items()))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
