"""Run folders: ``runs/<name>/`` with the resolved ``config.yaml``, ``metrics.jsonl`` and,
depending on the command, a ledger, checkpoints and a report.

Guarantees (a run folder is data from anyone, and ``run.name=../..`` must not escape), all here so that every
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

A run folder is data that may come from anyone (a colleague's tarball, a shared disk), so:

* **No file in it is opened through a symbolic link.** Writers and readers of run files go
  through the helpers here (:func:`atomic_write_text`, :class:`JsonlWriter`,
  :func:`read_jsonl`, :func:`open_run_file`); inside a run folder they refuse a link as the
  last component (``O_NOFOLLOW``) and any folder in the path that resolves outside the run.
  Rewrites are a temporary file + rename in the folder, which replaces a link instead of
  writing through it.
* **``run.json`` records what the run was started from**: pofe version, command, sha256 of
  ``config.yaml`` and of every input file the config names. A resume of a folder whose config
  or inputs changed is refused naming the changed file (:func:`verify_run_folder`); a folder
  from an older pofe without ``run.json`` is resumed with a warning that it cannot be verified.
* Settings that run code or send data elsewhere (``callable`` judges, ``trust_remote_code``,
  an endpoint URL in use) are never taken silently from a resumed folder's config:
  :func:`untrusted_settings` lists them and the CLI refuses them without ``--trust-run-config``.
* Files are created with the process's umask (``0o666 & ~umask``), never a forced mode.
* A fresh run folder that a bad-input error left with nothing computed in it is removed
  (:func:`discard_unused_runs`): a config error leaves no run folder behind.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import logging
import math
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field, field_validator

from pofe.config import PofeConfig, dump_config
from pofe.errors import PofeError

log = logging.getLogger(__name__)


MAX_NAME_BYTES = 200
"""Longest ``run.name`` in UTF-8 bytes (a file name is at most 255 bytes on common file systems)."""


class RunConfig(PofeConfig):
    """Where a command writes its outputs."""

    output_dir: str = "runs"
    """Parent folder of run folders."""
    name: str | None = None
    """Run folder name (one path component, no ``/``); default ``<command>-<YYYYmmdd-HHMMSS>``.
    Taken: ``<name>-2``, ``<name>-3``, ..."""
    collective_timeout_s: int = Field(600, ge=10, le=86400)
    """Seconds a process of a distributed run (torchrun, accelerate launch) waits in one collective
    (all-reduce, gather, barrier) for the others before the run ends with one line saying so
    (a process that stopped answering: stopped, swapped out, hung in I/O). 10 s to 1 day; raise it
    when one process legitimately works alone for long (a slow save, a first compile)."""
    allow_world_change: bool = False
    """``--resume`` with another number of processes than the checkpoint was written by. Refused
    by default: the global batch (processes x ``train.batch_size``) and each process's data and
    sampling seeds change, so the resumed run is not the one that was started."""
    push_to_hub: str | None = None
    """A Hugging Face repo id (``namespace/name``) to upload ``final/`` (with its model card
    ``README.md``) to when the run ends (``--push-to-hub REPO``); created when missing. Uses
    ``huggingface_hub``'s token (``HF_TOKEN`` or ``hf auth login``) and ``HF_ENDPOINT``. Offline
    mode or no token is refused before the run starts; a failed upload is one line naming the repo
    and the run folder stays complete. Only commands that write ``final/``."""

    @field_validator("name", mode="before")
    @classmethod
    def _as_typed(cls, v: Any) -> Any:
        # YAML reads ``name: 2024-12-01`` as a date and ``name: 123`` as an int; the user typed a
        # folder name, so take it as that text (bools stay refused: ``yes`` is not a name).
        if isinstance(v, (_dt.date, _dt.datetime)) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            return v.isoformat() if isinstance(v, (_dt.date, _dt.datetime)) else str(v)
        return v

    @field_validator("push_to_hub", mode="before")
    @classmethod
    def _repo_text(cls, v: Any) -> Any:
        # ``--set run.push_to_hub=2024`` is the text typed, not a number (bools stay refused)
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("push_to_hub")
    @classmethod
    def _repo_id(cls, v: str | None) -> str | None:
        from pofe.hub import check_repo_id

        return v if v is None else check_repo_id(v)

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip() or v in (".", "..") or "/" in v or "\\" in v or "\0" in v or v.startswith("~"):
            raise ValueError("must be a single folder name inside run.output_dir (no '/', '..' or '~')")
        bad = next((c for c in v if ord(c) < 32 or 127 <= ord(c) < 160 or c in "\u2028\u2029"), None)
        if bad is not None:
            # a newline or escape in a folder name breaks every listing, log line and script that reads it
            raise ValueError(f"must not contain control characters (found {bad!r})")
        try:
            size = len(v.encode("utf-8"))
        except UnicodeEncodeError as e:  # a lone surrogate (undecodable bytes in argv): no file name holds it
            raise ValueError(f"must be Unicode text (found the lone surrogate {v[e.start]!r})") from None
        if size > MAX_NAME_BYTES:
            # file systems take 255 bytes per name ("File name too long"); the rest leaves room for "-9999"
            raise ValueError(f"is {size} bytes long in UTF-8; a run folder name is at most {MAX_NAME_BYTES}")
        return v


class RunError(PofeError):
    """A run folder that cannot be used (missing, not a pofe run, held by another process).
    ``str(e)`` is one line; the CLI exits 2 with it."""

    exit_code = 2


class RunFolderGone(RunError):
    """A run folder (or a file pofe was appending to) deleted while the run was writing it: one
    line, exit 1 (the environment, not the input)."""

    exit_code = 1


LOCK_NAME = ".lock"
MANIFEST = "run.json"
_HELD: dict[str, int] = {}  # resolved run dir -> open fd holding its flock (for the process's life)

# Run folders this process reads or writes (absolute path as given -> its real path): inside
# them no file is opened through a link and no folder may resolve outside the run.
_ROOTS: dict[str, str] = {}
_COMMANDS: dict[str, str] = {}  # absolute run dir -> the command that created or resumed it
_FRESH: list[Path] = []  # run folders this process created (removed again if nothing was computed)
_VERIFIED: set[str] = set()  # run folders the CLI just checked (open_run then skips one check)


def _process_umask() -> int:
    # read once: os.umask can only be read by setting it, which must not race with threads later
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _process_umask()
FILE_MODE = 0o666 & ~_UMASK
"""Mode of files pofe creates: what ``open()`` would give under the process's umask."""
DIR_MODE = 0o777 & ~_UMASK
"""Mode of folders pofe creates through ``mkdtemp`` (which forces 0700)."""


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


