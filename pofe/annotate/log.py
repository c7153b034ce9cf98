"""The calibration file of ``pofe annotate``: an append-only JSONL event log.

Every key press that decides something is one line, written and fsync'd before the page
hears back, so closing the tab, killing the server or losing power loses nothing that was
acknowledged. Nothing is ever edited: undo is an appended ``undo`` event. Rows::

    {"event": "open",  "annotator", "pairs", "pairs_sha256", "n_pairs", "seed", "pofe", "time"}
    {"event": "label", "annotator", "pair_id", "label": "A"|"B"|"tie", "choice": "left"|"right"|"tie",
     "shown": "ab"|"ba", "prompt", "response_a", "response_b", "pairs", "time"}
    {"event": "skip",  "annotator", "pair_id", "time"}
    {"event": "undo",  "annotator", "pair_id", "time"}

``label`` is relative to ``response_a``/``response_b`` (the pair's own order); ``shown``
records what the person saw on the left (``ab``: response_a) and ``choice`` which side they
picked, so the mapping can be checked. Label rows carry the texts, which makes the file a
self-contained calibration set (``pofe audit --calibration FILE``). The meaning of the log
(which decisions stand after undos) lives in one function,
:func:`pofe.data.calibration.resolve_annotation_events`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pofe.data.calibration import resolve_annotation_events
from pofe.data.prompts import DataError
from pofe.errors import PofeError

log = logging.getLogger(__name__)

# Characters that are legal raw inside a JSON string but that line readers other than pofe's
# treat as line breaks (str.splitlines: U+0085, U+2028, U+2029) or that UTF-8 cannot encode
# (lone surrogates): written as \uXXXX escapes, which every JSON reader turns back into the
# same text.
_UNSAFE = re.compile("[\u0085\u2028\u2029\ud800-\udfff]")
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # errnos the page hears as 507 Insufficient Storage


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def json_text(obj: Any) -> str:
    """``obj`` as one line of JSON, readable as UTF-8 and split into lines on ``\n`` only by
    any reader (non-ASCII text is kept as it is, for a person reading the file)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False))


def split_lines(data: bytes) -> list[str]:
    """A JSONL file's lines: split on ``\n`` only (``str.splitlines`` would also split on
    separators a JSON string may hold raw, e.g. U+2028 written by another tool)."""
    text = data.decode("utf-8")
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]


class LogWriteError(PofeError, OSError):
    """An event could not be saved (full disk, I/O error); the log is as it was before it.
    ``errno`` is the cause's; ``str(e)`` is one line naming the log."""

    exit_code = 1

    def __str__(self) -> str:
        return str(self.strerror)


class LogInUse(DataError):
    """Another live server holds this (log, annotator): two writers of one undo stack would
    each replay the log without the other's events and interleave contradicting decisions."""

    exit_code = 2


class AnnotatorLock:
    """Exclusive ``fcntl.flock`` on a lock file next to the log, one per (log, annotator),
    held while the server runs; the kernel releases it when the process dies (SIGKILL too).
    The holder's PID is written inside so that a refused second server can name it."""

    def __init__(self, log_path: str | Path, annotator: str):
        real = Path(os.path.realpath(log_path))  # one lock whatever the name (symlink, relative path)
        name = f".{real.name}.{annotator}.lock"
        if len(name.encode()) > 255:  # NAME_MAX: a very long log name gets a hashed one
            name = f".{hashlib.sha256(real.name.encode()).hexdigest()[:16]}.{annotator}.lock"
        self.path = real.parent / name
        real.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise LogInUse(f"{log_path}: annotator {annotator!r} is already labelling this log in another pofe "
                               f"annotate (PID {holder}); use that page, or stop it first") from None
            # A holder that was just closing may have unlinked the file we opened: lock the
            # file that is at the path now, not an orphan.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            try:
                os.unlink(self.path)  # while still held: nobody can have locked it meanwhile
            except OSError:
                pass
            os.close(self._fd)
            self._fd = -1


class EventLog:
    """Append events to ``path`` (created with its folder), one fsync'd ``os.write`` each.

    Each event is whole or absent. Appends from every server on the file (one per annotator)
    are serialised by an exclusive ``flock`` on the log itself, so the offset an event starts
    at is known: a short write or a failed fsync (full disk) is cut back off with
    ``ftruncate`` and reported, never acknowledged, and the next event starts a line of its
    own. A torn last line (a crash mid-write, never acknowledged to the page) is cut off when
    the log is opened and before each append, so no event is glued onto one.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.torn_bytes_dropped = 0  # bytes of torn last lines cut off since this log was opened
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        # Read access too: the tail is checked with pread before each append.
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        if created:  # make the new directory entry durable too
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        with self._flocked(fcntl.LOCK_EX):
            self._repair_tail()

    @contextmanager
    def _flocked(self, how: int) -> Iterator[None]:
        fcntl.flock(self._fd, how)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _repair_tail(self) -> int:
        """Make the file end with a newline (called under the exclusive flock); its size after."""
        size = os.fstat(self._fd).st_size
        if not size or os.pread(self._fd, 1, size - 1) == b"\n":
            return size
        data = os.pread(self._fd, size, 0)
        cut = data.rfind(b"\n") + 1
        tail = data[cut:]
        try:
            whole = json.loads(tail)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and "event" in whole:
            # A complete event that only lacks its newline (e.g. an edited file): keep it.
            os.write(self._fd, b"\n")
            size += 1
        else:
            self.torn_bytes_dropped += len(tail)
            log.warning("%s: dropping a torn last line (%d bytes, from a write that was cut short)", self.path,
                        len(tail))
            os.ftruncate(self._fd, cut)
            size = cut
        os.fsync(self._fd)
        return size

    def rows(self) -> list[dict[str, Any]]:
        """Every event, in file order. Strict: a malformed line names its line number."""
        # The thread lock too: a second flock call on this descriptor would convert (and then
        # release) an append's exclusive lock rather than wait for it.
        with self._lock, self._flocked(fcntl.LOCK_SH):  # never read another server's event half-written
            data = self.path.read_bytes()
        out = []
        for i, line in enumerate(split_lines(data)):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path}:{i + 1}: invalid JSON ({e.msg})") from None
        return out

    def standing(self, annotator: str) -> list[dict[str, Any]]:
        """This annotator's decisions that stand (after undos), oldest first."""
        return [d for d in resolve_annotation_events(self.rows(), str(self.path)) if d["annotator"] == annotator]

    def append(self, event: dict[str, Any]) -> dict[str, Any]:
        """Write one event durably, or raise :class:`LogWriteError` with the file unchanged."""
        row = {**event, "time": now()}
        data = (json_text(row) + "\n").encode("utf-8")
        with self._lock, self._flocked(fcntl.LOCK_EX):
            start = self._repair_tail()
            try:
                written = os.write(self._fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, f"short write, {written} of {len(data)} bytes (disk full?)")
                os.fsync(self._fd)
            except OSError as e:
                self._take_back(start)
                raise LogWriteError(e.errno, f"{self.path}: could not write the event: {e.strerror or e}") from e
        return row

    def _take_back(self, start: int) -> None:
        """Cut a failed append's bytes off again: whole or absent. Shrinking needs no space."""
        try:
            os.ftruncate(self._fd, start)
            os.fsync(self._fd)
        except OSError as e:  # the next append's tail check cuts a partial line off again
            log.error("%s: could not cut a failed write back off (%s)", self.path, e)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
