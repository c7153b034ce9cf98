"""Human-labelled calibration sets for ``pofe audit``: pofe's own JSONL form and adapters for
the formats in ``../shared/data``.

pofe's form, one JSON object per line::

    {"prompt": "...", "response_a": "...", "response_b": "...", "label": "A"}

``label`` is ``"A"``, ``"B"`` or ``"tie"`` (case-insensitive); the integers ``1``/``2`` (the
LLMBar convention, 1 = response_a) and ``0.5`` (tie) are accepted too. Optional ``id``.

Every source :func:`pofe.data.io.read_located` reads works (files, ``save_to_disk``
folders, ``llmbar:<subset>``, ``hh-rlhf:helpful``); the format is detected per row:

* preference pairs -- standard ``prompt/chosen/rejected`` (the human-preferred reply is
  ``chosen``, or ``p`` says), conversational, or HH-RLHF (``chosen``/``rejected`` full transcripts that share every turn but the last
  assistant reply; ``.jsonl`` or ``.jsonl.gz``): the prompt is the dialogue up to the final
  ``Assistant:`` turn, the responses are the two final replies. Pairs whose transcripts differ
  before the last reply, or whose two replies are identical, are skipped (a label on
  identical text says nothing about the judge). Chosen is always first in the file, so each
  pair is put in a random order (seeded): without that, position bias would pass for
  agreement. (Pairs are read by :func:`pofe.data.preferences.to_pair`, so a standard pair
  is never mistaken for an HH transcript.)
* LLMBar (``input``/``output_1``/``output_2``/``label`` in {1, 2}, a JSON array): mapped
  as is (LLMBar's order is already mixed).
* ``pofe annotate`` event logs (rows with ``event`` and ``annotator``): undo and skip events
  resolved, ties kept, one item per (annotator, pair) -- see :func:`from_annotations`.

A directory (not a ``save_to_disk`` one) is searched for ``.jsonl``, ``.jsonl.gz``,
``.json``, ``.csv`` and ``.parquet`` files.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from pofe.data.io import read_located
from pofe.errors import DataError
from pofe.jsonl import json_line
from pofe.data.preferences import Label, check_one_shape, normalise_label, to_pair
from pofe.data.prompts import to_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationItem:
    prompt: str
    response_a: str
    response_b: str
    label: Label
    source: str = ""
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def detect_format(record: dict[str, Any]) -> str:
    keys = set(record)
    if {"event", "annotator"} <= keys:
        return "pofe-annotate"
    if {"prompt", "response_a", "response_b", "label"} <= keys:
        return "pofe"
    if {"input", "output_1", "output_2", "label"} <= keys:
        return "llmbar"
    if {"chosen", "rejected"} <= keys:
        return "pairs"  # standard / conversational / HH-RLHF: read by pofe.data.preferences
    raise DataError(f"unknown calibration format with keys {sorted(keys)}: expected pofe "
                    "(prompt/response_a/response_b/label), LLMBar (input/output_1/output_2/label) or "
                    "preference pairs (prompt/chosen/rejected, chat messages, HH-RLHF transcripts)")


_ASSISTANT = "\n\nAssistant:"
_HUMAN = "\n\nHuman:"


def split_hh_transcript(transcript: str) -> tuple[str, str]:
    """(dialogue before the last assistant reply, that reply)."""
    cut = transcript.rfind(_ASSISTANT)
    if cut < 0:
        raise ValueError("HH-RLHF transcript without an 'Assistant:' turn")
    return transcript[:cut], transcript[cut + len(_ASSISTANT):].strip()


def _item(row: dict[str, Any], where: str, fmt: str, source: str, idx: int,
          rng: np.random.Generator) -> CalibrationItem | str:
    """One row as an item, or a skip reason."""
    check_one_shape(row, where)
    if fmt == "pofe":
        for k in ("response_a", "response_b"):
            if not isinstance(row.get(k), str):
                raise DataError(f"{where}: {k!r} must be a string")
        return CalibrationItem(to_prompt(row, where, "prompt").text, row["response_a"], row["response_b"],
                               _label(row["label"], where), source, str(row.get("id") or f"{source}:{idx}"))
    if fmt == "llmbar":
        return CalibrationItem(row["input"], row["output_1"], row["output_2"], _label(row["label"], where),
                               source, f"{source}:{idx}")
    pair = to_pair(row, where)
    if isinstance(pair, str):
        return pair
    # A pair file lists the human-preferred reply first, so each pair is put in a random
    # (seeded) order: without that, position bias would pass for agreement.
    label: Label = "tie" if pair.p == 0.5 else "A"
    a, b = (pair.chosen, pair.rejected) if pair.p >= 0.5 else (pair.rejected, pair.chosen)
    if rng.random() < 0.5:
        a, b = b, a
        label = "B" if label == "A" else label
    return CalibrationItem(pair.prompt, a, b, label, source, f"{source}:{idx}")


def _label(value: Any, where: str) -> Label:
    try:
        return normalise_label(value, where)
    except ValueError as e:
        raise DataError(str(e)) from None


def _files(path: Path) -> list[Path]:
    if path.is_dir() and not ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        found = sorted(p for p in path.rglob("*") if p.is_file() and (p.name.endswith(_FILE_NAMES)))
        if not found:
            raise DataError(f"{path}: no calibration files ({', '.join(_FILE_NAMES)}) in this folder")
        return found
    return [path]


_FILE_NAMES = (".jsonl", ".jsonl.gz", ".json", ".csv", ".parquet")
_GENERIC_NAMES = ("dataset.json", "test.jsonl.gz", "test.jsonl", "train.jsonl.gz", "train.jsonl", "data.jsonl")


def source_name(path: Path) -> str:
    """A short readable source: ``hh-rlhf/helpful-base``, ``Adversarial/Neighbor``, ``calib/my.jsonl``."""
    if path.name in _GENERIC_NAMES:
        return "/".join(path.parts[-3:-1])
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _read_source(path: Path, seed: int, skip_bad_rows: bool) -> tuple[list[CalibrationItem], np.random.Generator]:
    """All items of one source, and its rng (after the pair-order draws) for the subset draw."""
    rows = read_located(path, skip_bad_rows=skip_bad_rows)
    # One rng per file, seeded from the seed and the file name, so adding a file to the list
    # never changes the order its items are shown in.
    rng = np.random.default_rng([seed, sum(path.name.encode())])
    source = source_name(path)
    if rows.items and detect_format(rows.items[0][1]) == "pofe-annotate":
        # An event log is read as a whole: undo and skip events refer to earlier rows.
        return from_annotations([r for _, r in rows], source), rng
    index = {where: i for i, (where, _) in enumerate(rows)}
    return rows.map(lambda row, where: _item(row, where, detect_format(row), source, index[where], rng)), rng


def _subset(items: list[CalibrationItem], n: int, rng: np.random.Generator) -> list[CalibrationItem]:
    if n >= len(items):
        return items
    pick = np.sort(rng.choice(len(items), size=n, replace=False))
    return [items[i] for i in pick]


def load_calibration_file(path: str | Path, *, limit: int | None = None, seed: int = 0,
                          skip_bad_rows: bool = False) -> list[CalibrationItem]:
    """Items of one source -- a file, a save_to_disk folder or a named source such as
    ``llmbar:Natural`` (format detected per row); ``limit`` draws a seeded random subset of
    that many items (the whole source when ``None``)."""
    items, rng = _read_source(Path(path), seed, skip_bad_rows)
    return items if limit is None else _subset(items, limit, rng)


def shares(sizes: list[int], limit: int) -> list[int]:
    """``limit`` items split evenly over sources of ``sizes``, a source smaller than its share
    giving all it has and the rest split among the others (earlier sources take the remainder):
    50 over two files of 100 is 25 + 25, over 100 and 20 is 30 + 20. Every source is
    represented alike, as a per-file limit did, while the set is the size asked for."""
    out, left = [0] * len(sizes), limit
    open_ = [i for i, n in enumerate(sizes) if n > 0]
    while left > 0 and open_:
        each, extra = divmod(left, len(open_))
        for rank, i in enumerate(open_):
            give = min(sizes[i] - out[i], each + (rank < extra))
            out[i] += give
            left -= give
        open_ = [i for i in open_ if out[i] < sizes[i]]
    return out


def load_calibration(paths: Iterable[str | Path], *, limit: int | None = None, seed: int = 0,
                     skip_bad_rows: bool = False) -> list[CalibrationItem]:
    """Items from files, folders (searched for calibration files) or named sources; ``limit``
    is the size of the whole set, split evenly over the sources (:func:`shares`; a seeded random
    subset of each; one source draws exactly as :func:`load_calibration_file`)."""
    files = [f for p in paths for f in _files(Path(p))]
    read = [_read_source(f, seed, skip_bad_rows) for f in files]
    if files and not any(items for items, _ in read):  # "audit: the calibration set is empty" named no file
        raise DataError(f"{', '.join(map(str, files[:3]))}{' ...' if len(files) > 3 else ''}: no calibration pairs "
                        f"(an empty {'file' if len(files) == 1 else 'set of files'})")
    if limit is None:
        return [it for items, _ in read for it in items]
    n = shares([len(items) for items, _ in read], limit)
    return [it for (items, rng), k in zip(read, n) for it in _subset(items, k, rng)]


def write_calibration(items: Iterable[CalibrationItem], path: str | Path) -> None:
    """Write items in pofe's JSONL form (e.g. to freeze a converted subset)."""
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json_line({"prompt": it.prompt, "response_a": it.response_a, "response_b": it.response_b,
                               "label": it.label, "id": it.id}) + "\n")


