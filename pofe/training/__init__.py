"""Shared training plumbing for every loop (online, sft, self-reward, rm, rl): policy loading
with optional LoRA, the reference policy, optimisers and schedules, and atomic checkpoints
with everything needed for an exact resume.

Kept here once so that loops stay short and a fix lands everywhere at once.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Literal

import numpy as np
import torch

from pofe.config import PofeConfig
from pofe.models import DEFAULT_MODEL, load_model


class LoraSettings(PofeConfig):
    """LoRA (peft). With LoRA the reference policy is the same weights with the adapter
    disabled, so no second copy of the model is held in memory."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


class ModelConfig(PofeConfig):
    """The policy (or any trained model)."""

    name: str = DEFAULT_MODEL
    """Embedded name, Hugging Face id or local directory."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    trust_remote_code: bool = False
    """Only enabled when asked: remote code runs arbitrary Python."""
    gradient_checkpointing: bool = False
    """Trades compute for memory; off by default (it costs ~3x per step on CPU)."""
    lora: LoraSettings = LoraSettings()


class OptimConfig(PofeConfig):
    """Optimiser and schedule (OAIF Sec. 4.1: Adafactor, lr 5e-7, 150 warm-up steps)."""

    name: Literal["adamw", "adafactor"] = "adamw"
    lr: float = 5e-7
    warmup_steps: int = 150
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """After warm-up: constant (OAIF), or linear / cosine decay to ``min_lr_ratio * lr``."""
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0
    """Max global grad norm; null disables clipping."""


def apply_lora(model, lora: LoraSettings):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=lora.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def load_policy(cfg: ModelConfig, *, model=None, tokenizer=None):
    """Load the policy (or wrap a given in-memory ``model``), apply LoRA when enabled."""
    if model is None:
        model, tokenizer = load_model(cfg.name, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    return model, tokenizer


class Reference:
    """The reference policy pi_0 (OAIF: the initial policy).

    With LoRA: the policy itself with its adapter disabled (no copy). Full fine-tuning: a
    frozen deep copy made before the first update.
    """

    def __init__(self, policy, *, lora: bool):
        self.lora = lora
        self._frozen = None
        if not lora:
            self._frozen = copy.deepcopy(policy)
            self._frozen.eval()
            for p in self._frozen.parameters():
                p.requires_grad_(False)
        self._policy = policy

    @property
    def module(self):
        """The module that computes pi_0 (e.g. to share with an annotator of the same weights).
        With LoRA it is the policy itself: call it only inside :meth:`model`."""
        return self._policy if self.lora else self._frozen

    @contextlib.contextmanager
    def model(self) -> Iterator[Any]:
        """Yield a module computing reference outputs (no grad)."""
        if self.lora:
            was_training = self._policy.training
            self._policy.eval()
            with torch.no_grad(), self._policy.disable_adapter():
                yield self._policy
            if was_training:
                self._policy.train()
        else:
            with torch.no_grad():
                yield self._frozen


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = trainable_parameters(model)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    from transformers.optimization import Adafactor

    # relative_step=False so the configured lr is used (the paper sets lr explicitly).
    return Adafactor(params, lr=cfg.lr, relative_step=False, scale_parameter=False, warmup_init=False,
                     weight_decay=cfg.weight_decay)


def make_scheduler(optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warm = max(0, cfg.warmup_steps)

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if cfg.schedule == "constant" or total_steps <= warm:
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total_steps - warm))
        lo = cfg.min_lr_ratio
        if cfg.schedule == "linear":
            return lo + (1 - lo) * (1 - frac)
        return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * frac))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ----------------------------------------------------------------------------- checkpoints

def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _trainable_state_dict(model) -> dict[str, torch.Tensor]:
    # Only what is trained (LoRA adapters, or everything for full fine-tuning).
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k in names}


def save_checkpoint(ckpt_dir: str | Path, *, model, optimizer=None, scheduler=None, step: int,
                    state: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint atomically: a temporary directory renamed into place, so a crash
    mid-write never leaves a checkpoint that resume would trust."""
    from safetensors.torch import save_file

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{ckpt_dir.name}-", dir=ckpt_dir.parent))
    try:
        sd = _trainable_state_dict(model)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"))
        extra = {"step": step, "rng": rng_state(), "state": state or {}}
        if optimizer is not None:
            extra["optimizer"] = optimizer.state_dict()
        if scheduler is not None:
            extra["scheduler"] = scheduler.state_dict()
        torch.save(extra, tmp / "trainer_state.pt")
        # meta.json is for humans and tools: scalars only (buffers etc. live in trainer_state.pt)
        small = {k: v for k, v in (state or {}).items() if isinstance(v, (int, float, str, bool)) or v is None}
        (tmp / "meta.json").write_text(json.dumps({"step": step, **small}, default=str))
        if ckpt_dir.exists():
            shutil.rmtree(ckpt_dir)
        os.replace(tmp, ckpt_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ckpt_dir


def load_checkpoint(ckpt_dir: str | Path, *, model, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns ``{"step", "state"}``."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    sd = load_file(str(ckpt_dir / "model.safetensors"))
    missing = set(sd) - set(model.state_dict())
    if missing:
        raise ValueError(f"{ckpt_dir}: checkpoint has parameters the model lacks, e.g. {sorted(missing)[:3]}")
    model.load_state_dict(sd, strict=False)
    extra = torch.load(ckpt_dir / "trainer_state.pt", weights_only=False)
    if optimizer is not None and "optimizer" in extra:
        optimizer.load_state_dict(extra["optimizer"])
    if scheduler is not None and "scheduler" in extra:
        scheduler.load_state_dict(extra["scheduler"])
    if restore_rng:
        set_rng_state(extra["rng"])
    return {"step": extra["step"], "state": extra.get("state", {})}


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The highest ``checkpoints/step-N`` folder of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    steps = []
    for d in root.iterdir():
        if d.is_dir() and d.name.startswith("step-") and (d / "trainer_state.pt").exists():
            try:
                steps.append((int(d.name.split("-", 1)[1]), d))
            except ValueError:
                continue
    return max(steps)[1] if steps else None


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the ``keep_last`` highest ``checkpoints/step-N`` folders (0 keeps all)."""
    root = Path(run_dir) / "checkpoints"
    if keep_last <= 0 or not root.is_dir():
        return
    steps = []
    for d in root.iterdir():
        if d.is_dir() and d.name.startswith("step-"):
            try:
                steps.append((int(d.name.split("-", 1)[1]), d))
            except ValueError:
                continue
    for _, d in sorted(steps)[:-keep_last]:
        shutil.rmtree(d, ignore_errors=True)


def save_final(model, tokenizer, out_dir: str | Path) -> Path:
    """Save a model that plain transformers / vLLM can load. With LoRA, the adapter is saved
    under ``adapter/`` and the merged weights at ``out_dir`` itself."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    to_save = model
    if hasattr(model, "peft_config"):
        model.save_pretrained(out_dir / "adapter")
        to_save = copy.deepcopy(model).merge_and_unload()
    to_save.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
