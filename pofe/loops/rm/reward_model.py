"""Reward-model plumbing shared by ``pofe rm`` (training), ``pofe rl`` and the
``reward-model`` judge (inference): how a (prompt, response) is rendered and scored, loading
a causal LM with a fresh scalar head (LoRA optional), a tiny random RM for tests, and the
held-out evaluation of reward margins.

The model is a sequence-classification head (``num_labels = 1``) on any causal LM; the reward
is read at the last non-padding token of the chat-rendered (prompt, response), and the model
is saved as a plain ``AutoModelForSequenceClassification`` directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pofe.records import PreferencePair
from pofe.runtime.model import ModelConfig, check_lora_targets, no_hub_lookup_at_save


def rm_text(tokenizer, prompt: str | Sequence[dict[str, str]], response: str) -> str:
    """How a (prompt, response) is shown to the reward model: the chat template with the
    response as the assistant turn after the prompt's turns (a conversation keeps its system
    message and earlier turns)."""
    from pofe.models import apply_chat_template

    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    return apply_chat_template(tokenizer, turns + [{"role": "assistant", "content": response}], add_generation_prompt=False)


def pair_prompt(q: PreferencePair) -> str | list[dict[str, str]]:
    """The prompt of a pair as the reward model reads it: its messages when it came as a conversation."""
    return [dict(m) for m in q.messages] if q.messages else q.prompt


def rewards(model, tokenizer, prompts: Sequence[str | Sequence[dict[str, str]]], responses: Sequence[str], *,
            max_length: int = 512) -> torch.Tensor:
    """(B,) rewards: the score head at the last non-padding token (transformers' sequence-
    classification pooling, which finds the rightmost non-pad token, so padding side and a
    trailing EOS do not matter as long as training and inference render the same way)."""
    old_side, old_trunc = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    try:
        enc = tokenizer([rm_text(tokenizer, x, y) for x, y in zip(prompts, responses)], return_tensors="pt", padding=True,
                        truncation=True, max_length=max_length, add_special_tokens=False)
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = old_side, old_trunc
    dev = next(model.parameters()).device
    out = model(input_ids=enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev))
    return out.logits[:, 0].float()


def pair_margins(model, tokenizer, pairs: Sequence[PreferencePair], *, max_length: int = 512) -> torch.Tensor:
    """Δr = r(x, chosen) − r(x, rejected) for a batch of pairs (one forward for both sides)."""
    r = rewards(model, tokenizer, [pair_prompt(q) for q in pairs] * 2, [q.chosen for q in pairs] + [q.rejected for q in pairs],
                max_length=max_length)
    return r[: len(pairs)] - r[len(pairs):]


def load_reward_model(cfg: ModelConfig):
    """A causal LM with a fresh scalar head (or an existing RM directory), LoRA if enabled."""
    from transformers import AutoModelForSequenceClassification

    from pofe.models import load_model

    model, tok = load_model(cfg.name, dtype=cfg.dtype, device=cfg.device, trust_remote_code=cfg.trust_remote_code,
                            model_class=AutoModelForSequenceClassification, num_labels=1, **cfg.load_kwargs(),
                            fresh_head=True)  # a causal LM gets a new score head here: the one weight made fresh
    return wrap_reward_model(model, cfg, pad_token_id=tok.pad_token_id), tok


def wrap_reward_model(model, cfg: ModelConfig, *, pad_token_id: int | None = None):
    """Gradient checkpointing and LoRA on a sequence classifier.

    LoRA uses task_type SEQ_CLS so peft also trains the new score head (it is listed in
    ``modules_to_save``); save_final merges the adapter into a plain checkpoint."""
    # Sequence-classification pooling finds the last non-pad token by pad_token_id, so it
    # must be the tokenizer's pad id (load_model sets it; an in-memory model gets it here).
    if model.config.pad_token_id is None:
        if pad_token_id is None:
            raise ValueError("reward model has no pad_token_id; pass the tokenizer's")
        model.config.pad_token_id = pad_token_id
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        check_lora_targets(model, cfg.lora.target_modules)  # one line, not peft's exception from deep inside

        lc = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                        target_modules=cfg.lora.target_modules, task_type="SEQ_CLS")
        model = no_hub_lookup_at_save(get_peft_model(model, lc))
    return model



def save_reward_model(model, tokenizer, out_dir, *, max_length: int, labels: str, loss: str, base: str):
    """``final/`` of ``pofe rm``: the model saved atomically (merged under LoRA) plus
    ``pofe_reward_model.json`` (how rewards are read, what it was trained on) for the
    ``reward-model`` judge, ``pofe rl`` and ``pofe report``. Returns the folder."""
    import json

    from pofe.runs import atomic_write_text
    from pofe.runtime.checkpoints import save_final

    out = save_final(model, tokenizer, out_dir)
    atomic_write_text(out / "pofe_reward_model.json", json.dumps(
        {"format": "chat-template, reward at the last non-pad token", "num_labels": 1, "max_length": max_length,
         "labels": labels, "loss": loss, "base": base}, indent=2))
    return out

def tiny_reward_model(tokenizer, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A tiny random Llama sequence classifier (num_labels = 1) for tests."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id, num_labels=1)
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(cfg)


def evaluate_reward_model(model, tokenizer, pairs: Sequence[PreferencePair], *, batch_size: int = 16, max_length: int = 512,
                          bins: int = 10) -> dict[str, Any] | None:
    """Held-out accuracy, calibration and margins (:func:`pofe.evaluation.rm_metrics.margin_metrics`)."""
    from pofe.evaluation.rm_metrics import margin_metrics

    if not pairs:
        return None
    was = model.training
    model.eval()
    margins: list[float] = []
    with torch.no_grad():
        for s in range(0, len(pairs), batch_size):
            margins += pair_margins(model, tokenizer, pairs[s:s + batch_size], max_length=max_length).tolist()
    if was:
        model.train()
    return margin_metrics(margins, [q.p for q in pairs], bins=bins)
