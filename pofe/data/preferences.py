"""Preference data: (prompt, chosen, rejected[, p]) for offline DAP, reward models, exports.

:func:`load_preferences` reads any source :func:`pofe.data.io.read_located` reads and maps
each row with :func:`to_pair`. Accepted row shapes (TRL's preference formats first):

* standard ``{"prompt", "chosen", "rejected"[, "p"]}`` -- ``p`` = P(chosen better), default 1
  (a soft label, kept);
* conversational, explicit prompt: ``prompt`` = chat messages, ``chosen`` / ``rejected`` =
  the assistant reply as messages; implicit prompt: ``chosen`` / ``rejected`` = whole chats
  sharing every turn but the last assistant reply. The prompt's turns (system message
  included) are kept in :attr:`PreferencePair.messages`;
* Anthropic HH-RLHF ``chosen`` / ``rejected`` transcripts without ``prompt``: the shared
  dialogue is the prompt (as messages), the two last replies the responses. A pair whose
  dialogues differ before the last reply is skipped and counted;
* pofe's own pair files: an online ledger / ``pofe label`` ``labels.jsonl`` / ``pofe judge``
  verdicts (``prompt, response_a, response_b, p``; ``kind`` other than ``annotation`` is
  ignored, ``p = null`` (the judge could not read it) is skipped and counted, never given
  an invented label), ``preferences.jsonl`` of ``label`` / ``cai revise``;
* a human-labelled comparison: pofe's calibration form (``response_a``, ``response_b``,
  ``label`` A/B/tie) or LLMBar (``input``, ``output_1``, ``output_2``, ``label`` 1/2).

Pairs whose two responses are identical carry no preference: skipped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pofe.data.chat import check_messages, hh_messages, is_hh_transcript, transcript
from pofe.data.io import number, read_located
from pofe.errors import DataError
from pofe.records import PreferencePair

_PROVENANCE = ("judge_id", "template_hash", "template_id", "principle_id", "constitution_version", "step", "pair_id")


@dataclass
class PreferenceData:
    pairs: list[PreferencePair]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count


def _p(value: Any, where: str) -> float:
    p = number(value, where, "p")  # true / null / 400 digits: an error, never 1.0
    if not 0.0 <= p <= 1.0:
        raise DataError(f"{where}: 'p' must be in [0, 1], got {value!r}")
    return p


# The pair shapes a row may take; a row holding two of them is ambiguous (which two texts
# are compared?), so it is refused rather than read as whichever shape is checked first.
_SHAPES = (("chosen", "rejected"), ("response_a", "response_b"), ("output_1", "output_2"))


def check_one_shape(row: dict[str, Any], where: str) -> None:
    shapes = [f"{a}/{b}" for a, b in _SHAPES if a in row and b in row]
    if len(shapes) > 1:
        raise DataError(f"{where}: the row has both {' and '.join(repr(x) for x in shapes)}: "
                        "one pair of responses per row (drop the other fields)")


# A human label of a pair; read here (not in pofe.data.calibration, which builds on this module)
# because preference rows may carry one instead of ``p``.
Label = Literal["A", "B", "tie"]


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


def _human_p(label: Any, where: str) -> float:
    """P(response_a better) from a human label (A/B/tie, LLMBar's 1/2)."""
    try:
        return {"A": 1.0, "B": 0.0, "tie": 0.5}[normalise_label(label, where)]
    except ValueError as e:
        raise DataError(str(e)) from None


def _response(value: Any, where: str, name: str) -> tuple[tuple[dict[str, str], ...] | None, str]:
    """(turns before the reply or None, the reply text) of a chosen/rejected value."""
    if isinstance(value, str):
        return None, value
    if isinstance(value, list):
        msgs = check_messages(value, where, name)
        if msgs[-1]["role"] != "assistant":
            raise DataError(f"{where}: {name!r} messages must end with the assistant's reply")
        return msgs[:-1], msgs[-1]["content"]
    raise DataError(f"{where}: {name!r} must be a string or chat messages, got {type(value).__name__}")


def _text_field(row: dict[str, Any], key: str, where: str) -> str:
    v = row.get(key)
    if not isinstance(v, str):
        raise DataError(f"{where}: {key!r} must be a string, got {type(v).__name__}")
    return v


def to_pair(row: dict[str, Any], where: str) -> PreferencePair | str:
    """One row as a pair, or the reason it carries no preference (a short string)."""
    if row.get("kind") is not None and row.get("kind") != "annotation":
        return "other-row-kind"
    prompt_msgs: tuple[dict[str, str], ...] | None = None
    prov: dict[str, Any] = {"source": where}
    check_one_shape(row, where)
    if "response_a" in row and "response_b" in row:  # pofe ledger / labels / verdicts / calibration
        if "p" in row and "label" in row:
            raise DataError(f"{where}: the row has both 'p' (a judge's label) and 'label' (a human's): "
                            "keep the one to train on")
        if "p" in row:
            if row["p"] is None:
                return "unlabelled"
            p = _p(row["p"], where)
            prov = {"source": "ledger" if row.get("kind") else where,
                    **{k: row[k] for k in _PROVENANCE if row.get(k) is not None}}
        elif "label" in row:
            p = _human_p(row["label"], where)
        else:
            raise DataError(f"{where}: a response_a/response_b row needs 'p' (a judge's) or 'label' (a human's)")
        chosen, rejected = _text_field(row, "response_a", where), _text_field(row, "response_b", where)
        prompt = row.get("prompt")
    elif {"input", "output_1", "output_2", "label"} <= set(row):  # LLMBar
        p = _human_p(row["label"], where)
        prompt, chosen, rejected = row["input"], _text_field(row, "output_1", where), _text_field(row, "output_2", where)
    else:
        for key in ("chosen", "rejected"):
            if key not in row:
                raise DataError(f"{where}: missing field {key!r} (fields: {sorted(row)})")
        # no 'p' means a hard label (TRL's format); 'p': null is a label that is missing
        p = _p(row["p"], where) if "p" in row else 1.0
        prompt = row.get("prompt")
        if prompt is None and is_hh_transcript(row["chosen"]) and is_hh_transcript(row["rejected"]):
            cut_c, cut_r = row["chosen"].rfind("\n\nAssistant:"), row["rejected"].rfind("\n\nAssistant:")
            if row["chosen"][:cut_c] != row["rejected"][:cut_r]:
                return "different-dialogue"
            prompt_msgs = hh_messages(row["chosen"][:cut_c])
            chosen = row["chosen"][cut_c + len("\n\nAssistant:"):].strip()
            rejected = row["rejected"][cut_r + len("\n\nAssistant:"):].strip()
            if not prompt_msgs:
                raise DataError(f"{where}: 'chosen' is an HH transcript without a Human turn")
        else:
            head_c, chosen = _response(row["chosen"], where, "chosen")
            head_r, rejected = _response(row["rejected"], where, "rejected")
            if prompt is None:  # TRL implicit prompt: the shared turns before the replies
                if not head_c:
                    raise DataError(f"{where}: missing field 'prompt' (fields: {sorted(row)})")
                if head_c != head_r:
                    raise DataError(f"{where}: implicit-prompt 'chosen' and 'rejected' differ before the last reply")
                prompt_msgs = head_c
            elif head_c:  # explicit prompt with extra turns in chosen: they belong to the prompt
                prompt_msgs = (check_messages(prompt, where, "prompt") if isinstance(prompt, list)
                               else ({"role": "user", "content": prompt},)) + head_c
    if prompt_msgs is None and isinstance(prompt, list):
        prompt_msgs = check_messages(prompt, where, "prompt")
    if prompt_msgs is not None:
        if not any(m["role"] == "user" for m in prompt_msgs):
            raise DataError(f"{where}: the prompt holds no user turn")
        prompt = transcript(prompt_msgs)
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: 'prompt' must be a non-empty string or chat messages, got {str(prompt)[:40]!r}")
    if chosen == rejected:
        return "identical"
    if prompt_msgs is not None and len(prompt_msgs) == 1 and prompt_msgs[0]["role"] == "user":
        prompt_msgs = None  # a lone user turn is the plain prompt: nothing to keep beyond the text
    return PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, p=p, provenance=prov, messages=prompt_msgs)


