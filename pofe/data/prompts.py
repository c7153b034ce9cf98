"""Prompt-only data (OAIF Algorithm 1's D_X: prompts without responses).

:func:`load_prompts` reads any source :func:`pofe.data.io.read_located` reads and maps each
row with :func:`to_prompt`. A row's prompt is, in this order:

* the field named by ``field`` (``data.prompt_field``), when given;
* ``prompt`` -- a string, or chat messages (TRL's conversational prompt format);
* ``messages`` -- a chat; a trailing assistant turn (the answer) is dropped;
* ``turns`` -- FastChat MT-Bench / Vicuna questions: the first turn (later turns depend on
  the model's first answer, so they are not static prompts);
* ``instruction`` (+ ``input``, or Self-Instruct's first ``instances`` input) -- Alpaca,
  Self-Instruct, alpaca_eval outputs;
* ``goal`` (AdvBench), ``question``, ``query``, ``input``, ``text`` (a TXT line);
* ``chosen`` with no ``prompt``: an HH-RLHF transcript (the dialogue before the last
  ``Assistant:`` reply, as messages) or a TRL implicit-prompt chat (the turns before the
  last assistant reply).

Conversations keep the system message and every turn in :attr:`Prompt.messages`;
:attr:`Prompt.text` is their transcript (:func:`pofe.data.chat.transcript`). With no source
at all the loops use :data:`DEFAULT_PROMPTS`, a small built-in set so that ``pofe online``
runs out of the box.
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
    transcript,
)
from pofe.data.io import read_located
from pofe.errors import DataError
from pofe.records import Prompt

TEXT_FIELDS = ("goal", "question", "query", "input", "text")
PROMPT_FIELDS = ("prompt", "instruction") + TEXT_FIELDS

__all__ = ["DataError", "DEFAULT_PROMPTS", "PROMPT_FIELDS", "PromptCursor", "default_prompts", "load_prompts",
           "load_prompt_texts", "split_heldout", "to_prompt"]

# A built-in prompt set for out-of-the-box runs: short everyday instructions whose answers
# can be long or short, so that a length or helpfulness objective has room to move.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Explain what photosynthesis is.",
    "Give me three tips for sleeping better.",
    "How do I boil an egg?",
    "What is the difference between weather and climate?",
    "Write a short poem about the sea.",
    "Why is the sky blue?",
    "Suggest a name for a pet cat.",
    "How can I improve my handwriting?",
    "What does a computer's CPU do?",
    "Describe a healthy breakfast.",
    "What are the benefits of regular exercise?",
    "How do I make a cup of tea?",
    "Explain gravity to a child.",
    "What is a prime number?",
    "Give me an idea for a weekend activity.",
    "How do plants drink water?",
    "What is the largest planet in our solar system?",
    "Translate 'good morning' into Spanish.",
    "How can I save money on groceries?",
    "What is the boiling point of water?",
    "Summarise the story of Cinderella.",
    "What is machine learning?",
    "How do I start learning to play the guitar?",
    "Why do leaves change colour in autumn?",
    "What should I pack for a day at the beach?",
    "How does a rainbow form?",
    "Give me a tip for staying focused while studying.",
    "What is the difference between a virus and a bacterium?",
    "How many continents are there?",
    "Write a thank-you note to a friend.",
    "What is the purpose of a seatbelt?",
    "How do I clean a cast-iron pan?",
    "Explain what an atom is.",
    "What is a good way to learn new vocabulary?",
    "Why do we have seasons?",
    "Recommend a hobby for someone who likes being outdoors.",
    "What does the heart do?",
    "How do I write a good email subject line?",
    "What is the speed of light?",
    "Describe the water cycle.",
    "What are some ways to reduce stress?",
    "How do bees make honey?",
    "What is the tallest mountain on Earth?",
    "Give me a simple recipe for pancakes.",
    "What is democracy?",
    "How do I change a flat bicycle tyre?",
    "Why is recycling important?",
    "What is the moon made of?",
    "How can I be more productive in the morning?",
    "Explain what a noun is.",
    "What causes thunder?",
    "Give me a fun fact about octopuses.",
    "How do I keep houseplants alive?",
    "What is the difference between a lake and a sea?",
    "How does a refrigerator keep food cold?",
    "Write a one-line slogan for a bakery.",
    "What are the primary colours?",
    "How do vaccines work?",
    "What is a budget and why is it useful?",
    "Name three famous painters.",
    "How do I tie a tie?",
    "Why do cats purr?",
    "What is the internet?",
    "Suggest a quick dinner idea.",
    "How can I make new friends in a new city?",
    "What is an ecosystem?",
    "How far is the Moon from the Earth?",
    "Give me advice for a job interview.",
    "What is the meaning of the word 'empathy'?",
    "How do airplanes stay in the air?",
    "What is a healthy amount of water to drink each day?",
    "Describe your ideal holiday.",
    "How do I start running as a beginner?",
    "What are fossils?",
    "Explain what inflation means.",
    "Give me a tongue twister.",
    "What is the function of roots in a plant?",
    "How do I apologise to someone I upset?",
    "What is the difference between a frog and a toad?",
)


def default_prompts() -> list[Prompt]:
    return [Prompt(text=t, id=f"default-{i}") for i, t in enumerate(DEFAULT_PROMPTS)]


def _from_messages(msgs: tuple[dict[str, str], ...], where: str, name: str, **kw) -> Prompt:
    if msgs[-1]["role"] == "assistant":
        msgs = msgs[:-1]
    if not msgs or not any(m["role"] == "user" for m in msgs):
        raise DataError(f"{where}: {name!r} holds no user turn")
    return Prompt(text=transcript(msgs), messages=msgs, **kw)


def _instruction(row: dict[str, Any]) -> str | None:
    ins = row.get("instruction")
    if not isinstance(ins, str) or not ins.strip():
        return None
    extra = row.get("input")
    if not isinstance(extra, str) and isinstance(row.get("instances"), list) and row["instances"]:
        first = row["instances"][0]
        extra = first.get("input") if isinstance(first, dict) else None
    return f"{ins}\n\n{extra}" if isinstance(extra, str) and extra.strip() else ins


def to_prompt(row: dict[str, Any], where: str, field: str | None = None) -> Prompt:
    """One row as a :class:`Prompt` (see the module docstring for the fields tried)."""
    rid = row.get("id", row.get("question_id"))
    kw = {"id": str(rid) if rid is not None else None,
          "reference": row["reference"] if isinstance(row.get("reference"), str) else None}
    if field is not None:
        if field not in row:
            raise DataError(f"{where}: missing field {field!r} (fields: {sorted(row)})")
        value, name = row[field], field
    elif "prompt" in row:
        value, name = row["prompt"], "prompt"
    elif "messages" in row:
        value, name = row["messages"], "messages"
    elif "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise DataError(f"{where}: 'turns' must be a non-empty list of strings")
        value, name = turns[0], "turns"
    elif _instruction(row) is not None:
        value, name = _instruction(row), "instruction"
    elif "chosen" in row and is_hh_transcript(row["chosen"]):
        head = row["chosen"][:row["chosen"].rfind("\n\nAssistant:")]
        return _from_messages(hh_messages(head), where, "chosen", **kw)
    elif "chosen" in row and is_messages(row["chosen"]):
        turns, _ = split_prompt(check_messages(row["chosen"], where, "chosen"), where, "chosen")
        return _from_messages(turns, where, "chosen", **kw)
    else:
        name = next((f for f in TEXT_FIELDS if f in row), None)
        if name is None:
            raise DataError(f"{where}: no prompt field; expected one of {list(PROMPT_FIELDS) + ['messages', 'turns']} "
                            f"(fields: {sorted(row)}); set data.prompt_field to name it")
        value = row[name]
    if isinstance(value, list) and name != "turns":
        return _from_messages(check_messages(value, where, name), where, name, **kw)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: {name!r} must be a non-empty string or chat messages, got {str(value)[:40]!r}")
    return Prompt(text=value, **kw)


def load_prompts(source: str | Path | None, *, field: str | None = None, split: str | None = None,
                 limit: int | None = None, skip_bad_rows: bool = False) -> list[Prompt]:
    """Load prompt-only data; ``None`` gives the built-in :data:`DEFAULT_PROMPTS`.

    Raises:
        DataError: naming the file and line (or row) and the field that could not be read.
    """
    if source is None:
        prompts = default_prompts()
    else:
        rows = read_located(source, split=split, skip_bad_rows=skip_bad_rows)
        prompts = rows.map(lambda row, where: to_prompt(row, where, field), limit=limit)
        if not prompts:
            raise DataError(f"{source}: no prompts")
    return prompts[:limit] if limit else prompts


def load_prompt_texts(source: str | Path, *, field: str | None = None, split: str | None = None,
                      limit: int | None = None, skip_bad_rows: bool = False) -> list[str]:
    """Prompts as one string each, for the commands whose generator and judge take text
    (``label``, ``rl``, ``cai revise``, ``eval``): a conversation becomes its transcript,
    with the system message and every turn (:func:`pofe.data.chat.transcript`)."""
    return [p.text for p in load_prompts(source, field=field, split=split, limit=limit, skip_bad_rows=skip_bad_rows)]


def split_heldout(prompts: Sequence[Prompt], n_eval: int, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """Split off ``n_eval`` held-out prompts (a fixed, seeded choice) for win-rate evaluation.

    With fewer than ``2 * n_eval`` prompts the evaluation set is the first ``n_eval`` prompts
    and also stays in training (too little data to hold out), which the caller reports.
    """
    prompts = list(prompts)
    if n_eval <= 0:
        return prompts, []
    if len(prompts) < 2 * n_eval:
        return prompts, prompts[:n_eval]
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_eval])
    return [p for i, p in enumerate(prompts) if i not in held], [prompts[i] for i in sorted(held)]


class PromptCursor:
    """Deterministic, resumable stream of prompts: epoch ``e`` visits the data in a
    permutation seeded by ``(seed, e)``; the state is a single integer position, so a
    checkpoint stores it and a resumed run draws exactly the same prompts."""

    def __init__(self, prompts: Sequence[Any], seed: int, position: int = 0, shuffle: bool = True):
        if not prompts:
            raise DataError("no prompts to draw from")
        self.items = list(prompts)
        self.seed = seed
        self.position = position
        self.shuffle = shuffle
        self._perm_epoch = -1
        self._perm: list[int] = []

    def _order(self, epoch: int) -> list[int]:
        if epoch != self._perm_epoch:
            order = list(range(len(self.items)))
            if self.shuffle:
                random.Random(f"{self.seed}-{epoch}").shuffle(order)
            self._perm, self._perm_epoch = order, epoch
        return self._perm

    def take(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            epoch, k = divmod(self.position, len(self.items))
            out.append(self.items[self._order(epoch)[k]])
            self.position += 1
        return out
