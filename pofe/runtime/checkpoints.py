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
    manifest.json              written last: size and sha256 of every file above, the step, the
                               number of processes, the pofe version, and each append-only output
                               of the run (bytes, rows, sha256) as it was at this step

Why a manifest: a checkpoint is read back days later from a disk that may have rotted, or from a
folder someone edited or cut short; a resume from wrong weights or a wrong step runs on with exit
0. :func:`verify_checkpoint` checks every file against it before anything is loaded, and
:func:`resume_point` passes over a damaged newest checkpoint for the previous intact one, saying
so. A checkpoint of an older pofe (``trainer_state.json`` format 2, no manifest) is accepted with a
warning after the structural checks only: refusing it would strand every run started before.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pofe.runtime.guards import check_finite_weights
from pofe.errors import PofeError

FORMAT = 3
"""trainer_state.json format; 1 was the pickled trainer_state.pt (refused, never read), 2 had no
manifest.json (accepted with a warning), 3 has one (a format-3 checkpoint without it is damaged)."""
NL = b"\n"
MANIFEST = "manifest.json"
"""Written last into every checkpoint: what :func:`verify_checkpoint` checks the files against."""
FINAL_MARKER = "pofe_final.json"
"""Written last into ``final/``: the files and their sizes, so a torn folder is detected."""


log = logging.getLogger(__name__)


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
                    optimizer_state: dict[str, Any] | None = None, processes: int = 1,
                    outputs: dict[str, dict[str, Any]] | None = None) -> Path:
    """Write a checkpoint atomically: a temporary directory renamed into place, so a crash
    mid-write never leaves a checkpoint that resume would trust. ``model_state`` /
    ``optimizer_state``: the trainable weights and the optimiser state already gathered whole
    (a sharded model, :mod:`pofe.runtime.sharding`), written instead of reading them here.
    ``processes``: how many processes ran the step; ``outputs``: the run's append-only outputs as
    :func:`output_record` found them, both recorded in ``manifest.json`` (written last)."""
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
        _write_manifest(tmp, step=step, processes=processes, outputs=outputs)  # last: it vouches for the rest
    return ckpt_dir


def _sha256(path: Path, limit: int | None = None) -> str:
    """sha256 of a file's bytes (of its first ``limit`` bytes), read in 1 MiB blocks."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def _write_manifest(folder: Path, *, step: int, processes: int, outputs: dict[str, dict[str, Any]] | None) -> None:
    from pofe import __version__

    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"format": 1, "step": step, "processes": processes, "pofe_version": __version__, "files": files,
                "outputs": outputs or {}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def output_record(run_dir: str | Path, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each append-only output of a run now: ``{"bytes", "rows", "sha256"}`` (a missing file: 0 rows).
    Recorded in the checkpoint, so that a resume can tell an output cut short or deleted after it
    (whose rows a resume would never redo) from one that only grew."""
    from pofe.runs import open_run_file

    out: dict[str, dict[str, Any]] = {}
    for n in names:
        path = Path(run_dir) / n
        key = os.path.abspath(path)
        if not os.path.lexists(path):
            _RUNNING.pop(key, None)
            out[n] = {"bytes": 0, "rows": 0, "sha256": hashlib.sha256(b"").hexdigest()}
            continue
        with os.fdopen(open_run_file(path, os.O_RDONLY), "rb") as f:  # never through a link
            st = os.fstat(f.fileno())
            size, rows, h, ident = _RUNNING.get(key, (0, 0, hashlib.sha256(), None))
            if ident != (st.st_dev, st.st_ino) or st.st_size < size:  # another file, or cut back (a rewind)
                size, rows, h = 0, 0, hashlib.sha256()
            h = h.copy()
            f.seek(size)
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                rows += block.count(NL)
                size += len(block)
        _RUNNING[key] = (size, rows, h, (st.st_dev, st.st_ino))
        out[n] = {"bytes": size, "rows": rows, "sha256": h.hexdigest()}
    return out


# path -> (bytes, rows, sha256 so far, (device, inode)): the outputs are append-only, so each
# checkpoint hashes only what was appended since the last one (a whole re-read at every checkpoint
# made recording quadratic in the run's length: label checkpoints every batch).
_RUNNING: dict[str, tuple[int, int, Any, tuple[int, int] | None]] = {}


def _step_of(folder: Path) -> int | None:
    """N of a ``step-N`` folder (None for a folder named otherwise)."""
    name = folder.name
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None


