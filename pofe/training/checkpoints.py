"""Checkpoints with everything an exact resume needs, and the final model -- with no pickle.

Why no ``torch.load`` of pickles (``weights_only`` off): unpickling runs code, and a run folder is data
that may come from anyone (a planted pickled ``trainer_state.pt`` would run its code on
``--resume``). Tensors (weights, optimiser moments, RNG states) go to safetensors, everything
else (step, loop state, optimiser hyper-parameters, scheduler, Python/NumPy RNG scalars) to
JSON; neither format can carry code.

Layout of ``checkpoints/step-N/``::

    model.safetensors          trainable weights (LoRA adapters, or all for full fine-tuning)
    trainer_state.safetensors  optimiser state tensors + RNG state tensors
    trainer_state.json         step, loop state, optimiser/scheduler non-tensor state, RNG scalars
    meta.json                  step + scalar loop state, for humans and tools
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pofe.training.guards import check_finite_weights
from pofe.errors import PofeError

FORMAT = 2
"""trainer_state.json format; 1 was the pickled trainer_state.pt (refused, never read)."""
FINAL_MARKER = "pofe_final.json"
"""Written last into ``final/``: the files and their sizes, so a torn folder is detected."""


class CheckpointError(PofeError):
    """A checkpoint or final model that cannot be trusted. ``str(e)`` is one line."""

    exit_code = 2


# ----------------------------------------------------------------------------- RNG

def rng_state() -> dict[str, Any]:
    """Every RNG a loop draws from, as plain lists and tensors (no pickle needed)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------- tensors <-> JSON

