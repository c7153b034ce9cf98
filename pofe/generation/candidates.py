"""Scored candidates (Self-Rewarding LMs Sec. 3.4, Steps 2-3): N responses per prompt from the
current model, each scored by a pointwise judge (the model itself with the additive rubric,
k samples averaged). Unscored candidates keep ``None``: never an invented score.

Written per chunk of prompts to an append-only JSONL file, so a crash resumes at the next
chunk and a finished chunk is never generated (or paid for) twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from pydantic import Field

from pofe.config import PofeConfig
from pofe.generation.sampling import SamplingConfig, generate
from pofe.runs import JsonlWriter, atomic_write_text, read_jsonl
from pofe.data.io import json_line


class CandidateSettings(PofeConfig):
    """Steps 2-3: candidates per prompt, sampled from M_{t-1} and scored by it."""

    n: int = Field(4, ge=2)
    """Candidates per prompt (paper: 4); a pair needs two."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=256, batch_size=8)
    """Paper: T 0.7, top-p 0.9."""
    chunk: int = Field(8, ge=1)
    """Prompts per generate+judge chunk; each finished chunk is appended to disk (resume point)."""


def scored_candidates(path: Path, prompts: Sequence[str], policy, tokenizer, judge, cfg: CandidateSettings, *,
                      seed: Callable[[int], int]) -> list[dict]:
    """Rows ``{index, prompt, responses, scores, samples, finished, tokens, judge_id}``, one per
    prompt, for every prompt (earlier chunks read back from ``path``). ``seed(start)`` seeds
    the chunk that starts at prompt ``start`` (a resumed run samples what it would have)."""
    done = [r for r in (read_jsonl(path) if path.exists() else []) if r.get("index") is not None]
    if path.exists():  # drop a torn last line before appending
        atomic_write_text(path, "".join(json_line(r) + "\n" for r in done))
    with JsonlWriter(path) as w:
        n = cfg.n
        for start in range(len(done), len(prompts), cfg.chunk):
            part = list(prompts[start:start + cfg.chunk])
            groups = generate(policy, tokenizer, part, n=n, sampling=cfg.sampling, seed=seed(start))
            scores = judge.score([x for x, g in zip(part, groups) for _ in g], [o.text for g in groups for o in g])
            for i, (x, g) in enumerate(zip(part, groups)):
                ss = scores[i * n:(i + 1) * n]
                row = {"index": start + i, "prompt": x, "responses": [o.text for o in g],
                       "scores": [s.score for s in ss], "samples": [list(s.samples) for s in ss],
                       "finished": [o.finished for o in g], "tokens": [o.num_tokens for o in g],
                       "judge_id": getattr(judge, "id", None)}
                w.write(row)
                done.append(row)
    return done


def first_responses(model, tokenizer, prompts: Sequence[str], sampling: SamplingConfig, seed: int) -> list[str]:
    """One response per prompt (e.g. greedy, for evaluation and checkpoint selection)."""
    if not prompts:
        return []
    return [g[0].text for g in generate(model, tokenizer, list(prompts), n=1, sampling=sampling, seed=seed)]
