"""Run folders: ``runs/<name>/`` with the resolved ``config.yaml``, ``metrics.jsonl`` and,
depending on the command, a ledger, checkpoints and a report.

Guarantees (issue 14, defect 8 and the ``run.name=../..`` probe), all here so that every
command gets them by calling :func:`open_run`:

* **Never shared.** A new folder is claimed with ``mkdir`` without ``exist_ok`` -- atomic on
  POSIX, so of two runs started together with one ``run.name`` exactly one gets ``<name>``
  and the other ``<name>-2`` (the old "exists and non-empty?" check raced).
* **Never outside** ``run.output_dir``: ``run.name`` is one path component.
* **Never used by two live processes.** The process that owns a run folder holds an exclusive
  ``fcntl.flock`` on ``<run>/.lock`` (its PID written inside) for the rest of its life; a
  ``--resume`` of a folder another live process holds is refused naming that PID. The kernel
  releases a flock when its process dies (SIGKILL included), so a lock left by a crashed run
  is stale by construction and simply taken over.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, field_validator

from pofe.config import PofeConfig, dump_config

log = logging.getLogger(__name__)


class RunConfig(PofeConfig):
    """Where a command writes its outputs."""

    output_dir: str = "runs"
    """Parent folder of run folders."""
    name: str | None = None
    """Run folder name (one path component, no ``/``); default ``<command>-<YYYYmmdd-HHMMSS>``.
    Taken: ``<name>-2``, ``<name>-3``, ..."""

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip() or v in (".", "..") or "/" in v or "\\" in v or "\0" in v or v.startswith("~"):
            raise ValueError("must be a single folder name inside run.output_dir (no '/', '..' or '~')")
        return v


class RunError(Exception):
    """A run folder that cannot be used (missing, not a pofe run, held by another process).
    ``str(e)`` is one line; the CLI exits 2 with it."""


LOCK_NAME = ".lock"
_HELD: dict[str, int] = {}  # resolved run dir -> open fd holding its flock (for the process's life)


def _is_main_process() -> bool:
    # torchrun / accelerate set RANK; only rank 0 owns (creates, locks, writes) the run folder.
    try:
        return int(os.environ.get("RANK", "0") or 0) == 0
    except ValueError:
        return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_run(run_dir: str | Path) -> None:
    """Take the run folder's lock for the rest of this process's life (idempotent in one
    process). Raises :class:`RunError` naming the PID when another live process holds it."""
    import fcntl

    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key in _HELD:
        return
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunError(f"{run_dir}: in use by a running pofe process (PID {holder}); wait for it to finish or "
                       f"stop it before resuming") from None
    previous = os.read(fd, 64).decode(errors="replace").strip()
    if previous.isdigit() and int(previous) != os.getpid():
        state = "still alive but not holding it" if _pid_alive(int(previous)) else "no longer running"
        log.info("%s: taking over a stale lock of PID %s (%s)", run_dir, previous, state)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd


def release_run(run_dir: str | Path) -> None:
    """Release this process's lock on ``run_dir`` (normally the process's exit does it)."""
    fd = _HELD.pop(str(Path(run_dir).resolve()), None)
    if fd is not None:
        os.close(fd)


def new_run_dir(run: RunConfig, command: str) -> Path:
    """Claim and lock a fresh run folder under ``run.output_dir`` (``<name>``, else
    ``<name>-2``, ``<name>-3``, ...; never one that already exists)."""
    base = Path(run.output_dir)
    name = run.name or f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.mkdir(parents=True, exist_ok=True)  # OSError (read-only, full, permission): the CLI says so in one line
    root = base.resolve()
    for k in range(1, 10_000):
        candidate = base / (name if k == 1 else f"{name}-{k}")
        if candidate.resolve().parent != root:  # defence in depth: the validator already refuses this
            raise RunError(f"run.name {name!r}: the run folder would be outside run.output_dir {str(base)!r}")
        try:
            candidate.mkdir()  # the atomic claim: exactly one process succeeds per name
        except FileExistsError:
            continue
        lock_run(candidate)
        return candidate
    raise RunError(f"run.name {name!r}: {name}-2 ... {name}-9999 are all taken in {base}")


def open_run(run: RunConfig, command: str, *, resume: str | Path | None = None) -> Path:
    """The run folder a command writes into: a fresh one, or ``resume`` (which must already be
    a pofe run folder holding ``config.yaml``), locked by this process either way. Every
    command goes through here, so the guarantees about run folders (never shared by two runs,
    never outside ``run.output_dir``, never resumed while another process holds it) live in
    one place. Under torchrun only rank 0 creates and locks; other ranks get the folder via
    the caller's broadcast (new runs) or ``resume``."""
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise RunError(f"--resume {run_dir}: no such run folder (no config.yaml there)")
        if not (run_dir / "config.yaml").is_file():
            raise RunError(f"--resume {run_dir}: no config.yaml there (not a pofe run folder)")
        if _is_main_process():
            lock_run(run_dir)
        return run_dir
    return new_run_dir(run, command)


def write_config(run_dir: Path, cfg: BaseModel) -> Path:
    path = Path(run_dir) / "config.yaml"
    atomic_write_text(path, dump_config(cfg))
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file + rename so a crash never leaves a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp creates 0600; run files are meant to be read by others
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item") and callable(v.item):
        try:
            return _clean(v.item())
        except (ValueError, RuntimeError):
            pass
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonlWriter:
    """Append-only JSON Lines file, flushed after each row so a crash loses nothing written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(row), ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read one of a run's OWN append-only JSON Lines files (ledger, metrics, candidates) on
    resume or report: a torn last line is what a crash mid-write leaves, so it is skipped;
    any other bad line is an error. Never use this for inputs -- a user's file with a bad
    last line must be a located error: use :func:`pofe.data.io.read_rows`."""
    rows = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: invalid JSON ({e.msg})") from None
    return rows
