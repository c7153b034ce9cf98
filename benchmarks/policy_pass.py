"""Seconds of one DAP forward(+backward) on 4 pairs of the embedded SmolLM2-135M: the joint batch
vs the packed pass (each prompt once), SDPA vs eager attention, fp32 vs bf16 autocast (round-3 notes).

    python benchmarks/policy_pass.py [--precision bf16|fp32] [--no-grad] [--repeats 5] [--profile]
    python benchmarks/policy_pass.py --smoke    # a tiny random model, 1 repeat: the script runs, in seconds

Pairs are random token ids of the bar benchmark's sizes (prompts 36-46 tokens, responses 30 or
48); every variant runs on the same pairs, interleaved, after one warm-up each.
"""

from __future__ import annotations

import argparse
import random
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--no-grad", action="store_true", help="reference pass: forward only")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--malloc", action="store_true", help="pofe's glibc malloc tuning first (keep_freed_memory)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of one pass per variant")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 1 repeat")
    args = ap.parse_args(argv)
    if args.smoke:
        from machine import smoke_model

        args.model, args.repeats = smoke_model(), 1

    import torch

    from pofe.runtime import ModelConfig, load_policy
    from pofe.runtime.allocator import keep_freed_memory
    from pofe.loops.online.dap import TokenPair, pair_logps
    from pofe.runtime.precision import attention_for, autocast

    if args.malloc:
        keep_freed_memory()
    random.seed(0)
    policy, tok = load_policy(ModelConfig(name=args.model))
    policy.train()
    ids = lambda n: tuple(random.randrange(1000, 20000) for _ in range(n))  # noqa: E731
    pairs = [TokenPair(ids(random.randint(36, 46)), ids(48), ids(random.choice([30, 48]))) for _ in range(4)]

    def once(shared: bool, eager: bool) -> float:
        t = time.perf_counter()
        with autocast(args.precision, "cpu"), attention_for(policy, eager), torch.set_grad_enabled(not args.no_grad):
            lp = pair_logps(policy, pairs, tok.pad_token_id, "cpu", shared=shared)
        if not args.no_grad:
            lp.sum().backward()
            policy.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    variants = {f"{'packed' if s else 'joint'} {'eager' if e else 'sdpa'}": (s, e) for s in (False, True) for e in (False, True)}
    for v in variants.values():
        once(*v)
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, v in variants.items():
            times[k].append(once(*v))
    print(f"{args.precision} {'forward' if args.no_grad else 'forward+backward'}, 4 pairs, {torch.get_num_threads()} threads")
    for k, ts in times.items():
        print(f"  {k:13s} median {sorted(ts)[len(ts) // 2]:.3f} s  ({', '.join(f'{x:.2f}' for x in ts)})")
    if args.profile:
        from torch.profiler import profile

        for k, v in variants.items():
            with profile() as p:
                once(*v)
            print(k)
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
