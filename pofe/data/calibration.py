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

A directory (not a ``save_to_disk`` one) is searched for ``.jsonl``, ``.jsonl.gz``,
``.json``, ``.csv`` and ``.parquet`` files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

import numpy as np

from pofe.data.io import DataError, read_located
from pofe.data.preferences import to_pair
from pofe.data.prompts import to_prompt

log = logging.getLogger(__name__)

Label = Literal["A", "B", "tie"]


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


def normalise_label(value: Any, where: str) -> Label:
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("a", "1"):
            return "A"
        if v in ("b", "2"):
            return "B"
        if v in ("tie", "t", "0.5", "equal"):
            return "tie"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == 1:
            return "A"
        if value == 2:
            return "B"
        if value == 0.5:
            return "tie"
    raise ValueError(f"{where}: label must be 'A', 'B' or 'tie' (or 1/2 as in LLMBar, 0.5 for a tie); got {value!r}")


def detect_format(record: dict[str, Any]) -> str:
    keys = set(record)
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


def load_calibration_file(path: str | Path, *, limit: int | None = None, seed: int = 0,
                          skip_bad_rows: bool = False) -> list[CalibrationItem]:
    """Items of one source -- a file, a save_to_disk folder or a named source such as
    ``llmbar:Natural`` (format detected per row); ``limit`` draws a seeded random subset of
    that many items (the whole source when ``None``)."""
    path = Path(path)
    rows = read_located(path, skip_bad_rows=skip_bad_rows)
    # One rng per file, seeded from the seed and the file name, so adding a file to the list
    # never changes which items another file contributes.
    rng = np.random.default_rng([seed, sum(path.name.encode())])
    source = source_name(path)
    index = {where: i for i, (where, _) in enumerate(rows)}
    items = rows.map(lambda row, where: _item(row, where, detect_format(row), source, index[where], rng))
    if limit is not None and limit < len(items):
        pick = np.sort(rng.choice(len(items), size=limit, replace=False))
        items = [items[i] for i in pick]
    return items


def load_calibration(paths: Iterable[str | Path], *, limit: int | None = None, seed: int = 0,
                     skip_bad_rows: bool = False) -> list[CalibrationItem]:
    """Items from files, folders (searched for calibration files) or named sources; ``limit``
    applies per file."""
    out: list[CalibrationItem] = []
    for p in paths:
        for f in _files(Path(p)):
            out.extend(load_calibration_file(f, limit=limit, seed=seed, skip_bad_rows=skip_bad_rows))
    return out


def write_calibration(items: Iterable[CalibrationItem], path: str | Path) -> None:
    """Write items in pofe's JSONL form (e.g. to freeze a converted subset)."""
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps({"prompt": it.prompt, "response_a": it.response_a, "response_b": it.response_b,
                                "label": it.label, "id": it.id}, ensure_ascii=False) + "\n")