def _read_state_json(ckpt_dir: Path) -> dict[str, Any]:
    """``trainer_state.json`` parsed and checked for the sections every checkpoint has (a
    ``step`` that agrees with the folder's name, ``rng``, ``state``)."""
    meta = ckpt_dir / "trainer_state.json"
    if not meta.is_file():
        if (ckpt_dir / "trainer_state.pt").exists():
            raise CheckpointError(f"{ckpt_dir}: pickled trainer_state.pt (older pofe) is refused: unpickling can run "
                                  f"code; start a new run")
        raise CheckpointError(f"{ckpt_dir}: no trainer_state.json (not a pofe checkpoint)")
    try:
        extra = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{meta}: unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                              f"the checkpoint is damaged") from None
    if not isinstance(extra, dict):
        raise CheckpointError(f"{meta}: not a checkpoint's state (a JSON object is expected); the checkpoint is damaged")
    step = extra.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{meta}: no valid step (found {step!r}); the checkpoint is damaged")
    named = _step_of(ckpt_dir)
    if named is not None and step != named:
        raise CheckpointError(f"{meta}: says step {step} in folder {ckpt_dir.name}; the checkpoint was edited or is "
                              f"damaged")
    for section in ("rng", "state"):
        if section not in extra:
            raise CheckpointError(f"{meta}: no {section} section (every checkpoint has one); the checkpoint is damaged")
    if not isinstance(extra["state"], dict):
        raise CheckpointError(f"{meta}: its state section is not a JSON object; the checkpoint is damaged")
    return extra


def verify_checkpoint(ckpt_dir: str | Path) -> dict[str, Any]:
    """Check a checkpoint before anything of it is used: every file its ``manifest.json`` lists is
    there with the recorded size and sha256, the manifest's step is the folder's, and
    ``trainer_state.json`` has its sections. Returns the manifest (``{}`` for a checkpoint of an
    older pofe, which has none: accepted with a warning, structure checked only).

    Raises:
        CheckpointError: one line naming the damaged or missing file.
    """
    ckpt_dir = Path(ckpt_dir)
    _no_links(ckpt_dir, (MANIFEST, "trainer_state.json", "trainer_state.safetensors", "model.safetensors"))
    mpath = ckpt_dir / MANIFEST
    if not (ckpt_dir / "trainer_state.json").is_file() and (ckpt_dir / "trainer_state.pt").exists():
        _read_state_json(ckpt_dir)  # the pickled format's own refusal (never unpickled), before any other
    if os.path.lexists(mpath) and not mpath.is_file():
        raise CheckpointError(f"{mpath}: not a regular file; the checkpoint is damaged")
    if not mpath.exists():
        extra = _read_state_json(ckpt_dir)
        if extra.get("format") != 2:
            raise CheckpointError(f"{mpath}: missing (every checkpoint of this pofe is written with one, last); the "
                                  f"checkpoint is incomplete or damaged")
        log.warning("%s: no %s (written by an older pofe): its files cannot be checked against recorded hashes; "
                    "resuming from it as it is", ckpt_dir, MANIFEST)
        return {}
    try:
        manifest = json.loads(mpath.read_text())
        files, step = manifest["files"], manifest["step"]
        if not isinstance(files, dict) or not isinstance(step, int) or not isinstance(manifest.get("outputs", {}), dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"{mpath}: not a valid checkpoint manifest; the checkpoint is damaged") from None
    named = _step_of(ckpt_dir)
    if named is not None and step != named:
        raise CheckpointError(f"{mpath}: says step {step} in folder {ckpt_dir.name}; the checkpoint was edited or is "
                              f"damaged")
    for name in ("trainer_state.json", "trainer_state.safetensors"):
        if name not in files:
            raise CheckpointError(f"{mpath}: does not list {name}; the checkpoint is damaged")
    if (ckpt_dir / "model.safetensors").exists() and "model.safetensors" not in files:
        raise CheckpointError(f"{mpath}: does not list model.safetensors; the checkpoint is damaged")
    for name, rec in files.items():
        path = ckpt_dir / str(name)
        try:
            size, digest = int(rec["bytes"]), str(rec["sha256"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{mpath}: bad entry for {name}; the checkpoint is damaged") from None
        if "/" in str(name) or str(name) in ("", ".", ".."):
            raise CheckpointError(f"{mpath}: lists {name!r}, not a file of the checkpoint; the checkpoint is damaged")
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST}); the checkpoint is damaged")
        have = path.stat().st_size
        if have != size:
            raise CheckpointError(f"{path}: {have} bytes where {MANIFEST} records {size} (changed after it was "
                                  f"written: cut short, emptied, edited or replaced); the checkpoint is damaged")
        if _sha256(path) != digest:
            raise CheckpointError(f"{path}: its sha256 differs from {MANIFEST} (bit rot or an edit after it was "
                                  f"written); the checkpoint is damaged")
    extra = _read_state_json(ckpt_dir)
    if extra["step"] != step:
        raise CheckpointError(f"{ckpt_dir / 'trainer_state.json'}: says step {extra['step']}, {MANIFEST} step {step}; "
                              f"the checkpoint is damaged")
    return manifest


