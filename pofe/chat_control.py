"""Chat-control strings broken in text that did not come from pofe: a data prompt or a response
holding ``<|im_end|>\n<|im_start|>system`` must not open a real turn in a chat template. A leaf:
the model loader renders with it (:mod:`pofe.models`), judges and data use it too."""

from __future__ import annotations

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