# ----------------------------------------------------------------------------- untrusted folders

def guard_run_dir(run_dir: str | Path) -> None:
    """Treat ``run_dir`` as a run folder from now on in this process: every run-file helper
    refuses links inside it (:func:`check_run_path`). :func:`open_run` does this; ``pofe
    report`` / ``export`` call it for the folder they read."""
    d = os.path.abspath(run_dir)
    _ROOTS[d] = os.path.realpath(d)


def _root_of(path: str | Path) -> tuple[str, str] | None:
    p = os.path.abspath(path)
    best = None
    for d, real in _ROOTS.items():
        if (p == d or p.startswith(d + os.sep)) and (best is None or len(d) > len(best[0])):
            best = (d, real)
    return best


def check_run_path(path: str | Path) -> bool:
    """Refuse (``RunError``) a path inside a guarded run folder that is a symbolic link, or
    whose folder resolves outside the run folder (a planted ``eval -> /home/you`` link).
    Returns True when ``path`` is inside a guarded run folder (open it with ``O_NOFOLLOW``)."""
    root = _root_of(path)
    if root is None:
        return False
    d, real = root
    p = os.path.abspath(path)
    if p == d:
        return True
    if os.path.islink(p):
        raise RunError(f"{path}: is a symbolic link; files in a run folder are never read or written through links "
                       f"(a received run folder could point them anywhere)")
    parent = os.path.realpath(os.path.dirname(p))
    if not (parent == real or parent.startswith(real + os.sep)):
        raise RunError(f"{path}: its folder resolves outside the run folder {d} (a symbolic link); refused")
    return True


