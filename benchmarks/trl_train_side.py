#!/usr/bin/env python
"""The TRL side of ``benchmarks/train_vs_trl.py``: TRL 1.16's ``SFTTrainer`` or ``RewardTrainer``
on the rows pofe's loader wrote, in the TRL anchor's venv (``../shared/anchors/trl/setup.sh``),
on its fp32 SmolLM2-135M-Instruct copy (the same GGUF pofe converts). Prints one JSON line:
median seconds per optimiser step (first step excluded) and peak RSS.

Settings matched to pofe's side: full fine-tuning, AdamW, constant lr 1e-5 without warm-up, 8
rows per step, max_length 512, no gradient checkpointing (TRL's default turns it on, pofe never
does), no checkpoints, no evaluation, one data-loader process. The rows come in pofe's batch
order and are read sequentially, so step k holds pofe's step-k rows; the tokens of every step
(attention-mask sum, and the padded batch size) are counted in ``compute_loss``.
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


def chat(text, role):
    return [{"role": role, "content": text}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", choices=["sft", "rm"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--model", default=str(ANCHOR / "smol135"), help="model folder (default: the anchor's SmolLM2 copy)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    rows = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
    model_dir = args.model
    tok = AutoTokenizer.from_pretrained(model_dir)
    times, t0, tokens = [], [0.0], []

    def counted(cls):
        class Counted(cls):
            def compute_loss(self, model, inputs, *a, **kw):
                if model.training:
                    tokens.append((int(inputs["attention_mask"].sum()), int(inputs["attention_mask"].numel())))
                return super().compute_loss(model, inputs, *a, **kw)
        return Counted

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            t0[0] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - t0[0])

    common = dict(output_dir=str(Path(args.work) / f"trl-{args.command}"), per_device_train_batch_size=args.batch,
                  gradient_accumulation_steps=1, max_steps=args.steps, learning_rate=1e-5, lr_scheduler_type="constant",
                  warmup_steps=0, use_cpu=args.device == "cpu", bf16=args.bf16, logging_steps=1, save_strategy="no", report_to=[],
                  max_length=args.max_length, gradient_checkpointing=False, dataloader_num_workers=0, seed=0,
                  train_sampling_strategy="sequential")
    if args.command == "sft":
        from trl import SFTConfig, SFTTrainer

        ds = Dataset.from_list([{"prompt": p if isinstance(p, list) else chat(p, "user"),
                                 "completion": chat(r["completion"], "assistant")} for r in rows for p in [r["prompt"]]])
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
        trainer = counted(SFTTrainer)(model=model, args=SFTConfig(**common), train_dataset=ds, processing_class=tok,
                             callbacks=[Timer()])
    else:
        from trl import RewardConfig, RewardTrainer

        ds = Dataset.from_list([{"prompt": chat(r["prompt"], "user") if isinstance(r["prompt"], str) else r["prompt"],
                                 "chosen": chat(r["chosen"], "assistant"), "rejected": chat(r["rejected"], "assistant")}
                                for r in rows])
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype="float32")
        model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        trainer = counted(RewardTrainer)(model=model, args=RewardConfig(**common), train_dataset=ds, processing_class=tok,
                                callbacks=[Timer()])
    trainer.train()
    print(json.dumps({"seconds_per_step": statistics.median(times[1:]), "steps": len(times),
                      "tokens_per_step": round(statistics.mean(t[0] for t in tokens[1:])),
                      "padded_tokens_per_step": round(statistics.mean(t[1] for t in tokens[1:])),
                      "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                      **({"peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3)} if args.device == "cuda" else {})}))


if __name__ == "__main__":
    main()
