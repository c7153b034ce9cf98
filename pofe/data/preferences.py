"""Preference data: (prompt, chosen, rejected[, p]) for offline DAP (the OAIF baseline).

``load_preferences(path)`` reads every format :func:`pofe.data.prompts.load_rows` reads,
with rows in one of these shapes:

* ``{"prompt", "chosen", "rejected"[, "p"]}`` — ``p`` = P(chosen better), default 1;
  ``chosen`` / ``rejected`` may also be chat message lists (the last assistant turn is the
  response, the turns before it the prompt);
* a pofe ledger row (``kind: annotation`` with ``response_a``, ``response_b``, ``p``): the
  ledger of an online run doubles as an offline dataset. Rows whose ``p`` is null (the
  judge could not label them) or whose responses are identical are skipped and counted,
  never given an invented label; rows of other kinds (per-pair losses) are ignored;
* Anthropic HH rows (``chosen`` / ``rejected`` full dialogues without ``prompt``): the
  shared dialogue up to the last ``Assistant:`` is the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pofe.data.prompts import DataError, hh_prompt, load_rows
from pofe.records import PreferencePair


@dataclass
class PreferenceData:
    pairs: list[PreferencePair]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count


def _last_assistant(value: Any, where: str, name: str) -> tuple[str, list[dict] | None]:
    if isinstance(value, str):
        return value, None
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        if value[-1].get("role") != "assistant":
            raise DataError(f"{where}: '{name}' messages must end with an assistant turn")
        return value[-1]["content"], value[:-1]
    raise DataError(f"{where}: '{name}' must be a string or a list of chat messages")


def _pair_from_row(row: Any, where: str) -> PreferencePair | str:
    """A pair, or a skip reason (string)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with prompt/chosen/rejected")
    if row.get("kind") is not None and row.get("kind") != "annotation":
        return "other-row-kind"
    if "response_a" in row and "response_b" in row:  # a pofe ledger row
        p = row.get("p")
        if p is None:
            return "unlabelled"
        if row["response_a"] == row["response_b"]:
            return "identical"
        prov = {k: row[k] for k in ("judge_id", "template_hash", "template_id", "principle_id", "step", "pair_id")
                if row.get(k) is not None}
        prompt = row.get("prompt")
        if not isinstance(prompt, str):
            raise DataError(f"{where}: ledger row without a 'prompt' string")
        return PreferencePair(prompt=prompt, chosen=row["response_a"], rejected=row["response_b"], p=float(p),
                              provenance={"source": "ledger", **prov})
    for key in ("chosen", "rejected"):
        if key not in row:
            raise DataError(f"{where}: missing field {key!r} (fields: {sorted(row)})")
    prompt = row.get("prompt")
    if prompt is None and isinstance(row["chosen"], str) and isinstance(row["rejected"], str):
        # Anthropic HH: both dialogues share the prompt, the last assistant turn differs.
        prompt = hh_prompt(row["chosen"])
        if prompt is None:
            raise DataError(f"{where}: no 'prompt' field and 'chosen' is not an HH dialogue")
        marker = "\n\nAssistant:"
        chosen = row["chosen"][row["chosen"].rfind(marker) + len(marker):].strip()
        rejected = row["rejected"][row["rejected"].rfind(marker) + len(marker):].strip()
    else:
        chosen, msgs = _last_assistant(row["chosen"], where, "chosen")
        rejected, _ = _last_assistant(row["rejected"], where, "rejected")
        if prompt is None and msgs:
            user = [m for m in msgs if m.get("role") == "user"]
            prompt = user[-1]["content"] if user else None
        if isinstance(prompt, list):
            user = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
            prompt = user[-1]["content"] if user else None
        if not isinstance(prompt, str):
            raise DataError(f"{where}: missing field 'prompt' (fields: {sorted(row)})")
    p = row.get("p", 1.0)
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise DataError(f"{where}: 'p' must be a number in [0, 1], got {p!r}") from None
    if not 0.0 <= p <= 1.0:
        raise DataError(f"{where}: 'p' must be in [0, 1], got {p}")
    if chosen == rejected:
        return "identical"
    return PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, p=p, provenance={"source": where})


def load_preferences(source: str | Path, *, split: str | None = None, limit: int | None = None) -> PreferenceData:
    """Load a preference dataset; see the module docstring for the accepted shapes.

    Raises:
        DataError: naming the file and line (or row) and the missing or bad field.
    """
    if not Path(source).exists() and str(source).endswith((".jsonl", ".json", ".gz", ".csv", ".parquet")):
        raise DataError(f"preference file not found: {source}")
    pairs: list[PreferencePair] = []
    skipped: dict[str, int] = {}
    for where, row in load_rows(source, split=split):
        out = _pair_from_row(row, where)
        if isinstance(out, str):
            skipped[out] = skipped.get(out, 0) + 1
            continue
        pairs.append(out)
        if limit and len(pairs) >= limit:
            break
    if not pairs:
        raise DataError(f"{source}: no usable preference pairs (skipped: {skipped or 'none'})")
    return PreferenceData(pairs, skipped)