def _split(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace every tensor in a nested structure by ``{"__tensor__": key}`` (stored in
    ``tensors``); tuples become lists. Anything that is neither JSON nor a tensor is an error
    at save time, never a silent ``str()``."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        return {"__dict__": [[k, _split(v, f"{prefix}.{i}", tensors)] for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        return [_split(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"checkpoint: cannot store {type(obj).__name__} at {prefix} (only tensors and JSON values)")


def _join(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        # keys keep their type (optimiser state is keyed by int parameter index)
        return {k: _join(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb+") as f:
                os.fsync(f.fileno())
    for d in sorted({p.parent for p in root.rglob("*")} | {root}):
        _fsync_dir(d)


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target`` (replacing an old ``target``). A crash at any point leaves
    either the old complete folder, the new complete one, or none -- never a mix."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        if old.is_symlink():
            old.unlink()  # a link is removed itself, never the folder it points to
        elif old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(tmp, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _atomic_dir(target: Path):
    """Yield a temporary sibling of ``target`` to write into; on success fsync it and swap it
    into place, on any failure remove it (``target`` keeps its old complete contents)."""
    from pofe.runs import DIR_MODE, check_run_path

    target.parent.mkdir(parents=True, exist_ok=True)
    check_run_path(target)  # a planted checkpoints/ or step-N link must not send weights elsewhere
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, DIR_MODE)  # mkdtemp makes 0700; the folder gets what mkdir would under the umask
    try:
        yield tmp
        _fsync_tree(tmp)
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------- checkpoints

def _trainable_state_dict(model) -> dict[str, torch.Tensor]:
    # Only what is trained (LoRA adapters, or everything for full fine-tuning). The tensors are
    # the model's own (a whole-model copy here was the run's peak of memory): save_file reads
    # them synchronously; only a tensor that shares storage with one already taken, or is not
    # contiguous, is copied, because safetensors refuses both.
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for k, v in model.state_dict().items():
        if k not in names:
            continue
        v = v.detach()
        key = (v.untyped_storage().data_ptr(), v.untyped_storage().nbytes())
        if key in seen or not v.is_contiguous():
            v = v.clone(memory_format=torch.contiguous_format)
        else:
            seen.add(key)
        out[k] = v
    return out


def save_checkpoint(ckpt_dir: str | Path, *, model, optimizer=None, scheduler=None, step: int,
                    state: dict[str, Any] | None = None, model_state: dict[str, torch.Tensor] | None = None,
                    optimizer_state: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint atomically: a temporary directory renamed into place, so a crash
    mid-write never leaves a checkpoint that resume would trust. ``model_state`` /
    ``optimizer_state``: the trainable weights and the optimiser state already gathered whole
    (a sharded model, :mod:`pofe.training.sharding`), written instead of reading them here."""
    from safetensors.torch import save_file

    ckpt_dir = Path(ckpt_dir)
    with _atomic_dir(ckpt_dir) as tmp:
        if model is not None:  # a command without weights (pofe label) checkpoints only its state
            sd = model_state if model_state is not None else _trainable_state_dict(model)
            check_finite_weights(sd, step=step)  # NaN weights are never checkpointed
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"))
        tensors: dict[str, torch.Tensor] = {}
        extra: dict[str, Any] = {"format": FORMAT, "step": step, "state": state or {},
                                 "rng": _split(rng_state(), "rng", tensors)}
        if optimizer is not None:
            osd = optimizer_state if optimizer_state is not None else optimizer.state_dict()
            extra["optimizer"] = _split(osd, "optimizer", tensors)
        if scheduler is not None:
            extra["scheduler"] = _split(scheduler.state_dict(), "scheduler", tensors)
        json.dumps(extra["state"])  # the loop's own state must be plain JSON (fails loudly here)
        save_file(tensors, str(tmp / "trainer_state.safetensors"))
        (tmp / "trainer_state.json").write_text(json.dumps(extra))
        # meta.json is for humans and tools: scalars only
        small = {k: v for k, v in (state or {}).items() if isinstance(v, (int, float, str, bool)) or v is None}
        (tmp / "meta.json").write_text(json.dumps({"step": step, **small}))
    return ckpt_dir


def load_checkpoint(ckpt_dir: str | Path, *, model, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns ``{"step", "state"}``.

    Reads only safetensors and JSON. A checkpoint in the old pickled format
    (``trainer_state.pt``) is refused, never unpickled."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    meta = ckpt_dir / "trainer_state.json"
    _no_links(ckpt_dir, ("trainer_state.json", "trainer_state.safetensors", "model.safetensors"))
    if not meta.is_file():
        if (ckpt_dir / "trainer_state.pt").exists():
            raise CheckpointError(f"{ckpt_dir}: pickled trainer_state.pt (older pofe) is refused: unpickling can run "
                                  f"code; start a new run")
        raise CheckpointError(f"{ckpt_dir}: no trainer_state.json (not a pofe checkpoint)")
    try:
        extra = json.loads(meta.read_text())
        tensors = load_file(str(ckpt_dir / "trainer_state.safetensors"))
        sd = load_file(str(ckpt_dir / "model.safetensors")) if model is not None else {}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt_dir}: unreadable checkpoint ({e})") from None
    from pofe.training import zero

    engine = model if zero.is_engine(model) else None  # DeepSpeed ZeRO: names are its module's
    if model is not None:
        missing = set(sd) - set((model.module if engine is not None else model).state_dict())
        if missing:
            raise CheckpointError(f"{ckpt_dir}: checkpoint has parameters the model lacks, e.g. {sorted(missing)[:3]}")
    from pofe.training.sharding import is_sharded, load_full_state

    sharded = engine is not None or is_sharded(model)  # whole tensors from the one format, each process keeping its shard
    if engine is not None:
        zero.load_full_state(engine, sd, optimizer, _join(extra["optimizer"], tensors) if "optimizer" in extra else None)
    elif sharded:
        load_full_state(model, sd, optimizer, _join(extra["optimizer"], tensors) if "optimizer" in extra else None)
    elif model is not None:
        model.load_state_dict(sd, strict=False)
    if optimizer is not None and "optimizer" in extra and not sharded:
        optimizer.load_state_dict(_join(extra["optimizer"], tensors))
    if scheduler is not None and "scheduler" in extra:
        scheduler.load_state_dict(_join(extra["scheduler"], tensors))
    if restore_rng:
        set_rng_state(_join(extra["rng"], tensors))
    return {"step": extra["step"], "state": extra.get("state", {})}


def _no_links(folder: Path, names=()) -> None:
    """Refuse a checkpoint folder (or a file of it) that is a symbolic link: a received run folder
    could point it anywhere, and pruning or reading would then act outside the run."""
    for p in (folder, *(folder / n for n in names)):
        if p.is_symlink():
            raise CheckpointError(f"{p}: is a symbolic link; checkpoints are never read, written or pruned "
                                  f"through links")


def _step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / "checkpoints"
    if root.is_symlink():
        _no_links(root)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        if d.name.startswith("step-") and d.is_symlink():
            _no_links(d)
        if d.is_dir() and d.name.startswith("step-"):
            try:
                out.append((int(d.name.split("-", 1)[1]), d))
            except ValueError:
                continue
    return sorted(out)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The highest ``checkpoints/step-N`` folder of a run, or None. A folder holding only the
    old pickled format is returned too, so that :func:`load_checkpoint` refuses it loudly
    instead of the run silently restarting from step 0."""
    steps = [(n, d) for n, d in _step_dirs(run_dir)
             if (d / "trainer_state.json").exists() or (d / "trainer_state.pt").exists()]
    return steps[-1][1] if steps else None


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the ``keep_last`` highest ``checkpoints/step-N`` folders (0 keeps all)."""
    if keep_last <= 0:
        return
    for _, d in _step_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------- final model

def save_final(model, tokenizer, out_dir: str | Path) -> Path:
    """Save a model that plain transformers / vLLM can load, atomically: written into a
    temporary sibling, fsynced, a marker listing every file and its size written last, then
    renamed into place (a ``final/`` torn by a crash must never pass as a result).

    With LoRA, the adapter (with the tokenizer, and the base model's *name* in its
    ``adapter_config.json``) is saved under ``adapter/`` and the merged weights at ``out_dir``."""
    out_dir = Path(out_dir)
    with _atomic_dir(out_dir) as tmp:
        to_save = model
        if hasattr(model, "peft_config"):
            model.save_pretrained(tmp / "adapter")
            tokenizer.save_pretrained(tmp / "adapter")
            to_save = copy.deepcopy(model).merge_and_unload()
        to_save.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / FINAL_MARKER).write_text(json.dumps({"files": files}, indent=1))
    return out_dir


def final_complete(out_dir: str | Path) -> bool:
    """True when ``out_dir`` is a whole final model written by :func:`save_final`: its marker
    exists and every file it lists is there with the recorded size. A resume that finds this
    False rewrites ``final/`` from the last checkpoint instead of exiting 0 on torn weights."""
    out_dir = Path(out_dir)
    try:
        files = json.loads((out_dir / FINAL_MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for rel, size in files.items():
        p = out_dir / rel
        if not p.is_file() or p.stat().st_size != size:
            return False
    return True
