"""SQLite cache of judge reads, shared by every LLM judge backend.

"For production use ... cache each (prompt, order) result" (rlaif-constitutional-ai.txt,
implementation sketch). One entry is one *ordered* read, keyed by a hash of everything
that can change the answer: judge model fingerprint (name, revision, weights identity),
template content hash, decoding parameters, prompt, the ordered pair (first, second),
principle (id, version and text) and any reference. Labelling (A, B) and later (B, A)
therefore reuses both reads.

Concurrency: WAL journal + busy timeout so several processes (a judge server and a loop,
two CLI runs) can share one file; within a process one connection is guarded by a lock
so judge threads can share it. Failed reads are never stored: a transient endpoint error
must be retried next time, not replayed forever.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pofe.config import PofeConfig
from pofe.models import pofe_home


class CacheConfig(PofeConfig):
    """Judge cache (SQLite)."""

    enabled: bool = True
    """Store and reuse judge reads. Disabled automatically for a live model passed in at
    run time (its weights change while training) unless the caller gives a ``cache_tag``."""
    path: str | None = None
    """SQLite file; default ``$POFE_HOME/judge-cache.sqlite`` (shared by runs)."""


def default_cache_path() -> Path:
    return pofe_home() / "judge-cache.sqlite"


def cache_key(*parts: Any) -> str:
    """Stable sha256 of JSON-encoded parts (order matters: (A, B) != (B, A))."""
    blob = json.dumps(parts, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """Key -> JSON value store with hit/miss counters."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout=30000")
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:  # e.g. a filesystem without shared memory; still correct, just slower
            pass
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS judge_cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
        )
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: dict[str, Any]) -> None:
        blob = json.dumps(value, ensure_ascii=False)
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO judge_cache (key, value, created) VALUES (?, ?, ?)",
                               (key, blob, time.time()))

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]

    def stats(self) -> dict[str, int]:
        return {"cache_hits": self.hits, "cache_misses": self.misses}

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def open_cache(cfg: CacheConfig | None, *, path: str | Path | None = None) -> JudgeCache | None:
    """The cache a judge should use, or None when disabled."""
    if cfg is not None and not cfg.enabled:
        return None
    p = path or (cfg.path if cfg is not None else None) or default_cache_path()
    return JudgeCache(p)
