"""Prompt rendering and EOS handling that both engines (:mod:`pofe.generation.sampling`,
:mod:`pofe.generation.vllm`) and the judge backends share. It sits below the engines so that
the vLLM engine does not have to import the ``hf`` engine's module (which builds the engine
table that points back at vLLM)."""

from __future__ import annotations

from pofe.models import apply_chat_template


def _render(tokenizer, prompt) -> str:
    return apply_chat_template(tokenizer, prompt)


def _eos_ids(model, tokenizer) -> list[int]:
    ids = set()
    gc = getattr(model, "generation_config", None)
    e = getattr(gc, "eos_token_id", None) if gc is not None else None
    for x in (e if isinstance(e, (list, tuple)) else [e]):
        if x is not None:
            ids.add(int(x))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def _cut_at_eos(ids: list[int], eos_ids: list[int], pad_id: int | None) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS (the EOS is part of the response's
    likelihood: it is what makes a short answer short). Returns (ids, finished)."""
    for k, t in enumerate(ids):
        if t in eos_ids:
            return ids[: k + 1], True
    return ids, False
