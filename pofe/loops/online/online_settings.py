"""``pofe online``'s data and evaluation settings (kept out of the recipe module so that it reads
as setup -> loop -> save; re-exported by :mod:`pofe.loops.online`)."""

from __future__ import annotations

from pydantic import Field

from pofe.config import PofeConfig
from pofe.generation import SamplingConfig
from pofe.judges.config import JudgeConfig


class DataSettings(PofeConfig):
    """Training and held-out data."""

    prompts: str | None = None
    """Prompt-only data (JSONL/TXT/CSV/parquet or a datasets name); None = built-in prompts."""
    prompt_field: str | None = None
    """Field holding the prompt (default: the first of prompt/instruction/question/text/input/messages)."""
    split: str | None = None
    """Split of a datasets name."""
    max_prompts: int | None = Field(None, ge=1)
    """Use at most this many prompts (None = all)."""
    eval_prompts: str | None = None
    """Held-out prompts for the win rate; None = split off eval.num_prompts from data.prompts."""
    preferences: str | None = None
    """mode=offline: prompt/chosen/rejected[/p] data (a pofe ledger works too)."""


class EvalSettings(PofeConfig):
    """Win rate of the current policy against the initial one on held-out prompts."""

    every: int = Field(0, ge=0)
    """Win rate vs the initial policy every N steps (0 = only at the end)."""
    enabled: bool = True
    """false: no evaluation at all."""
    num_prompts: int = Field(16, ge=0)
    """Held-out prompts."""
    judge: JudgeConfig | None = None
    """Evaluation judge; None = the training judge. OAIF evaluates with a different model to
    avoid rewarding the annotator's quirks (Sec. 4.1: Gemini Pro judges, PaLM 2 annotates)."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_new_tokens=48)
    """Greedy by default so that the win rate does not depend on sampling luck."""
