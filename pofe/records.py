"""Small records shared by every pipeline stage.

They are plain frozen dataclasses so they serialise to JSON (``to_dict``) for
ledgers and datasets without a schema library in the hot path.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any


def _asdict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


@dataclass(frozen=True)
class Prompt:
    """A user instruction. ``messages`` holds the conversation (system message and every turn,
    ending with a user turn) when the prompt came as chat messages; then ``text`` is the
    judge's view of it (:func:`pofe.data.chat.transcript`: the user's message for a single
    turn, a ``System:/Human:/Assistant:`` transcript otherwise) and generation renders
    ``messages`` with the chat template."""

    text: str
    id: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    reference: str | None = None  # optional reference answer (for reference-overlap judges)

    def to_dict(self) -> dict[str, Any]:
        d = _asdict(self)
        d["messages"] = list(self.messages) if self.messages else None
        return d


@dataclass(frozen=True)
class Completion:
    """One sampled response: its text, token ids and (optionally) per-token log-probs."""

    prompt: str
    text: str
    token_ids: tuple[int, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()  # the rendered prompt's ids, kept to avoid re-tokenising
    logprobs: tuple[float, ...] | None = None
    finished: bool = True  # False when generation stopped at max_new_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        return _asdict(self)


@dataclass(frozen=True)
class Judgment:
    """A pairwise verdict on (prompt, A, B), both orders, with provenance.

    ``p`` is P(A better than B) after position debiasing, ``p = (p_ab + p_ba) / 2``
    where both per-order numbers are already expressed as P(A better)
    (OAIF Appendix E; rlaif-constitutional-ai "debiasing by both orders").
    ``p`` is ``None`` when no order could be parsed: judges never invent a value.
    """

    p: float | None
    p_ab: float | None  # order (A, B): P(A better)
    p_ba: float | None  # order (B, A): P(A better), i.e. 1 - P(first better)
    consistent: bool | None  # both orders prefer the same response
    parse_ok: bool
    judge_id: str
    template_hash: str | None = None
    template_id: str | None = None
    principle_id: str | None = None
    constitution_version: str | None = None
    raw: tuple[str, ...] = ()  # raw generated text per order, where text was generated
    hard_label_fallback: bool = False  # endpoint returned no logprobs; verdict read as text
    tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = _asdict(self)
        d["raw"] = list(self.raw)
        return d


@dataclass(frozen=True)
class Score:
    """A pointwise verdict (rubric or expected score). ``score`` is None when unscored."""

    score: float | None
    parse_ok: bool
    judge_id: str
    samples: tuple[float | None, ...] = ()
    template_hash: str | None = None
    template_id: str | None = None
    raw: tuple[str, ...] = ()
    tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = _asdict(self)
        d["raw"] = list(self.raw)
        d["samples"] = list(self.samples)
        return d


@dataclass(frozen=True)
class PreferencePair:
    """A preference between two responses. ``p`` = P(chosen better than rejected), default 1.

    ``provenance`` says where the label came from (judge id, template hash, principle,
    step, ...), so a pair written to disk can be traced back to the annotation.
    """

    prompt: str
    chosen: str
    rejected: str
    p: float = 1.0
    provenance: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, str], ...] | None = None
    """The prompt as chat messages (system message and earlier turns kept) when it came as a
    conversation; ``prompt`` is then its transcript (see :class:`Prompt`)."""

    def __post_init__(self) -> None:
        # a bool is no probability, though float(True) is 1.0
        if isinstance(self.p, bool) or not isinstance(self.p, numbers.Real) or not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"PreferencePair.p must be a number in [0, 1], got {self.p!r}")

    def oriented(self) -> "PreferencePair":
        """The same preference with ``chosen`` the preferred response and ``p`` ≥ ½ (:func:`pofe.labels.orient`);
        ``provenance["swapped"]`` says whether the two were exchanged."""
        from pofe.labels import orient

        chosen, rejected, p = orient(self.chosen, self.rejected, self.p)
        swapped = float(self.p) < 0.5
        return PreferencePair(prompt=self.prompt, chosen=chosen, rejected=rejected, p=p, messages=self.messages,
                              provenance={**self.provenance, "swapped": swapped} if swapped else dict(self.provenance))

    def hardened(self) -> "PreferencePair | None":
        """The hard label (oriented, ``p`` = 1, the soft ``p`` kept as ``provenance["soft_p"]``), or None for an
        exact tie, which carries no preference (:func:`pofe.labels.harden`)."""
        from pofe.labels import harden

        q = self.oriented()
        if harden(q.p) is None:
            return None
        return PreferencePair(prompt=q.prompt, chosen=q.chosen, rejected=q.rejected, p=1.0, messages=q.messages,
                              provenance={**q.provenance, "soft_p": self.p})

    def to_dict(self) -> dict[str, Any]:
        d = _asdict(self)
        d["messages"] = list(self.messages) if self.messages else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PreferencePair":
        return cls(
            prompt=d["prompt"],
            chosen=d["chosen"],
            rejected=d["rejected"],
            p=d.get("p", 1.0),
            provenance=dict(d.get("provenance") or {}),
            messages=tuple(d["messages"]) if d.get("messages") else None,
        )


@dataclass(frozen=True)
class SFTExample:
    """A prompt (text, or chat messages without the final answer) and its target response."""

    prompt: str | tuple[dict[str, str], ...]
    response: str
    source: str = "ift"
