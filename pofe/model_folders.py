"""Model folders are untrusted input: the checks :mod:`pofe.models` makes on a local model or
adapter folder before transformers, tokenizers or peft read any of it, and the folder's identity
that ``run.json`` records.

A folder someone hands you (``--model``, ``model.name``, ``model.adapter``, a judge's model) may be
torn by a copy, edited, or built to hurt: a FIFO named ``config.json`` blocks the first open for
ever, a safetensors header claiming a TiB is allocated before it is read, a truncated
``tokenizer.json`` ends in a Rust panic. Each is refused here with one line naming the file
(:class:`pofe.errors.ModelError`), cheaply: JSON files parsed under a size cap, safetensors files
by their headers only (the tensor data is never read here).

:func:`fingerprint` is what identifies a model folder in ``run.json`` (:mod:`pofe.runs`): sizes and
sha256 of every small file, and for a large one (weights) its size, the sha256 of its safetensors
header and of 16 blocks spread over the data -- weights replaced by other weights of the same shapes
change every block, and the cost is a few MiB read whatever the model's size. No mtimes: a folder
copied with its bytes intact is the same model.

A leaf module: it imports nothing of pofe but :mod:`pofe.errors`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

from pofe.errors import ModelError

MAX_JSON_BYTES = 128 << 20
"""A model folder's JSON files (the largest real ``tokenizer.json`` is a few tens of MiB)."""
MAX_HEADER_BYTES = 100 << 20
"""A safetensors header (safetensors' own limit)."""
MAX_TEXT_BYTES = 16 << 20
"""A chat template, merges or vocabulary text file."""

JSON_FILES = ("config.json", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "generation_config.json", "added_tokens.json", "chat_template.json",
              "model.safetensors.index.json")
"""The JSON files of a model folder that transformers, tokenizers or peft read."""
TEXT_FILES = ("chat_template.jinja", "merges.txt", "vocab.txt", "tokenizer.model")

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def regular_size(path: Path) -> int:
    """The size of ``path``, which must be a regular file (a link to one is fine: the Hugging Face
    cache links to blobs). Checked with ``stat``, never by opening: opening a FIFO blocks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelError(f"{path}: missing (a link to nothing?)") from None
    except OSError as e:
        raise ModelError(f"{path}: unreadable ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise ModelError(f"{path}: is {kind}; a model folder's files must be regular files")
    return st.st_size


def read_json(path: Path, *, cap: int = MAX_JSON_BYTES) -> Any:
    """A model folder's JSON file, parsed (a regular file under ``cap`` bytes)."""
    size = regular_size(path)
    if size > cap:
        raise ModelError(f"{path}: {size} bytes, over the {cap >> 20} MiB a model folder's JSON file may have")
    try:
        return json.loads(path.read_bytes())
    except UnicodeDecodeError:
        raise ModelError(f"{path}: not UTF-8 text (not a JSON file)") from None
    except ValueError as e:
        msg = getattr(e, "msg", str(e))
        where = f" at line {e.lineno} column {e.colno}" if hasattr(e, "lineno") else ""
        raise ModelError(f"{path}: not valid JSON ({msg}{where}; truncated?)") from None


