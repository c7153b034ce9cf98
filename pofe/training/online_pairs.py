"""Online pairs (OAIF Algorithm 1, steps 2-3, and the labelling rule before step 4): sample
``n`` responses per prompt from the current policy, let the annotator judge every pair in
both orders, and turn each verdict into a training pair -- or count why not.

The labelling rule is shared by every loop that trains on judge verdicts, so that
``labels.drop_inconsistent`` / ``labels.min_margin`` mean one thing everywhere
(issue: order-inconsistent near-0.5 verdicts trained as full-confidence hard labels).
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pydantic import Field, field_validator

from pofe.config import PofeConfig
from pofe.generation import SamplingConfig, generate
from pofe.data.prompts import PromptCursor
from pofe.records import Completion, Judgment, Prompt
from pofe.runs import JsonlWriter
from pofe.training.dap import TokenPair
from pofe.training.ledger import annotation_row


class LabelSettings(PofeConfig):
    """Which judge labels are trained on. The defaults train every readable non-tie label, as
    OAIF Algorithm 1 does; dropped pairs are counted in metrics.jsonl and the summary, and
    marked in the ledger (``status``)."""

    drop_inconsistent: bool = False
    """Drop pairs whose two judge orders prefer different responses (a position-biased read:
    as a hard label it would be trained at full confidence)."""
    min_margin: float = Field(0.0, ge=0.0, le=0.5)
    """Drop pairs with |p - 1/2| below this (near-coin-flip labels); 0 keeps all."""
    calibration: str | None = None
    """An audit report (``pofe audit`` output) whose fitted calibration map is applied to every
    label before the filters (ledger: ``p`` calibrated, ``p_raw`` the judge's own); checked
    when the config is parsed."""

    @field_validator("calibration")
    @classmethod
    def _readable_map(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                calibration_map(v)
            except (OSError, ValueError) as e:
                raise ValueError(str(e)) from None
        return v


@functools.lru_cache(maxsize=8)
def calibration_map(report: str) -> dict:
    from pofe.evaluation.calibrate import load_calibration_map

    return load_calibration_map(report)


def judged_p(ann: "Annotation", hygiene: LabelSettings) -> float | None:
    """The annotation's p, calibrated by ``hygiene.calibration`` when set (None stays None)."""
    p = None if ann.judgment is None else ann.judgment.p
    if p is None or hygiene.calibration is None:
        return p
    from pofe.evaluation.calibrate import apply_calibration

    return apply_calibration(p, calibration_map(hygiene.calibration))



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


def prompt_input(p: Prompt):
    return list(p.messages) if p.messages else p.text


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

SKIP_REASONS = ("identical", "unlabelled", "inconsistent", "low_margin", "ties")


def label(ann: Annotation, labels: str, hygiene: LabelSettings | None = None) -> TokenPair | str:
    """The training pair of an annotation, or why it is skipped (in this order): identical
    responses / unlabelled (a judge's p=None: labels are never invented) / inconsistent
    orders and |p - 1/2| < min_margin (only when ``hygiene`` asks) / ties (hard labels)."""
    hygiene = hygiene or LabelSettings()
    if ann.a.text == ann.b.text:
        return "identical"
    if ann.judgment is None or ann.judgment.p is None:
        return "unlabelled"
    if hygiene.drop_inconsistent and ann.judgment.consistent is False:
        return "inconsistent"
    p = float(judged_p(ann, hygiene))
    if below_margin(p, hygiene.min_margin):
        return "low_margin"
    a, b = ann.a, ann.b
    if p < 0.5:  # orient so chosen = the preferred response (the soft losses are symmetric)
        a, b, p = b, a, 1.0 - p
    if labels == "hard":
        if p == 0.5:
            return "ties"
        p = 1.0
    return TokenPair(a.prompt_token_ids, a.token_ids, b.token_ids, p, ann.pair_id)


def below_margin(p: float, min_margin: float) -> bool:
    """|p - 1/2| < min_margin, with a margin of exactly min_margin kept (0.6 - 0.5 is
    0.0999... in floating point)."""
    return abs(float(p) - 0.5) + 1e-9 < min_margin


def zero_counts() -> dict[str, int]:
    return {"annotations": 0, "trained": 0, **{r: 0 for r in SKIP_REASONS}}


def label_annotations(anns: Sequence[Annotation], labels: str, rank: int, hygiene: LabelSettings | None = None,
                      ) -> tuple[list[TokenPair], dict[str, int], list[dict]]:
    """Training pairs, counts per outcome, and one ledger row per annotation."""
    pairs, counts, rows = [], zero_counts(), []
    counts["annotations"] = len(anns)
    for ann in anns:
        out = label(ann, labels, hygiene) if ann.selected else "ranking"
        status = "trained" if isinstance(out, TokenPair) else out
        if isinstance(out, TokenPair):
            pairs.append(out)
        if status in counts:
            counts[status] += 1
        rows.append(annotation_row(pair_id=ann.pair_id, step=ann.step, rank=rank, prompt=ann.prompt, a=ann.a, b=ann.b,
                                   judgment=ann.judgment, status=status, selected=ann.selected))
        if hygiene is not None and hygiene.calibration is not None and ann.judgment is not None:
            rows[-1].update(p=judged_p(ann, hygiene), p_raw=ann.judgment.p, calibration=hygiene.calibration)
    return pairs, counts, rows


# ----------------------------------------------------------------------------- loop state

@dataclass
class LoopState:
    """What one step of a DAP loop needs from its setup (built once by the loop's ``run``)."""

    cfg: Any  # the loop's config (train.batch_size, train.grad_accum, sampling, loss, labels)
    acc: Any
    ddp_policy: Any
    tok: Any
    judge: Any
    judge_ctx: Callable
    cursor: PromptCursor
    buffer: list[list[TokenPair]]
    ledger: JsonlWriter | None
    tok_cache: dict = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return self.cfg.train.batch_size * self.cfg.train.grad_accum


@dataclass
class StepPairs:
    """One step's training pairs, outcome counts, ledger rows, generation sizes and timings."""

    pairs: list[TokenPair]
    counts: dict[str, int]
    rows: list[dict] = field(default_factory=list)  # ledger rows of all processes
    gen: tuple[int, int, int] = (0, 0, 0)  # tokens, characters, samples (this process)
    times: dict[str, float] = field(default_factory=dict)
    slices: list[list[TokenPair]] = field(default_factory=list)  # labelled, not yet in the buffer (see publish)
