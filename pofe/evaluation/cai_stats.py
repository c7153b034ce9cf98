"""What ``pofe cai revise`` measures on its traces: per chunk (``metrics.jsonl``) and over the
run (``summary.json``), refusal rates of the originals and the final revisions on the red-team
prompts *and* on benign prompts run through the same process -- a constitution that only
teaches refusal shows up as the benign rate climbing with the harmful one (seed, "Over-refusal
or over-compliance"). A trace is any object with ``prompt``, ``original``, ``final``,
``rounds`` and ``empty_revisions`` (:class:`pofe.generation.critique.Trace`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pofe.stats import mean


def chunk_metrics(which: str, traces: Sequence[Any]) -> dict[str, Any]:
    """One revised chunk's metrics.jsonl row (without ``step``, which the driver adds)."""
    return {"set": which, "prompts": len(traces),
            "unchanged": sum(t.final.strip() == t.original.strip() for t in traces),
            "empty_revisions": sum(t.empty_revisions for t in traces),
            "chars_original": mean([len(t.original) for t in traces]),
            "chars_revised": mean([len(t.final) for t in traces])}


def revision_stats(traces: Sequence[Any]) -> dict[str, Any]:
    """Over the red-team traces: unchanged texts, blank revisions, principle draws and lengths."""
    principle_counts: dict[str, int] = {}
    for t in traces:
        for r in t.rounds:
            principle_counts[r["principle_id"]] = principle_counts.get(r["principle_id"], 0) + 1
    return {"unchanged": sum(t.final.strip() == t.original.strip() for t in traces),
            "empty_revisions": sum(t.empty_revisions for t in traces), "principle_counts": principle_counts,
            "mean_chars": {"original": mean([len(t.original) for t in traces]),
                           "revised": mean([len(t.final) for t in traces])}}


def refusal_summary(harmful: Sequence[Any], benign: Sequence[Any]) -> dict[str, Any]:
    """Refusal rates of the original responses and the final revisions, harmful and benign."""
    from pofe.evaluation.refusal import refusal_report

    def rep(which: str) -> dict[str, Any]:
        pick = (lambda t: t.original) if which == "original" else (lambda t: t.final)
        r = refusal_report(([t.prompt for t in benign], [pick(t) for t in benign]) if benign else None,
                           ([t.prompt for t in harmful], [pick(t) for t in harmful]) if harmful else None)
        return {k: r[k] for k in ("over_refusal_rate", "harmful_refusal_rate", "gap")}

    return {"original": rep("original"), "revised": rep("final"), "detector": "patterns"}
