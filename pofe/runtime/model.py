"""The policy and its reference pi_0: the ``model:`` sections of the commands (device and
dtype, the model to load, LoRA), loading the policy with a new or a continued LoRA adapter, and
the reference policy (OAIF: the initial policy) -- under LoRA the policy itself with its adapter
disabled, else a frozen copy made before the first update.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, Literal

import torch
from pydantic import Field, model_validator

from pofe.config import PofeConfig, PositiveFloat, PositiveInt
from pofe.models import DEFAULT_MODEL, load_model


class LoraSettings(PofeConfig):
    """LoRA (peft). With LoRA the reference policy is the same weights with the adapter
    disabled, so no second copy of the model is held in memory."""

    enabled: bool = False
    r: PositiveInt = 16
    """Adapter rank (>= 1)."""
    alpha: PositiveFloat = 32
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter input, in [0, 1)."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or ``all-linear``."""


class DeviceConfig(PofeConfig):
    """Where and in what dtype a model runs (``model:`` of commands whose models are named
    elsewhere, e.g. ``pofe eval``'s policies)."""

    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """auto = CUDA when present, then MPS, else CPU."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Weights dtype (bfloat16 on GPUs; float32 is the safe CPU default)."""


class LoadConfig(DeviceConfig):
    """A model used without training it (``pofe chat``)."""

    name: str = DEFAULT_MODEL
    """Embedded name, Hugging Face id or local directory (a saved ``adapter/`` folder works too)."""
    trust_remote_code: bool = False
    """Only enabled when asked: remote code runs arbitrary Python."""
    revision: str | None = None
    """A branch, tag or commit of the Hugging Face Hub repo ``name`` (None: its main branch). Refused
    for an embedded name or a local folder, whose files are what they are."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"] | None = None
    """The attention kernel transformers builds the model with (``from_pretrained(attn_implementation=)``);
    None: transformers' choice (``sdpa`` where the model supports it). ``flash_attention_2`` / ``_3``
    need the flash-attn package and a CUDA GPU."""

    @model_validator(mode="after")
    def _revision_of_a_hub_id(self):
        if self.revision is not None:
            from pofe.models import EMBEDDED_MODELS, is_hub_id

            if not self.revision.strip():
                raise ValueError("model.revision must be a branch, tag or commit (or null)")
            if not is_hub_id(self.name):
                what = "an embedded model" if self.name in EMBEDDED_MODELS else "a local folder"
                raise ValueError(f"model.revision {self.revision!r} picks a version of a Hugging Face Hub repo; "
                                 f"model.name {self.name!r} is {what} (drop model.revision)")
        return self

    def load_kwargs(self) -> dict[str, Any]:
        """``revision`` and ``attn_implementation`` for :func:`pofe.models.load_model`, where set."""
        return {k: v for k, v in (("revision", self.revision), ("attn_implementation", self.attn_implementation))
                if v is not None}


class ModelConfig(LoadConfig):
    """The policy (or any trained model)."""

    gradient_checkpointing: bool = False
    """Trades compute for memory; off by default (it costs ~3x per step on CPU)."""
    lora: LoraSettings = LoraSettings()
    """A new LoRA adapter on ``name`` (reference = the same weights with the adapter disabled)."""
    adapter: str | None = None
    """Continue training an existing LoRA adapter folder (e.g. ``runs/sft-1/final/adapter``) on
    ``name``; the reference is the starting policy, base + this adapter (a frozen copy)."""

    @model_validator(mode="after")
    def _adapter_or_new_lora(self):
        if self.adapter is not None and self.lora.enabled:
            raise ValueError("model.adapter continues an existing adapter; model.lora.enabled would add a second, "
                             "new one (set one of them)")
        return self


def no_hub_lookup_at_save(peft_model):
    """``peft_model`` saving without asking the Hub about its base model. peft's default
    ``save_embedding_layers="auto"`` looks the base's ``config.json`` up on the Hub whenever the
    base is not a local folder -- the embedded model's name is not -- to see whether the
    vocabulary was resized: a network call at every checkpoint, and two warnings ("Unable to
    fetch remote file ... Name or service not known") offline. pofe never resizes the
    embeddings (a missing pad token is the EOS token), so an adapter has none to save."""
    import functools

    peft_model.save_pretrained = functools.partial(peft_model.save_pretrained, save_embedding_layers=False)
    return peft_model


def apply_lora(model, lora: LoraSettings):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=lora.target_modules, task_type="CAUSAL_LM")
    return no_hub_lookup_at_save(get_peft_model(model, cfg))


def load_policy(cfg: ModelConfig, *, model=None, tokenizer=None):
    """Load the policy on ``cfg.device`` (or wrap a given in-memory ``model``); apply a new
    LoRA adapter when enabled, or continue the existing ``cfg.adapter`` (trainable)."""
    if model is None:
        model, tokenizer = load_model(cfg.name, dtype=cfg.dtype, device=cfg.device, trust_remote_code=cfg.trust_remote_code,
                                      **cfg.load_kwargs())
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.adapter is not None:
        from pofe.models import load_adapter

        model = no_hub_lookup_at_save(load_adapter(model, cfg.adapter, trainable=True))
    elif cfg.lora.enabled:
        check_lora_targets(model, cfg.lora.target_modules)
        model = apply_lora(model, cfg.lora)
    return model, tokenizer


def check_lora_targets(model, targets: list[str] | str) -> None:
    """Refuse ``model.lora.target_modules`` that match no module of the model, with one line (peft
    raises its own exception from deep inside). Matched as peft does: a list by a name's last
    components, a string as a regular expression over the whole name, ``all-linear`` always."""
    import re

    from pofe.models import ModelError

    if targets == "all-linear":
        return
    names = [n for n, _ in model.named_modules()]
    if isinstance(targets, str):
        try:
            hit = any(re.fullmatch(targets, n) for n in names)
        except re.error as e:
            raise ModelError(f"model.lora.target_modules {targets!r}: not a regular expression ({e})") from None
    else:
        hit = any(n == t or n.endswith(f".{t}") for n in names for t in targets)
    if not hit:
        raise ModelError(f"model.lora.target_modules {targets!r}: match no module of the model {model.name_or_path!r} "
                         f"(its modules end in e.g. {sorted({n.rsplit('.', 1)[-1] for n in names if n})[:6]})")


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

    def linear_weights_to(self, dtype: torch.dtype) -> int:
        """Keep the frozen copy's Linear weights in ``dtype`` (bf16 when every reference pass runs
        under bf16 autocast); returns how many tensors changed.

        Why: autocast rounds each fp32 weight to bf16 at every call, so the outputs are
        bit-identical, while each pass skips a cast of the weights
        and the fp32 copy no longer takes memory (SmolLM2-135M: 0.2 GB).
        Embeddings, norms and a Linear tied to an embedding (the LM head) stay fp32, as autocast
        computes them in fp32. Only for a frozen copy: a LoRA reference is the policy itself."""
        if self.lora:
            raise ValueError("a LoRA reference is the trained policy itself: its weights keep their dtype")
        tied = {id(m.weight) for m in self._frozen.modules() if isinstance(m, torch.nn.Embedding)}
        n = 0
        for m in self._frozen.modules():
            if isinstance(m, torch.nn.Linear) and id(m.weight) not in tied:
                for p in (m.weight, m.bias):
                    if p is not None and p.dtype != dtype:
                        p.data = p.data.to(dtype)
                        n += 1
        return n

    def release(self) -> None:
        """Drop the frozen copy (its log-probs now come from elsewhere:
        :mod:`pofe.loops.online.reference`); ``model()`` then yields None."""
        if self.lora:
            raise ValueError("a LoRA reference is the trained policy itself: there is no copy to release")
        self._frozen = None

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
