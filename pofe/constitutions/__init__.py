"""Constitutions: versioned YAML lists of comparative principles for AI feedback.

A constitution file has a ``version`` and ``principles`` (each ``id`` + comparative
``text``, optional ``critique``/``revision`` prompts for SL-CAI). One principle is sampled
per comparison with a seeded RNG, or an ensemble of K distinct principles is averaged
(Bai et al. 2022; rlaif-constitutional-ai.txt: "Sample one principle per comparison rather
than concatenating all of them... sampling gives the reward model a mixture of
perspectives that behaves like an ensemble"). Every label records principle id and
constitution version, because editing a principle changes the label distribution.

The sample for a comparison is a function of (seed, prompt, unordered pair) only, not of
batch composition or call order: re-labelling a pair (a resumed run, the swapped order,
another batch size) meets the same principle, so results and cache entries are
reproducible.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pofe.config import safe_yaml_load

DEFAULT_CONSTITUTION = "default"


@dataclass(frozen=True)
class Principle:
    id: str
    text: str
    critique: str | None = None
    revision: str | None = None
    harm: bool = False  # a harm principle: SL-CAI critiques of red-team responses draw only these


@dataclass(frozen=True)
class Constitution:
    name: str
    version: str
    principles: tuple[Principle, ...]
    source: str = ""

    def get(self, principle_id: str) -> Principle:
        for p in self.principles:
            if p.id == principle_id:
                return p
        raise KeyError(f"constitution {self.name!r} has no principle {principle_id!r}")

    def rng_for(self, seed: int, *parts: str) -> random.Random:
        """A seeded RNG specific to one comparison (order-independent in ``parts``)."""
        h = hashlib.sha256()
        h.update(str(seed).encode())
        for s in sorted(parts):
            h.update(b"\x00" + s.encode("utf-8"))
        return random.Random(int.from_bytes(h.digest()[:8], "big"))

    def sample(self, rng: random.Random, k: int = 1) -> list[Principle]:
        """K distinct principles (K <= 0 or K >= len: all of them, in file order)."""
        if k <= 0 or k >= len(self.principles):
            return list(self.principles)
        return rng.sample(list(self.principles), k)

    def for_comparison(self, seed: int, prompt: str, a: str, b: str, k: int = 1) -> list[Principle]:
        return self.sample(self.rng_for(seed, prompt, a, b), k)


def available_constitutions() -> list[str]:
    root = resources.files("pofe") / "constitutions"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_constitution(name_or_path: str = DEFAULT_CONSTITUTION) -> Constitution:
    """Load a shipped constitution by name or a YAML file by path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        try:
            text, source = p.read_text(encoding="utf-8"), str(p)
        except UnicodeDecodeError as e:
            raise ValueError(f"{p}: not UTF-8 text (byte {e.start})") from None
    else:
        f = resources.files("pofe") / "constitutions" / f"{name_or_path}.yaml"
        if not f.is_file():
            raise ValueError(f"unknown constitution {name_or_path!r}: not a file, and not one of {available_constitutions()}")
        text, source = f.read_text(encoding="utf-8"), f"pofe/constitutions/{name_or_path}.yaml"
    data: Any = safe_yaml_load(text, source) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a constitution is a mapping with 'version' and 'principles'")
    unknown = set(data) - {"name", "version", "principles", "description"}
    if unknown:
        raise ValueError(f"{source}: unknown keys {sorted(unknown)}")
    if "version" not in data:
        raise ValueError(f"{source}: missing 'version' (every label records the constitution version)")
    raw = data.get("principles")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{source}: 'principles' must be a non-empty list")
    principles, seen = [], set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item.get("id") or not item.get("text"):
            raise ValueError(f"{source}: principle #{i + 1} needs 'id' and 'text'")
        extra = set(item) - {"id", "text", "critique", "revision", "harm"}
        if extra:
            raise ValueError(f"{source}: principle {item['id']!r}: unknown keys {sorted(extra)}")
        pid = str(item["id"])
        if pid in seen:
            raise ValueError(f"{source}: duplicate principle id {pid!r}")
        seen.add(pid)
        principles.append(Principle(id=pid, text=" ".join(str(item["text"]).split()),
                                    critique=item.get("critique"), revision=item.get("revision"),
                                    harm=bool(item.get("harm", False))))
    return Constitution(name=str(data.get("name") or p.stem), version=str(data["version"]),
                        principles=tuple(principles), source=source)


__all__ = ["Principle", "Constitution", "load_constitution", "available_constitutions", "DEFAULT_CONSTITUTION"]