def read_config(path: Path) -> dict[str, Any]:
    """``config.json`` (or ``adapter_config.json``): a JSON object."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ModelError(f"{path}: not a JSON object (a model config is one)")
    return data


def safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file, checked against the file's size: the length it claims, every
    tensor's offsets inside the data, and the data ending where the file does (a truncated or padded
    file is refused). Reads the header only."""
    size = regular_size(path)
    if size < 8:
        raise ModelError(f"{path}: {size} bytes, too short to be a safetensors file (truncated or empty)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise ModelError(f"{path}: its header claims {n} bytes but the file has {size} (truncated, or not a "
                             f"safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError
    except ValueError:
        raise ModelError(f"{path}: its safetensors header is not valid JSON (damaged or not a safetensors file)") from None
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in info["data_offsets"])
            if not 0 <= start <= stop:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: tensor {name!r} has no valid data_offsets (damaged safetensors header)") from None
        end = max(end, stop)
    if 8 + n + end != size:
        raise ModelError(f"{path}: its tensors end at byte {8 + n + end} but the file has {size} bytes "
                         f"({'truncated' if 8 + n + end > size else 'trailing data'}: a torn copy?)")
    return header


def check_folder(path: str | Path) -> dict[str, Any] | None:
    """Check a local model or adapter folder before anything loads it: no special file (FIFO,
    device, socket) at its top level, every JSON file transformers reads parsed, every text file
    regular and capped, every safetensors header consistent with its file. Returns ``config.json``
    (None for an adapter folder).

    Raises:
        ModelError: one line naming the file at fault.
    """
    folder = Path(path)
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        try:
            mode = os.stat(entry).st_mode
        except OSError:
            continue  # a dangling link: only a file transformers opens matters, and that is checked below
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            regular_size(entry)  # raises, naming what it is
    for name in JSON_FILES:
        if os.path.lexists(folder / name):
            (read_config if name.endswith("config.json") else read_json)(folder / name)
    for name in TEXT_FILES:
        if os.path.lexists(folder / name) and regular_size(folder / name) > MAX_TEXT_BYTES:
            raise ModelError(f"{folder / name}: over the {MAX_TEXT_BYTES >> 20} MiB a model folder's text file may have")
    for p in sorted(folder.glob("*.safetensors")):
        safetensors_header(p)
    if os.path.lexists(folder / "config.json"):
        return read_config(folder / "config.json")
    return None


# ----------------------------------------------------------------------------- identity

_FULL_HASH_BYTES = 16 << 20
_BLOCKS, _BLOCK = 16, 64 << 10


def _file_digest(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= _FULL_HASH_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return f"{size}:{h.hexdigest()}"
        if path.suffix == ".safetensors":  # the header names every tensor, its dtype, shape and place
            (n,) = struct.unpack("<Q", f.read(8))
            h.update(f.read(min(n, MAX_HEADER_BYTES)))
        for i in range(_BLOCKS):
            f.seek(size * i // _BLOCKS)
            h.update(f.read(_BLOCK))
    return f"{size}:sampled:{h.hexdigest()}"


def fingerprint(path: str | Path) -> dict[str, str]:
    """File name -> digest of every regular file at the top of a model folder (hidden files and
    READMEs left out): what ``run.json`` records and ``--resume`` compares."""
    folder = Path(path)
    out: dict[str, str] = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.suffix.lower() == ".md":
            continue
        try:
            if not stat.S_ISREG(os.stat(p).st_mode):
                continue
        except OSError:
            continue
        out[p.name] = _file_digest(p)
    return out


def is_model_folder(value: str) -> bool:
    """Whether a config value names a local model or adapter folder."""
    try:
        p = os.path.expanduser(value)
        return os.path.isdir(p) and (os.path.isfile(os.path.join(p, "config.json"))
                                     or os.path.isfile(os.path.join(p, "adapter_config.json")))
    except (OSError, ValueError):
        return False


def model_identities(named: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """``run.json``'s ``models``: for each (config key, folder), the folder's :func:`fingerprint`; an
    adapter folder brings the local folder of the base model it names too (key ``<key>.base``)."""
    out: list[dict[str, Any]] = []
    for key, value in named:
        folder = Path(os.path.expanduser(value))
        out.append({"key": key, "path": value, "files": fingerprint(folder)})
        try:
            base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            base = None
        if isinstance(base, str) and is_model_folder(base):
            out.append({"key": f"{key}.base", "path": base, "files": fingerprint(Path(os.path.expanduser(base)))})
    return out


def model_change(recorded: dict[str, Any]) -> str | None:
    """What changed in a model folder since ``run.json`` recorded it (one phrase naming the file),
    or None when nothing did."""
    folder = Path(os.path.expanduser(str(recorded["path"])))
    if not folder.is_dir():
        return f"{folder} no longer exists"
    was, now = dict(recorded["files"]), fingerprint(folder)
    for name in sorted(set(was) | set(now)):
        if name not in now:
            return f"{folder / name} was removed"
        if name not in was:
            return f"{folder / name} was added"
        if was[name] != now[name]:
            return f"{folder / name} changed"
    return None
