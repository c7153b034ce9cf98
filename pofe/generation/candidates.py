"""Scored candidates (Self-Rewarding LMs Sec. 3.4, Steps 2-3): N responses per prompt from the
current model, each scored by a pointwise judge (the model itself with the additive rubric,
k samples averaged). Unscored candidates keep ``None``: never an invented score.

Written per chunk of prompts to an append-only JSONL file, so a crash resumes at the next
chunk and a finished chunk is never generated (or paid for) twice.

Data-parallel (``dp``, a :class:`pofe.runtime.parallel.DataParallel`): each process generates
and scores its contiguous block of every chunk (``dp.map``), the rows come back to every
process in prompt order and only rank 0 appends them, so the file is written once, in order,
whatever the number of processes. A block samples from ``block_seed(chunk seed, rank)``: the
sampled candidates depend on how many processes split the chunk (one process samples exactly
as before), greedy responses and a deterministic judge's scores do not. A resume with the same
number of processes samples what the uninterrupted run did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from pydantic import Field

from pofe.config import PofeConfig
from pofe.generation.sampling import SamplingConfig, generate
from pofe.runs import JsonlWriter, atomic_write_text, read_jsonl
from pofe.jsonl import json_line
from pofe.runtime.guards import fault_point
from pofe.runtime.parallel import DataParallel
from pofe.runtime.seeds import block_seed


class CandidateSettings(PofeConfig):
    """Steps 2-3: candidates per prompt, sampled from M_{t-1} and scored by it."""

    n: int = Field(4, ge=2)
    """Candidates per prompt (paper: 4); a pair needs two."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=256, batch_size=8)
    """Paper: T 0.7, top-p 0.9."""
    chunk: int = Field(8, ge=1)
    """Prompts per generate+judge chunk; each finished chunk is appended to disk (resume point)."""


def scored_candidates(path: Path, prompts: Sequence[str], policy, tokenizer, judge, cfg: CandidateSettings, *,
                      seed: Callable[[int], int], dp: DataParallel = DataParallel()) -> list[dict]:
    """Rows ``{index, prompt, responses, scores, samples, finished, tokens, judge_id}``, one per
    prompt, for every prompt (earlier chunks read back from ``path``). ``seed(start)`` seeds
    the chunk that starts at prompt ``start`` (a resumed run samples what it would have); ``dp``:
    this process's part (every process calls this; rank 0 owns ``path``)."""
    done = None
    if dp.main:
        done = [r for r in (read_jsonl(path) if path.exists() else []) if r.get("index") is not None]
        if path.exists():  # drop a torn last line before appending
            atomic_write_text(path, "".join(json_line(r) + "\n" for r in done))
    done = dp.from_main(done)  # every process resumes at rank 0's next chunk
    n = cfg.n

    def block(start: int, part: list[str]) -> list[dict]:
        groups = generate(policy, tokenizer, part, n=n, sampling=cfg.sampling, seed=block_seed(seed(start), dp.rank))
        scores = judge.score([x for x, g in zip(part, groups) for _ in g], [o.text for g in groups for o in g])
        return [{"prompt": x, "responses": [o.text for o in g], "scores": [s.score for s in ss],
                 "samples": [list(s.samples) for s in ss], "finished": [o.finished for o in g],
                 "tokens": [o.num_tokens for o in g], "judge_id": getattr(judge, "id", None)}
                for x, g, ss in zip(part, groups, (scores[i * n:(i + 1) * n] for i in range(len(part))))]

    with JsonlWriter(path) if dp.main else _Discard() as w:
        for start in range(len(done), len(prompts), cfg.chunk):
            got = dp.map(lambda mine, start=start: block(start, mine), list(prompts[start:start + cfg.chunk]))
            for i, r in enumerate(got):
                row = {"index": start + i, **r}
                w.write(row)
                done.append(row)
            fault_point(f"candidates:{start}")  # crash/resume suite: the chunk at ``start`` is on disk
    return done


class _Discard:
    """The writer of a process other than rank 0: rows are gathered, rank 0 writes them."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def write(self, row: dict) -> None:
        return None


def first_responses(model, tokenizer, prompts: Sequence[str], sampling: SamplingConfig, seed: int,
                    dp: DataParallel = DataParallel()) -> list[str]:
    """One response per prompt (e.g. greedy, for evaluation and checkpoint selection), every
    process's block gathered in prompt order (``dp``; a collective). Greedy responses do not
    depend on the number of processes; sampled ones draw from ``block_seed(seed, rank)``."""
    if not prompts:
        return []

    def block(part: list[str]) -> list[str]:
        return [g[0].text for g in generate(model, tokenizer, part, n=1, sampling=sampling,
                                            seed=block_seed(seed, dp.rank))]

    return dp.map(block, list(prompts))
