"""Train TRL 1.16 on a pofe export, in a fresh process (run by tests/data/test_export.py).

Why a separate process: a TRL/transformers Trainer leaves process-wide state behind (accelerate
singletons, compiled-kernel caches) that changed the floating-point results of pofe tests run
after it in the same process. Prints one JSON line: global step and logged losses.

    python _trl_consumer.py dpo|reward DATA(jsonl or save_to_disk folder) OUT_DIR
"""

import json
import sys

import torch

torch.set_num_threads(1)


def main(kind: str, data: str, out: str) -> None:
    import datasets
    import trl  # in the test extra: an import error here is a broken test environment

    from pofe.models import load_tokenizer, tiny_causal_lm

    tok = load_tokenizer()
    ds = (datasets.load_dataset("json", data_files=data, split="train") if data.endswith(".jsonl")
          else datasets.load_from_disk(data))
    if kind == "dpo":
        args = trl.DPOConfig(output_dir=out, max_steps=2, per_device_train_batch_size=2, report_to=[], use_cpu=True,
                             save_strategy="no", logging_steps=1, max_length=64)
        trainer = trl.DPOTrainer(model=tiny_causal_lm(tok), ref_model=tiny_causal_lm(tok), args=args, train_dataset=ds,
                                 processing_class=tok)
    else:
        from transformers import LlamaForSequenceClassification

        config = tiny_causal_lm(tok).config
        config.num_labels = 1
        args = trl.RewardConfig(output_dir=out, max_steps=2, per_device_train_batch_size=2, report_to=[], use_cpu=True,
                                save_strategy="no", logging_steps=1, max_length=64)
        trainer = trl.RewardTrainer(model=LlamaForSequenceClassification(config), args=args, train_dataset=ds,
                                    processing_class=tok)
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(json.dumps({"global_step": result.global_step, "losses": losses, "columns": ds.column_names}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