def resume_point(run_dir: str | Path) -> Path | None:
    """The checkpoint a resume continues from: the newest ``checkpoints/step-N`` that passes
    :func:`verify_checkpoint`. A damaged newest one is passed over for the previous intact one
    (there is one when ``checkpoint.keep_last >= 2``) with one warning line saying so; None when
    the run has no checkpoint.

    Raises:
        CheckpointError: every checkpoint is damaged (the line names the newest one's damaged file).
    """
    found = [d for _, d in reversed(_step_dirs(run_dir)) if any(d.iterdir())]
    first: CheckpointError | None = None
    for d in found:
        try:
            verify_checkpoint(d)
        except CheckpointError as e:
            first = first or e
            continue
        if first is not None:
            log.warning("%s; resuming from %s instead, the newest intact checkpoint", first, d.name)
        return d
    if first is not None:
        if len(found) == 1:
            raise first
        raise CheckpointError(f"{first}; no earlier checkpoint is intact either (start a new run)")
    return None


def check_processes(ckpt_dir: str | Path, world: int, *, allow: bool = False) -> None:
    """Refuse to resume with another number of processes than the checkpoint's ``manifest.json``
    records: the global batch (processes x ``train.batch_size``), the data each process takes and
    the per-process sampling seeds would all change, so the resumed run would silently not be the
    one that was started. ``allow`` (``run.allow_world_change``): go on, with a warning line.
    A checkpoint without a manifest (an older pofe) records no count and is not checked."""
    ckpt_dir = Path(ckpt_dir)
    try:
        was = json.loads((ckpt_dir / MANIFEST).read_text()).get("processes")
    except (FileNotFoundError, ValueError):
        return
    if not isinstance(was, int) or isinstance(was, bool) or was == world:
        return
    what = (f"checkpoint {ckpt_dir.name} was written by {was} process{'es' if was != 1 else ''}, this resume runs "
            f"{world}")
    if allow:
        log.warning("%s: the global batch and each process's data and seeds change from here "
                    "(run.allow_world_change=true)", what)
        return
    raise CheckpointError(f"{what}: the global batch and each process's data and seeds would change; resume with "
                          f"{was} process{'es' if was != 1 else ''}, or --set run.allow_world_change=true to go on anyway")


def check_outputs(run_dir: str | Path, ckpt_dir: str | Path, names: tuple[str, ...]) -> None:
    """Refuse to resume over an append-only output that was cut short, deleted or rewritten after
    the checkpoint: a resume continues after the rows the checkpoint counted and would never redo
    the lost ones. The checkpoint's ``manifest.json`` records bytes, rows and sha256 of each; a
    checkpoint of an older pofe only the bytes (in its state), checked alone."""
    from pofe.runs import open_run_file

    run_dir, ckpt_dir = Path(run_dir), Path(ckpt_dir)
    try:
        record = json.loads((ckpt_dir / MANIFEST).read_text()).get("outputs") or {}
    except FileNotFoundError:  # older pofe: the sizes the state kept for the rewind
        sizes = _read_state_json(ckpt_dir)["state"].get("outputs") or {}
        record = {n: {"bytes": b} for n, b in sizes.items()}
    for name in names:
        rec = record.get(name) or {}
        want = int(rec.get("bytes") or 0)
        if want == 0:
            continue
        path = run_dir / name
        rows = f"{rec['rows']} rows, {want} bytes" if "rows" in rec else f"{want} bytes"
        if not os.path.lexists(path):
            raise CheckpointError(f"{path}: deleted after checkpoint {ckpt_dir.name}, which counted {rows} in it; a "
                                  f"resume would never redo them: put the file back or start a new run")
        with os.fdopen(open_run_file(path, os.O_RDONLY), "rb") as f:  # never through a link
            have = os.fstat(f.fileno()).st_size
            head = f.read(want)
        if have < want:
            now = f"{head.count(NL)} rows, {have} bytes" if "rows" in rec else f"{have} bytes"
            raise CheckpointError(f"{path}: {now} where checkpoint {ckpt_dir.name} counted {rows}: cut short after "
                                  f"it, and a resume would never redo the lost rows: put the whole file back or start "
                                  f"a new run")
        if "sha256" in rec and hashlib.sha256(head).hexdigest() != rec["sha256"]:
            raise CheckpointError(f"{path}: its first {rows} changed after checkpoint {ckpt_dir.name} (sha256 "
                                  f"differs): put the file back or start a new run")


