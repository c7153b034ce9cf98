"""Prompt-only data (OAIF Algorithm 1's D_X: prompts without responses).

``load_prompts(path)`` reads:

* ``.jsonl`` / ``.jsonl.gz`` / ``.json``: one object per line (or a JSON list) with a prompt field
  (``prompt``, ``instruction``, ``question``, ``text``, ``input`` or chat ``messages``), or a
  bare string per line. Anthropic HH rows (``chosen`` = "\\n\\nHuman: ... \\n\\nAssistant: ...")
  give the dialogue up to the last assistant turn;
* ``.txt``: one prompt per non-empty line;
* ``.csv`` / ``.parquet`` / ``.arrow`` and any ``datasets`` dataset name (``name`` or
  ``name:split``): through ``datasets.load_dataset``.

Errors name the file and the line (or row) and the field that was missing, never a bare
KeyError. With no file at all the loops use :data:`DEFAULT_PROMPTS`, a small built-in set
so that ``pofe online`` runs out of the box.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any, Iterable, Sequence

from pofe.records import Prompt

PROMPT_FIELDS = ("prompt", "instruction", "question", "text", "input", "query")


class DataError(ValueError):
    """A data file that cannot be read; ``str(e)`` names the file and line or field."""


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


def hh_prompt(dialogue: str) -> str | None:
    """The HH-RLHF dialogue up to (and excluding) the last ``Assistant:`` turn's answer.

    Single-turn dialogues give the human's message; multi-turn ones keep the earlier turns as
    text, which the chat template then wraps as one user message.
    """
    marker = "\n\nAssistant:"
    k = dialogue.rfind(marker)
    if k < 0:
        return None
    head = dialogue[:k].strip()
    if head.startswith("Human:") and "\n\nAssistant:" not in head:
        head = head[len("Human:"):].strip()
    return head or None


def _prompt_from_row(row: Any, where: str, field: str | None) -> Prompt:
    if isinstance(row, str):
        if not row.strip():
            raise DataError(f"{where}: empty prompt")
        return Prompt(text=row)
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object or a string, got {type(row).__name__}")
    rid = row.get("id")
    rid = str(rid) if rid is not None else None
    ref = row.get("reference") if isinstance(row.get("reference"), str) else None
    if field is not None:
        if field not in row:
            raise DataError(f"{where}: missing field {field!r} (fields: {sorted(row)})")
        value = row[field]
    else:
        value = next((row[f] for f in PROMPT_FIELDS if isinstance(row.get(f), str) and row[f].strip()), None)
        if value is None and "messages" in row:
            value = row["messages"]
        if value is None and isinstance(row.get("chosen"), str):  # Anthropic HH format
            value = hh_prompt(row["chosen"])
    if value is None:
        raise DataError(f"{where}: no prompt field; expected one of {list(PROMPT_FIELDS) + ['messages']} "
                        f"(fields: {sorted(row)}); pass data.prompt_field to name it")
    if isinstance(value, list):  # chat messages: the prompt is the conversation so far
        msgs = [m for m in value if isinstance(m, dict) and "role" in m and "content" in m]
        if len(msgs) != len(value) or not msgs:
            raise DataError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        if msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]
        if not msgs:
            raise DataError(f"{where}: 'messages' holds no user turn")
        return Prompt(text=msgs[-1]["content"], id=rid, messages=tuple(msgs), reference=ref)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: prompt must be a non-empty string")
    return Prompt(text=value, id=rid, reference=ref)


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_json_rows(path: Path) -> Iterable[tuple[str, Any]]:
    """Yield ``(where, row)`` from a JSONL (optionally gzipped) or a JSON-list file."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    with _open_text(path) as f:
        if name.endswith(".json"):
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
            if isinstance(data, dict):  # {"data": [...]} or similar single-key wrappers
                lists = [v for v in data.values() if isinstance(v, list)]
                if len(lists) != 1:
                    raise DataError(f"{path}: expected a JSON list of rows (or one key holding a list)")
                data = lists[0]
            if not isinstance(data, list):
                raise DataError(f"{path}: expected a JSON list of rows")
            for i, row in enumerate(data):
                yield f"{path} row {i}", row
            return
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i}: invalid JSON ({e.msg})") from None
            yield f"{path}:{i}", row


def load_rows(source: str | Path, *, split: str | None = None) -> Iterable[tuple[str, Any]]:
    """Rows of any supported file, or of a ``datasets`` dataset (``name`` or ``name:split``)."""
    path = Path(source)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if path.exists() and (name.endswith(".jsonl") or name.endswith(".json")):
        yield from iter_json_rows(path)
        return
    if path.exists() and name.endswith(".txt"):
        with _open_text(path) as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    yield f"{path}:{i}", line.rstrip("\n")
        return
    yield from _datasets_rows(str(source), split)


def _datasets_rows(source: str, split: str | None) -> Iterable[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise DataError(f"{source}: not a JSONL/TXT file and the 'datasets' package is not installed") from None
    path = Path(source)
    builders = {".csv": "csv", ".parquet": "parquet", ".arrow": "arrow", ".tsv": "csv"}
    try:
        if path.exists() and path.suffix in builders:
            kw = {"delimiter": "\t"} if path.suffix == ".tsv" else {}
            ds = datasets.load_dataset(builders[path.suffix], data_files=str(path), split=split or "train", **kw)
        elif path.is_dir():
            ds = datasets.load_from_disk(str(path)) if (path / "dataset_info.json").exists() or (path / "state.json").exists() \
                else datasets.load_dataset(str(path), split=split or "train")
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split or "train"]
        else:
            name, _, sp = source.partition(":")
            ds = datasets.load_dataset(name, split=sp or split or "train")
    except DataError:
        raise
    except FileNotFoundError as e:
        raise DataError(f"{source}: not found ({e})") from None
    except Exception as e:  # datasets raises many types; keep one clear message
        raise DataError(f"{source}: could not load with datasets ({type(e).__name__}: {e})") from None
    for i, row in enumerate(ds):
        yield f"{source} row {i}", row


def load_prompts(source: str | Path | None, *, field: str | None = None, split: str | None = None,
                 limit: int | None = None) -> list[Prompt]:
    """Load prompt-only data; ``None`` gives the built-in :data:`DEFAULT_PROMPTS`.

    Raises:
        DataError: naming the file and line (or row) that could not be read.
    """
    if source is None:
        prompts = default_prompts()
    else:
        if not Path(source).exists() and (str(source).endswith((".jsonl", ".json", ".txt", ".csv", ".gz", ".parquet"))):
            raise DataError(f"prompt file not found: {source}")
        prompts = [_prompt_from_row(row, where, field) for where, row in load_rows(source, split=split)]
        if not prompts:
            raise DataError(f"{source}: no prompts")
    return prompts[:limit] if limit else prompts


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