def open_run_file(path: str | Path, flags: int, mode: int | None = None) -> int:
    """``os.open`` for a file of a run folder: never through a link, created with the
    process's umask. Returns the file descriptor."""
    inside = check_run_path(path)
    if inside:
        # A received folder may hold a FIFO or a device under a run file's name: opening a FIFO
        # blocks until a writer comes (``pofe report`` hung), a device may act on open. Refused
        # before any open; O_NONBLOCK covers a swap between this check and the open (it changes
        # nothing for a regular file).
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise RunError(f"{path}: not a regular file (a run file must be one)")
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | (os.O_NOFOLLOW | os.O_NONBLOCK if inside else 0),
                     FILE_MODE if mode is None else mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunError(f"{path}: is a symbolic link; files in a run folder are never opened through links") from None
        raise
    if inside and not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunError(f"{path}: not a regular file (a run file must be one)")
    return fd


def read_run_bytes(path: str | Path) -> bytes:
    """The bytes of a file of a run folder (never through a link)."""
    fd = open_run_file(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_run_text(path: str | Path) -> str:
    return read_run_bytes(path).decode("utf-8")


# ----------------------------------------------------------------------------- the lock

def lock_run(run_dir: str | Path) -> None:
    """Take the run folder's lock for the rest of this process's life (idempotent in one
    process). Raises :class:`RunError` naming the PID when another live process holds it."""
    import fcntl

    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key in _HELD:
        return
    guard_run_dir(run_dir)
    path = run_dir / LOCK_NAME
    fd = open_run_file(path, os.O_RDWR | os.O_CREAT)  # a planted .lock link must not get its target truncated
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
        _FRESH.append(candidate)
        _COMMANDS[os.path.abspath(candidate)] = command
        lock_run(candidate)
        return candidate
    raise RunError(f"run.name {name!r}: {name}-2 ... {name}-9999 are all taken in {base}")


def open_run(run: RunConfig, command: str, *, resume: str | Path | None = None) -> Path:
    """The run folder a command writes into: a fresh one, or ``resume`` (which must already be
    a pofe run folder holding ``config.yaml``, unchanged since its ``run.json`` was written),
    locked by this process either way. Every command goes through here, so the guarantees
    about run folders (never shared by two runs, never outside ``run.output_dir``, never
    resumed while another process holds it, never written through links) live in one place.
    Under torchrun only rank 0 creates and locks; other ranks get the folder via the caller's
    broadcast (new runs) or ``resume``."""
    if resume is not None:
        run_dir = Path(resume)
        if not run_dir.is_dir():
            raise RunError(f"--resume {run_dir}: no such run folder (no config.yaml there)")
        if not (run_dir / "config.yaml").is_file():
            raise RunError(f"--resume {run_dir}: no config.yaml there (not a pofe run folder)")
        guard_run_dir(run_dir)
        verify_run_folder(run_dir, again=False)
        _COMMANDS.setdefault(os.path.abspath(run_dir), command)
        if _is_main_process():
            lock_run(run_dir)
        return run_dir
    return new_run_dir(run, command)


# ----------------------------------------------------------------------------- run.json

def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (inputs may be multi-GB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# Keys whose files are outputs, caches or run folders (they change while a run works), never inputs.
_NOT_INPUTS = {"run", "cache", "output", "out", "output_dir", "log"}


def input_files(cfg: BaseModel | dict) -> list[tuple[str, str]]:
    """(dotted key, path) of every existing regular file the config names (data files, prompts,
    pairs, preferences, calibration reports, template and constitution files, ...): each
    string value, or string in a list, that is the path of a file. Outputs and caches are left
    out."""
    def is_file(node: str) -> bool:
        try:
            return os.path.isfile(os.path.expanduser(node))
        except (OSError, ValueError):
            return False

    return _config_paths(cfg, is_file)


def _config_paths(cfg: BaseModel | dict, keep: Callable[[str], bool]) -> list[tuple[str, str]]:
    """(dotted key, value) of every one-line string of the config (in lists too, outputs and caches
    left out) for which ``keep(value)`` holds."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg
    out: list[tuple[str, str]] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if str(k) not in _NOT_INPUTS:
                    walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif isinstance(node, str) and node and "\n" not in node and len(node) < 4096 and keep(node):
            out.append((key, node))

    walk(data, "")
    return out


def model_folders(cfg: BaseModel | dict) -> list[tuple[str, str]]:
    """(dotted key, path) of every local model or adapter folder the config names (``model.name``,
    ``model.adapter``, a judge's model, ...): a model is an input too, and ``run.json`` records its
    fingerprint (:func:`pofe.model_folders.fingerprint`) so that a resume on other weights is refused."""
    from pofe.model_folders import is_model_folder

    return _config_paths(cfg, is_model_folder)


def write_manifest(run_dir: str | Path, cfg: BaseModel) -> Path:
    """``run.json``: pofe version, command, sha256 of ``config.yaml`` and of every input file the
    config names, so that a resume can tell that the run would continue from what it started."""
    from pofe import __version__

    run_dir = Path(run_dir)
    inputs = [{"key": k, "path": p, "sha256": file_sha256(os.path.expanduser(p)),
               "bytes": os.path.getsize(os.path.expanduser(p))} for k, p in input_files(cfg)]
    from pofe.model_folders import model_identities

    manifest = {"format": 1, "pofe_version": __version__, "command": _COMMANDS.get(os.path.abspath(run_dir)),
                "config_sha256": hashlib.sha256(read_run_bytes(run_dir / "config.yaml")).hexdigest(),
                "inputs": inputs, "models": model_identities(model_folders(cfg))}
    path = run_dir / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=1) + "\n")
    return path


def verify_run_folder(run_dir: str | Path, *, again: bool = True) -> None:
    """Refuse (``RunError``) to resume a folder whose ``config.yaml`` or input files changed since
    its ``run.json`` was written, naming the changed file; a folder without ``run.json`` (an
    older pofe) is resumed with a warning that it cannot be verified. ``again=False`` (what
    :func:`open_run` passes) skips one check the CLI has just made for the same command."""
    run_dir = Path(run_dir)
    key = os.path.abspath(run_dir)
    if not again and key in _VERIFIED:
        _VERIFIED.discard(key)
        return
    guard_run_dir(run_dir)
    config = run_dir / "config.yaml"
    text = read_run_bytes(config)  # refuses a config.yaml link before anything reads it
    path = run_dir / MANIFEST
    if not os.path.lexists(path):
        log.warning("%s: no %s (written by an older pofe): its config and inputs cannot be verified; resuming as it is",
                    run_dir, MANIFEST)
        _VERIFIED.add(key)
        return
    try:
        manifest = json.loads(read_run_text(path))
        want = manifest["config_sha256"]
        inputs = manifest.get("inputs") or []
        if not isinstance(want, str) or not isinstance(inputs, list):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise RunError(f"--resume {run_dir}: {path} is not a valid run manifest; cannot verify the run "
                       f"(start a new run)") from None
    if hashlib.sha256(text).hexdigest() != want:
        raise RunError(f"--resume {run_dir}: {config} changed since the run wrote it (its sha256 differs from "
                       f"{MANIFEST}); a resumed run continues the run that was started: start a new run to change settings")
    for item in inputs:
        try:
            k, p, h = item["key"], item["path"], item["sha256"]
        except (KeyError, TypeError):
            raise RunError(f"--resume {run_dir}: {path} is not a valid run manifest (bad inputs entry)") from None
        full = os.path.expanduser(p)
        if not os.path.isfile(full):
            raise RunError(f"--resume {run_dir}: input {k} = {p} no longer exists; the run cannot continue on "
                           f"the data it started with (start a new run)")
        if file_sha256(full) != h:
            raise RunError(f"--resume {run_dir}: input {k} = {p} changed since the run started (sha256 differs "
                           f"from {MANIFEST}); resuming would mix two datasets in one run: start a new run")
    from pofe.model_folders import model_change

    for item in manifest.get("models") or []:  # absent in a run.json of an older pofe: nothing recorded to compare
        try:
            change = model_change(item)
        except (KeyError, TypeError, ValueError):
            raise RunError(f"--resume {run_dir}: {path} is not a valid run manifest (bad models entry)") from None
        if change is not None:
            raise RunError(f"--resume {run_dir}: {item['key']} = {item['path']} changed since the run started "
                           f"({change}); a resumed run would continue on other weights: start a new run")
    _VERIFIED.add(key)


# Keys whose value makes pofe import and run code, run a model folder's Python, or send the
# run's data to a server. A resumed folder's config is anyone's data: these must come from
# the command line (or an explicit --trust-run-config), never silently from the folder.
def untrusted_settings(cfg: BaseModel | dict) -> list[tuple[str, Any]]:
    """(dotted key, value) of every setting in ``cfg`` that executes code or sends data out:
    ``callable`` import paths (judges, rewards), ``trust_remote_code: true``, the
    ``base_url`` of an endpoint the config actually uses, and a ``push_to_hub`` repo."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg
    found: list[tuple[str, Any]] = []

    def endpoint_in_use(owner: Any) -> bool:
        if not isinstance(owner, dict) or ("kind" not in owner and "backend" not in owner):
            return True  # an endpoint section of unknown use: assume it is used
        return owner.get("kind") == "openai" or owner.get("backend") == "openai"

    def walk(node: Any, key: str, parents: tuple) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                sub = f"{key}.{k}" if key else str(k)
                # Import paths are 'module:function' (the only form pofe imports); built-in
                # names such as reward.function=length have no colon. Flag any colon, whatever else.
                if k in ("callable", "function", "import_path") and isinstance(v, str) and ":" in v:
                    found.append((sub, v))
                elif k == "trust_remote_code" and v is True:
                    found.append((sub, v))
                elif k == "push_to_hub" and isinstance(v, str):  # uploads the run's model to that repo
                    found.append((sub, v))
                elif k == "base_url" and isinstance(v, str) and endpoint_in_use(parents[-1] if parents else None):
                    found.append((sub, v))
                else:
                    walk(v, sub, (*parents, node))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]", parents)

    walk(data, "", ())
    return found


RESUMABLE_SETTINGS = ("judge.budget", "reward.judge.budget", "run.collective_timeout_s", "run.allow_world_change")
"""Keys ``--resume RUN --set KEY=VALUE`` may change: limits on what a run may spend or wait, and
the explicit consent to resume with another number of processes; never what it computes (a resumed
run otherwise keeps its saved config.yaml)."""


def rewrite_resumed_config(run_dir: str | Path, cfg: BaseModel) -> None:
    """After ``--resume --set`` changed a :data:`RESUMABLE_SETTINGS` key: ``config.yaml`` written
    again and its sha256 in ``run.json`` updated (the inputs' hashes stay), so a later resume
    verifies and keeps the new value. Under the folder's lock (a live run's config is never
    rewritten), by the main process only."""
    if not _is_main_process():
        return
    run_dir = Path(run_dir)
    lock_run(run_dir)  # held for the run this process is about to continue (open_run takes it again: idempotent)
    atomic_write_text(run_dir / "config.yaml", dump_config(cfg))
    path = run_dir / MANIFEST
    if os.path.lexists(path):
        manifest = json.loads(read_run_text(path))
        manifest["config_sha256"] = hashlib.sha256(read_run_bytes(run_dir / "config.yaml")).hexdigest()
        atomic_write_text(path, json.dumps(manifest, indent=1) + "\n")


def write_config(run_dir: Path, cfg: BaseModel) -> Path:
    """``config.yaml`` (the resolved config) and ``run.json`` (what the run started from)."""
    path = Path(run_dir) / "config.yaml"
    atomic_write_text(path, dump_config(cfg))
    if _is_main_process():
        write_manifest(run_dir, cfg)
    return path


# Files a command writes into a fresh folder before it computes anything (recreated on any start).
_NOT_COMPUTED = {"config.yaml", MANIFEST, LOCK_NAME, "inputs.json"}


def discard_unused_runs() -> list[Path]:
    """Remove the run folders this process created that hold nothing computed (only the
    config, the manifest, the lock, empty files and an empty TensorBoard log): what a bad-input
    error right after the folder was claimed leaves. Returns the folders removed."""
    removed = []
    for d in list(_FRESH):
        try:
            computed = False
            for p in d.rglob("*"):
                if p.is_symlink() or not p.is_file() or p.name in _NOT_COMPUTED:
                    continue
                if p.stat().st_size > 0 and "tensorboard" not in p.relative_to(d).parts:
                    computed = True
                    break
            if computed:
                continue
            release_run(d)
            shutil.rmtree(d)
            removed.append(d)
            _FRESH.remove(d)
        except OSError:
            continue
    return removed


def forget_fresh_runs() -> None:
    """A new command starts: the run folders created so far are not its to discard, and no
    check of an earlier command stands for it."""
    _FRESH.clear()
    _VERIFIED.clear()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder + rename, so a crash never leaves a torn
    file and an existing link at ``path`` is replaced, never written through."""
    path = Path(path)
    root = _root_of(path)
    if root is not None and not os.path.isdir(root[0]):  # never re-create a run folder deleted mid-run
        raise RunFolderGone(f"{root[0]}: the run folder was deleted while this run was writing it; {path.name} "
                            f"and what the folder held are lost")
    path.parent.mkdir(parents=True, exist_ok=True)
    check_run_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp creates 0600; give what open() would under the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file + rename so a crash never leaves a torn file."""
    atomic_write_bytes(path, text.encode("utf-8"))


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
        # never through a link inside a run folder: a planted ledger.jsonl link appended rows elsewhere
        fd = open_run_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._f = os.fdopen(fd, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        from pofe.jsonl import json_line

        self._f.write(json_line(_clean(row)) + "\n")
        self._f.flush()
        if os.fstat(self._f.fileno()).st_nlink == 0:
            # The file was deleted under us (its run folder removed mid-run): every row goes to an
            # unlinked inode, and the summary read back "0/0 pairs" with exit 0. Stop, saying so.
            raise RunFolderGone(f"{self.path}: deleted while this run was writing it (was the run folder removed?); "
                                f"the rows written to it are lost")

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
    from pofe.jsonl import is_blank_line, iter_jsonl_lines

    rows = []
    text = read_run_text(path) if check_run_path(path) else Path(path).read_text(encoding="utf-8")
    # Split on "\n" only: str.splitlines also splits on U+2028 / U+0085 inside a JSON string.
    lines = [(i, ln) for i, ln in iter_jsonl_lines(text) if not is_blank_line(ln)]
    for k, (i, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError, ValueError) as e:
            if k == len(lines) - 1:  # the torn tail of a crash mid-write
                break
            raise ValueError(f"{path}:{i}: invalid JSON ({getattr(e, 'msg', type(e).__name__)})") from None
    return rows
