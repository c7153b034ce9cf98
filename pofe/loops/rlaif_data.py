"""Prompt and pair sources shared by the RLAIF / Constitutional-AI commands (``cai revise``,
``label``, ``rm``, ``rl``).

A *source* is one string so it fits in a YAML key or a ``--set`` override:

* a file: ``.txt`` (one prompt a line), ``.jsonl`` / ``.json`` (field ``prompt``, ``text``,
  ``instruction`` or ``goal``), ``.csv`` (column ``prompt`` or ``goal``);
* a ``../shared/data`` adapter: ``advbench`` (harmful instructions), ``xstest`` /
  ``xstest:safe`` / ``xstest:unsafe`` (benign look-alikes and their harmful contrasts),
  ``hh-rlhf:harmless`` / ``hh-rlhf:helpful`` (first human turn of each dialogue).

Why these adapters: the seed (rlaif-constitutional-ai, "Stage 1") runs critique-and-revise on
red-team prompts, mixes in helpfulness data, and tracks refusals on a benign set next to a
red-team set ("Over-refusal or over-compliance from the constitution"); AdvBench, XSTest and
HH-RLHF are the local copies of exactly those three kinds of data.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pofe.records import PreferencePair

_TURN = re.compile(r"\n\n(Human|Assistant): ")


def shared_data_dir() -> Path:
    """``$POFE_SHARED_DATA``, else ``<repo>/../shared/data``, else ``./../shared/data``."""
    env = os.environ.get("POFE_SHARED_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if here.is_dir():
        return here
    return Path.cwd().parent / "shared" / "data"


def _need(path: Path, source: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"source {source!r}: {path} not found (set POFE_SHARED_DATA to the shared data folder)")
    return path


def hh_turns(transcript: str) -> list[tuple[str, str]]:
    """Split an HH-RLHF transcript ``\\n\\nHuman: ...\\n\\nAssistant: ...`` into (role, text) turns."""
    parts = _TURN.split(transcript)
    # parts = [prefix, role1, text1, role2, text2, ...]
    return [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


def _read_hh(split: str) -> Iterator[dict[str, Any]]:
    path = _need(shared_data_dir() / "hh-rlhf" / f"{split}-base" / "test.jsonl.gz", f"hh-rlhf:{split}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _field(row: dict[str, Any], names: tuple[str, ...], source: str) -> str:
    for n in names:
        if n in row and row[n] is not None:
            return str(row[n])
    raise ValueError(f"source {source!r}: row has none of the fields {names}: keys {sorted(row)}")


def load_prompts(source: str, *, limit: int | None = None) -> list[str]:
    """Prompts from a file or a shared-data adapter (see module docstring); first ``limit``."""
    out: list[str] = []
    name, _, sub = source.partition(":")
    sd = shared_data_dir()
    path = Path(source)
    if path.suffix and path.exists():
        if path.suffix == ".txt":
            out = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        elif path.suffix in (".jsonl", ".json"):
            text = path.read_text(encoding="utf-8")
            rows = json.loads(text) if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
            out = [r if isinstance(r, str) else _field(r, ("prompt", "text", "instruction", "goal"), source) for r in rows]
        elif path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as f:
                out = [_field(r, ("prompt", "goal", "text"), source) for r in csv.DictReader(f)]
        else:
            raise ValueError(f"source {source!r}: unsupported file type {path.suffix} (txt, jsonl, json, csv)")
    elif name == "advbench":
        with open(_need(sd / "advbench" / "harmful_behaviors.csv", source), newline="", encoding="utf-8") as f:
            out = [r["goal"] for r in csv.DictReader(f)]
    elif name == "xstest":
        if sub not in ("", "safe", "unsafe"):
            raise ValueError(f"source {source!r}: xstest takes :safe or :unsafe")
        with open(_need(sd / "xstest" / "xstest_prompts.csv", source), newline="", encoding="utf-8") as f:
            out = [r["prompt"] for r in csv.DictReader(f) if not sub or r["label"] == sub]
    elif name == "hh-rlhf":
        if sub not in ("harmless", "helpful"):
            raise ValueError(f"source {source!r}: use hh-rlhf:harmless or hh-rlhf:helpful")
        seen = set()
        for row in _read_hh(sub):
            turns = hh_turns(row["chosen"])
            if turns and turns[0][0] == "Human" and turns[0][1] not in seen:
                seen.add(turns[0][1])
                out.append(turns[0][1])
            if limit is not None and len(out) >= limit:
                break
    else:
        raise ValueError(
            f"unknown prompt source {source!r}: a .txt/.jsonl/.json/.csv file, advbench, xstest[:safe|:unsafe], "
            "hh-rlhf:harmless or hh-rlhf:helpful"
        )
    return out[:limit] if limit is not None else out


def load_sft_examples(source: str, *, limit: int | None = None) -> list[dict[str, str]]:
    """(prompt, response) examples: a jsonl with ``prompt``/``response`` (or ``completion``),
    or ``hh-rlhf:helpful`` / ``hh-rlhf:harmless`` (single-turn dialogues, the human-preferred reply)."""
    name, _, sub = source.partition(":")
    out: list[dict[str, str]] = []
    if name == "hh-rlhf":
        for row in _read_hh(sub or "helpful"):
            turns = hh_turns(row["chosen"])
            if len(turns) == 2 and turns[0][0] == "Human" and turns[1][0] == "Assistant" and turns[1][1]:
                out.append({"prompt": turns[0][1], "response": turns[1][1]})
            if limit is not None and len(out) >= limit:
                break
        return out
    path = _need(Path(source), source)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out.append({"prompt": _field(r, ("prompt",), source), "response": _field(r, ("response", "completion", "chosen"), source)})
    return out[:limit] if limit is not None else out


def load_pairs(source: str, *, limit: int | None = None) -> list[PreferencePair]:
    """Preference pairs: a jsonl of :class:`PreferencePair` rows (``prompt, chosen, rejected, p``),
    or ``hh-rlhf:helpful`` / ``hh-rlhf:harmless`` (single-turn human comparisons, p = 1)."""
    name, _, sub = source.partition(":")
    out: list[PreferencePair] = []
    if name == "hh-rlhf":
        for row in _read_hh(sub or "helpful"):
            c, r = hh_turns(row["chosen"]), hh_turns(row["rejected"])
            if len(c) == 2 and len(r) == 2 and c[0] == r[0] and c[1][1] and r[1][1] and c[1][1] != r[1][1]:
                out.append(PreferencePair(prompt=c[0][1], chosen=c[1][1], rejected=r[1][1], p=1.0,
                                          provenance={"source": source, "label": "human"}))
            if limit is not None and len(out) >= limit:
                break
        return out
    path = _need(Path(source), source)
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                out.append(PreferencePair.from_dict(json.loads(line)))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{i + 1}: not a preference pair ({e})") from None
    return out[:limit] if limit is not None else out
