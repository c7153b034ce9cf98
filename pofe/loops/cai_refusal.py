"""``pofe cai refusal``: over-refusal on benign prompts next to refusal on harmful ones, for any
model (its config and run; :mod:`pofe.cli.cai` maps options to keys and prints).

Principles written only about harm teach refusal: Constitutional AI reports its gain as a better
harmlessness-helpfulness trade-off with far less evasive refusing (Bai et al. 2022), so the
refusal rate on benign prompts is tracked next to harmfulness on a red-team set. XSTest's safe /
unsafe halves make the two rates comparable (same phrasing, opposite right answers).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from pofe.config import PofeConfig, Seed
from pofe.generation import SamplingConfig
from pofe.runtime import ModelConfig


class RefusalDataConfig(PofeConfig):
    """The two prompt sets."""

    benign: str = "xstest:safe"
    """Benign prompts (a refusal here is over-refusal)."""
    harmful: str = "xstest:unsafe"
    """Harmful prompts (a refusal here is wanted)."""
    max_prompts: Annotated[int, Field(ge=1)] = 50
    """Prompts per set (the first N of each)."""


class RefusalEvalConfig(PofeConfig):
    """``pofe cai refusal``."""

    model: ModelConfig = ModelConfig()
    """The model whose refusals are counted."""
    data: RefusalDataConfig = RefusalDataConfig()
    """The prompt sets (``data.benign``, ``data.harmful``, ``data.max_prompts``)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.0)
    """Greedy by default, so the rates do not depend on sampling luck."""
    seed: Seed = 0
    """Sampling seed (when temperature > 0)."""


def run(cfg: RefusalEvalConfig) -> dict[str, Any]:
    """Load both prompt sets (before the model: a bad source fails fast), answer each once, and
    count refusals; returns :func:`pofe.evaluation.refusal.evaluate_refusal`'s report with the
    model's name."""
    from pofe.data.prompts import load_prompt_texts
    from pofe.evaluation.refusal import evaluate_refusal
    from pofe.models import load_model

    benign = load_prompt_texts(cfg.data.benign, limit=cfg.data.max_prompts)
    harmful = load_prompt_texts(cfg.data.harmful, limit=cfg.data.max_prompts)
    m, tok = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device,
                        trust_remote_code=cfg.model.trust_remote_code, **cfg.model.load_kwargs())
    rep = evaluate_refusal(m, tok, benign, harmful, sampling=cfg.sampling, seed=cfg.seed)
    rep["model"] = cfg.model.name
    return rep
