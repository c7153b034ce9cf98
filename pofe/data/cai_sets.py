"""The datasets ``pofe cai revise`` makes from its critique -> revision traces (SL-CAI,
rlaif-constitutional-ai "Stage 1: critique and revision"): the final revisions paired with
their prompts are SFT data, mixed with helpfulness data "so the model does not drift toward
refusal"; the (final revision > original) pairs are a preference set (the alignment-handbook
CAI recipe trains DPO on exactly these). A trace is any object with ``prompt``, ``original``,
``final`` and ``rounds`` (:class:`pofe.generation.critique.Trace`)."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

from pofe.records import PreferencePair

log = logging.getLogger(__name__)


def load_limited(source: str, limit: int | None, key: str) -> tuple[list[str], dict[str, Any]]:
    """The first ``limit`` prompts of ``source`` and how many the limit left out (logged when
    it cut any: a default cap must never drop prompts unseen)."""
    from pofe.data.prompts import load_prompt_texts

    given = load_prompt_texts(source)
    used = given[:limit]
    info = {"source": str(source), "available": len(given), "used": len(used), "limited": len(given) - len(used),
            key: limit}
    if info["limited"]:
        log.warning("cai revise: %s=%s: using the first %d of %d prompts of %s; %d of %d left out",
                    key, limit, len(used), len(given), source, info["limited"], len(given))
    return used, info


def mix_sft(cai_rows: list[dict[str, Any]], helpful_rows: list[dict[str, Any]], ratio: float, *, seed: int = 0) -> list[dict[str, Any]]:
    """CAI rows plus helpfulness rows so that helpful / total = ``ratio`` (as close as the
    available helpful rows allow), shuffled with ``seed``.

    n_helpful = round(n_cai * ratio / (1 - ratio)); e.g. 30 revisions at ratio 0.25 -> 10.
    """
    if not 0 <= ratio < 1:
        raise ValueError(f"helpful ratio must be in [0, 1), got {ratio}")
    want = round(len(cai_rows) * ratio / (1 - ratio)) if ratio > 0 else 0
    rng = random.Random(seed)
    helpful = list(helpful_rows)
    rng.shuffle(helpful)
    rows = list(cai_rows) + helpful[:want]
    rng.shuffle(rows)
    return rows


def sft_set(traces: Sequence[Any], constitution_version: str, helpful: str | None, ratio: float, *,
            seed: int = 0) -> list[dict[str, Any]]:
    """``sft.jsonl``: (prompt, final revision) of every trace with a non-blank final text, mixed
    with helpfulness examples read from ``helpful`` (null: none) at ``ratio``."""
    from pofe.data.sft import load_examples

    cai_rows = [{"prompt": t.prompt, "response": t.final, "source": "cai-revision",
                 "constitution_version": constitution_version} for t in traces if t.final.strip()]
    helpful_rows = []
    if helpful and ratio > 0:
        want = round(len(cai_rows) * ratio / (1 - ratio))
        helpful_rows = [{"prompt": e.prompt if isinstance(e.prompt, str) else list(e.prompt), "response": e.response,
                         "source": "helpful"} for e in load_examples(helpful, limit=max(4 * want, want))]
    return mix_sft(cai_rows, helpful_rows, ratio if helpful_rows else 0.0, seed=seed)


def preference_pairs(traces: Sequence[Any], constitution: Any) -> list[PreferencePair]:
    """(final revision > original) pairs, p = 1; identical texts carry no preference and are skipped."""
    out = []
    for t in traces:
        if t.final.strip() and t.final.strip() != t.original.strip():
            out.append(PreferencePair(prompt=t.prompt, chosen=t.final, rejected=t.original, p=1.0, provenance={
                "source": "cai-revise", "constitution": constitution.name, "constitution_version": constitution.version,
                "principle_ids": [r["principle_id"] for r in t.rounds], "rounds": len(t.rounds)}))
    return out
