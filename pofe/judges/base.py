"""The judge protocols every pipeline consumes AI feedback through.

A *pairwise* judge answers "is A better than B?" for a batch of (prompt, A, B) and returns
:class:`~pofe.records.Judgment` verdicts (both orders, debiased p, consistency, parse
status, provenance). A *pointwise* judge returns :class:`~pofe.records.Score` verdicts.
Judges never invent a value: an unreadable output gives ``p=None`` / ``score=None`` with
``parse_ok=False``, and callers count and report it.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from pofe.records import Judgment, Score


@runtime_checkable
class PairwiseJudge(Protocol):
    """Compare two responses to the same prompt."""

    id: str

    def judge(
        self,
        prompts: Sequence[str],
        responses_a: Sequence[str],
        responses_b: Sequence[str],
        *,
        references: Sequence[str | None] | None = None,
    ) -> list[Judgment]: ...


@runtime_checkable
class PointwiseJudge(Protocol):
    """Score one response to a prompt."""

    id: str

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        *,
        references: Sequence[str | None] | None = None,
    ) -> list[Score]: ...


def check_batch(prompts, a, b=None) -> None:
    if len(prompts) != len(a) or (b is not None and len(b) != len(a)):
        raise ValueError(
            f"judge batch mismatch: {len(prompts)} prompts, {len(a)} responses A"
            + (f", {len(b)} responses B" if b is not None else "")
        )