def load_preferences(source: str | Path, *, split: str | None = None, limit: int | None = None,
                     skip_bad_rows: bool = False) -> PreferenceData:
    """Load a preference dataset; see the module docstring for the accepted shapes.

    Raises:
        DataError: naming the file and line (or row) and the missing or bad field.
    """
    rows = read_located(source, split=split, skip_bad_rows=skip_bad_rows)
    pairs = rows.map(to_pair, limit=limit)
    skipped = dict(rows.skipped)
    if rows.bad:
        skipped["bad-row"] = len(rows.bad)
    if not pairs:
        raise DataError(f"{source}: no usable preference pairs (skipped: {skipped or 'none'})")
    return PreferenceData(pairs, skipped)


def load_pairs(source: str | Path, *, limit: int | None = None, skip_bad_rows: bool = False) -> list[PreferencePair]:
    """The pairs of :func:`load_preferences` (skip counts are logged)."""
    return load_preferences(source, limit=limit, skip_bad_rows=skip_bad_rows).pairs


def load_unlabelled_pairs(source: str | Path, *, skip_bad_rows: bool = False) -> list[tuple[str, str, str]]:
    """(prompt text, response A, response B) triples to be labelled (``pofe label --pairs``):
    ``prompt, response_a, response_b`` rows (any ``p`` or ``label`` is ignored), or any
    preference row :func:`to_pair` reads (chosen as A). A chat prompt is its transcript."""
    from pofe.data.prompts import to_prompt

    def triple(row: dict[str, Any], where: str) -> tuple[str, str, str] | str:
        if "response_a" in row and "response_b" in row:
            return (to_prompt(row, where, "prompt").text, _text_field(row, "response_a", where),
                    _text_field(row, "response_b", where))
        pair = to_pair(row, where)
        return pair if isinstance(pair, str) else (pair.prompt, pair.chosen, pair.rejected)

    rows = read_located(source, skip_bad_rows=skip_bad_rows)
    out = rows.map(triple)
    if not out:
        raise DataError(f"{source}: no pairs to label (skipped: {rows.skipped or 'none'})")
    return out
