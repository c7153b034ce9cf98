"""``pofe rl`` (RLOO, GRPO) vs TRL's ``RLOOTrainer`` / ``GRPOTrainer``, paired back to back
(pofe, TRL, pofe, TRL, ...), each side in its own process so peak RSS is per run.

Both sides train SmolLM2-135M-Instruct (full fine-tuning, AdamW, constant lr 1e-5, KL
coefficient 0.05 against a frozen reference: in the reward for RLOO, in the loss for GRPO) on
the same 16 prompts (``../shared/anchors/trl/bench_prompts.jsonl``), ``--batch`` prompts x
``--group`` samples per optimiser step, ``--max-new-tokens`` at temperature 1, top-p 1, with
the same programmatic reward: pofe's ``length`` reward (``prefer: shorter, unit: chars``),
−len(text) / (4 · max_new_tokens), given to TRL as a reward function. Generation: transformers
``generate`` on both sides by default (pofe ``sampling.engine=hf``; the TRL anchor has no
vLLM); ``--pofe-set sampling.engine=vllm`` measures pofe's in-process vLLM sampler against
the same TRL run. Step time is the wall time of one optimiser step (pofe: the recipe's
``step``; TRL: the Trainer's ``on_step_begin`` -> ``on_step_end``); the first step is excluded.
Each side prints tokens generated per step: a shorter-is-better reward shortens the samples as
training goes, so compare s/step next to it.

    python benchmarks/rl_vs_trl.py --algo rloo --rounds 2
    python benchmarks/rl_vs_trl.py --algo grpo --rounds 2 --bf16
    python benchmarks/rl_vs_trl.py --algo rloo --smoke                     # 1 round, 2 x 2 samples, 16 tokens, 3 steps

Needs the TRL anchor environment: ``bash ../shared/anchors/trl/setup.sh`` (once). The TRL side
is ``benchmarks/trl_rl_side.py``, run with the anchor's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_line, paired_line, peak_rss_gb

HERE = Path(__file__).resolve().parent
PROMPTS = HERE.parent.parent / "shared" / "anchors" / "trl" / "bench_prompts.jsonl"
TRL_PY = Path(os.environ.get("TRL_ANCHOR_DIR", Path.home() / ".cache" / "pofe-trl-anchor")) / "venv" / "bin" / "python"


def pofe_sets(algo: str, steps: int, batch: int, group: int, max_new_tokens: int, temperature: float, bf16: bool,
              work: Path) -> list[str]:
    """The ``pofe rl`` config of the pairing (``--set`` form), before the user's ``--pofe-set``."""
    return [f"algo={algo}", f"kl_in={'reward' if algo == 'rloo' else 'loss'}", "beta=0.05",
            "model.name=smollm2-135m-instruct", f"data.prompts={PROMPTS}", "data.max_prompts=null", "eval.num_prompts=0",
            "sampling.engine=hf", f"sampling.max_new_tokens={max_new_tokens}", f"sampling.temperature={temperature}",
            "sampling.top_p=1.0", "reward.kind=programmatic", "reward.function=length", "reward.prefer=shorter",
            "reward.unit=chars", "optim.lr=1e-5", "optim.warmup_steps=0", "optim.schedule=constant",
            f"train.steps={steps}", f"train.batch_size={batch}", f"train.group_size={group}",
            f"train.precision={'bf16' if bf16 else 'fp32'}", "log.progress=false", f"run.output_dir={work}",
            f"run.name=rl-{algo}-pofe"]