def load_checkpoint(ckpt_dir: str | Path, *, model, optimizer=None, scheduler=None, restore_rng: bool = True,
                    verify: bool = True) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns ``{"step", "state"}``.

    Reads only safetensors and JSON. A checkpoint in the old pickled format
    (``trainer_state.pt``) is refused, never unpickled. ``verify``: check it against its manifest
    first (:func:`verify_checkpoint`; False when the caller just did). The weights must name exactly
    the model's trainable parameters (one the checkpoint lacks would keep its initial value, one the
    model lacks would be dropped), and a section the caller restores (optimizer, scheduler) must be
    there: a resume with a fresh optimiser is not the run that was checkpointed."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    if verify:
        verify_checkpoint(ckpt_dir)
    _no_links(ckpt_dir, ("trainer_state.json", "trainer_state.safetensors", "model.safetensors"))
    extra = _read_state_json(ckpt_dir)
    meta = ckpt_dir / "trainer_state.json"
    for section, wanted in (("optimizer", optimizer), ("scheduler", scheduler)):
        if wanted is not None and section not in extra:
            raise CheckpointError(f"{meta}: no {section} section (the run restores one: resuming without it would "
                                  f"not continue the run that was checkpointed); the checkpoint is damaged")
    tensors: dict[str, torch.Tensor] = {}
    for name, into in (("trainer_state.safetensors", "tensors"), ("model.safetensors", "sd")):
        if name == "model.safetensors" and model is None:
            continue
        if not (ckpt_dir / name).is_file():  # never opened when a FIFO or a device (opening one can block)
            raise CheckpointError(f"{ckpt_dir / name}: missing or not a regular file; the checkpoint is damaged")
        try:
            loaded = load_file(str(ckpt_dir / name))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError for a torn file
            raise CheckpointError(f"{ckpt_dir / name}: unreadable ({type(e).__name__}: "
                                  f"{(str(e).splitlines() or [''])[0]}); the checkpoint is damaged") from None
        if into == "tensors":
            tensors = loaded
        else:
            sd = loaded
    from pofe.runtime import zero

    engine = model if zero.is_engine(model) else None  # DeepSpeed ZeRO: names are its module's
    if model is not None:
        target = model.module if engine is not None else model
        have = set(target.state_dict())
        trained = {n for n, p in target.named_parameters() if p.requires_grad}
        extra_keys, lacking = sorted(set(sd) - have), sorted(trained - set(sd))
        if extra_keys:
            raise CheckpointError(f"{ckpt_dir / 'model.safetensors'}: has {len(extra_keys)} parameters the model lacks, "
                                  f"e.g. {extra_keys[:3]} (a checkpoint of another model)")
        if lacking:
            raise CheckpointError(f"{ckpt_dir / 'model.safetensors'}: lacks {len(lacking)} of the model's trained "
                                  f"parameters, e.g. {lacking[:3]} (they would keep their initial values)")
        for k, v in sd.items():
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise CheckpointError(f"{ckpt_dir / 'model.safetensors'}: parameter {k} holds NaN or inf; the "
                                      f"checkpoint is damaged")
    from pofe.runtime.sharding import is_sharded, load_full_state

    def joined(section: str):
        try:
            return _join(extra[section], tensors)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CheckpointError(f"{meta}: its {section} section does not match trainer_state.safetensors "
                                  f"({type(e).__name__}: {e}); the checkpoint is damaged") from None

    sharded = engine is not None or is_sharded(model)  # whole tensors from the one format, each process keeping its shard
    opt_state = joined("optimizer") if optimizer is not None else None
    try:
        if engine is not None:
            zero.load_full_state(engine, sd, optimizer, opt_state)
        elif sharded:
            load_full_state(model, sd, optimizer, opt_state)
        elif model is not None:
            model.load_state_dict(sd, strict=False)  # strict in both directions above; frozen weights are not saved
        if optimizer is not None and not sharded:
            optimizer.load_state_dict(opt_state)
        if scheduler is not None:
            scheduler.load_state_dict(joined("scheduler"))
        rng = joined("rng") if restore_rng else None
        if rng is not None:
            set_rng_state(rng)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{ckpt_dir}: does not fit this run's model or optimiser ({type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0]})") from None
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
