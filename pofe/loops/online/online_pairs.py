"""Online pairs (OAIF Algorithm 1, steps 2-3, and the labelling rule before step 4): sample
``n`` responses per prompt from the current policy, let the annotator judge every pair in
both orders, and turn each verdict into a training pair -- or count why not.

Which verdicts are trained on is :class:`pofe.labels.LabelPolicy` (``labels:``), the one rule
every command that trains on judge labels applies; this module adds only the ``identical``
reason (two equal samples are never judged: they would give a zero DAP gradient).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from pofe.generation import SamplingConfig, generate
from pofe.generation.base import prompt_input
from pofe.labels import DROP_REASONS, LabelPolicy, harden, orient
from pofe.records import Completion, Judgment, Prompt
from pofe.loops.online.dap import TokenPair
from pofe.loops.online.ledger import annotation_row


# ----------------------------------------------------------------------------- sample & annotate

@dataclass
class Annotation:
    """One judged (or skipped) pair of sampled responses: a ledger row in the making."""

    pair_id: str
    step: int
    prompt: Prompt
    a: Completion
    b: Completion
    judgment: Judgment | None  # None when not judged (identical responses)
    selected: bool = True  # False: a round-robin comparison only used for ranking (n > 2)


def sample_and_annotate(policy, tokenizer, judge, prompts: Sequence[Prompt], *, n: int, sampling: SamplingConfig,
                        step: int, rank: int = 0, judge_context: Callable = contextlib.nullcontext,
                        times: dict[str, float] | None = None, seed: int | None = None) -> list[Annotation]:
    """Steps 2-3 of Algorithm 1 for a batch of prompts (the caller seeds the RNG, or passes
    ``seed``: a background thread must not draw from torch's process-wide generator).

    All ``n`` samples of all prompts come from one batched ``generate`` (KV cache), and all
    non-identical pairs go to the judge in one call (the judge scores both orders in one
    batch). Pairs with identical responses are not judged: they carry no preference and
    would give a zero DAP gradient (h = 0), so they are masked out and counted.
    """
    times = times if times is not None else {}
    t0 = time.perf_counter()
    groups = generate(policy, tokenizer, [prompt_input(p) for p in prompts], n=n, sampling=sampling, seed=seed)
    times["generate"] = times.get("generate", 0.0) + time.perf_counter() - t0
    cands: list[Annotation] = []
    for prompt, g in zip(prompts, groups):
        for j in range(n):
            for k in range(j + 1, n):
                cands.append(Annotation(f"s{step}-r{rank}-{len(cands)}", step, prompt, g[j], g[k], None, n == 2))
    todo = [c for c in cands if c.a.text != c.b.text]
    t1 = time.perf_counter()
    if todo:
        with judge_context():
            verdicts = judge.judge([c.prompt.text for c in todo], [c.a.text for c in todo], [c.b.text for c in todo],
                                   references=[c.prompt.reference for c in todo])
        for c, v in zip(todo, verdicts):
            c.judgment = v
    times["judge"] = times.get("judge", 0.0) + time.perf_counter() - t1
    if n > 2:
        _select_best_vs_worst(cands, n)
    return cands


def _select_best_vs_worst(cands: list[Annotation], n: int) -> None:
    """Mark, per prompt, the (best, worst) comparison by mean round-robin win probability."""
    per = n * (n - 1) // 2
    index = [(j, k) for j in range(n) for k in range(j + 1, n)]
    for start in range(0, len(cands), per):
        group = cands[start:start + per]
        wins: list[list[float]] = [[] for _ in range(n)]
        for (j, k), c in zip(index, group):
            if c.judgment is not None and c.judgment.p is not None:
                wins[j].append(c.judgment.p)
                wins[k].append(1.0 - c.judgment.p)
        score = [sum(w) / len(w) if w else None for w in wins]
        scored = [i for i in range(n) if score[i] is not None]
        best = max(scored, key=lambda i: score[i]) if len(scored) >= 2 else None
        worst = min(scored, key=lambda i: score[i]) if len(scored) >= 2 else None
        if best is None or best == worst:
            group[0].selected = True  # nothing usable: keep one row so the skip is counted
            continue
        group[index.index((min(best, worst), max(best, worst)))].selected = True


# ----------------------------------------------------------------------------- labels

SKIP_REASONS = ("identical", *DROP_REASONS)  # identical first: such a pair is never judged


def label(ann: Annotation, labels: str, policy: LabelPolicy | None = None) -> TokenPair | str:
    """The training pair of an annotation, or why it is skipped: identical responses first
    (never judged), then :meth:`pofe.labels.LabelPolicy.drop_reason` on the calibrated p
    (unlabelled / inconsistent / low_margin / ties for hard labels); the kept pair is
    oriented to the preferred response and, for hard labels, hardened to p = 1."""
    policy = policy or LabelPolicy()
    if ann.a.text == ann.b.text:
        return "identical"
    j = ann.judgment
    p = policy.calibrated(None if j is None else j.p)
    why = policy.drop_reason(p, None if j is None else j.consistent, hard=labels == "hard")
    if why is not None:
        return why
    chosen, rejected, p = orient(ann.a, ann.b, p)
    if labels == "hard":
        p = harden(p)  # 1.0: an exact tie was dropped above
    lps = None if chosen.logprobs is None or rejected.logprobs is None else (sum(chosen.logprobs), sum(rejected.logprobs))
    return TokenPair(chosen.prompt_token_ids, chosen.token_ids, rejected.token_ids, p, ann.pair_id, lps)


def zero_counts() -> dict[str, int]:
    return {"annotations": 0, "trained": 0, **{r: 0 for r in SKIP_REASONS}}


def label_annotations(anns: Sequence[Annotation], labels: str, rank: int, policy: LabelPolicy | None = None,
                      ) -> tuple[list[TokenPair], dict[str, int], list[dict]]:
    """Training pairs, counts per outcome, and one ledger row per annotation."""
    pairs, counts, rows = [], zero_counts(), []
    counts["annotations"] = len(anns)
    for ann in anns:
        out = label(ann, labels, policy) if ann.selected else "ranking"
        status = "trained" if isinstance(out, TokenPair) else out
        if isinstance(out, TokenPair):
            pairs.append(out)
        if status in counts:
            counts[status] += 1
        rows.append(annotation_row(pair_id=ann.pair_id, step=ann.step, rank=rank, prompt=ann.prompt, a=ann.a, b=ann.b,
                                   judgment=ann.judgment, status=status, selected=ann.selected))
        if policy is not None and policy.calibration is not None and ann.judgment is not None:
            rows[-1].update(p=policy.calibrated(ann.judgment.p), p_raw=ann.judgment.p, calibration=policy.calibration)
    return pairs, counts, rows
