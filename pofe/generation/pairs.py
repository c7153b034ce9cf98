"""Two samples per prompt, the pairs RL-CAI's feedback model labels (rlaif-constitutional-ai,
"Stage 2": sample two responses from the SL-CAI policy at a temperature around 1.0)."""

from __future__ import annotations

from collections.abc import Sequence

from pofe.generation.base import SamplingConfig


def sample_pairs(model, tokenizer, prompts: Sequence[str], sampling: SamplingConfig, seed: int) -> list[tuple[str, str, str]]:
    """(prompt, response A, response B) for each prompt: one ``generate`` call with n=2 (KV cache shared)."""
    from pofe.generation.sampling import generate

    outs = generate(model, tokenizer, list(prompts), n=2, sampling=sampling, seed=seed)
    return [(x, g[0].text, g[1].text) for x, g in zip(prompts, outs)]
