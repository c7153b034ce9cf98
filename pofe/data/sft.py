"""Supervised examples: (prompt, target response) rows for ``pofe sft`` (and the SL-CAI /
self-rewarding seed fine-tuning that reuse it).

:func:`to_example` accepts, in this order:

* ``messages`` -- a chat ending with the assistant's answer (TRL's conversational
  language-modelling format); the turns before it, system message included, are the prompt;
* ``prompt`` + ``completion`` / ``response`` / ``output`` / ``answer`` / ``target`` -- TRL's
  prompt-completion format; prompt and completion may be chat messages (conversational
  prompt-completion);
* Alpaca ``instruction`` [+ ``input``] + ``output``; Self-Instruct seed tasks
  (``instruction`` + first ``instances`` input/output);
* preference rows: ``prompt`` + ``chosen`` (standard or conversational), HH-RLHF
  (``chosen`` transcript) and TRL implicit-prompt chats -- the preferred reply is the target,
  the dialogue before it the prompt.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Sequence

from pofe.data.chat import (
    check_messages,
    hh_messages,
    is_hh_transcript,
    is_messages,
    split_prompt,
)
from pofe.data.io import read_located
from pofe.errors import DataError
from pofe.data.prompts import PROMPT_FIELDS, to_prompt
from pofe.records import SFTExample

RESPONSE_FIELDS = ("completion", "response", "output", "answer", "target")

__all__ = ["RESPONSE_FIELDS", "SFTExample", "load_examples", "load_sft_data", "source_counts", "to_example"]


def _chat(msgs: tuple[dict[str, str], ...], where: str, name: str, source: str) -> SFTExample:
    head, reply = split_prompt(msgs, where, name)
    prompt = head[0]["content"] if len(head) == 1 and head[0]["role"] == "user" else head
    return SFTExample(prompt, reply, source)


def to_example(row: dict[str, Any], where: str, source: str = "ift") -> SFTExample:
    """One training row as an :class:`SFTExample`; errors name the file and line."""
    if "messages" in row and not any(isinstance(row.get(f), str) for f in PROMPT_FIELDS):
        return _chat(check_messages(row["messages"], where, "messages"), where, "messages", source)
    if isinstance(row.get("instances"), list) and row["instances"] and "instruction" in row:  # Self-Instruct
        inst = row["instances"][0]
        if not isinstance(inst, dict) or not isinstance(inst.get("output"), str):
            raise DataError(f"{where}: 'instances'[0] needs an 'output' string")
        return SFTExample(to_prompt(row, where).text, inst["output"], source)
    if "prompt" not in row and "chosen" in row:  # a preference chat: the preferred reply is the target
        if is_hh_transcript(row["chosen"]):
            return _chat(hh_messages(row["chosen"]), where, "chosen", source)
        if is_messages(row["chosen"]):
            return _chat(check_messages(row["chosen"], where, "chosen"), where, "chosen", source)
    name = next((f for f in (*RESPONSE_FIELDS, "chosen") if f in row), None)
    if name is None:
        raise DataError(f"{where}: need a prompt field ({'/'.join(PROMPT_FIELDS)} or messages) and a response field "
                        f"({'/'.join(RESPONSE_FIELDS)}); fields: {sorted(row)}")
    value = row[name]
    rest = {k: v for k, v in row.items() if k not in (name, "rejected")}
    if isinstance(value, list):  # conversational completion: the assistant's message(s)
        msgs = check_messages(value, where, name)
        if msgs[-1]["role"] != "assistant":
            raise DataError(f"{where}: {name!r} messages must end with the assistant's answer")
        value = msgs[-1]["content"]
    if not isinstance(value, str):
        raise DataError(f"{where}: {name!r} must be a string, got {type(value).__name__}")
    p = to_prompt(rest, where)
    return SFTExample(p.messages if p.messages and len(p.messages) > 1 else p.text, value, source)


def load_examples(paths: Sequence[str | Path] | str | Path, source: str = "ift", limit: int | None = None,
                  skip_bad_rows: bool = False) -> list[SFTExample]:
    """Examples of every source in ``paths`` (first ``limit`` of each)."""
    out: list[SFTExample] = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        rows = read_located(path, skip_bad_rows=skip_bad_rows)
        examples = rows.map(lambda row, where: to_example(row, where, source), limit=limit)
        if not examples:  # name the file: "no usable examples" after the merge would not say which
            raise DataError(f"{path}: no {source} examples (skipped: {rows.skipped or 'none'})")
        out.extend(examples)
    return out


def source_counts(examples: Sequence[SFTExample], eft_capped: int = 0) -> dict[str, int]:
    """``{"ift", "eft", "eft_capped"}`` of a mixed example list (the summary's ``data``)."""
    return {"ift": sum(e.source == "ift" for e in examples), "eft": sum(e.source == "eft" for e in examples),
            "eft_capped": eft_capped}


def load_sft_data(cfg: Any, seed: int = 0) -> tuple[list[SFTExample], dict[str, int]]:
    """IFT + EFT examples of ``pofe sft``'s ``data`` section (``ift``, ``eft``, ``limit``,
    ``eft_max_ratio``) and their counts. With ``eft_max_ratio`` the EFT examples are a seeded
    sample of at most that multiple of the IFT count (Self-Rewarding LMs: 1,630 EFT with
    3,200 IFT). ``eft`` counts the EFT examples read, ``eft_capped`` those left out."""
    ift = load_examples(cfg.ift, "ift", cfg.limit)
    eft = load_examples(cfg.eft, "eft", cfg.limit)
    capped = 0
    if cfg.eft_max_ratio is not None and len(eft) > cfg.eft_max_ratio * len(ift):
        keep = int(cfg.eft_max_ratio * len(ift))
        capped = len(eft) - keep
        eft = random.Random(seed).sample(eft, keep)
    return ift + eft, {"ift": len(ift), "eft": len(eft) + capped, "eft_capped": capped}