# --------------------------------------------------------------------------- pofe annotate

ANNOTATION_EVENTS = ("open", "label", "skip", "undo")


def resolve_annotation_events(rows: Iterable[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """The decisions (``label`` and ``skip`` events) of a ``pofe annotate`` log that still
    stand once every ``undo`` is applied, in the order they were given.

    The log is append-only (nothing is ever edited, so a closed tab or a crash loses nothing):
    ``undo`` withdraws its annotator's standing decision on its pair, and a second decision on
    the same (annotator, pair) replaces the first. ``open`` events (one per server start) only
    carry provenance. This is the one place the log is interpreted: the annotate server
    rebuilds its state with it, and :func:`from_annotations` reads calibration items with it.
    Errors name the source and line (the server writes no blank lines).
    """
    stacks: dict[str, list[dict[str, Any]]] = {}
    order = 0
    for i, r in enumerate(rows):
        where = f"{source}:{i + 1}"
        if not isinstance(r, dict):
            raise ValueError(f"{where}: expected a JSON object (a pofe annotate event)")
        ev, who = r.get("event"), r.get("annotator")
        if ev not in ANNOTATION_EVENTS:
            raise ValueError(f"{where}: unknown event {ev!r} (expected one of {', '.join(ANNOTATION_EVENTS)})")
        if not isinstance(who, str) or not who:
            raise ValueError(f"{where}: 'annotator' must be a non-empty string")
        if ev == "open":
            continue
        pid = r.get("pair_id")
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"{where}: '{ev}' event without a 'pair_id' string")
        stack = stacks.setdefault(who, [])
        if ev == "undo":
            # Each (annotator, pair) has at most one standing decision, so naming the pair is
            # unambiguous; the server undoes its session's latest one (a session over another
            # file or subset can have later decisions on pairs it does not show).
            hit = [k for k, d in enumerate(stack) if d["pair_id"] == pid]
            if not hit:
                raise ValueError(f"{where}: undo of pair {pid!r} by {who!r}, who has no standing decision on it")
            del stack[hit[0]]
            continue
        if ev == "label":
            for key in ("prompt", "response_a", "response_b"):
                if not isinstance(r.get(key), str):
                    raise ValueError(f"{where}: label event without a '{key}' string")
            normalise_label(r.get("label"), where)
        stack[:] = [d for d in stack if d["pair_id"] != pid]
        order += 1
        stack.append({**r, "_order": order})
    standing = sorted((d for s in stacks.values() for d in s), key=lambda d: d["_order"])
    return [{k: v for k, v in d.items() if k != "_order"} for d in standing]


def from_annotations(rows: Iterable[dict[str, Any]], source: str) -> list[CalibrationItem]:
    """Calibration items from a ``pofe annotate`` log: one per standing ``label`` of each
    (annotator, pair); skipped and undone pairs give none, a tie stays a tie.

    ``response_a``/``response_b`` are the pair's own order, the same for every annotator
    (the page shows them in a per-annotator random order and maps the key pressed back), so
    two annotators' labels of one pair compare directly: items share ``id`` (the pair id) and
    differ in ``source`` (``annotator@file``), which is how human-human agreement is found.
    """
    return [CalibrationItem(d["prompt"], d["response_a"], d["response_b"], normalise_label(d["label"], source),
                            f"{d['annotator']}@{source}", d["pair_id"])
            for d in resolve_annotation_events(rows, source) if d["event"] == "label"]
