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

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from pofe.data.calibration import resolve_annotation_events

log = logging.getLogger(__name__)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class EventLog:
    """Append events to ``path`` (created with its folder), one fsync'd ``os.write`` each.

    A single ``write`` on an ``O_APPEND`` descriptor keeps lines whole even when two servers
    (two annotators) append to one file. A torn last line -- a crash mid-write, never
    acknowledged to the page -- is cut off when the log is opened, so the next event does not
    land on the same line.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created:  # make the new directory entry durable too
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self._repair_tail()

    def _repair_tail(self) -> None:
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        tail = data[cut:]
        try:
            json.loads(tail)
            os.write(self._fd, b"\n")  # a whole event that only lacks its newline
        except ValueError:
            log.warning("%s: dropping a torn last line (%d bytes, written during a crash)", self.path, len(tail))
            os.truncate(self.path, cut)
        os.fsync(self._fd)

    def rows(self) -> list[dict[str, Any]]:
        """Every event, in file order. Strict: a malformed line names its line number."""
        out = []
        for i, line in enumerate(self.path.read_text(encoding="utf-8").splitlines()):
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
        row = {**event, "time": now()}
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            written = os.write(self._fd, data)
            if written != len(data):  # pragma: no cover - a full disk
                raise OSError(f"{self.path}: short write ({written} of {len(data)} bytes)")
            os.fsync(self._fd)
        return row

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
