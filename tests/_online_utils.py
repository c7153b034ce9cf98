"""Helpers shared by the ``pofe online`` tests (tiny configs, a scripted judge)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pofe.config import load_config
from pofe.records import Judgment


def tiny_cfg(out: Path, model_dir: Path, *sets: str):
    """A seconds-long ``pofe online`` config on the tiny model with the length judge."""
    from pofe.loops.online import OnlineConfig

    base = [f"model.name={model_dir}", "judge.kind=length", "train.steps=2", "train.batch_size=2",
            "sampling.max_new_tokens=6", "optim.lr=1e-3", "optim.warmup_steps=0", f"run.output_dir={out}",
            "eval.num_prompts=2", "eval.sampling.max_new_tokens=6", "log.progress=false", "log.tensorboard=false"]
    return load_config(OnlineConfig, None, base + list(sets))


class FakeJudge:
    """A scripted pairwise judge: ``fn(prompt, a, b) -> p | None`` for both orders."""

    def __init__(self, fn: Callable[[str, str, str], float | None], judge_id: str = "fake"):
        self.fn, self.id, self.calls = fn, judge_id, 0

    def judge(self, prompts, responses_a, responses_b, *, references=None):
        self.calls += 1
        out = []
        for x, a, b in zip(prompts, responses_a, responses_b):
            t0 = time.perf_counter()
            p = self.fn(x, a, b)
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=None if p is None else True, parse_ok=p is not None,
                                judge_id=self.id, latency_s=time.perf_counter() - t0))
        return out


def eos_tiny_model(tokenizer, eos_boost: float = 1.4):
    """A tiny random model that stops on its own: every embedding gets a constant coordinate
    (so the final hidden state has a consistent component) and EOS a larger one, giving
    P(EOS) of a few percent per token. A random model otherwise never samples EOS over a
    49k vocabulary, and response length in tokens could not move."""
    import torch

    from pofe.models import tiny_causal_lm

    m = tiny_causal_lm(tokenizer)
    with torch.no_grad():
        w = m.get_input_embeddings().weight
        w[:, 1] = 1.0
        w[tokenizer.eos_token_id, 1] = 1.0 + eos_boost
    return m
