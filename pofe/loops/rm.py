"""``pofe rm``: a Bradley-Terry reward model trained on soft (AI) or hard (human) labels.

rlaif-constitutional-ai, "From judge log-probabilities to a label": the reward model is
trained with the Bradley-Terry cross-entropy against the soft target,

    L = BCE_with_logits(r(x, y1) − r(x, y2), p̃) = −p̃ log σ(Δr) − (1 − p̃) log σ(−Δr),

whose per-pair minimiser is σ(Δr) = p̃, i.e. Δr = logit(p̃): the RM inherits the judge's
confidence, not only its ranking (worked example: p̃ = 0.581 -> margin 0.33, versus an
unbounded push under a hard label). Hard labels (p = 1) are the special case. The seed
mixes AI harmlessness labels with human helpfulness pairs; ``data.train`` takes several
sources (``pofe label`` output, ``hh-rlhf:helpful``, any PreferencePair jsonl).

The model is a sequence-classification head (``num_labels = 1``) on any causal LM, full
fine-tuning or LoRA; the reward is read at the last non-padding token of the chat-rendered
(prompt, response). It is saved with ``save_pretrained`` as a plain
``AutoModelForSequenceClassification`` directory, so the ``reward-model`` judge
(P(A ≻ B) = σ(r_A − r_B)) and ``pofe rl`` load it directly.

Reported on held-out pairs: pairwise accuracy, calibration (reliability bins and ECE of
σ(Δr) against the labels), and margin statistics next to the margin the labels imply
(mean logit(p)): inflated margins are what RL exploits (seed, "Overconfident labels").
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from pofe.config import PofeConfig
from pofe.records import PreferencePair
from pofe.runs import (
    JsonlWriter,
    RunConfig,
    atomic_write_text,
    new_run_dir,
    write_config,
)
from pofe.training import ModelConfig, OptimConfig

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class RMDataConfig(PofeConfig):
    train: list[str] = Field(default_factory=list)
    """Pair sources, mixed: PreferencePair jsonl files (e.g. runs/label-*/preferences.jsonl) or hh-rlhf:helpful / hh-rlhf:harmless."""
    eval: list[str] | None = None
    """Held-out pair sources (default: a random ``eval_fraction`` of train)."""
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    max_pairs_per_source: int | None = None
    labels: Literal["soft", "hard"] = "soft"
    """soft: train on p as given; hard: threshold at 0.5 (p = 1 for the favourite; p = 0.5 pairs dropped)."""


class RMOptimConfig(OptimConfig):
    """RM defaults: a reward head trains at a far higher rate than OAIF's policy lr, no warm-up.
    (A subclass so ``--set optim.lr=...`` keeps warmup_steps = 0.)"""

    lr: float = 1e-5
    warmup_steps: int = 0


class RMConfig(PofeConfig):
    """``pofe rm``."""

    model: ModelConfig = ModelConfig()
    """Base causal LM (a score head is added) and LoRA settings."""
    data: RMDataConfig = RMDataConfig()
    optim: RMOptimConfig = RMOptimConfig()
    epochs: int = 1
    batch_size: int = 8
    """Pairs per optimiser step (2 x batch_size sequences per forward)."""
    max_length: int = 512
    """Tokens per (prompt, response); truncated from the left so the scored last token survives."""
    eval_every: int | None = None
    """Evaluate every N steps (default: only at the end)."""
    calibration_bins: int = 10
    seed: int = 0
    run: RunConfig = RunConfig()


# ----------------------------------------------------------------------------- pure pieces

def soft_bt_loss(margin: torch.Tensor, p: torch.Tensor | float) -> torch.Tensor:
    """Per-pair Bradley-Terry cross-entropy against soft targets: BCE-with-logits on
    Δr = r₁ − r₂ versus p = P(y₁ ≻ y₂). Minimised at Δr = logit(p); p ∈ {0, 1} is the
    ordinary RM loss (seed sketch ``soft_bt_loss``)."""
    p_t = torch.as_tensor(p, dtype=margin.dtype, device=margin.device).expand_as(margin)
    if torch.any((p_t < 0) | (p_t > 1)):
        raise ValueError("soft label p must lie in [0, 1]")
    return F.binary_cross_entropy_with_logits(margin, p_t, reduction="none")


def hardened(pairs: Sequence[PreferencePair]) -> list[PreferencePair]:
    """Hard labels from soft ones: the favourite becomes chosen with p = 1; exact ties dropped."""
    out = []
    for q in pairs:
        if q.p == 0.5:
            continue
        c, r = (q.chosen, q.rejected) if q.p > 0.5 else (q.rejected, q.chosen)
        out.append(PreferencePair(prompt=q.prompt, chosen=c, rejected=r, p=1.0, provenance={**q.provenance, "soft_p": q.p}))
    return out


def logit(p: float, eps: float = 1e-6) -> float:
    p = min(max(p, eps), 1 - eps)
    return math.log(p / (1 - p))


def rm_eval_metrics(margins: Sequence[float], p: Sequence[float], *, bins: int = 10) -> dict[str, Any]:
    """Held-out metrics of reward margins Δr = r(chosen) − r(rejected) against labels p.

    * accuracy: over pairs with p ≠ ½, the share where sign(Δr) = sign(p − ½); Δr = 0 is a miss.
    * calibration: the predicted q = σ(Δr) against the label p in ``bins`` equal bins of q.
      Each pair enters twice, as (q, p) and (1 − q, 1 − p): the orientation of a pair is
      arbitrary, and without the mirror every point of a chosen-first dataset would sit in
      the upper half. ECE = Σ_b (n_b / N) |mean q_b − mean p_b|.
    * margins: mean, std, quantiles, mean |Δr|, and the margin the labels imply,
      mean logit(p) over soft labels (p strictly inside (0, 1)): a well-fit soft RM has
      mean Δr close to it; hard labels have no finite target.
    """
    m = torch.as_tensor(list(margins), dtype=torch.float64)
    y = torch.as_tensor(list(p), dtype=torch.float64)
    n = len(m)
    if n == 0:
        return {"n": 0}
    decided = y != 0.5
    correct = ((m > 0) & (y > 0.5)) | ((m < 0) & (y < 0.5))
    acc = float(correct[decided].double().mean()) if decided.any() else None
    q = torch.sigmoid(m)
    qs = torch.cat([q, 1 - q])
    ys = torch.cat([y, 1 - y])
    idx = torch.clamp((qs * bins).long(), max=bins - 1)
    table = []
    ece = 0.0
    for b in range(bins):
        sel = idx == b
        k = int(sel.sum())
        if k == 0:
            table.append({"bin": [b / bins, (b + 1) / bins], "n": 0, "mean_pred": None, "mean_label": None})
            continue
        mq, my = float(qs[sel].mean()), float(ys[sel].mean())
        ece += k / (2 * n) * abs(mq - my)
        table.append({"bin": [b / bins, (b + 1) / bins], "n": k, "mean_pred": mq, "mean_label": my})
    soft = (y > 0) & (y < 1)
    target = float(torch.tensor([logit(float(v)) for v in y[soft]]).mean()) if soft.any() else None
    loss = float(F.binary_cross_entropy_with_logits(m, y))
    return {
        "n": n,
        "accuracy": acc,
        "n_decided": int(decided.sum()),
        "loss": loss,
        "ece": ece,
        "reliability": table,
        "margin": {
            "mean": float(m.mean()), "std": float(m.std()) if n > 1 else 0.0, "mean_abs": float(m.abs().mean()),
            "p10": float(torch.quantile(m, 0.1)), "median": float(m.median()), "p90": float(torch.quantile(m, 0.9)),
            "max_abs": float(m.abs().max()),
            "label_implied_mean": target,
        },
    }


# ----------------------------------------------------------------------------- model plumbing

def rm_text(tokenizer, prompt: str, response: str) -> str:
    """How a (prompt, response) is shown to the reward model: the chat template with the
    response as the assistant turn. The ``reward-model`` judge and ``pofe rl`` use this too."""
    from pofe.models import apply_chat_template

    return apply_chat_template(tokenizer, [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
                               add_generation_prompt=False)


def rewards(model, tokenizer, prompts: Sequence[str], responses: Sequence[str], *, max_length: int = 512) -> torch.Tensor:
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


def load_reward_model(cfg: ModelConfig):
    """A causal LM with a fresh scalar head (or an existing RM directory), LoRA if enabled.

    LoRA uses task_type SEQ_CLS so peft also trains the new score head (it is listed in
    ``modules_to_save``); save_final merges the adapter into a plain checkpoint.
    """
    from transformers import AutoModelForSequenceClassification

    from pofe.models import load_model

    model, tok = load_model(cfg.name, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code,
                            model_class=AutoModelForSequenceClassification, num_labels=1)
    return wrap_reward_model(model, cfg, pad_token_id=tok.pad_token_id), tok


def wrap_reward_model(model, cfg: ModelConfig, *, pad_token_id: int | None = None):
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

        lc = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                        target_modules=cfg.lora.target_modules, task_type="SEQ_CLS")
        model = get_peft_model(model, lc)
    return model


def tiny_reward_model(tokenizer, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A tiny random Llama sequence classifier (num_labels = 1) for tests."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id, num_labels=1)
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(cfg)


# ----------------------------------------------------------------------------- training

def evaluate(model, tokenizer, pairs: Sequence[PreferencePair], *, batch_size: int = 16, max_length: int = 512,
             bins: int = 10) -> dict[str, Any]:
    was = model.training
    model.eval()
    margins: list[float] = []
    with torch.no_grad():
        for s in range(0, len(pairs), batch_size):
            b = pairs[s : s + batch_size]
            r = rewards(model, tokenizer, [q.prompt for q in b] * 2, [q.chosen for q in b] + [q.rejected for q in b],
                        max_length=max_length)
            margins += (r[: len(b)] - r[len(b):]).tolist()
    if was:
        model.train()
    return rm_eval_metrics(margins, [q.p for q in pairs], bins=bins)


def train_reward_model(model, tokenizer, train: Sequence[PreferencePair], eval_pairs: Sequence[PreferencePair], cfg: RMConfig,
                       *, metrics_writer: JsonlWriter | None = None) -> dict[str, Any]:
    """The training loop: shuffled batches, soft BT loss, AdamW/Adafactor from
    ``pofe.training``; returns {"steps", "eval", "history"}."""
    from pofe.training import make_optimizer, make_scheduler

    rng = random.Random(cfg.seed)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt = make_optimizer(model, cfg.optim)
    sched = make_scheduler(opt, cfg.optim, total)
    model.train()
    step = 0
    history = []
    order = list(range(len(train)))
    for epoch in range(cfg.epochs):
        rng.shuffle(order)
        for s in range(0, len(order), cfg.batch_size):
            b = [train[i] for i in order[s : s + cfg.batch_size]]
            t0 = time.perf_counter()
            r = rewards(model, tokenizer, [q.prompt for q in b] * 2, [q.chosen for q in b] + [q.rejected for q in b],
                        max_length=cfg.max_length)
            margin = r[: len(b)] - r[len(b):]
            p = torch.tensor([q.p for q in b], dtype=margin.dtype, device=margin.device)
            loss = soft_bt_loss(margin, p).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = None
            if cfg.optim.grad_clip:
                gn = float(torch.nn.utils.clip_grad_norm_([x for x in model.parameters() if x.requires_grad], cfg.optim.grad_clip))
            opt.step()
            sched.step()
            step += 1
            row = {"step": step, "epoch": epoch, "loss": float(loss), "margin_mean": float(margin.mean()),
                   "accuracy": float(((margin > 0) == (p > 0.5)).float().mean()), "grad_norm": gn,
                   "lr": sched.get_last_lr()[0], "seconds": round(time.perf_counter() - t0, 4)}
            if cfg.eval_every and step % cfg.eval_every == 0 and eval_pairs:
                ev = evaluate(model, tokenizer, eval_pairs, batch_size=cfg.batch_size, max_length=cfg.max_length,
                              bins=cfg.calibration_bins)
                row.update({"eval_accuracy": ev.get("accuracy"), "eval_ece": ev.get("ece"), "eval_loss": ev.get("loss"),
                            "eval_margin_mean": ev.get("margin", {}).get("mean")})
            history.append(row)
            if metrics_writer is not None:
                metrics_writer.write(row)
    ev = evaluate(model, tokenizer, eval_pairs, batch_size=cfg.batch_size, max_length=cfg.max_length,
                  bins=cfg.calibration_bins) if eval_pairs else None
    return {"steps": step, "eval": ev, "history": history}


def split_pairs(pairs: list[PreferencePair], fraction: float, seed: int) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Deterministic train/eval split; at least one eval pair when fraction > 0 and n > 1."""
    idx = list(range(len(pairs)))
    random.Random(seed).shuffle(idx)
    k = round(len(pairs) * fraction)
    if fraction > 0 and k == 0 and len(pairs) > 1:
        k = 1
    ev = set(idx[:k])
    return [q for i, q in enumerate(pairs) if i not in ev], [q for i, q in enumerate(pairs) if i in ev]


