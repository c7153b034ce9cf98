"""``pofe cache``: look after the shared judge cache (``$POFE_HOME/judge-cache.sqlite`` by
default): ``stats``, ``prune --max-size``, ``clear``, ``export -o FILE``.

The cache only ever saves judge calls (every entry is keyed on everything that can change
a read), so pruning or clearing it never changes a result, only what the next run pays.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import JsonOpt, emit_json, fail
from pofe.jsonl import json_line

PathOpt = typer.Option(None, "--path", help="Cache file (default: $POFE_HOME/judge-cache.sqlite).")

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024 ** 2, "mb": 1024 ** 2, "mib": 1024 ** 2,
          "g": 1024 ** 3, "gb": 1024 ** 3, "gib": 1024 ** 3}


def parse_size(text: str) -> int:
    """'500M', '2 GB', '1024' -> bytes (binary units). Raises ValueError naming the input."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"--max-size {text!r}: expected a size such as 500M, 2G or 1048576")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _open(path: Optional[Path], *, must_exist: bool = True):
    import sqlite3

    from pofe.judges.cache import JudgeCache, default_cache_path

    p = Path(path) if path else default_cache_path()
    if must_exist and not p.exists():
        fail(f"no judge cache at {p}")
    try:
        return JudgeCache(p)
    except (sqlite3.Error, OSError) as e:
        fail(f"cannot open judge cache {p}: {e}", code=1)


def register(app: typer.Typer) -> None:
    cache_app = typer.Typer(help="The shared judge cache: stats, prune, clear, export.", no_args_is_help=True)
    app.add_typer(cache_app, name="cache")

    @cache_app.command(help="Entries, sizes and age of the judge cache.")
    def stats(path: Optional[Path] = PathOpt, json_out: bool = JsonOpt) -> None:
        from pofe.judges.cache import default_cache_path

        if path is None and not default_cache_path().exists():
            # no judge has cached a read yet: a state to report, not an error (a --path that is
            # not there is a mistyped file and stays one)
            where = default_cache_path()
            if json_out:
                emit_json({"path": str(where), "exists": False, "entries": 0, "file_bytes": 0, "data_bytes": 0,
                           "oldest": None, "newest": None})
            else:
                typer.echo(f"no judge cache yet at {where} (a judge with the cache on writes it on its first read)")
            return
        c = _open(path)
        s = {**c.summary(), "exists": True}
        c.close()
        if json_out:
            emit_json(s)
            return
        typer.echo(f"judge cache {s['path']}: {s['entries']} entries, {s['file_bytes'] / 1e6:.2f} MB on disk "
                   f"({s['data_bytes'] / 1e6:.2f} MB of data)")

    @cache_app.command(help="Delete the oldest entries until the cache's data fits in --max-size (e.g. 500M).")
    def prune(max_size: str = typer.Option(..., "--max-size", help="Size cap: bytes, or 500K / 200M / 2G."),
              path: Optional[Path] = PathOpt, json_out: bool = JsonOpt) -> None:
        cap = parse_size(max_size)
        c = _open(path)
        before = c.summary()
        deleted = c.prune(cap)
        after = c.summary()
        c.close()
        out = {"path": after["path"], "deleted": deleted, "entries": after["entries"], "max_bytes": cap,
               "data_bytes_before": before["data_bytes"], "data_bytes": after["data_bytes"],
               "file_bytes": after["file_bytes"]}
        if json_out:
            emit_json(out)
        else:
            typer.echo(f"pruned {deleted} entries; {after['entries']} left ({after['data_bytes'] / 1e6:.2f} MB of data, "
                       f"cap {cap / 1e6:.2f} MB)")

    @cache_app.command(help="Delete every entry.")
    def clear(path: Optional[Path] = PathOpt, yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
              json_out: bool = JsonOpt) -> None:
        c = _open(path)
        if not yes and not typer.confirm(f"delete all {len(c)} entries of {c.path}?"):
            c.close()
            fail("not cleared", code=1)
        n = c.clear()
        c.close()
        if json_out:
            emit_json({"path": str(c.path), "deleted": n})
        else:
            typer.echo(f"cleared {n} entries from {c.path}")

    @cache_app.command(help="Write every entry as JSON lines (key, created, value) to -o FILE.")
    def export(output: Path = typer.Option(..., "-o", "--output", help="JSONL file to write."),
               path: Optional[Path] = PathOpt, json_out: bool = JsonOpt) -> None:
        c = _open(path)
        from pofe.outputs import guard_outputs  # never the cache itself (also via a link), never inside a live run

        guard_outputs({"-o": output}, [c.path])
        from pofe.runs import atomic_write_text

        n = 0
        lines = []
        for e in c.iter_entries():
            lines.append(json_line(e) + "\n")
            n += 1
        c.close()
        try:
            atomic_write_text(output, "".join(lines))
        except OSError as e:
            fail(f"cannot write {output}: {e.strerror or e}", code=1)
        if json_out:
            emit_json({"path": str(c.path), "output": str(output), "entries": n})
        else:
            typer.echo(f"exported {n} entries to {output}")
