"""One way to read rows: every command's input goes through :func:`read_located`.

A *source* is one string, so it fits in a YAML key or a ``--set`` override:

* a file: ``.jsonl`` / ``.json`` (a list, or one key holding a list), ``.csv`` / ``.tsv``
  (header row = field names), ``.parquet``, ``.arrow``, ``.txt`` (one row a non-empty line,
  field ``text``); any of them ``.gz``-compressed; a UTF-8 byte-order mark is ignored;
* a ``datasets.save_to_disk`` folder (``split`` picks from a ``DatasetDict``);
* a named local adapter over ``../shared/data`` (:data:`ADAPTERS`): ``hh-rlhf[:harmless|
  :helpful]``, ``advbench``, ``xstest[:safe|:unsafe]``, ``llmbar[:<subset>]``,
  ``self-instruct[:seed|:user]``, ``mt-bench``, ``vicuna-bench``, ``koala``;
* a Hub id ``name[:config]:split`` through ``datasets`` -- tried only when the source is not a
  local path. With ``HF_HUB_OFFLINE=1`` an uncached id fails at once with one line.

Every row comes back as a ``dict`` with its location (``file:line`` or ``source row i``), so
later errors (a missing field, a bad label) name the row. A malformed row anywhere in a file
-- the last line included -- is a :class:`DataError`, unless ``skip_bad_rows=True``: then it
is counted in :attr:`Rows.bad` and reported by the caller, never dropped silently.
(Tolerating a torn last line is right only for a run's own append-only files after a crash:
that is :func:`pofe.runs.read_jsonl`, which is never used for inputs.)
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pofe.errors import DataError
from pofe.jsonl import is_blank_line, iter_jsonl_lines

log = logging.getLogger(__name__)

FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow", ".txt")


def parse_json(text: str, where: str) -> Any:
    """``json.loads(text)``, every failure a one-line :class:`DataError` naming ``where``:
    invalid JSON, a number too long for Python's int parser, nesting deep enough to exhaust
    the recursion limit."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        line = f":{e.lineno}" if "\n" in text and not re.search(r":\d+$", where) else ""
        raise DataError(f"{where}{line}: invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise DataError(f"{where}: invalid row (JSON nested too deeply to read)") from None
    except ValueError as e:  # int('1' * 5000): Python's limit on integer digits
        raise DataError(f"{where}: invalid JSON ({' '.join(str(e).split(':')[0].split())})") from None


def number(value: Any, where: str, name: str) -> float:
    """A finite float from a row's numeric field; a bool, null, text or a number too large for
    a float (``1e400``, 400 digits) is a :class:`DataError` naming the row and field: JSON's
    ``true`` is no number, though ``float(True)`` is 1.0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                out = None
            if out is not None and math.isfinite(out):
                return out
        raise DataError(f"{where}: {name!r} must be a number, got {_show(value)}")
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        raise DataError(f"{where}: {name!r} must be a finite number, got {_show(value)}")
    return out


def _show(value: Any) -> str:
    """A short, one-line view of a bad value for an error message."""
    text = json.dumps(value) if isinstance(value, (bool, type(None))) else repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > 40:
        return f"an integer of {len(text)} digits"
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class Rows:
    """Rows of one source, each with its location; ``bad`` lists rows skipped under
    ``skip_bad_rows`` as ``"where: why"``."""

    source: str
    items: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    skip_bad_rows: bool = False
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count, from map()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(self.items)

    def report(self) -> None:
        if self.bad:
            log.warning("%s: skipped %d bad row(s) (first: %s)", self.source, len(self.bad), self.bad[0])
        if self.skipped:
            log.info("%s: skipped rows carrying nothing to use: %s", self.source, self.skipped)

    def map(self, fn: Callable[[dict[str, Any], str], Any], *, limit: int | None = None) -> list[Any]:
        """``fn(row, where)`` over the rows, first ``limit`` results. ``fn`` returns a record,
        or a short string naming why the row carries nothing to use (counted in
        :attr:`skipped`); a :class:`DataError` it raises stops here unless ``skip_bad_rows``
        (then counted in :attr:`bad`). Reports what was skipped."""
        out: list[Any] = []
        for where, row in self.items:
            if limit is not None and len(out) >= limit:
                break
            try:
                got = fn(row, where)
            except DataError as e:
                if not self.skip_bad_rows:
                    raise
                self.bad.append(str(e))
                continue
            if isinstance(got, str):
                self.skipped[got] = self.skipped.get(got, 0) + 1
                continue
            out.append(got)
        self.report()
        return out


def shared_data_dir() -> Path:
    """``$POFE_SHARED_DATA``, else ``<repo>/../shared/data``, else ``./../shared/data``."""
    env = os.environ.get("POFE_SHARED_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if here.is_dir():
        return here
    return Path.cwd().parent / "shared" / "data"


# ----------------------------------------------------------------------------- adapters

@dataclass(frozen=True)
class Adapter:
    """A named local data set: files under the shared data folder, an optional row filter."""

    files: Callable[[str], list[str]]  # sub-name -> paths relative to shared_data_dir()
    keep: Callable[[str, dict[str, Any]], bool] = lambda sub, row: True
    subs: tuple[str, ...] = ("",)  # accepted sub-names ("" = none given); () = any


def _xstest_keep(sub: str, row: dict[str, Any]) -> bool:
    return not sub or row.get("label") == sub


def _llmbar_files(sub: str) -> list[str]:
    root = shared_data_dir() / "llmbar"
    if sub:
        return [str(p.relative_to(shared_data_dir())) for p in sorted(root.rglob("dataset.json"))
                if sub.lower() in str(p.parent.relative_to(root)).lower()]
    return [str(p.relative_to(shared_data_dir())) for p in sorted((root / "LLMBar").rglob("dataset.json"))]


# Why these: the RLAIF / Constitutional-AI seed runs critique-and-revise on red-team prompts
# (AdvBench, HH-RLHF harmless), mixes in helpfulness data (HH-RLHF helpful) and tracks refusals
# on benign look-alikes (XSTest safe); the judge audits use LLMBar (sub-name: any folder, e.g.
# Natural, Neighbor, MT-Bench); Self-Instruct seeds and MT-Bench / Vicuna / Koala are the
# instruction and evaluation prompt sets of the OAIF / self-rewarding seeds.
ADAPTERS: dict[str, Adapter] = {
    "hh-rlhf": Adapter(lambda s: [f"hh-rlhf/{k}-base/test.jsonl.gz" for k in ([s] if s else ["helpful", "harmless"])],
                       subs=("", "helpful", "harmless")),
    "advbench": Adapter(lambda s: ["advbench/harmful_behaviors.csv"]),
    "xstest": Adapter(lambda s: ["xstest/xstest_prompts.csv"], _xstest_keep, subs=("", "safe", "unsafe")),
    "llmbar": Adapter(_llmbar_files, subs=()),
    "self-instruct": Adapter(lambda s: ["self-instruct/" + {"": "seed_tasks.jsonl", "seed": "seed_tasks.jsonl",
                                                            "user": "user_oriented_instructions.jsonl"}[s]],
                             subs=("", "seed", "user")),
    "mt-bench": Adapter(lambda s: ["fastchat-llm-judge/mt_bench/question.jsonl"]),
    "vicuna-bench": Adapter(lambda s: ["fastchat-llm-judge/vicuna_bench/question.jsonl"]),
    "koala": Adapter(lambda s: ["koala-test-set/koala_test_set.jsonl"]),
}


def adapter_names() -> str:
    return ", ".join(f"{k}" + ("" if a.subs == ("",) else f"[:{'|'.join(s for s in a.subs if s) or 'subset'}]")
                     for k, a in ADAPTERS.items())


# ----------------------------------------------------------------------------- files

def _strip_gz(name: str) -> str:
    return name[:-3] if name.endswith(".gz") else name


def _text(path: Path) -> str:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: not a readable gzip file ({e})") from None
    try:
        return raw.decode("utf-8-sig")  # -sig: a leading BOM is not part of the first row
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); is it a binary file with a text suffix?") from None


def _as_row(value: Any, where: str) -> dict[str, Any]:
    """A row is an object; a bare string is a one-field row ``{"text": ...}`` (a prompt list)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        return {"text": value}
    raise DataError(f"{where}: expected a JSON object (or a string), got {type(value).__name__} {str(value)[:40]!r}")


def _add(rows: Rows, where: str, make: Callable[[], dict[str, Any]], skip: bool) -> None:
    try:
        rows.items.append((where, make()))
    except DataError as e:
        if not skip:
            raise
        rows.bad.append(str(e))


def _read_jsonl(path: Path, rows: Rows, skip: bool) -> None:
    for i, line in iter_jsonl_lines(_text(path)):
        if is_blank_line(line):
            continue
        where = f"{path}:{i}"
        _add(rows, where, lambda line=line, where=where: _as_row(parse_json(line, where), where), skip)


def _read_json(path: Path, rows: Rows, skip: bool) -> None:
    data = parse_json(_text(path), str(path))
    if isinstance(data, dict):  # {"data": [...]}: one key holding the list of rows
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(f"{path}: expected a JSON list of rows (or an object with one key holding a list)")
        data = lists[0]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    for i, value in enumerate(data):
        _add(rows, f"{path} row {i}", lambda value=value, i=i: _as_row(value, f"{path} row {i}"), skip)


# csv's default field limit is 128 KiB: a long response (a whole document) in one field
# exceeded it with an internal error. The limit stays, well above any text a model takes,
# so that a file with a stray quote is a located error rather than one field of everything.
CSV_FIELD_LIMIT = 64 * 1024 * 1024


@contextlib.contextmanager
def _csv_field_limit(limit: int):
    old = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _read_csv(path: Path, rows: Rows, skip: bool, delimiter: str) -> None:
    # strict: a quote left open at the end of the file is an error (lenient csv took the
    # torn row, the rest of the file in its last field, as whole)
    reader = csv.DictReader(io.StringIO(_text(path), newline=""), delimiter=delimiter, strict=True)
    with _csv_field_limit(CSV_FIELD_LIMIT):
        line = 1
        try:
            if not reader.fieldnames:
                raise DataError(f"{path}: empty CSV (no header row)")
            for rec in reader:
                where = f"{path}:{line + 1}"  # the header is line 1
                line = reader.line_num

                def make(rec=rec, where=where):
                    if None in rec or any(v is None for v in rec.values()):
                        raise DataError(f"{where}: {len(reader.fieldnames)} columns expected ({', '.join(reader.fieldnames)})")
                    return dict(rec)
                _add(rows, where, make, skip)
        except csv.Error as e:
            # a malformed record ends the reader: nothing after it can be located, so even
            # under skip_bad_rows this is an error, not a skip
            why = str(e)
            if "field larger than field limit" in why:
                why = f"a field is over the {CSV_FIELD_LIMIT // (1024 * 1024)} MiB limit (an unclosed quote?)"
            elif "unexpected end of data" in why:
                why = "the file ends inside a quoted field (a torn last row, or an unclosed quote)"
            raise DataError(f"{path}:{line + 1}: malformed CSV row ({why})") from None


def _read_table(path: Path, rows: Rows, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            table = pq.read_table(path)
        else:  # datasets writes Arrow IPC streams; plain Arrow files are the other variant
            try:
                with pa.memory_map(str(path)) as src:
                    table = pa.ipc.open_stream(src).read_all()
            except pa.ArrowInvalid:
                with pa.memory_map(str(path)) as src:
                    table = pa.ipc.open_file(src).read_all()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable {kind} file ({e})") from None
    for i, rec in enumerate(table.to_pylist()):
        rows.items.append((f"{path} row {i}", rec))


def _read_file(path: Path, rows: Rows, skip: bool) -> None:
    name = _strip_gz(path.name)
    suffix = Path(name).suffix
    if suffix == ".jsonl":
        _read_jsonl(path, rows, skip)
    elif suffix == ".json":
        _read_json(path, rows, skip)
    elif suffix in (".csv", ".tsv"):
        _read_csv(path, rows, skip, "\t" if suffix == ".tsv" else ",")
    elif suffix in (".parquet", ".arrow"):
        if path.name.endswith(".gz"):
            raise DataError(f"{path}: compressed {suffix} is not supported; decompress it")
        _read_table(path, rows, suffix[1:])
    elif suffix == ".txt":
        for i, line in iter_jsonl_lines(_text(path)):  # a U+2028 inside a prompt is no line break
            if line.strip():
                rows.items.append((f"{path}:{i}", {"text": line}))
    else:
        raise DataError(f"{path}: unsupported file type {suffix or '(none)'}; "
                        f"use {', '.join(FILE_SUFFIXES)} (optionally .gz) or a datasets save_to_disk folder")


def _check_saved_dataset(path: Path) -> None:
    """Name the damaged file of a ``save_to_disk`` folder (``datasets`` names only the folder, or
    nothing: random bytes in ``state.json`` were a bare UnicodeDecodeError): its JSON files, and
    the header of each Arrow shard its ``state.json`` lists, split folders included."""
    import pyarrow as pa

    def load(f: Path) -> Any:
        try:
            return json.loads(f.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"{f}: not UTF-8 text (byte {e.start}); a damaged file of the datasets folder {path}") from None
        except (ValueError, RecursionError) as e:
            raise DataError(f"{f}: not valid JSON ({getattr(e, 'msg', type(e).__name__)}); a damaged file of the "
                            f"datasets folder {path}") from None

    folders = [path]
    if (path / "dataset_dict.json").is_file():
        splits = load(path / "dataset_dict.json")
        splits = splits.get("splits") if isinstance(splits, dict) else None
        folders += [path / s for s in splits or [] if isinstance(s, str) and s and "/" not in s and s not in (".", "..")]
    for folder in folders:
        if (folder / "dataset_info.json").is_file():
            load(folder / "dataset_info.json")
        state = load(folder / "state.json") if (folder / "state.json").is_file() else None
        files = state.get("_data_files") if isinstance(state, dict) else None
        for entry in files if isinstance(files, list) else []:
            name = entry.get("filename") if isinstance(entry, dict) else None
            shard = folder / name if isinstance(name, str) and name and "/" not in name else None
            if shard is None or not shard.is_file():
                continue  # datasets reports a missing shard itself
            try:
                with pa.OSFile(str(shard)) as f:
                    pa.ipc.open_stream(f).schema  # noqa: B018 -- reading the header is the check
            except (pa.ArrowException, OSError, ValueError) as e:
                raise DataError(f"{shard}: not a readable Arrow shard ({type(e).__name__}: "
                                f"{' '.join(str(e).split())}); a damaged file of the datasets folder {path}") from None


def _read_saved_dataset(path: Path, rows: Rows, split: str | None) -> None:
    import datasets

    _check_saved_dataset(path)
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for a bad folder; one line here
        raise DataError(f"{path}: not a readable datasets save_to_disk folder ({type(e).__name__}: {e})") from None
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        pick = split or ("train" if "train" in ds else names[0] if len(names) == 1 else None)
        if pick not in ds:
            raise DataError(f"{path}: split {split!r} not found; splits: {', '.join(names)}"
                            if split else f"{path}: several splits ({', '.join(names)}); name one with split")
        ds = ds[pick]
    for i, rec in enumerate(ds):
        rows.items.append((f"{path} row {i}", dict(rec)))


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@contextlib.contextmanager
def _hub_offline():
    """Make ``datasets`` / ``huggingface_hub`` use the local cache only, for this call."""
    import datasets
    import huggingface_hub.constants as hc

    old = datasets.config.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hc.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE = old


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One short connection attempt, so an unreachable Hub is a quick error rather than
    ``huggingface_hub``'s ~30 s of retries."""
    import socket
    from urllib.parse import urlparse

    import huggingface_hub.constants as hc

    url = urlparse(hc.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout).close()
        return True
    except OSError:
        return False


def _read_hub(source: str, rows: Rows, split: str | None) -> None:
    """``name[:config]:split`` through ``datasets.load_dataset``: the local cache first; the
    Hub only when not offline (``HF_HUB_OFFLINE``) and reachable."""
    parts = source.split(":")
    if len(parts) > 3:
        raise DataError(f"{source}: a Hub id is name[:config]:split")
    name, config, sp = parts[0], (parts[1] if len(parts) == 3 else None), (parts[-1] if len(parts) > 1 else split)
    import datasets

    def fail(e: Exception, why: str) -> DataError:
        first = str(e).splitlines()[0] if str(e) else ""
        return DataError(f"{source}: not a local file or folder, a named source ({adapter_names()}), nor a loadable "
                         f"datasets id ({why}): {type(e).__name__}: {first}")

    try:
        with _hub_offline():
            ds = datasets.load_dataset(name, config, split=sp or "train")
    except Exception as e:  # not cached (or a bad config/split): maybe the Hub has it
        if _offline():
            raise fail(e, "HF_HUB_OFFLINE is set and it is not in the local cache") from None
        if not _hub_reachable():
            raise fail(e, "not in the local cache and the Hub is unreachable") from None
        try:
            ds = datasets.load_dataset(name, config, split=sp or "train")
        except Exception as e2:  # connection, missing config/split, ...: one line
            raise fail(e2, "the Hub refused it") from None
    for i, rec in enumerate(ds):
        rows.items.append((f"{source} row {i}", dict(rec)))


def read_located(source: str | Path, *, split: str | None = None, skip_bad_rows: bool = False) -> Rows:
    """Rows of ``source`` with their locations (see the module docstring for sources).

    Raises:
        DataError: one line naming the file and line/row (a missing file, a malformed row,
        an unknown adapter, an uncached Hub id).
    """
    source = str(source)
    rows = Rows(source, skip_bad_rows=skip_bad_rows)
    path = Path(source).expanduser()
    if path.is_file():
        _read_file(path, rows, skip_bad_rows)
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            _read_saved_dataset(path, rows, split)
        else:
            raise DataError(f"{path}: a folder that is not a datasets save_to_disk folder; name a file in it")
    elif _strip_gz(path.name).endswith(FILE_SUFFIXES) or source.startswith((".", "/", "~")):
        raise DataError(f"file not found: {source}")
    else:
        name, _, sub = source.partition(":")
        if name in ADAPTERS:
            ad = ADAPTERS[name]
            if ad.subs and sub not in ad.subs:
                raise DataError(f"{source}: {name} takes {' or '.join(repr(':' + s) for s in ad.subs if s)}")
            files = [shared_data_dir() / f for f in ad.files(sub)]
            if not files:
                raise DataError(f"{source}: no {name} files match {sub!r} under {shared_data_dir()}")
            for f in files:
                if not f.is_file():
                    raise DataError(f"{source}: {f} not found (set POFE_SHARED_DATA to the shared data folder)")
                part = Rows(source)
                _read_file(f, part, skip_bad_rows)
                rows.items.extend((w, r) for w, r in part.items if ad.keep(sub, r))
                rows.bad.extend(part.bad)
        else:
            _read_hub(source, rows, split)
    return rows


def read_rows(source: str | Path, *, split: str | None = None, skip_bad_rows: bool = False) -> list[dict[str, Any]]:
    """The rows of ``source`` as dicts (see :func:`read_located` for sources and errors)."""
    rows = read_located(source, split=split, skip_bad_rows=skip_bad_rows)
    rows.report()
    return [r for _, r in rows]
