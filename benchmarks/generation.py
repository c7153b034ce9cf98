"""Generation tokens/s of the ``hf`` and ``vllm`` engines, back to back in one run.

The embedded SmolLM2-135M-Instruct, the same chat-rendered prompts for both engines,
sampling at temperature 0.9, every sequence forced to the full length (HF
``min_new_tokens``, vLLM ``ignore_eos``) so both engines decode the same number of tokens;
tokens/s = batch x new tokens / wall seconds of one call, after one warm-up call per engine
(vLLM's first request pays a start-up cost). Batch 8/32/64 x 48/128 new tokens by default.

Needs vLLM (``scripts/setup.sh`` installs it where it can run); run from the repository root:

    python benchmarks/generation.py [--batches 8 32 64] [--new-tokens 48 128] [--hf-dtype float32]
        [--vllm-dtype bfloat16] [--threads N] [--json]

Numbers depend on the machine and its load: say which when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _prompts(n: int) -> list[str]:
    from pofe.data.prompts import load_prompts

    base = [p.text for p in load_prompts(None)]
    return [base[i % len(base)] for i in range(n)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="CUDA: vLLM's share, next to the HF copy")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[48, 128])
    ap.add_argument("--hf-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--vllm-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads for hf (default: torch's)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model, batch 2 x 4 new tokens; vLLM only when it imports")
    args = ap.parse_args(argv)
    if args.smoke:
        import importlib.util

        from machine import smoke_model

        args.model, args.batches, args.new_tokens = smoke_model(), [2], [4]
        args.engines = [e for e in args.engines if e == "hf" or importlib.util.find_spec("vllm") is not None]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep stdout for the numbers

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from pofe.generation.sampling import _render
    from pofe.models import load_model, resolve_model_path

    model, tok = load_model(args.model, dtype=args.hf_dtype, device=args.device)
    tok.padding_side = "left"
    prompts = [_render(tok, p) for p in _prompts(max(args.batches))]
    results: dict = {"model": args.model, "device": args.device, "hf_dtype": args.hf_dtype, "vllm_dtype": args.vllm_dtype,
                     "threads": torch.get_num_threads(), "runs": []}
    if not args.json:
        print(f"model={args.model} device={args.device} hf={args.hf_dtype} vllm={args.vllm_dtype} "
              f"threads={torch.get_num_threads()}", flush=True)

    def hf_call(batch: int, new: int) -> float:
        enc = tok(prompts[:batch], return_tensors="pt", padding=True, add_special_tokens=False).to(args.device)
        t0 = time.perf_counter()
        if args.device == "cuda":
            torch.cuda.synchronize()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=0.9,
                                 top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
        dt = time.perf_counter() - t0
        assert out.shape[1] - enc["input_ids"].shape[1] == new
        return dt

    llm = None
    if "vllm" in args.engines:
        import vllm
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from pofe.generation.vllm import new_llm

        t0 = time.perf_counter()
        kw = {"gpu_memory_utilization": args.gpu_memory_utilization} if args.device == "cuda" else {}
        llm = new_llm(vllm, model=resolve_model_path(args.model), dtype=args.vllm_dtype, max_model_len=1024,
                      enforce_eager=True, seed=0, **kw)  # keeps torch's thread count for the hf runs
        results["vllm_load_s"] = round(time.perf_counter() - t0, 1)
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def vllm_call(batch: int, new: int) -> float:
        sp = SamplingParams(temperature=0.9, top_p=1.0, top_k=0, max_tokens=new, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids[:batch]], sp, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == new for o in outs)
        return dt

    calls = {"hf": hf_call, "vllm": vllm_call}
    for eng in args.engines:
        calls[eng](min(args.batches), 8)  # warm-up
    for new in args.new_tokens:
        for batch in args.batches:
            row = {"batch": batch, "new_tokens": new}
            for eng in args.engines:  # back to back: same machine state for both engines
                dt = calls[eng](batch, new)
                row[f"{eng}_s"] = round(dt, 2)
                row[f"{eng}_tok_s"] = round(batch * new / dt, 1)
            if "hf" in args.engines and "vllm" in args.engines:
                row["speedup"] = round(row["vllm_tok_s"] / row["hf_tok_s"], 2)
            results["runs"].append(row)
            if not args.json:
                print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":  # the guard vLLM's spawned workers need
    sys.exit(0 if main() else 1)