# ----------------------------------------------------------------------------- the command

def run(cfg: RMConfig, *, model=None, tokenizer=None) -> dict[str, Any]:
    """Setup -> train -> evaluate -> save (``<run>/model`` is a save_pretrained directory)."""
    from pofe.data.preferences import load_pairs
    from pofe.training import save_final, seed_everything

    # --- setup
    seed_everything(cfg.seed)
    if not cfg.data.train:
        raise ValueError("rm: data.train is empty; give at least one pair source (e.g. runs/label-*/preferences.jsonl)")
    run_dir = new_run_dir(cfg.run, "rm")
    write_config(run_dir, cfg)
    train: list[PreferencePair] = []
    per_source = {}
    for src in cfg.data.train:
        got = load_pairs(src, limit=cfg.data.max_pairs_per_source)
        per_source[src] = len(got)
        train += got
    if cfg.data.eval:
        eval_pairs = [q for src in cfg.data.eval for q in load_pairs(src, limit=cfg.data.max_pairs_per_source)]
    else:
        train, eval_pairs = split_pairs(train, cfg.data.eval_fraction, cfg.seed)
    if cfg.data.labels == "hard":
        train = hardened(train)
    if not train:
        raise ValueError("rm: no training pairs left")
    if model is None:
        model, tokenizer = load_reward_model(cfg.model)
    else:
        model = wrap_reward_model(model, cfg.model, pad_token_id=tokenizer.pad_token_id)
    log.info("rm: %d train / %d eval pairs (%s labels)", len(train), len(eval_pairs), cfg.data.labels)

    # --- train
    t0 = time.perf_counter()
    with JsonlWriter(run_dir / "metrics.jsonl") as mw:
        before = evaluate(model, tokenizer, eval_pairs, batch_size=cfg.batch_size, max_length=cfg.max_length,
                          bins=cfg.calibration_bins) if eval_pairs else None
        res = train_reward_model(model, tokenizer, train, eval_pairs, cfg, metrics_writer=mw)
    seconds = time.perf_counter() - t0

    # --- save
    out = save_final(model, tokenizer, run_dir / "model")
    atomic_write_text(out / "pofe_reward_model.json", json.dumps(
        {"format": "chat-template, reward at the last non-pad token", "num_labels": 1, "max_length": cfg.max_length,
         "labels": cfg.data.labels, "base": cfg.model.name}, indent=2))
    summary = {
        "run_dir": str(run_dir), "model_dir": str(out), "train_pairs": len(train), "eval_pairs": len(eval_pairs),
        "sources": per_source, "labels": cfg.data.labels, "steps": res["steps"], "seconds": round(seconds, 2),
        "eval_before": before, "eval": res["eval"],
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
