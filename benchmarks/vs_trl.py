"""pofe's online step vs TRL's OnlineDPOTrainer, paired back to back (pofe, TRL, pofe, TRL, ...).

Both sides run the bar config of ``benchmarks/online_step.py`` (SmolLM2-135M policy and a
both-order SmolLM2 annotator, 4 prompts x 2 samples, 48 new tokens, DPO beta 0.1, 6 steps,
first excluded) on the same prompts (``../shared/anchors/trl/bench_prompts.jsonl``). Machines
and load change absolute times, not the ratio of a paired run, so report medians of rounds.

    python benchmarks/vs_trl.py --rounds 2 --pofe="--precision bf16 --judge-dtype bfloat16" --trl=--bf16
    python benchmarks/vs_trl.py --smoke    # 1 round, 2 steps; pofe on a tiny random model (online_step.py --smoke)

Needs the TRL anchor environment: ``bash ../shared/anchors/trl/setup.sh`` (once).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANCHOR = HERE.parent.parent / "shared" / "anchors" / "trl"
TRL_PY = Path(os.environ.get("TRL_ANCHOR_DIR", Path.home() / ".cache" / "pofe-trl-anchor")) / "venv" / "bin" / "python"


def run_pofe(extra: str, steps: int) -> dict:
    cmd = [sys.executable, str(HERE / "online_step.py"), "--judge", "llm", "--steps", str(steps), "--json",
           "--prompts", str(ANCHOR / "bench_prompts.jsonl"), *shlex.split(extra)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    # the summary is the last thing printed, json.dumps(indent=2): its "{" is the last one that opens
    # a line (vLLM logs its own "{...}" config to stdout before it)
    return json.loads(out[out.rindex("\n{") + 1:] if "\n{" in out else out[out.index("{"):])


def run_trl(extra: str, steps: int, script: Path = ANCHOR / "trl_bench.py", allocator: str = "glibc") -> dict:
    """One TRL run; ``script``: the anchor's trl_bench.py, or a wrapper that takes its arguments
    and prints its result lines (``benchmarks/trl_online_shape.py``, other batch shapes).
    ``allocator="tcmalloc"``: TRL with the tcmalloc that pofe preloads (same library, LD_PRELOAD)."""
    cmd = [str(TRL_PY), str(script), "--loss-types", "sigmoid", "--judge", "llm", "--both-orders",
           "--steps", str(steps), *shlex.split(extra)]
    env = dict(os.environ)
    if allocator == "tcmalloc":
        from pofe.preload import tcmalloc_library

        lib = tcmalloc_library()
        if lib is None:
            sys.exit("--trl-allocators tcmalloc: no tcmalloc on this machine (apt-get install libtcmalloc-minimal4)")
        env["LD_PRELOAD"] = lib
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("TRL_ONLINE_DPO_S_PER_STEP="):
            res["seconds_per_step"] = float(line.split("=", 1)[1])
        elif line.startswith("TRL_ONLINE_DPO_PEAK_RSS_MB_SIGMOID="):
            res["peak_rss_gb"] = round(float(line.split("=", 1)[1]) / 1024, 2)
        elif line.startswith("RESULT sigmoid: "):
            res["detail"] = json.loads(line.split(": ", 1)[1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pofe", default="", help="extra arguments for benchmarks/online_step.py")
    ap.add_argument("--trl", default="", help="extra arguments for trl_bench.py (e.g. --bf16)")
    ap.add_argument("--trl-allocators", default="glibc",
                    help="comma-separated: glibc (TRL as it ships), tcmalloc (TRL with the tcmalloc pofe preloads); "
                         "each round runs TRL once per allocator, after pofe")
    ap.add_argument("--smoke", action="store_true",
                    help="1 round of 2 steps of 2 prompts x 4 new tokens; pofe: online_step.py --smoke (a tiny random "
                         "model); TRL: trl_online_shape.py on the anchor's model ($TRL_ANCHOR_DIR: tests point it at a "
                         "tiny one)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.pofe = 1, 2, f"{args.pofe} --smoke"
    allocators = [a.strip() for a in args.trl_allocators.split(",") if a.strip()]
    if not allocators or set(allocators) - {"glibc", "tcmalloc"}:
        sys.exit(f"--trl-allocators: glibc and/or tcmalloc, got {args.trl_allocators!r}")
    if not TRL_PY.exists():
        sys.exit(f"TRL anchor venv not found at {TRL_PY}: run bash {ANCHOR / 'setup.sh'} first")
    pofe, trl = [], {a: [] for a in allocators}
    for r in range(args.rounds):
        p = run_pofe(args.pofe, args.steps)
        pofe.append(p)
        print(f"round {r + 1} pofe: {p['seconds_per_step']} s/step  split {p.get('time_split_s')}  "
              f"peak RSS {p.get('peak_rss_gb')} GB  allocator {p.get('allocator', 'glibc')}", flush=True)
        for a in allocators:
            t = (run_trl(f"{args.trl} --batch 2 --max-new-tokens 4", args.steps, HERE / "trl_online_shape.py", a)
                 if args.smoke else run_trl(args.trl, args.steps, allocator=a))  # smoke: TRL at pofe's smoke shape
            trl[a].append(t)
            print(f"round {r + 1} TRL ({a}): {t.get('seconds_per_step')} s/step  peak RSS {t.get('peak_rss_gb')} GB  "
                  f"ratio {t['seconds_per_step'] / p['seconds_per_step']:.2f}x", flush=True)
    mp = statistics.median(x["seconds_per_step"] for x in pofe)
    for a in allocators:
        mt = statistics.median(x["seconds_per_step"] for x in trl[a])
        print(f"pofe [{args.pofe}] median {mp:.2f} s/step | TRL ({a}) [{args.trl}] median {mt:.2f} s/step | "
              f"speed-up {mt / mp:.2f}x over {args.rounds} paired rounds")


if __name__ == "__main__":
    main()
