"""``pofe sft`` / ``pofe rm`` vs TRL's ``SFTTrainer`` / ``RewardTrainer``, paired back to back
(pofe, TRL, pofe, TRL, ...), each side in its own process so peak RSS is per run.

Both sides train the same model (SmolLM2-135M-Instruct, full fine-tuning, AdamW, constant
lr), on the same rows (read once by pofe's own loader and handed to TRL as prompt/completion
or prompt/chosen/rejected chat rows, so both see the same text), with the same batch (8 rows
per optimiser step, no accumulation), ``max_length`` 512, the same precision and steps; the
first step is excluded as warm-up. Step time is the wall time of one optimiser step (pofe: the
recipe's ``step``; TRL: the Trainer's ``on_step_begin`` -> ``on_step_end``).

    python benchmarks/train_vs_trl.py --command sft --rounds 2            # fp32
    python benchmarks/train_vs_trl.py --command rm --rounds 2 --bf16      # pofe train.precision=bf16, TRL --bf16

Caveat to settle before quoting a ratio: TRL's trainers drop or truncate rows longer than
``max_length`` their own way (pofe truncates the prompt side from the left), so long HH-RLHF
dialogues may give the two sides different token counts; compare tokens per step too.

Needs the TRL anchor environment: ``bash ../shared/anchors/trl/setup.sh`` (once). The TRL side
is ``benchmarks/trl_train_side.py``, run with the anchor's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
TRL_PY = Path(os.environ.get("TRL_ANCHOR_DIR", Path.home() / ".cache" / "pofe-trl-anchor")) / "venv" / "bin" / "python"
SOURCES = {"sft": str(DATA / "self-instruct" / "seed_tasks.jsonl"), "rm": "hh-rlhf:helpful"}


def dump_rows(command: str, n: int, out: Path) -> None:
    """The rows both sides train on, as pofe's loaders read them."""
    if command == "sft":
        from pofe.data.sft import load_examples

        rows = [{"prompt": ex.prompt if isinstance(ex.prompt, str) else list(ex.prompt), "completion": ex.response}
                for ex in load_examples([SOURCES["sft"]], "ift", n)]
    else:
        from pofe.data.preferences import load_pairs

        rows = [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in load_pairs(SOURCES["rm"], limit=n)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def pofe_side(command: str, rows: Path, steps: int, batch: int, bf16: bool, work: Path) -> dict:
    """One pofe run in this process: the command's recipe on the driver, its ``step`` timed."""
    from pofe.recipe import drive

    precision = "bf16" if bf16 else "fp32"
    common = {"model": {"name": "smollm2-135m-instruct"}, "optim": {"lr": 1e-5, "warmup_steps": 0, "schedule": "constant"},
              "log": {"progress": False}, "run": {"output_dir": str(work), "name": f"{command}-pofe"}}
    if command == "sft":
        from pofe.loops.sft import SFTConfig as Cfg, SFTRecipe as Base

        cfg = Cfg.model_validate({**common, "data": {"ift": [str(rows)], "max_length": 512},
                                  "train": {"steps": steps, "batch_size": batch, "grad_accum": 1, "precision": precision}})
    else:
        from pofe.loops.rm import RMConfig as Cfg, RMRecipe as Base

        cfg = Cfg.model_validate({**common, "data": {"train": [str(rows)], "eval_fraction": 0.0, "labels": "hard"},
                                  "max_length": 512,
                                  "train": {"steps": steps, "batch_size": batch, "precision": precision}})
    times: list[float] = []

    class Timed(Base):
        def step(self, step):
            t = time.perf_counter()
            row = super().step(step)
            times.append(time.perf_counter() - t)
            return row

    drive(Timed(cfg))
    return {"seconds_per_step": statistics.median(times[1:]), "steps": len(times),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def run_side(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--command", choices=["sft", "rm"], required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--bf16", action="store_true", help="pofe train.precision=bf16, TRL bf16=True")
    ap.add_argument("--side", choices=["pofe"], help=argparse.SUPPRESS)  # internal: one pofe run
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side == "pofe":
        print(json.dumps(pofe_side(args.command, Path(args.data), args.steps, args.batch, args.bf16, Path(args.work))))
        return
    if not TRL_PY.exists():
        sys.exit(f"TRL anchor environment not found at {TRL_PY}: bash ../shared/anchors/trl/setup.sh")
    work = Path(tempfile.mkdtemp(prefix=f"pofe-{args.command}-vs-trl-"))
    rows = work / "rows.jsonl"
    dump_rows(args.command, args.rows, rows)
    flags = ["--steps", str(args.steps), "--batch", str(args.batch)] + (["--bf16"] if args.bf16 else [])
    pofe_res, trl_res = [], []
    for r in range(args.rounds):
        w = work / f"round-{r}"
        w.mkdir()
        p = run_side([sys.executable, __file__, "--command", args.command, "--side", "pofe", "--data", str(rows),
                      "--work", str(w), *flags])
        print(f"round {r + 1} pofe: {p['seconds_per_step']:.3f} s/step  peak RSS {p['peak_rss_gb']} GB", flush=True)
        t = run_side([str(TRL_PY), str(HERE / "trl_train_side.py"), "--command", args.command, "--data", str(rows),
                      "--work", str(w), *flags])
        print(f"round {r + 1} TRL : {t['seconds_per_step']:.3f} s/step  peak RSS {t['peak_rss_gb']} GB", flush=True)
        pofe_res.append(p), trl_res.append(t)
    mp = statistics.median(x["seconds_per_step"] for x in pofe_res)
    mt = statistics.median(x["seconds_per_step"] for x in trl_res)
    print(f"{args.command}{' bf16' if args.bf16 else ' fp32'}: pofe median {mp:.3f} s/step | TRL median {mt:.3f} s/step | "
          f"speed-up {mt / mp:.2f}x over {args.rounds} paired rounds | peak RSS pofe "
          f"{max(x['peak_rss_gb'] for x in pofe_res)} GB, TRL {max(x['peak_rss_gb'] for x in trl_res)} GB")


if __name__ == "__main__":
    main()
