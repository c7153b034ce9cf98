#!/usr/bin/env python
"""The sides of ``benchmarks/device_check.py``'s paired runs, one per process (so each side's peak
memory is its own): each prints one JSON line, last.

    python benchmarks/device_sides.py pofe-online  --model DIR --prompts FILE --device cuda --steps 4 [--bf16]
    python benchmarks/device_sides.py trl-online   --model DIR --prompts FILE --device cuda --steps 4 [--bf16]
    python benchmarks/device_sides.py pofe-train --command sft|rm --model DIR --data ROWS --work DIR --device cuda [--bf16]

(TRL's SFTTrainer / RewardTrainer side is ``benchmarks/trl_train_side.py --model DIR --device``.)

Online DPO at the bar's shape on both sides: 4 prompts a step, two samples each drawn with HF
``generate`` (temperature 0.9), a pairwise LLM judge on the same model reading both orders,
sigmoid DPO with beta 0.1, AdamW lr 5e-7, bf16 autocast over fp32 weights with ``--bf16``. pofe's
side is ``benchmarks/online_step.py`` (``pofe online``, judge ``llm``); TRL's is its
``OnlineDPOTrainer`` with the judge wrapped as a reward function, as TRL >= 1.1 takes only
pointwise ``reward_funcs`` (a preference p for the first sample, 1 - p for the second).
Seconds per step: the median without the first step; peak GPU memory: ``max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true", "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
    os.environ.setdefault(_k, _v)

JUDGE_PROMPT = ("Which response answers the request better?\n\nRequest: {prompt}\n\nResponse 1: {a}\n\n"
                "Response 2: {b}\n\nAnswer with 1 or 2 only.")


def peak_rss_gb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def peak_gpu_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def prompts_of(path: str) -> list[str]:
    return [json.loads(x)["prompt"] for x in Path(path).read_text().splitlines() if x.strip()]


class BothOrdersJudge:
    """P(first response better) from the next-token probabilities of "1" and "2" under the chat
    template, read in both orders and averaged (pofe's llm judge reads both orders too)."""

    def __init__(self, model_dir: str, device: str, dtype):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval().requires_grad_(False)
        self.device = device
        self.ids = [self.tok.encode(c, add_special_tokens=False)[-1] for c in ("1", "2")]

    def p_first(self, prompts, firsts, seconds) -> list[float]:
        texts = [self.tok.apply_chat_template([{"role": "user", "content": JUDGE_PROMPT.format(prompt=p, a=a, b=b)}],
                                              tokenize=False, add_generation_prompt=True)
                 for p, a, b in zip(prompts, firsts, seconds)]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with self.torch.inference_mode():
            last = self.model(**enc).logits[:, -1, :]
        return self.torch.softmax(last[:, self.ids].float(), dim=-1)[:, 0].tolist()

    def __call__(self, prompts, pairs) -> list[float]:
        a, b = [x for x, _ in pairs], [y for _, y in pairs]
        p = self.p_first(prompts * 2, a + b, b + a)
        n = len(pairs)
        return [0.5 * (p[i] + 1.0 - p[n + i]) for i in range(n)]


def trl_online(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    dtype = torch.bfloat16 if a.bf16 else torch.float32
    tok = AutoTokenizer.from_pretrained(a.model)
    policy = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    judge = BothOrdersJudge(a.model, a.device, dtype)
    text = lambda x: x[-1]["content"] if isinstance(x, list) else x  # noqa: E731

    def pairwise_judge_reward(prompts, completions, **kw):  # the two samples of a prompt: first half, second half
        n = len(prompts) // 2
        p = judge([text(x) for x in prompts[:n]], list(zip(map(text, completions[:n]), map(text, completions[n:]))))
        return p + [1.0 - x for x in p]

    times, t0 = [], [0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            t0[0] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if a.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0[0])

    cfg = OnlineDPOConfig(output_dir=str(Path(a.work) / "trl-online"), per_device_train_batch_size=4,
                          gradient_accumulation_steps=1, max_steps=a.steps, learning_rate=5e-7, beta=0.1,
                          loss_type="sigmoid", max_new_tokens=a.max_new_tokens, temperature=0.9, logging_steps=1,
                          save_strategy="no", report_to="none", bf16=a.bf16, use_cpu=a.device == "cpu",
                          gradient_checkpointing=False, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts_of(a.prompts)])
    trainer = OnlineDPOTrainer(model=policy, reward_funcs=pairwise_judge_reward, args=cfg, processing_class=tok,
                               train_dataset=ds, callbacks=[Timer()])
    trainer.train()
    return {"seconds_per_step": statistics.median(times[1:] or times), "steps": len(times), "peak_gpu_gib": peak_gpu_gib(),
            "peak_rss_gb": peak_rss_gb()}


def pofe_online(a) -> dict:
    sys.path.insert(0, str(HERE))
    import online_step

    argv = ["--model", a.model, "--device", a.device, "--judge", "llm", "--steps", str(a.steps), "--prompts", a.prompts,
            "--set", f"sampling.max_new_tokens={a.max_new_tokens}", "--set", "log.progress=false"]
    if a.bf16:
        argv += ["--precision", "bf16", "--judge-dtype", "bfloat16"]
    r = online_step.main(argv)
    # online_step's step time is the wall time between metrics rows (step 1 excluded), as TRL's is
    return {"seconds_per_step": r["seconds_per_step"], "steps": r["steps"], "peak_gpu_gib": peak_gpu_gib(),
            "peak_rss_gb": r["peak_rss_gb"], "time_split_s": r["time_split_s"]}


def pofe_train(a) -> dict:
    sys.path.insert(0, str(HERE))
    from train_vs_trl import pofe_side

    r = pofe_side(a.command, Path(a.data), a.steps, a.batch, a.max_length, a.bf16, Path(a.work), model=a.model,
                  device=a.device)
    return {**r, "peak_gpu_gib": peak_gpu_gib()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("side", choices=["pofe-online", "trl-online", "pofe-train"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", help="online: a JSON Lines file of {'prompt': ...}")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--command", choices=["sft", "rm"])
    ap.add_argument("--data", help="pofe-train: the rows")
    ap.add_argument("--work", default="/tmp/pofe-device-sides")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=512)
    a = ap.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    r = {"pofe-online": pofe_online, "trl-online": trl_online, "pofe-train": pofe_train}[a.side](a)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
