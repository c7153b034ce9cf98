#!/usr/bin/env python
"""The TRL side of ``benchmarks/rl_vs_trl.py``: TRL 1.16's ``RLOOTrainer`` or ``GRPOTrainer`` in the
TRL anchor's venv (``../shared/anchors/trl/setup.sh``), on its fp32 SmolLM2-135M-Instruct copy
(the same GGUF pofe converts). Prints one JSON line: median seconds per optimiser step (first
step excluded), tokens generated per step and peak RSS.

Settings matched to pofe's side: the same prompts (chat-formatted: the chat template renders
them as pofe's sampler does), ``batch`` prompts x ``group`` samples per optimiser step (one
generation batch per step: ``steps_per_generation=1``, one pass over it: ``num_iterations=1``,
no accumulation), ``max_completion_length`` new tokens at the given temperature, top-p 1 and no
top-k, KL coefficient 0.05 (a reference model loaded on both sides: RLOO puts it in the reward,
GRPO in the loss, as pofe's ``kl_in`` does for each algo), AdamW, constant lr 1e-5 without
warm-up, no gradient checkpointing (pofe never does), no checkpoints, no evaluation, one
data-loader process. Generation is TRL's default: transformers ``generate`` (the anchor venv has
no vLLM). The reward is pofe's ``length`` reward with ``prefer: shorter, unit: chars``:
−len(text) / (4 · max_new_tokens), a plain function of the completion text.
"""

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true", "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
    os.environ.setdefault(_k, _v)

ANCHOR = Path(os.environ.get("TRL_ANCHOR_DIR", Path.home() / ".cache" / "pofe-trl-anchor"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", choices=["rloo", "grpo"], required=True)
    ap.add_argument("--prompts", required=True, help="jsonl with a 'prompt' field per line")
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()

    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    prompts = [json.loads(x)["prompt"] for x in Path(args.prompts).read_text().splitlines() if x.strip()]
    need = args.steps * args.batch  # every step new prompts, as pofe walks its prompt list
    rows = [{"prompt": [{"role": "user", "content": prompts[i % len(prompts)]}]} for i in range(need)]
    model_dir = str(ANCHOR / "smol135")
    tok = AutoTokenizer.from_pretrained(model_dir)
    times, t0, generated = [], [0.0], []

    def length_reward(completions, completion_ids, **kw):
        generated.append(sum(len(ids) for ids in completion_ids))
        text = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [-len(t) / (4 * args.max_new_tokens) for t in text]

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            t0[0] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - t0[0])

    common = dict(output_dir=str(Path(args.work) / f"trl-{args.algo}"), per_device_train_batch_size=args.batch * args.group,
                  num_generations=args.group, steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1,
                  max_completion_length=args.max_new_tokens, temperature=args.temperature, top_p=1.0, top_k=0,
                  beta=0.05, max_steps=args.steps, learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0,
                  use_cpu=True, bf16=args.bf16, logging_steps=1, save_strategy="no", report_to=[],
                  gradient_checkpointing=False, dataloader_num_workers=0, seed=0, shuffle_dataset=False,
                  model_init_kwargs={"dtype": "float32"})  # fp32 master weights; --bf16 is autocast, as pofe's
    if args.algo == "rloo":
        from trl import RLOOConfig as Config, RLOOTrainer as Trainer
    else:
        from trl import GRPOConfig as Config, GRPOTrainer as Trainer
    trainer = Trainer(model=model_dir, reward_funcs=length_reward, args=Config(**common),
                      train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[Timer()])
    trainer.train()
    print(json.dumps({"seconds_per_step": statistics.median(times[1:]), "steps": len(times),
                      "generated_tokens_per_step": round(statistics.mean(generated[1:])),
                      "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}))


if __name__ == "__main__":
    main()
