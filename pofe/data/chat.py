"""Chat messages: validation, HH-RLHF transcripts <-> messages, and the text view of a
conversation that judges (which take one prompt string) see.

A conversation is never turned into ``str(list)``: it stays a tuple of ``{role, content}``
dicts for the chat template, and where one string is needed it is :func:`transcript`, the
``Human:/Assistant:`` form of Anthropic's HH-RLHF data (Bai et al. 2022), with a leading
``System:`` line when there is a system message.
"""

from __future__ import annotations

import re
from typing import Any

from pofe.errors import DataError

ROLES = ("system", "user", "assistant")

_TURN = re.compile(r"\n\n(Human|Assistant): ?")
_LABEL = {"system": "System", "user": "Human", "assistant": "Assistant"}


def is_messages(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def check_messages(value: Any, where: str, name: str) -> tuple[dict[str, str], ...]:
    """``value`` as a tuple of ``{role, content}`` messages, or a located :class:`DataError`."""
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: {name!r} must be a non-empty list of {{role, content}} messages")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            raise DataError(f"{where}: {name!r} message {k} must be {{role: system|user|assistant, content: string}}, "
                            f"got {str(m)[:60]}")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def hh_messages(transcript: str) -> tuple[dict[str, str], ...]:
    """An HH-RLHF transcript ``\\n\\nHuman: ...\\n\\nAssistant: ...`` as chat messages."""
    parts = _TURN.split(transcript)
    # parts = [text before the first turn, role1, text1, role2, text2, ...]
    return tuple({"role": "user" if parts[i] == "Human" else "assistant", "content": parts[i + 1].strip()}
                 for i in range(1, len(parts) - 1, 2))


def is_hh_transcript(value: Any) -> bool:
    return isinstance(value, str) and "\n\nAssistant:" in value and "Human:" in value


def transcript(messages: tuple[dict[str, str], ...] | list[dict[str, str]]) -> str:
    """One string for a conversation: a lone user turn is its content; anything longer (a
    system message, earlier turns) is the HH-style transcript, so no turn is lost."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{_LABEL[m['role']]}: {m['content']}" for m in messages)


def split_prompt(messages: tuple[dict[str, str], ...], where: str, name: str) -> tuple[tuple[dict[str, str], ...], str]:
    """(prompt turns, final assistant reply) of a conversation that ends with the reply."""
    if messages[-1]["role"] != "assistant" or len(messages) < 2:
        raise DataError(f"{where}: {name!r} must end with an assistant reply after at least one user turn")
    return messages[:-1], messages[-1]["content"]


def model_input(item: Any) -> str | list[dict[str, str]]:
    """What generation / the chat template should render for a Prompt or PreferencePair:
    its messages when it has them, else its text."""
    msgs = getattr(item, "messages", None)
    if msgs:
        return list(msgs)
    return item.text if hasattr(item, "text") else item.prompt
