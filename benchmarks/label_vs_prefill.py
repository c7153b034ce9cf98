"""``pofe label`` with an in-process vLLM judge vs the limit: the same judge prompts' bare vLLM
prefill throughput, in one process on one engine, paired (pofe, bare, pofe, bare, ...).

pofe side: ``pofe label`` on ``--pairs`` HH-RLHF helpful pairs (``data.pairs``, so nothing is
sampled), judge ``kind: vllm`` on the embedded SmolLM2 with label's default template (the
``constitution`` template under one sampled ``hhh`` principle), both orders, a fresh judge
cache per round (a cold cache: its lookups and writes are part of the cost), ``--batch`` pairs
per step. Each step's wall time is timed (the recipe's ``step``: rendering, tokenising, the
cache, the engine call(s), the probability arithmetic and the labels.jsonl rows).

Bare side: every ``generate`` call the judge made for its main read (``max_tokens=1``,
``logprobs=top_k``: one prefill and one decoded position per request) replayed on the same
engine's ``vllm.LLM`` with the recorded token ids (``TokensPrompt``) and the recorded
``SamplingParams``: what vLLM does for those prompts with no pofe around it. The prefix cache
is reset before each side so neither reuses the other's KV blocks.

Tokens/s = the prompt tokens of those main reads / seconds, over steps 2.. (step 1 starts the
engine and is excluded on both sides); ratio = pofe / bare (target >= 0.8). pofe's exact reads
(a choice spelling outside the top-k, read from prompt log-probs in a second prefill) count as
pofe time, not tokens.

    python benchmarks/label_vs_prefill.py --pairs 96 --batch 16 --rounds 2
    python benchmarks/label_vs_prefill.py --smoke                 # a tiny random judge, 8 pairs, 4 per step, 1 round
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from machine import cpu_line, peak_rss_gb


def write_pairs(n: int, out: Path) -> None:
    from pofe.data.preferences import load_pairs

    rows = [{"prompt": q.prompt, "chosen": q.chosen, "rejected": q.rejected} for q in load_pairs("hh-rlhf:helpful", limit=n)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


class Recorder:
    """Wraps ``Engine.generate`` to record each call's token ids and params, tagged by label step."""

    def __init__(self):
        from pofe.generation import vllm as pv

        self.pv, self.orig, self.calls, self.step, self.engine = pv, pv.Engine.generate, [], 0, None
        rec = self

        def generate(engine, prompts, params, lora_request=None):
            rec.engine = engine
            ids = [list(p) for p in prompts]
            t = time.perf_counter()
            out = rec.orig(engine, prompts, params, lora_request=lora_request)
            rec.calls.append((rec.step, ids, params, time.perf_counter() - t))
            return out

        pv.Engine.generate = generate

    def main_reads(self, first_step: int) -> list[tuple[list[list[int]], object]]:
        """The judge's main reads (not the exact reads, which ask for prompt log-probs) from ``first_step`` on."""
        return [(ids, p) for s, ids, p, _ in self.calls if s >= first_step and p.prompt_logprobs is None]

    def engine_seconds(self, first_step: int, exact: bool) -> float:
        """Seconds inside ``Engine.generate`` for the main reads (``exact`` False) or the exact reads."""
        return sum(t for s, _, p, t in self.calls if s >= first_step and (p.prompt_logprobs is not None) == exact)


