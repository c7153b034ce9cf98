"""Judge throughput and position bias of the embedded model. Prints JSON.

* throughput: pairs/s (each pair = both orders) of the in-process transformers backend and
  of the llama.cpp backend (xllamacpp server on 127.0.0.1) on the same pairs, cache off,
  model load / server start excluded and reported separately;
* position bias on human preference pairs from ../shared/data/hh-rlhf (helpful-base test):
  consistency rate, first-position win rate, and agreement with the human choice.
  The prompt is the shared transcript up to the last "Assistant:" turn; the responses are
  the two final replies. Rows are taken in file order among those whose chosen+rejected
  transcripts are under --max-chars (to bound CPU time); A/B sides are shuffled (seeded).

    .venv/bin/python benchmarks/judge_throughput.py                       # defaults
    .venv/bin/python benchmarks/judge_throughput.py --pairs 250 --throughput-pairs 24 --hh-backend llamacpp
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HH = ROOT.parent / "shared" / "data" / "hh-rlhf" / "helpful-base" / "test.jsonl.gz"
SEP = "\n\nAssistant:"


def hh_pairs(n: int, max_chars: int, seed: int):
    """(prompt, A, B, a_is_chosen) from HH-RLHF transcripts."""
    rng = random.Random(seed)
    out = []
    with gzip.open(HH, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            ch, rj = r["chosen"], r["rejected"]
            if len(ch) + len(rj) > max_chars:
                continue
            i, k = ch.rfind(SEP), rj.rfind(SEP)
            if i < 0 or ch[:i] != rj[:k]:
                continue  # the two transcripts must share everything but the last reply
            prompt = ch[:i].strip()
            c, w = ch[i + len(SEP):].strip(), rj[k + len(SEP):].strip()
            if not c or not w or c == w:
                continue
            if rng.random() < 0.5:
                out.append((prompt, c, w, True))
            else:
                out.append((prompt, w, c, False))
            if len(out) >= n:
                break
    return out


def throughput(judge, pairs) -> dict:
    P, A, B = [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]
    t0 = time.perf_counter()
    vs = judge.judge(P, A, B)
    s = time.perf_counter() - t0
    toks = sum(v.tokens for v in vs)
    return {"pairs": len(pairs), "seconds": round(s, 2), "pairs_per_s": round(len(pairs) / s, 3),
            "judge_tokens": toks, "tokens_per_s": round(toks / s, 1)}, vs


def bias_report(vs, pairs) -> dict:
    from pofe.judges import summarize_judgments

    s = summarize_judgments(vs)
    agree = [((v.p > 0.5) == a_chosen) if v.p != 0.5 else 0.5 for v, (_, _, _, a_chosen) in zip(vs, pairs) if v.p is not None]
    keep = ("n", "n_labelled", "mean_p", "consistency_rate", "first_position_win_rate", "parse_failures")
    out = {k: s[k] for k in keep}
    out["human_agreement"] = round(sum(float(x) for x in agree) / len(agree), 4) if agree else None
    out["mean_choice_mass"] = round(sum(m for v in vs for m in v.extra["choice_mass"] if m is not None)
                                    / max(1, sum(1 for v in vs for m in v.extra["choice_mass"] if m is not None)), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=250, help="hh-rlhf pairs for the position-bias numbers")
    ap.add_argument("--throughput-pairs", type=int, default=24)
    ap.add_argument("--max-chars", type=int, default=1500)
    ap.add_argument("--template", default="helpful")
    ap.add_argument("--hh-backend", choices=["llamacpp", "transformers", "both"], default="llamacpp")
    ap.add_argument("--llamacpp-threads", type=int, default=None)
    ap.add_argument("--torch-threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model on the transformers backend only (llama.cpp serves the embedded GGUF), 2 pairs")
    args = ap.parse_args()
    model_name = "smollm2-135m-instruct"
    if args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from machine import smoke_model

        model_name, args.pairs, args.throughput_pairs, args.hh_backend = smoke_model(), 2, 2, "transformers"
    if not HH.exists():
        print(json.dumps({"error": f"{HH} not found (needs ../shared/data)"}))
        sys.exit(1)
    import torch

    from pofe.judges import build_judge
    from pofe.judges.config import LlamaCppJudgeConfig, LLMJudgeConfig
    from pofe.models import load_model

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    pairs = hh_pairs(max(args.pairs, args.throughput_pairs), args.max_chars, args.seed)
    tp_pairs = pairs[: args.throughput_pairs]
    result: dict = {"model": model_name, "template": args.template, "cpu_threads_torch": torch.get_num_threads(),
                    "hh_pairs_available": len(pairs), "max_chars": args.max_chars}
    off = {"enabled": False}

    t0 = time.perf_counter()
    model, tok = load_model(model_name)
    result["transformers_load_s"] = round(time.perf_counter() - t0, 2)
    tj = build_judge(LLMJudgeConfig(template=args.template, cache=off), model=model, tokenizer=tok)
    result["transformers"], tv = throughput(tj, tp_pairs)

    if not args.smoke:  # llama.cpp serves the embedded GGUF, not the smoke model
        lc = {"n_parallel": 2} | ({"n_threads": args.llamacpp_threads} if args.llamacpp_threads else {})
        lj = build_judge(LlamaCppJudgeConfig(template=args.template, cache=off, llamacpp=lc))
        t0 = time.perf_counter()
        lj.judge(["warm-up"], ["a"], ["b"])
        result["llamacpp_start_s"] = round(time.perf_counter() - t0, 2)
        result["llamacpp"], lv = throughput(lj, tp_pairs)
        result["llamacpp"]["threads"] = lj.backend.server.threads
        diffs = [abs(a.p_ab - b.p_ab) for a, b in zip(lv, tv)] + [abs(a.p_ba - b.p_ba) for a, b in zip(lv, tv)]
        result["llamacpp_vs_transformers_max_abs_diff_per_order"] = round(max(diffs), 4)

    hh = pairs[: args.pairs]
    P, A, B = [p[0] for p in hh], [p[1] for p in hh], [p[2] for p in hh]
    if args.hh_backend in ("llamacpp", "both"):
        t0 = time.perf_counter()
        vs = lv + lj.judge(P[len(lv):], A[len(lv):], B[len(lv):])
        result["hh_rlhf_llamacpp"] = bias_report(vs, hh) | {"seconds": round(time.perf_counter() - t0, 1)}
    if not args.smoke:
        lj.close()
    if args.hh_backend in ("transformers", "both"):
        t0 = time.perf_counter()
        vs = tv + tj.judge(P[len(tv):], A[len(tv):], B[len(tv):])
        result["hh_rlhf_transformers"] = bias_report(vs, hh) | {"seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
