"""Cost curves of ``pofe online``'s best setting and TRL's Online DPO: seconds per step and peak
RSS as the work grows, next to the bf16 FLOP floor of each point.

Axes, one varied at a time from the bar config (4 prompts x 2 samples x 48 new tokens):
prompts per step (4, 8, 16), samples per prompt (2, 4), new tokens (48, 128, 256). Each point
is paired (pofe, TRL, pofe, TRL, ...; medians of ``--rounds``) with ``benchmarks/vs_trl.py``'s
``run_pofe`` / ``run_trl``. pofe runs the flags of ``benchmarks/best-setting.txt`` (one line of
``benchmarks/online_step.py`` flags) when it exists, else the README's setting B (vLLM judge,
compiled vLLM generator, bf16 training); TRL runs ``--trl`` (default ``--bf16``, its best on
CPU) through ``benchmarks/trl_online_shape.py``. TRL's Online DPO always samples two
completions per prompt, so the samples axis has no TRL point beyond 2.

The floor of a point is the bf16 FLOPs of the work at that point that no implementation can
skip, over a bf16 matmul rate this script measures on this CPU (torch.matmul, 2048 x 2048, all
threads): 2·N FLOPs per forward token (N = policy parameters) and 3x that for forward +
backward. Each distinct token is counted once: generation prefills each prompt once and decodes
every sample's new tokens; the judge reads every comparison of a prompt's samples (the
round-robin of k samples, k(k−1)/2 pairs) in both orders, and since its template quotes the
request before the replies, the template and each prompt are counted once and each read adds
its two responses; the reference forward and the policy forward + backward run each prompt once
and its two trained responses (the packed pass). New tokens per sample are pofe's
measured mean at the point (the model may stop before the limit). Attention's quadratic term,
the judge instruction after the replies and the optimiser are left out: a lower bound, not an
estimate.

Writes ``benchmarks/curves.json`` and ``benchmarks/curves.png`` and prints a markdown table.

    python benchmarks/curves.py --rounds 2                 # the full grid (6 points; one round took 45 min on 2 cores)
    python benchmarks/curves.py --from-json benchmarks/curves.json   # no runs: floors, table and plot again
    python benchmarks/curves.py --smoke                    # the bar point only, 2 steps, 1 round, to a temp dir
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
import time
from pathlib import Path

from machine import cpu_line
from vs_trl import run_pofe, run_trl

HERE = Path(__file__).resolve().parent
BAR = {"prompts": 4, "samples": 2, "new_tokens": 48}
AXES = {"prompts": (4, 8, 16), "samples": (2, 4), "new_tokens": (48, 128, 256)}
SETTING_B = "--judge vllm --engine vllm --precision bf16 --set sampling.vllm.enforce_eager=false"
PROMPTS = HERE.parent.parent / "shared" / "anchors" / "trl" / "bench_prompts.jsonl"


def points(axes: dict[str, tuple[int, ...]]) -> list[dict]:
    """The bar point, then each axis's other values with the rest at the bar."""
    out = [{"axis": "bar", **BAR}]
    for axis, values in axes.items():
        out += [{"axis": axis, **{**BAR, axis: v}} for v in values if v != BAR[axis]]
    return out


def best_flags() -> str:
    f = HERE / "best-setting.txt"
    return f.read_text().strip() if f.exists() else SETTING_B


def bf16_gflops(n: int = 2048, reps: int = 8) -> float:
    """Measured bf16 matmul rate of this CPU (GFLOP/s, best of three timings of ``reps`` products)."""
    import torch

    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    torch.matmul(a, b)  # warm-up: oneDNN picks its kernel
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 * reps / best / 1e9


def token_sizes(model_name: str = "smollm2-135m-instruct") -> dict[str, float]:
    """Policy parameters, the mean chat-rendered prompt length and the judge template's own tokens."""
    import re

    from pofe.judges.base import render_chat
    from pofe.judges.templates import load_template
    from pofe.models import apply_chat_template, load_model

    model, tok = load_model(model_name)
    params = sum(p.numel() for p in model.parameters())
    del model
    prompts = [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]
    plen = statistics.mean(len(tok(apply_chat_template(tok, p), add_special_tokens=False)["input_ids"]) for p in prompts)
    t = load_template("helpful")
    empty = t.render({k: "" for k in set(re.findall(r"\{(\w+)\}", t.prompt))})
    judge = len(tok(render_chat(tok, empty), add_special_tokens=False)["input_ids"])
    return {"params": params, "prompt_tokens": plen, "judge_template_tokens": judge}


