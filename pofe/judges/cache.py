"""SQLite cache of judge reads, shared by every LLM judge backend.

"For production use ... cache each (prompt, order) result" (rlaif-constitutional-ai.txt,
implementation sketch). One entry is one *ordered* read, keyed by a hash of everything
that can change the answer: the backend's fingerprint (model name, revision and weights
identity; for an endpoint its URL, API and the serving model as ``/v1/models`` reports it),
the template content hash, decoding settings (choices, order, CoT and its sampling,
temperature), prompt, the ordered pair (first, second), principle (id, version and text)
and any reference. Labelling (A, B) and later (B, A) therefore reuses both reads.

Concurrency: WAL journal + busy timeout so several processes (a judge server and a loop,
two CLI runs) can share one file; within a process one connection is guarded by a lock
so judge threads can share it. Failed reads are never stored (a transient endpoint error
must be retried next time, not replayed forever), but the successful reads of a batch
with one failure are (paid API work is not lost).

A cache that cannot be written (disk full, read-only file, locked too long) degrades to
uncached with one warning: labelling continues, nothing already computed is lost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from pofe.judges.config import CacheConfig
from pofe.jsonl import json_line
from pofe.paths import default_judge_cache_path

log = logging.getLogger(__name__)

__all__ = ["CacheConfig", "JudgeCache", "cache_key", "default_cache_path", "open_cache"]


def default_cache_path() -> Path:
    return default_judge_cache_path()


def cache_key(*parts: Any) -> str:
    """Stable sha256 of JSON-encoded parts (order matters: (A, B) != (B, A))."""
    blob = json.dumps(parts, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    # surrogatepass: a lone surrogate in a judged text must not crash the key; every other
    # text hashes exactly as before, so existing caches stay valid.
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


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
        self.write_failures = 0
        self.writable = True

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            try:
                row = self._conn.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error as e:  # a corrupt or vanished file reads as a miss, never as a value
                log.warning("judge cache %s unreadable (%s); treating as a miss", self.path, e)
                row = None
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        try:
            return json.loads(row[0])
        except ValueError:
            return None

    def put(self, key: str, value: dict[str, Any]) -> bool:
        """Store one read; False (after one warning per cache) when it cannot be written."""
        return self.put_many([(key, value)]) == 1

    def put_many(self, items: list[tuple[str, dict[str, Any]]]) -> int:
        """Store reads in one transaction; returns how many were written (0 when the cache
        is not writable: the caller carries on uncached)."""
        if not items or not self.writable:
            return 0
        rows = [(k, json_line(v), time.time()) for k, v in items]
        with self._lock:
            try:
                self._conn.executemany("INSERT OR REPLACE INTO judge_cache (key, value, created) VALUES (?, ?, ?)", rows)
            except sqlite3.Error as e:  # disk full, read-only, locked past busy_timeout
                self.write_failures += len(rows)
                self.writable = False
                log.warning("judge cache %s cannot be written (%s); continuing without caching", self.path, e)
                return 0
        return len(rows)

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]

    def stats(self) -> dict[str, int]:
        return {"cache_hits": self.hits, "cache_misses": self.misses, "cache_write_failures": self.write_failures}

    # -- maintenance (``pofe cache``) -----------------------------------------------------
    def summary(self) -> dict[str, Any]:
        with self._lock:
            n, oldest, newest, size = self._conn.execute(
                "SELECT COUNT(*), MIN(created), MAX(created), COALESCE(SUM(LENGTH(key) + LENGTH(value)), 0) "
                "FROM judge_cache").fetchone()
        return {"path": str(self.path), "entries": n, "file_bytes": file_bytes(self.path), "data_bytes": int(size),
                "oldest": oldest, "newest": newest}

    def prune(self, max_bytes: int) -> int:
        """Delete the oldest entries until the stored data fits in ``max_bytes``, then VACUUM
        so the file shrinks; returns the number of entries deleted."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT key, LENGTH(key) + LENGTH(value) FROM judge_cache ORDER BY created DESC, rowid DESC").fetchall()
            total, keep_until = 0, len(rows)
            for i, (_, size) in enumerate(rows):
                if total + size > max_bytes:
                    keep_until = i
                    break
                total += size
            doomed = [(k,) for k, _ in rows[keep_until:]]
            if doomed:
                self._conn.execute("BEGIN")
                self._conn.executemany("DELETE FROM judge_cache WHERE key = ?", doomed)
                self._conn.execute("COMMIT")
                self._conn.execute("VACUUM")
        return len(doomed)

    def clear(self) -> int:
        with self._lock:
            n = self._conn.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]
            self._conn.execute("DELETE FROM judge_cache")
            self._conn.execute("VACUUM")
        return n

    def iter_entries(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT key, value, created FROM judge_cache ORDER BY created, rowid").fetchall()
        for k, v, c in rows:
            yield {"key": k, "created": c, "value": json.loads(v)}

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def file_bytes(path: Path) -> int:
    """Size of the SQLite file with its WAL and shared-memory files."""
    return sum(os.path.getsize(p) for p in (str(path), f"{path}-wal", f"{path}-shm") if os.path.exists(p))


def open_cache(cfg: CacheConfig | None, *, path: str | Path | None = None) -> JudgeCache | None:
    """The cache a judge should use, or None when disabled. A cache that cannot be opened
    (unwritable folder, not an SQLite file) is a warning and no cache, not a failed run."""
    if cfg is not None and not cfg.enabled:
        return None
    p = path or (cfg.path if cfg is not None else None) or default_cache_path()
    try:
        return JudgeCache(p)
    except (sqlite3.Error, OSError) as e:
        log.warning("judge cache %s cannot be opened (%s); continuing without caching", p, e)
        return None
