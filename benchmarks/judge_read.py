"""Seconds of one vLLM judge read (4 pairs, both orders: 8 prefill requests of ~270 tokens) at a
KV block size: the prefix cache reuses whole blocks only (round-3 notes).

    python benchmarks/judge_read.py --block-size 32 [--no-prefix-cache] [--reads 3]
    python benchmarks/judge_read.py --smoke    # a tiny random model, 1 read: the script runs

Each read has new questions and new random responses, as in training; the first read (engine
warm-up) is not counted.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "anchors" / "trl" / "bench_prompts.jsonl"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-size", type=int, default=None, help="default: pofe's (32 on CPU)")
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--reads", type=int, default=3, help="at most 3 with the 16 bench prompts: a 4th repeats a question")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 1 read")
    args = ap.parse_args(argv)
    if args.smoke:
        from machine import smoke_model

        args.model, args.reads = smoke_model(), 1

    import pofe.generation.vllm as gv
    from pofe.judges.base import as_pairwise
    from pofe.judges.config import VLLMJudgeConfig
    from pofe.judges.registry import build_judge

    if args.no_prefix_cache:
        new_llm = gv.new_llm
        gv.new_llm = lambda vllm, **kw: new_llm(vllm, **kw, enable_prefix_caching=False)
    questions = ([json.loads(x)["prompt"] for x in PROMPTS.open()] if PROMPTS.exists()
                 else [f"Question number {i}: what is {i} times {i + 3}?" for i in range(64)])
    words = "the a cat dog runs quickly over lazy fox and then some words here".split()
    rng = random.Random(0)
    resp = lambda: " ".join(rng.choice(words) for _ in range(40))  # noqa: E731
    judge = as_pairwise(build_judge(VLLMJudgeConfig(model=args.model, cache={"enabled": False},
                                                    vllm={"max_model_len": 2048, "block_size": args.block_size})))
    times = []
    for i in range(args.reads + 1):
        q = [questions[(4 * i + k) % len(questions)] for k in range(4)]
        t = time.perf_counter()
        judge.judge(q, [resp() for _ in q], [resp() for _ in q])
        times.append(time.perf_counter() - t)
    print(f"block_size={args.block_size or 'default'} prefix_cache={not args.no_prefix_cache}: "
          f"{', '.join(f'{x:.3f}' for x in times[1:])} s per read (4 pairs, both orders)")


if __name__ == "__main__":
    main()
