"""``pofe chat``'s config (answer prompts with a model: a smoke test of the embedded default)."""

from __future__ import annotations

import time
from typing import Any

from pofe.config import PofeConfig, Seed
from pofe.generation import SamplingConfig
from pofe.runtime import LoadConfig


class ChatConfig(PofeConfig):
    model: LoadConfig = LoadConfig()
    """The model (``model.name``: embedded name, Hugging Face id or local directory; ``model.device``)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.0)
    seed: Seed = 0


def run(cfg: ChatConfig, prompts: list[str]) -> dict[str, Any]:
    """Load the model, answer each prompt once; returns the timings and responses."""
    from pofe.generation import generate
    from pofe.models import load_model

    t0 = time.perf_counter()
    m, tok = load_model(cfg.model.name, dtype=cfg.model.dtype, device=cfg.model.device,
                        trust_remote_code=cfg.model.trust_remote_code, **cfg.model.load_kwargs())
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    outs = generate(m, tok, prompts, n=1, sampling=cfg.sampling, seed=cfg.seed)
    gen_s = time.perf_counter() - t1
    rows = [{"prompt": p, "response": g[0].text, "tokens": g[0].num_tokens} for p, g in zip(prompts, outs)]
    return {"model": cfg.model.name, "load_seconds": round(load_s, 3), "generate_seconds": round(gen_s, 3),
            "responses": rows}