def pofe_round(pairs: Path, batch: int, work: Path, rec: Recorder, sets: list[str]) -> dict:
    from pofe.config import load_config
    from pofe.loops.label import LabelConfig, LabelRecipe
    from pofe.recipe import drive

    cfg = load_config(LabelConfig, None, [
        f"data.pairs={pairs}", f"train.batch_size={batch}", "judge.kind=vllm", "judge.model=smollm2-135m-instruct",
        "judge.template=constitution", "judge.constitution=hhh", f"judge.cache.path={work / 'judge-cache.sqlite'}",
        "log.progress=false", f"run.output_dir={work}", "run.name=label-vllm", *sets])
    times: list[float] = []
    rec.calls.clear()

    class Timed(LabelRecipe):
        def step(self, step):
            rec.step = step
            if rec.engine is not None:
                rec.engine.llm.reset_prefix_cache()
            t = time.perf_counter()
            row = super().step(step)
            times.append(time.perf_counter() - t)
            return row

    drive(Timed(cfg))
    reads = rec.main_reads(2)
    tokens = sum(len(x) for ids, _ in reads for x in ids)
    exact = sum(len(ids) for s, ids, p, _ in rec.calls if s >= 2 and p.prompt_logprobs is not None)
    main_s, exact_s = rec.engine_seconds(2, False), rec.engine_seconds(2, True)
    return {"seconds": sum(times[1:]), "steps": len(times), "prompt_tokens": tokens, "requests": sum(len(i) for i, _ in reads),
            "exact_reads": exact, "tokens_per_s": tokens / sum(times[1:]),
            "split_s": {"engine_main_reads": round(main_s, 2), "engine_exact_reads": round(exact_s, 2),
                        "outside_engine": round(sum(times[1:]) - main_s - exact_s, 2)}}


def bare_round(rec: Recorder) -> dict:
    """The recorded main reads on the bare ``vllm.LLM``: one ``generate`` per recorded call, as the judge batched them."""
    from vllm.inputs import TokensPrompt

    llm = rec.engine.llm
    reads = rec.main_reads(2)
    secs = 0.0
    for ids, params in reads:
        llm.reset_prefix_cache()  # as pofe's side: no KV blocks carried over from the step before
        t = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)
        secs += time.perf_counter() - t
    tokens = sum(len(x) for ids, _ in reads for x in ids)
    return {"seconds": secs, "prompt_tokens": tokens, "tokens_per_s": tokens / secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16, help="pairs per label step (train.batch_size)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a pofe label override after the benchmark's own (e.g. judge.vllm.kv_cache_tokens=16384)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random judge model, 8 pairs, 4 per step, 1 round")
    args = ap.parse_args()
    if args.smoke:
        from machine import smoke_model

        args.pairs, args.batch, args.rounds = 8, 4, 1
        args.sets = [f"judge.model={smoke_model()}", *args.sets]
    print(cpu_line(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="pofe-label-vs-prefill-"))
    pairs = work / "pairs.jsonl"
    write_pairs(args.pairs, pairs)
    rec = Recorder()
    pofe_res, bare_res = [], []
    try:
        for r in range(args.rounds):
            w = work / f"round-{r}"
            w.mkdir()
            p = pofe_round(pairs, args.batch, w, rec, args.sets)
            b = bare_round(rec)
            print(f"round {r + 1} pofe label: {p['prompt_tokens']} prompt tokens ({p['requests']} reads, {p['exact_reads']} "
                  f"exact reads) in {p['seconds']:.2f} s = {p['tokens_per_s']:.0f} tokens/s over steps 2..{p['steps']}; "
                  f"split {p['split_s']}", flush=True)
            print(f"round {r + 1} bare vLLM : {b['prompt_tokens']} prompt tokens in {b['seconds']:.2f} s = "
                  f"{b['tokens_per_s']:.0f} tokens/s", flush=True)
            pofe_res.append(p), bare_res.append(b)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mp = statistics.median(x["tokens_per_s"] for x in pofe_res)
    mb = statistics.median(x["tokens_per_s"] for x in bare_res)
    print(f"label vs bare prefill: pofe median {mp:.0f} tokens/s | bare vLLM median {mb:.0f} tokens/s | ratio {mp / mb:.2f} "
          f"(target >= 0.8) over {args.rounds} paired rounds | peak RSS (one process, both sides) {peak_rss_gb()} GB")


if __name__ == "__main__":
    main()
