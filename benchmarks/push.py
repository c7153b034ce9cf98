"""Seconds of one policy push into the in-process vLLM engine: the direct push
(``pofe.generation.direct_push``) against vLLM's ``reload_weights``, paired in one process.

Each round perturbs the embedded SmolLM2-135M policy, pushes it directly and reads the engine's
probe log-probs, then reloads the same weights and reads them again: the two must be identical (and
differ from the round before). Times include the fp32 -> engine-dtype casts and the prefix-cache reset.

    python benchmarks/push.py [--rounds 4]
    python benchmarks/push.py --smoke    # a tiny random model, 1 round: the script runs
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 1 round, eager engine (no compile)")
    args = ap.parse_args(argv)
    if args.smoke:
        from machine import smoke_model

        args.model, args.rounds = smoke_model(), 1

    import torch

    from pofe.generation import SamplingConfig
    from pofe.generation.vllm import generator_for
    from pofe.runtime import ModelConfig, load_policy

    from machine import cpu_line  # benchmarks/machine.py: the CPU, named with every number

    policy, tok = load_policy(ModelConfig(name=args.model))
    # a smoke run skips the graph compile (a minute on CPU): the push it measures is the same
    sampling = SamplingConfig(engine="vllm", vllm={"enforce_eager": args.smoke, "max_num_seqs": 16,
                                                   "max_num_batched_tokens": 1024})
    gen = generator_for(policy, tok, sampling)
    gen.generate(["Hello there"], n=2, sampling=sampling)  # start-up and the first (checked) push
    eng = gen.engine
    if not (eng.can_direct and eng.direct_verified):
        raise SystemExit("the direct push is not in use on this engine (see the warnings above)")

    def push(direct: bool) -> float:
        eng.can_direct = direct
        t = time.perf_counter()
        eng.load_full(gen._full_weights(), gen._want())
        return time.perf_counter() - t

    times = {"direct": [], "reload": []}
    previous = eng._probe()
    for _ in range(args.rounds):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1e-3 * torch.randn_like(p))
        times["direct"].append(push(True))
        got = eng._probe()
        times["reload"].append(push(False))
        want = eng._probe()
        if got != want or got == previous:
            raise SystemExit("the direct push's probe log-probs differ from the reload's (or did not move)")
        previous = want
    eng.can_direct = True
    print(cpu_line())
    for k, ts in times.items():
        print(f"{k:6s} median {statistics.median(ts):.3f} s  ({', '.join(f'{x:.2f}' for x in ts)})")
    print("probe log-probs identical after both pushes in every round")


if __name__ == "__main__":
    main()