def pofe_side(sets: list[str]) -> dict:
    """One pofe run in this process: ``pofe rl``'s recipe on the driver, its ``step`` timed."""
    from pofe.config import load_config
    from pofe.loops.rl import RLConfig, RLRecipe
    from pofe.recipe import drive

    cfg = load_config(RLConfig, None, sets)
    times: list[float] = []
    generated: list[float] = []
    splits: list[dict] = []

    class Timed(RLRecipe):
        def step(self, step):
            t = time.perf_counter()
            row = super().step(step)
            times.append(time.perf_counter() - t)
            generated.append(row["length"] * cfg.train.batch_size * cfg.train.group_size)
            splits.append(row["seconds"])  # rl_step's own split: generate / reward / update
            return row

    drive(Timed(cfg))
    return {"seconds_per_step": statistics.median(times[1:]), "steps": len(times),
            "generated_tokens_per_step": round(statistics.mean(generated[1:])), "peak_rss_gb": peak_rss_gb(),
            "split_s": {k: round(statistics.median(x[k] for x in splits[1:]), 2) for k in splits[0]}}


def run_side(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def show(r: int, side: str, x: dict) -> None:
    print(f"round {r + 1} {side:4s}: {x['seconds_per_step']:.3f} s/step  generated {x['generated_tokens_per_step']} "
          f"tokens/step  peak RSS {x['peak_rss_gb']} GB{'  split ' + str(x['split_s']) if 'split_s' in x else ''}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", choices=["rloo", "grpo"], required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--bf16", action="store_true", help="pofe train.precision=bf16, TRL bf16=True (autocast, fp32 weights)")
    ap.add_argument("--pofe-set", dest="pofe_sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a pofe rl override after the pairing's own (e.g. sampling.engine=vllm); repeatable")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round, 2 prompts x 2 samples, 16 new tokens, 2 steps; pofe on a tiny random model, TRL on "
                         "$TRL_ANCHOR_DIR's model (tests point the anchor at a tiny one)")
    ap.add_argument("--side", choices=["pofe"], help=argparse.SUPPRESS)  # internal: one pofe run
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke and args.side is None:
        from machine import smoke_model

        args.rounds, args.batch, args.group, args.max_new_tokens, args.steps = 1, 2, 2, 16, 2
        args.pofe_sets = [f"model.name={smoke_model()}", *args.pofe_sets]
    shape = dict(steps=args.steps, batch=args.batch, group=args.group, max_new_tokens=args.max_new_tokens,
                 temperature=args.temperature, bf16=args.bf16)
    if args.side == "pofe":
        print(json.dumps(pofe_side(pofe_sets(args.algo, work=Path(args.work), **shape) + args.pofe_sets)))
        return
    if not TRL_PY.exists():
        sys.exit(f"TRL anchor environment not found at {TRL_PY}: bash ../shared/anchors/trl/setup.sh")
    print(cpu_line(), flush=True)
    print(f"{args.algo}: {args.batch} prompts x {args.group} samples, {args.max_new_tokens} new tokens, "
          f"{args.steps} steps, {'bf16' if args.bf16 else 'fp32'}; pofe extra: {args.pofe_sets or 'none'}", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"pofe-rl-{args.algo}-vs-trl-"))
    flags = ["--steps", str(args.steps), "--batch", str(args.batch), "--max-new-tokens", str(args.max_new_tokens),
             "--temperature", str(args.temperature)] + (["--bf16"] if args.bf16 else [])
    pofe_res, trl_res = [], []
    for r in range(args.rounds):
        w = work / f"round-{r}"
        w.mkdir()
        extra = [x for s in args.pofe_sets for x in ("--pofe-set", s)]
        p = run_side([sys.executable, __file__, "--algo", args.algo, "--side", "pofe", "--work", str(w), "--group",
                      str(args.group), *flags, *extra])
        show(r, "pofe", p)
        t = run_side([str(TRL_PY), str(HERE / "trl_rl_side.py"), "--algo", args.algo, "--prompts", str(PROMPTS),
                      "--work", str(w), "--group", str(args.group), *flags])
        show(r, "TRL", t)
        pofe_res.append(p), trl_res.append(t)
        shutil.rmtree(w, ignore_errors=True)  # a run folder holds the final model (~0.5 GB)
    shutil.rmtree(work, ignore_errors=True)
    print(paired_line(f"rl {args.algo}{' bf16' if args.bf16 else ' fp32'}", pofe_res, trl_res))


if __name__ == "__main__":
    main()
