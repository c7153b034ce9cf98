"""Pairs to label: any pair file pofe reads, each pair with a stable id and a display order.

Accepted rows (JSONL/JSON, ``.gz``, CSV/parquet through ``datasets``):

* ``{prompt, response_a, response_b, ...}``: ``pofe label`` output, ``pofe judge`` output and
  online ledgers (``kind: annotation`` rows; rows of other kinds such as per-pair losses are
  ignored). A judge's ``p`` is neither needed nor shown: the person labels blind;
* ``{prompt, chosen, rejected}`` (also chat-message lists and Anthropic HH dialogues).
  "chosen first" is an ordering the file makes, not the person, so such a pair's
  ``response_a``/``response_b`` are put in a random order drawn from its id (as the HH-RLHF
  calibration adapter does): otherwise a judge's first-position bias would pass for
  agreement in the audit's single-order numbers.

A pair's id is the row's ``id`` or ``pair_id`` when it has one, else a hash of its prompt
and its two responses (order-free, so the same pair in another file gets the same id and two
annotators' labels of it can be compared). Pairs with identical responses are skipped and
counted (a label on identical text says nothing); a second copy of a pair (same prompt and
responses, in either order) is skipped too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pofe.data.prompts import DataError


@dataclass(frozen=True)
class AnnotationPair:
    id: str
    prompt: str
    response_a: str
    response_b: str
    where: str  # file:line of the row it came from


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate (a JSON "\ud800" escape in the pair file) still hashes,
    # and every other text hashes exactly as under plain UTF-8, so ids do not change.
    return text.encode("utf-8", "surrogatepass")


def content_id(prompt: str, a: str, b: str) -> str:
    x, y = sorted((a, b))
    h = hashlib.sha256(_utf8("\x00".join((prompt, x, y)))).hexdigest()
    return h[:16]


def _bit(*parts: str) -> bool:
    return hashlib.sha256(_utf8("\x00".join(parts))).digest()[0] & 1 == 1


def shown_swapped(pair_id: str, annotator: str, seed: int = 0) -> bool:
    """Whether this annotator sees ``response_b`` on the left. Drawn from (pair id, annotator,
    seed) rather than a session rng, so a reload or a restarted server shows the same order."""
    return _bit("shown", pair_id, annotator, str(seed))


def subset(pairs: list[AnnotationPair], limit: int | None, seed: int = 0) -> list[AnnotationPair]:
    """A seeded random ``limit`` of the pairs, in file order. Ranked by a hash of (seed, pair
    id), so it depends on neither the annotator nor a restart: two people asked for 300 pairs
    of one file get the same 300, and a resumed session the same ones again."""
    if limit is None or limit >= len(pairs):
        return list(pairs)
    def rank(i: int) -> bytes:
        return hashlib.sha256(_utf8(f"subset\x00{seed}\x00{pairs[i].id}")).digest()

    keep = set(sorted(range(len(pairs)), key=rank)[:limit])
    return [p for i, p in enumerate(pairs) if i in keep]


def _rows(path: Path):
    # The one call into the data layer's row reader (strict: a bad row anywhere is located).
    from pofe.data.io import read_located

    yield from read_located(path)


def _pair_from_row(row: Any, where: str) -> tuple[str, str, str, bool] | str:
    """(prompt, a, b, from_chosen_rejected) or a skip reason."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with prompt and response_a/response_b (or chosen/rejected)")
    if row.get("kind") is not None and row.get("kind") != "annotation":
        return "other-row-kind"
    if "response_a" in row or "response_b" in row:
        for key in ("prompt", "response_a", "response_b"):
            if not isinstance(row.get(key), str):
                raise DataError(f"{where}: field {key!r} must be a string (fields: {sorted(row)})")
        return row["prompt"], row["response_a"], row["response_b"], False
    from pofe.data.preferences import to_pair as preference_from_row

    pair = preference_from_row(row, where)
    if isinstance(pair, str):
        return pair
    return pair.prompt, pair.chosen, pair.rejected, True


def load_pairs(path: str | Path) -> tuple[list[AnnotationPair], dict[str, int]]:
    """Pairs of a file in file order, and ``{skip reason: count}``.

    Raises:
        DataError: the file is missing, a row is malformed (file and line named), two
            different pairs share an id, or no pair is left to label.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"pairs file not found: {path}")
    pairs: list[AnnotationPair] = []
    seen: dict[str, AnnotationPair] = {}
    seen_content: set[str] = set()
    skipped: dict[str, int] = {}
    for where, row in _rows(path):
        out = _pair_from_row(row, where)
        if isinstance(out, str):
            skipped[out] = skipped.get(out, 0) + 1
            continue
        prompt, a, b, ordered_by_file = out
        if a == b:
            skipped["identical"] = skipped.get("identical", 0) + 1
            continue
        given = row.get("id", row.get("pair_id"))
        pid = str(given) if isinstance(given, (str, int)) and not isinstance(given, bool) and str(given) else \
            content_id(prompt, a, b)
        if ordered_by_file and _bit("order", pid):
            a, b = b, a
        pair = AnnotationPair(pid, prompt, a, b, where)
        content = content_id(prompt, a, b)
        if pid in seen and content_id(seen[pid].prompt, seen[pid].response_a, seen[pid].response_b) != content:
            raise DataError(f"{where}: pair id {pid!r} is also used by a different pair at {seen[pid].where}")
        if pid in seen or content in seen_content:  # the same pair again: label it once
            skipped["duplicate"] = skipped.get("duplicate", 0) + 1
            continue
        seen[pid] = pair
        seen_content.add(content)
        pairs.append(pair)
    if not pairs:
        raise DataError(f"{path}: no pairs to label (skipped: {skipped or 'none'})")
    return pairs, skipped


