"""One guard for every user-given output path: :func:`guard_outputs`.

A command that writes a file the user named (``-o``, ``--output``, ``html=``) must never destroy
what it reads or what another process is writing. Before anything is read or written, each
output is checked against

* **every input** -- by resolved path *and* by ``(st_dev, st_ino)``, so a symlink or a hard
  link to an input is caught as well as ``./x/../input.jsonl``; an existing file inside an
  input *folder* (a calibration folder, a run folder) counts as an input of that folder;
* **every live run** -- a run folder's owner holds an exclusive ``flock`` on ``<run>/.lock``
  for its whole life (:mod:`pofe.runs`); an output inside a folder whose lock another live
  process holds would be written under that run's feet (``pofe judge -o runs/live/labels.jsonl``
  replaced a running ``pofe label``'s labels);
* **the other outputs** -- two outputs on one path would keep only the last one written;
* **its own shape** -- a file output that is a folder, a folder output that is a file, or a
  parent path that is a file.

A refusal is a :class:`~pofe.errors.DataError` (exit 2) of one line naming the flag, the
path and what writing there would destroy.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from pofe.errors import DataError
from pofe.paths import default_judge_cache_path

__all__ = ["check_output", "guard_outputs", "live_run_holding", "judge_inputs"]


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _lock_holder(lock: Path) -> str | None:
    """The PID text of the live process holding ``lock`` (a run folder's ``.lock``), or None
    when nobody holds it. The test takes the lock on a fresh descriptor and drops it at once:
    flock conflicts between descriptors even within one process, which is why the folders
    this process holds itself are skipped by the caller."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # a symlinked or unreadable .lock is not a pofe run lock we can test
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def live_run_holding(path: str | Path) -> tuple[Path, str] | None:
    """``(run folder, PID)`` of a run folder that contains ``path`` (as written or resolved)
    and whose lock another live process holds; None when there is none."""
    from pofe.runs import LOCK_NAME, _HELD

    p = Path(path).expanduser()
    seen: set[str] = set()
    for chain in (p.absolute().parents, p.resolve().parents):
        for folder in chain:
            key = str(folder.resolve())
            if key in seen:
                continue
            seen.add(key)
            if key in _HELD:  # this process's own run folder
                continue
            lock = folder / LOCK_NAME
            if not lock.is_file() or lock.is_symlink():
                continue
            pid = _lock_holder(lock)
            if pid is not None:
                return folder, pid
    return None


def _inside(child: Path, folder: Path) -> bool:
    try:
        child.relative_to(folder)
        return True
    except ValueError:
        return False


def guard_outputs(outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path | None], *,
                  folders: Collection[str] = ()) -> None:
    """Refuse (:class:`DataError`, one line) any output that would destroy an input, another
    output, or a live run's files. ``outputs`` maps the flag the user wrote (``-o``,
    ``--set html``) to its path (None: not given, skipped); ``inputs`` are every file or
    folder the command reads (None and non-paths such as ``advbench`` are skipped);
    ``folders`` names the flags whose output is a folder (``pofe report --output``)."""
    given = {flag: Path(str(p)).expanduser() for flag, p in outputs.items() if p is not None and str(p) != ""}
    srcs = []
    for s in inputs:
        if s is None or str(s) == "":
            continue
        sp = Path(str(s)).expanduser()
        if sp.exists():
            srcs.append((str(s), sp, sp.resolve(), _ident(sp), sp.is_dir()))
    done: dict[str, tuple[str, Path, tuple[int, int] | None]] = {}
    for flag, out in given.items():
        shown = f"{flag} {out}"
        is_folder_out = flag in folders
        if is_folder_out:
            if out.exists() and not out.is_dir():
                raise DataError(f"{shown}: is a file; give a folder")
        elif out.is_dir():
            raise DataError(f"{shown}: is a folder; give a file path")
        for parent in out.absolute().parents:
            if parent.exists():
                if not parent.is_dir():
                    raise DataError(f"{shown}: {parent} is a file, not a folder")
                break
        target, ident = out.resolve(), _ident(out)
        for name, sp, resolved, sid, is_dir in srcs:
            same = resolved == target or (ident is not None and ident == sid)
            if same:
                what = "the input folder" if is_dir else "the input file"
                raise DataError(f"{shown}: is {what} {name}; choose another output (inputs are never overwritten)")
            if is_dir and not is_folder_out and out.exists() and _inside(target, resolved):
                raise DataError(f"{shown}: is a file inside the input folder {name}; choose another output "
                                f"(inputs are never overwritten)")
        for other, (oflag, opath, oident) in done.items():
            if opath == target or (ident is not None and ident == oident):
                raise DataError(f"{shown}: is also the output of {oflag}; give each output its own path")
        live = live_run_holding(out)
        if live is not None:
            folder, pid = live
            raise DataError(f"{shown}: is inside the run folder {folder}, which a running pofe process (PID {pid}) "
                            f"is writing; choose a path outside it")
        done[str(target)] = (flag, target, ident)


def judge_inputs(judge: Any) -> list[str]:
    """The files a judge config reads (template and constitution files, the SQLite cache, a
    local GGUF / reward model; a jury's: its members' and their audit reports), so an output
    never lands on them."""
    out: list[str] = []
    for key in ("template", "constitution", "gguf", "reward_model", "model", "callable"):
        v = getattr(judge, key, None)
        if isinstance(v, str) and v and Path(v).expanduser().exists():
            out.append(v)
    llamacpp = getattr(judge, "llamacpp", None)
    if llamacpp is not None and isinstance(getattr(llamacpp, "gguf", None), str):
        out.append(llamacpp.gguf)
    cache = getattr(judge, "cache", None)
    if cache is not None and getattr(cache, "enabled", False):
        if cache.path:
            out.append(cache.path)
        else:
            out.append(str(default_judge_cache_path()))
    for member in getattr(judge, "members", None) or []:
        out += judge_inputs(member)
    out += [c for c in getattr(judge, "calibration", None) or [] if isinstance(c, str)]
    return out


def check_output(output: str | Path | None, inputs: list[str | Path | None], *, flag: str = "-o") -> None:
    """Refuse an output path that is a folder, that is (or links to) one of the inputs, or that
    lies inside a live run's folder: :func:`guard_outputs` with one output."""
    guard_outputs({flag: output}, inputs)
