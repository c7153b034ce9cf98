"""Judge configs and the plain name -> builder mapping (no substring matching, no import strings
except the explicit ``callable`` kind)."""

from __future__ import annotations

from typing import Callable, Literal

from pofe.config import PofeConfig
from pofe.models import DEFAULT_MODEL


class JudgeConfig(PofeConfig):
    """Which judge labels the pairs, and how."""

    kind: str = "llm"
    """Registry key: see ``JUDGES`` (e.g. llm, length, keyword, reference-overlap, callable)."""
    model: str = DEFAULT_MODEL
    """Judge model for LLM judges: embedded name, Hugging Face id or local directory."""
    template: str = "helpful"
    """Template name shipped with pofe (helpful, helpful-short, ...) or a path to a template file."""
    # programmatic judges
    prefer: Literal["shorter", "longer"] = "shorter"
    """length judge: which response wins."""
    unit: Literal["chars", "words"] = "chars"
    """length judge: how length is counted."""
    temperature: float = 0.0
    """programmatic judges: 0 = hard 1/0/0.5 labels, > 0 = sigmoid((v_A - v_B) / temperature)."""


def _length(cfg: JudgeConfig):
    from pofe.judges.programmatic import length_judge

    return length_judge(prefer=cfg.prefer, unit=cfg.unit, temperature=cfg.temperature)


JUDGES: dict[str, Callable[[JudgeConfig], object]] = {
    "length": _length,
}


def build_judge(cfg: JudgeConfig, **runtime):
    """Build the judge named by ``cfg.kind``. ``runtime`` passes live objects (e.g. a loaded
    model to share with the policy)."""
    try:
        builder = JUDGES[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown judge kind {cfg.kind!r}; choose one of {sorted(JUDGES)}") from None
    return builder(cfg, **runtime) if runtime else builder(cfg)