def floor(pt: dict, sizes: dict, new_tokens: float, gflops: float) -> dict:
    """Seconds of the bf16 FLOP floor of one step at ``pt`` (see the module docstring), per pass."""
    b, k, n, prompt = pt["prompts"], pt["samples"], sizes["params"], sizes["prompt_tokens"]
    reads = b * k * (k - 1)  # k(k-1)/2 pairs per prompt, both orders
    tokens = {"generate": b * (prompt + k * new_tokens),
              "judge": sizes["judge_template_tokens"] + b * prompt + reads * 2 * new_tokens,
              "reference": b * (prompt + 2 * new_tokens), "policy_fwd_bwd": b * (prompt + 2 * new_tokens)}
    flops = {name: 2 * n * t * (3 if name == "policy_fwd_bwd" else 1) for name, t in tokens.items()}
    split = {name: f / (gflops * 1e9) for name, f in flops.items()}
    return {"seconds": sum(split.values()), "split_s": {k2: round(v, 4) for k2, v in split.items()}}


def measure(pt: dict, rounds: int, steps: int, pofe_flags: str, trl_flags: str) -> dict:
    shape = (f" --set train.batch_size={pt['prompts']} --set train.samples_per_prompt={pt['samples']}"
             f" --set sampling.max_new_tokens={pt['new_tokens']}")
    pofe, trl = [], []
    for r in range(rounds):
        p = run_pofe(pofe_flags + shape, steps)
        pofe.append(p)
        print(f"  round {r + 1} pofe: {p['seconds_per_step']} s/step  peak RSS {p['peak_rss_gb']} GB", flush=True)
        if pt["samples"] == 2:  # TRL's Online DPO: two samples per prompt, always
            t = run_trl(f"{trl_flags} --batch {pt['prompts']} --max-new-tokens {pt['new_tokens']}", steps,
                        script=HERE / "trl_online_shape.py")
            trl.append(t)
            print(f"  round {r + 1} TRL : {t.get('seconds_per_step')} s/step  peak RSS {t.get('peak_rss_gb')} GB", flush=True)
    med = lambda xs, k: statistics.median(x[k] for x in xs) if xs else None  # noqa: E731
    gen = med(pofe, "gen_tokens_per_step")
    return {"pofe_s": med(pofe, "seconds_per_step"), "pofe_rss_gb": max(x["peak_rss_gb"] for x in pofe),
            "trl_s": med(trl, "seconds_per_step"), "trl_rss_gb": max(x["peak_rss_gb"] for x in trl) if trl else None,
            "pofe_new_tokens_per_sample": gen / (pt["prompts"] * pt["samples"]) if gen else pt["new_tokens"],
            "pofe_split_s": pofe[len(pofe) // 2].get("time_split_s")}


def table(rows: list[dict]) -> str:
    head = ("| varied | prompts | samples | new tokens | pofe s/step | TRL s/step | TRL / pofe | floor s/step "
            "| pofe / floor | pofe RSS GB | TRL RSS GB |\n|---|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f="{:.2f}": "n/a" if v is None else f.format(v)  # noqa: E731
    ratio = lambda a, b: fmt(a / b if a and b else None, "{:.2f}x")  # noqa: E731
    lines = [f"| {r['axis']} | {r['prompts']} | {r['samples']} | {r['new_tokens']} | {fmt(r['pofe_s'])} | {fmt(r['trl_s'])} "
             f"| {ratio(r['trl_s'], r['pofe_s'])} | {fmt(r['floor']['seconds'], '{:.3f}')} "
             f"| {ratio(r['pofe_s'], r['floor']['seconds'])} "
             f"| {fmt(r['pofe_rss_gb'])} | {fmt(r['trl_rss_gb'])} |" for r in rows]
    return "\n".join([head, *lines])


def plot(rows: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, len(AXES), figsize=(4.2 * len(AXES), 7), squeeze=False)
    bar = next(r for r in rows if r["axis"] == "bar")
    for j, axis in enumerate(AXES):
        pts = sorted([bar] + [r for r in rows if r["axis"] == axis], key=lambda r: r[axis])
        xs = [r[axis] for r in pts]
        for key, label, style in (("pofe_s", "pofe", "o-"), ("trl_s", "TRL", "s-")):
            got = [(x, r[key]) for x, r in zip(xs, pts) if r[key] is not None]
            if got:
                ax[0][j].plot(*zip(*got), style, label=label)
        ax[0][j].plot(xs, [r["floor"]["seconds"] for r in pts], "k--", label="bf16 FLOP floor")
        ax[0][j].set(xlabel=axis.replace("_", " "), ylabel="s / step", yscale="log", xticks=xs)
        for key, label, style in (("pofe_rss_gb", "pofe", "o-"), ("trl_rss_gb", "TRL", "s-")):
            got = [(x, r[key]) for x, r in zip(xs, pts) if r[key] is not None]
            if got:
                ax[1][j].plot(*zip(*got), style, label=label)
        ax[1][j].set(xlabel=axis.replace("_", " "), ylabel="peak RSS (GB)", xticks=xs)
        ax[0][j].legend(fontsize=8), ax[1][j].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="steps per run (the first is excluded as warm-up)")
    ap.add_argument("--pofe", default=None, help="online_step.py flags (default: best-setting.txt, else setting B)")
    ap.add_argument("--trl", default="--bf16", help="trl_bench.py flags")
    ap.add_argument("--out", default=None, help="folder for curves.json and curves.png (default: benchmarks/)")
    ap.add_argument("--smoke", action="store_true",
                    help="one point (2 prompts x 2 samples x 4 new tokens), 2 steps, 1 round, to a temp dir; pofe: "
                         "online_step.py --smoke (a tiny random model, hf engine and llm judge unless --pofe says "
                         "otherwise); TRL: the anchor's model ($TRL_ANCHOR_DIR: tests point it at a tiny one)")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="no runs: redo the floors, table and plot of a curves.json (its CPU's measured rate)")
    args = ap.parse_args()
    if args.from_json:
        replot(Path(args.from_json), Path(args.out) if args.out else None)
        return
    axes = {k: (BAR[k],) for k in AXES} if args.smoke else AXES
    smoke_model = None
    if args.smoke:
        from machine import smoke_model as make_smoke_model

        args.rounds, args.steps = 1, 2
        args.out = args.out or tempfile.mkdtemp(prefix="pofe-curves-")
        BAR.update(prompts=2, new_tokens=4)  # the one point of a smoke run
        axes = {k: (BAR[k],) for k in AXES}
        args.pofe = f"{args.pofe or ''} --smoke"
        smoke_model = make_smoke_model()
    out = Path(args.out) if args.out else HERE
    pofe_flags = args.pofe if args.pofe is not None else best_flags()
    shlex.split(pofe_flags)  # a bad quote fails here, not after an hour of runs
    cpu = cpu_line()
    print(cpu, flush=True)
    gflops = bf16_gflops(256, 2) if args.smoke else bf16_gflops()
    sizes = token_sizes(smoke_model) if args.smoke else token_sizes()
    print(f"bf16 matmul {gflops:.0f} GFLOP/s; policy {sizes['params'] / 1e6:.1f} M parameters; prompt "
          f"{sizes['prompt_tokens']:.1f} tokens, judge template {sizes['judge_template_tokens']} tokens", flush=True)
    print(f"pofe: {pofe_flags} | TRL: {args.trl}", flush=True)
    rows = []
    for pt in points(axes):
        print(f"point {pt}", flush=True)
        m = measure(pt, args.rounds, args.steps, pofe_flags, args.trl)
        rows.append({**pt, **m, "floor": floor(pt, sizes, m["pofe_new_tokens_per_sample"], gflops)})
    write(out, {"cpu": cpu, "bf16_gflops": round(gflops, 1), **sizes, "pofe_flags": pofe_flags, "trl_flags": args.trl,
                "rounds": args.rounds, "steps": args.steps, "points": rows})


def write(out: Path, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "curves.json").write_text(json.dumps(data, indent=2) + "\n")
    plot(data["points"], out / "curves.png", f"{data['cpu']}; pofe: {data['pofe_flags']}; TRL: {data['trl_flags']}")
    print(table(data["points"]))
    print(f"wrote {out / 'curves.json'} and {out / 'curves.png'}")


def replot(src: Path, out: Path | None) -> None:
    """The floors, table and plot of saved measurements, redone (same points, same CPU rate)."""
    data = json.loads(src.read_text())
    sizes = {k: data[k] for k in ("params", "prompt_tokens", "judge_template_tokens")}
    for r in data["points"]:
        r["floor"] = floor(r, sizes, r["pofe_new_tokens_per_sample"], data["bf16_gflops"])
    write(out or src.parent, data)


if __name__ == "__main__":
    main()
