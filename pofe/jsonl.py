"""JSON Lines text, written and read one way: every JSON pofe writes goes through
:func:`json_line`, every JSON Lines text it reads is split by :func:`iter_jsonl_lines`. A leaf:
run folders (:mod:`pofe.runs`) and input files (:mod:`pofe.data.io`) both use it."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

# Characters ``json.dumps(ensure_ascii=False)`` leaves raw that break a line-based reader or
# cannot be encoded: U+0085 / U+2028 / U+2029 end a line for ``str.splitlines`` (and for
# JavaScript, before ES2019), and a lone surrogate (from a JSON ``"\ud800"`` escape) has
# no UTF-8 form, so writing it raised UnicodeEncodeError. json.dumps escapes every other
# control character itself, and these can only occur inside JSON strings, where the
# ``\uXXXX`` escape reads back as the same character.
_LINE_UNSAFE = re.compile("[\x85\u2028\u2029\ud800-\udfff]")


def json_line(obj: Any, **kw: Any) -> str:
    """``obj`` as JSON text (no trailing newline) that any JSON Lines reader reads back as
    ``obj`` and that always encodes to UTF-8: ``json.dumps(obj, ensure_ascii=False, **kw)``
    with U+0085, U+2028, U+2029 and lone surrogates escaped. Every JSON pofe writes goes
    through here."""
    return _LINE_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False, **kw))


def json_lines(rows: Any) -> str:
    """The text of a JSON Lines file: one :func:`json_line` per row, each ending in ``\\n``."""
    return "".join(json_line(r) + "\n" for r in rows)


def iter_jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a JSON Lines text, split on ``\\n`` only (a ``\\r``
    before it is dropped). Not ``str.splitlines``: that also splits on U+2028, U+0085, form
    feeds, ..., which valid JSON may hold raw inside a string, so one row became two invalid
    halves. Every JSON Lines reader in pofe goes through here."""
    for i, line in enumerate(text.split("\n"), 1):
        yield i, line[:-1] if line.endswith("\r") else line


def is_blank_line(line: str) -> bool:
    """True for a line holding only JSON whitespace (space, tab, CR). Not ``str.strip``:
    that also strips U+2028, U+0085 and others, which are not JSON whitespace."""
    return not line.strip(" \t\r")
