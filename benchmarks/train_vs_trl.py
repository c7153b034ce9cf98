"""``pofe sft`` / ``pofe rm`` vs TRL's ``SFTTrainer`` / ``RewardTrainer``, paired back to back
(pofe, TRL, pofe, TRL, ...), each side in its own process so peak RSS is per run.

Both sides train the same model (SmolLM2-135M-Instruct, full fine-tuning, AdamW, constant
lr), with the same batch (8 rows per optimiser step, no accumulation), ``max_length`` 512, the
same precision and steps; the first step is excluded as warm-up. Step time is the wall time of
one optimiser step (pofe: the recipe's ``step``; TRL: the Trainer's ``on_step_begin`` ->
``on_step_end``).

Equal work: the rows are read once by pofe's own loader and kept only when every sequence
fits ``max_length`` as pofe renders it (TRL's ``RewardTrainer`` drops longer pairs and pofe
truncates them, ``SFTTrainer`` truncates and pofe drops, so a long row would be different work
on each side). TRL reads the kept rows in pofe's batch order (``train_sampling_strategy =
sequential`` over a file written in that order), so step k holds the same rows on both sides;
each side prints its tokens per step (real and padded) to show it.

    python benchmarks/train_vs_trl.py --command sft --rounds 2            # fp32
    python benchmarks/train_vs_trl.py --command rm --rounds 2 --bf16      # pofe train.precision=bf16, TRL --bf16
    python benchmarks/train_vs_trl.py --command rm --smoke                # 1 round, 4 rows x 256 tokens, 3 steps

Needs the TRL anchor environment: ``bash ../shared/anchors/trl/setup.sh`` (once). The TRL side
is ``benchmarks/trl_train_side.py``, run with the anchor's Python.
"""

from __future__ import annotations

import argparse
import json
import math
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
DATA = HERE.parent.parent / "shared" / "data"
TRL_PY = Path(os.environ.get("TRL_ANCHOR_DIR", Path.home() / ".cache" / "pofe-trl-anchor")) / "venv" / "bin" / "python"
SOURCES = {"sft": str(DATA / "self-instruct" / "seed_tasks.jsonl"), "rm": "hh-rlhf:helpful"}
SEED = 0


def rm_lengths(tok, q, max_length: int | None = None) -> tuple[int, int]:
    """Tokens of (prompt, chosen) and (prompt, rejected) as pofe's reward model reads them."""
    from pofe.loops.rm.reward_model import rm_text

    n = [len(tok(rm_text(tok, q.prompt, r), add_special_tokens=False)["input_ids"]) for r in (q.chosen, q.rejected)]
    return tuple(min(x, max_length) if max_length else x for x in n)


def dump_rows(command: str, n: int, max_length: int, steps: int, batch: int, out: Path, trl_out: Path) -> int:
    """The rows both sides train on, as pofe's loaders read them, kept only when they fit
    ``max_length`` (see the module docstring); ``trl_out`` holds them in pofe's batch order."""
    from pofe.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    if command == "sft":
        from pofe.data.sft import load_examples
        from pofe.loops.sft.step import batch_indices, tokenize_examples

        rows = [{"prompt": ex.prompt if isinstance(ex.prompt, str) else list(ex.prompt), "completion": ex.response}
                for ex in load_examples([SOURCES["sft"]], "ift", None)
                if tokenize_examples(tok, [ex], max_length)[0]][:n]
        order = [i for s in range(steps) for i in batch_indices(s, batch, len(rows), SEED)]
    else:
        from pofe.data.preferences import load_pairs
        from pofe.loops.rm.step import batch_schedule

        rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}
                for p in load_pairs(SOURCES["rm"], limit=4 * n + 64) if max(rm_lengths(tok, p)) <= max_length][:n]
        order = [i for b in batch_schedule(len(rows), batch, math.ceil(steps * batch / len(rows)), SEED, steps) for i in b]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trl_out.write_text("".join(json.dumps(rows[i]) + "\n" for i in order))
    return len(rows)


