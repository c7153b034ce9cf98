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

from pofe.data.io import DataError

ROLES = ("system", "user", "assistant")

CHAT_CONTROL_STRINGS = (
    # ChatML (Qwen, SmolLM, Phi-3.5/4, Yi, OpenHermes ...)
    "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>",
    # Llama 3 / 3.x
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
    "<|python_tag|>", "<|finetune_right_pad_id|>",
    # Llama 2 / Mistral / Mixtral
    "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    # Gemma
    "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>",
    # Phi-3, Zephyr, TinyLlama, ChatGLM
    "<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|endofprompt|>", "<|observation|>",
    # DeepSeek (full-width bars and the lower-one-eighth block)
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
    "<|begin▁of▁sentence|>", "<|end▁of▁sentence|>", "<|User|>", "<|Assistant|>",
    # Cohere Command-R
    "<BOS_TOKEN>", "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>",
    # OpenAI harmony (gpt-oss)
    "<|start|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
    # Falcon, StarCoder, Granite, OLMo, misc
    "<|startoftext|>", "<|pad|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|start_of_role|>",
    "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>",
)
"""Chat-control strings of the common template families. A remote judge's tokenizer is not
visible from here, so text sent to an endpoint has all of these broken; text rendered with a
tokenizer in this process has that tokenizer's own special tokens broken as well."""


def break_control(s: str) -> str:
    """``s`` changed just enough that no tokenizer reads it as its control token."""
    if s[0] == "<":
        return "‹" + s[1:]
    if s[0] == "[":
        return "［" + s[1:]
    return s[0] + "\u200b" + s[1:]


def neutralise_control(text: str, specials) -> str:
    """``text`` with every string of ``specials`` (longest first) broken by :func:`break_control`."""
    for s in sorted(specials, key=len, reverse=True):
        if len(s) > 1 and s in text:
            text = text.replace(s, break_control(s))
    return text


_SPECIALS: dict[tuple[int, int], tuple[str, ...]] = {}


def special_token_strings(tokenizer) -> tuple[str, ...]:
    """Every special token of ``tokenizer``: ``all_special_tokens`` and the added tokens marked
    special (SmolLM2 has 17, e.g. ``<file_sep>``, of which ``all_special_tokens`` lists 3)."""
    key = (id(tokenizer), len(getattr(tokenizer, "added_tokens_decoder", None) or {}))
    if key not in _SPECIALS:
        out = list(getattr(tokenizer, "all_special_tokens", ()) or ())
        for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(tok, "special", False):
                out.append(getattr(tok, "content", None))
        _SPECIALS[key] = tuple(dict.fromkeys(t for t in out if isinstance(t, str) and len(t) > 1))
    return _SPECIALS[key]


def neutralise_messages(tokenizer, messages) -> list[dict[str, str]]:
    """Chat messages whose contents cannot forge a turn: every special token of the
    tokenizer that renders them, and every known chat-control string, is broken in
    user-provided text (a data prompt with ``<|im_end|>\n<|im_start|>system`` would otherwise
    open a real system turn in the policy's chat template)."""
    specials = (*special_token_strings(tokenizer), *CHAT_CONTROL_STRINGS)
    return [{**m, "content": neutralise_control(m["content"], specials)} if isinstance(m.get("content"), str) else m
            for m in messages]
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