def pofe_side(command: str, rows: Path, steps: int, batch: int, max_length: int, bf16: bool, work: Path, *,
              model: str = "smollm2-135m-instruct", device: str = "auto") -> dict:
    """One pofe run in this process: the command's recipe on the driver, its ``step`` timed,
    the tokens of each step counted outside the timing. ``model``/``device``: another model
    folder on another device (benchmarks/device_check.py's random-weight Qwen2 shapes on CUDA)."""
    from pofe.recipe import drive

    precision = "bf16" if bf16 else "fp32"
    common = {"model": {"name": model, "device": device}, "optim": {"lr": 1e-5, "warmup_steps": 0, "schedule": "constant"},
              "log": {"progress": False}, "run": {"output_dir": str(work), "name": f"{command}-pofe"}, "seed": SEED}
    n_rows = sum(1 for _ in rows.open())
    if command == "sft":
        from pofe.loops.sft import SFTConfig as Cfg, SFTRecipe as Base
        from pofe.loops.sft.step import batch_indices

        cfg = Cfg.model_validate({**common, "data": {"ift": [str(rows)], "max_length": max_length},
                                  "train": {"steps": steps, "batch_size": batch, "grad_accum": 1, "precision": precision}})

        def lengths(recipe, step):
            return [len(t.prompt_ids) + len(t.response_ids) for t in (recipe.data[i] for i in batch_indices(step - 1, batch, len(recipe.data), SEED))]
    else:
        from pofe.loops.rm import RMConfig as Cfg, RMRecipe as Base

        cfg = Cfg.model_validate({**common, "data": {"train": [str(rows)], "eval_fraction": 0.0, "labels": "hard"},
                                  "max_length": max_length,
                                  "train": {"steps": steps, "batch_size": batch, "precision": precision,
                                            "epochs": math.ceil(steps * batch / n_rows)}})

        def lengths(recipe, step):
            pairs = [recipe.train[i] for i in recipe.schedule[step - 1]]
            return [x for q in pairs for x in rm_lengths(recipe.tokenizer, q, max_length)]
    times: list[float] = []
    tokens: list[tuple[int, int]] = []

    class Timed(Base):
        def step(self, step):
            t = time.perf_counter()
            row = super().step(step)
            times.append(time.perf_counter() - t)
            ls = lengths(self, step)
            tokens.append((sum(ls), len(ls) * max(ls)))
            return row

    drive(Timed(cfg))
    return summarise(times, tokens)


def summarise(times: list[float], tokens: list[tuple[int, int]]) -> dict:
    """Median seconds per step and mean tokens per step (real, padded), first step excluded."""
    return {"seconds_per_step": statistics.median(times[1:]), "steps": len(times),
            "tokens_per_step": round(statistics.mean(t[0] for t in tokens[1:])),
            "padded_tokens_per_step": round(statistics.mean(t[1] for t in tokens[1:])), "peak_rss_gb": peak_rss_gb()}


def run_side(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def show(r: int, side: str, x: dict) -> None:
    print(f"round {r + 1} {side:4s}: {x['seconds_per_step']:.3f} s/step  tokens/step {x['tokens_per_step']} "
          f"(padded {x['padded_tokens_per_step']})  {x['tokens_per_step'] / x['seconds_per_step']:.0f} tokens/s  "
          f"peak RSS {x['peak_rss_gb']} GB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--command", choices=["sft", "rm"], required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--bf16", action="store_true", help="pofe train.precision=bf16, TRL bf16=True")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round, 4 rows per step, max_length 256, 3 steps, both sides on a tiny random model")
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)  # internal: the model folder of both sides
    ap.add_argument("--side", choices=["pofe"], help=argparse.SUPPRESS)  # internal: one pofe run
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke and args.side is None:
        from machine import smoke_model

        args.rounds, args.batch, args.max_length, args.steps, args.rows = 1, 4, 256, 3, 12
        args.model = smoke_model()
    if args.side == "pofe":
        print(json.dumps(pofe_side(args.command, Path(args.data), args.steps, args.batch, args.max_length, args.bf16,
                                   Path(args.work), **({"model": args.model} if args.model else {}))))
        return
    if not TRL_PY.exists():
        sys.exit(f"TRL anchor environment not found at {TRL_PY}: bash ../shared/anchors/trl/setup.sh")
    print(cpu_line(), flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"pofe-{args.command}-vs-trl-"))
    rows, trl_rows = work / "rows.jsonl", work / "rows-trl-order.jsonl"
    kept = dump_rows(args.command, args.rows, args.max_length, args.steps, args.batch, rows, trl_rows)
    print(f"{kept} rows that fit max_length {args.max_length}; {args.steps} steps of {args.batch} rows", flush=True)
    flags = ["--steps", str(args.steps), "--batch", str(args.batch), "--max-length", str(args.max_length)]
    flags += ["--bf16"] if args.bf16 else []
    flags += ["--model", args.model] if args.model else []  # both sides: trl_train_side.py takes it too
    pofe_res, trl_res = [], []
    for r in range(args.rounds):
        w = work / f"round-{r}"
        w.mkdir()
        p = run_side([sys.executable, __file__, "--command", args.command, "--side", "pofe", "--data", str(rows),
                      "--work", str(w), *flags])
        show(r, "pofe", p)
        t = run_side([str(TRL_PY), str(HERE / "trl_train_side.py"), "--command", args.command, "--data", str(trl_rows),
                      "--work", str(w), *flags])
        show(r, "TRL", t)
        pofe_res.append(p), trl_res.append(t)
        shutil.rmtree(w, ignore_errors=True)  # a run folder holds the final model (~0.5 GB)
    shutil.rmtree(work, ignore_errors=True)
    print(paired_line(f"{args.command}{' bf16' if args.bf16 else ' fp32'}", pofe_res, trl_res))


if __name__ == "__main__":
    main()
