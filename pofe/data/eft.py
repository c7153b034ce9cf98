"""Human-ranked responses and the EFT (evaluation fine-tuning) builder.

Self-Rewarding LMs Sec. 3.4 ("Evaluation Fine-Tuning (EFT) data"): for prompts with several
human-ranked responses, the SFT baseline writes a justification and a score for each
response with the LLM-as-a-Judge rubric; an evaluation is accepted "if and only if the
ranking of the produced scores agrees with the human rankings"; then the score
distribution is rebalanced by "discarding some examples that receive the most common score"
(many got a 4). A held-out split of the ranked prompts (541 in the paper) measures the
reward-modelling metrics (:mod:`pofe.evaluation.rm_metrics`).

Ranked files (``load_ranked``), one prompt per row:

* ``{"prompt", "responses": [...], "ranks": [...]}`` -- rank 0 = best, ties allowed; or
  ``"responses"`` alone, already ordered best first;
* any preference row :func:`pofe.data.preferences.load_preferences` reads (prompt/chosen/
  rejected, chat messages, Anthropic HH dialogues) -- a two-response ranking, chosen first.
  HH-RLHF rows whose two replies are identical are skipped and counted.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import Field

from pofe.config import PofeConfig
from pofe.data.io import number, read_located
from pofe.errors import DataError
from pofe.data.preferences import to_pair


@dataclass(frozen=True)
class RankedPrompt:
    """A prompt and its responses with human ranks (0 = best, lower is better)."""

    prompt: str
    responses: tuple[str, ...]
    ranks: tuple[float, ...]
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "prompt": self.prompt, "responses": list(self.responses), "ranks": list(self.ranks)}


def _ranked_from_row(row: Any, where: str) -> RankedPrompt | str:
    if isinstance(row, dict) and "responses" in row:
        resp = row["responses"]
        if not isinstance(row.get("prompt"), str) or not isinstance(resp, list) or not all(isinstance(r, str) for r in resp):
            raise DataError(f"{where}: a ranked row needs 'prompt' (string) and 'responses' (list of strings)")
        ranks = row.get("ranks", list(range(len(resp))))
        if not isinstance(ranks, list) or len(ranks) != len(resp):
            raise DataError(f"{where}: 'ranks' must be a list as long as 'responses' ({len(resp)})")
        ranks = [number(r, where, "ranks") for r in ranks]  # true / null / 1e400: an error, not a rank
        if len(resp) < 2:
            return "fewer-than-2-responses"
        if len(set(ranks)) < 2:
            return "all-ranks-tied"
        rid = row.get("id")
        return RankedPrompt(row["prompt"], tuple(resp), tuple(ranks), str(rid) if rid is not None else where)
    pair = to_pair(row, where)
    if isinstance(pair, str):
        return pair
    if pair.p < 0.5:
        return RankedPrompt(pair.prompt, (pair.rejected, pair.chosen), (0.0, 1.0), where)
    if pair.p == 0.5:
        return "tied-preference"
    return RankedPrompt(pair.prompt, (pair.chosen, pair.rejected), (0.0, 1.0), where)


def load_ranked(source: str | Path, *, limit: int | None = None) -> tuple[list[RankedPrompt], dict[str, int]]:
    """Ranked prompts and the count of skipped rows per reason."""
    rows = read_located(source)
    out = rows.map(_ranked_from_row, limit=limit)
    if not out:
        raise DataError(f"{source}: no usable ranked prompts (skipped: {rows.skipped or 'none'})")
    return out, dict(rows.skipped)


def split_ranked(groups: Sequence[RankedPrompt], eval_fraction: float, *, seed: int = 0,
                 max_eval: int | None = None) -> tuple[list[RankedPrompt], list[RankedPrompt]]:
    """Seeded split by prompt into (EFT-building, held-out RM evaluation); no prompt is in both."""
    order = list(range(len(groups)))
    random.Random(f"eft-split-{seed}").shuffle(order)
    n_eval = int(round(eval_fraction * len(groups)))
    if max_eval is not None:
        n_eval = min(n_eval, max_eval)
    held = set(order[:n_eval])
    return [g for i, g in enumerate(groups) if i not in held], [g for i, g in enumerate(groups) if i in held]


class EFTConfig(PofeConfig):
    """EFT data from human-ranked responses."""

    ranked: str | None = None
    """Ranked file (see :func:`load_ranked`); e.g. ../shared/data/hh-rlhf/helpful-base/test.jsonl.gz."""
    limit: int | None = Field(None, ge=1)
    """Read at most this many ranked prompts."""
    eval_fraction: float = Field(0.25, ge=0.0, le=1.0)
    """Share of ranked prompts held out for the RM metrics (paper: 541 of 2171, ~0.25)."""
    max_eval: int | None = Field(None, ge=0)
    """Cap on held-out prompts (judging is the expensive part)."""
    rebalance_ratio: float | None = Field(1.0, gt=0)
    """Keep at most ``ratio x`` (count of the 2nd most common score) examples of the most
    common score; null disables rebalancing."""


def agrees(scores: Sequence[float], ranks: Sequence[float]) -> bool:
    """True iff every pair the humans ordered is ordered the same way, strictly, by the scores
    ("if humans ranked A higher than B, and the model assigns a higher score to A")."""
    n = len(ranks)
    for i in range(n):
        for j in range(n):
            if ranks[i] < ranks[j] and not scores[i] > scores[j]:
                return False
    return True


def rebalance(examples: list[dict[str, Any]], ratio: float | None, *, seed: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Drop (seeded, at random) examples of the most common score down to
    ``max(1, ceil(ratio * count of the second most common score))``. Returns (kept, dropped)."""
    if ratio is None or not examples:
        return examples, 0
    counts = Counter(e["score"] for e in examples).most_common()
    if len(counts) < 2:
        return examples, 0
    (top, c1), (_, c2) = counts[0], counts[1]
    cap = max(1, math.ceil(ratio * c2))
    if c1 <= cap:
        return examples, 0
    idx = [i for i, e in enumerate(examples) if e["score"] == top]
    drop = set(random.Random(f"eft-rebalance-{seed}").sample(idx, c1 - cap))
    return [e for i, e in enumerate(examples) if i not in drop], len(drop)


def build_eft(
    groups: Sequence[RankedPrompt],
    judge,
    render: Callable[[str, str], str],
    *,
    rebalance_ratio: float | None = 1.0,
    seed: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Judge every response with the rubric, keep the groups whose scores agree with the
    human ranking, and return EFT examples ``{"prompt": judge prompt, "response": the
    judge's own justification + "Score: N", "score", "group"}`` plus counts.

    ``judge``: a pointwise judge whose :class:`~pofe.records.Score` carries the raw generated
    text per sample (``raw``) and the per-sample values (``samples``) -- the rubric judge.
    ``render(prompt, response)``: the judge prompt the model sees (the EFT input).
    The target of each response is its sample whose score is closest to the mean (the first
    such), so the text and the score that passed the agreement check match.
    """
    flat = [(gi, x, y) for gi, g in enumerate(groups) for x, y in [(g.prompt, r) for r in g.responses]]
    scores = judge.score([x for _, x, _ in flat], [y for _, _, y in flat]) if flat else []
    by_group: dict[int, list[Any]] = {}
    for (gi, _, _), s in zip(flat, scores):
        by_group.setdefault(gi, []).append(s)
    stats: dict[str, Any] = {"groups": len(groups), "responses": len(flat), "groups_unscored": 0,
                             "groups_disagree": 0, "groups_kept": 0}
    examples: list[dict[str, Any]] = []
    for gi, g in enumerate(groups):
        ss = by_group.get(gi, [])
        if any(s.score is None for s in ss):
            stats["groups_unscored"] += 1
            continue
        if not agrees([s.score for s in ss], g.ranks):
            stats["groups_disagree"] += 1
            continue
        stats["groups_kept"] += 1
        for y, s in zip(g.responses, ss):
            vals = list(s.samples) if s.samples else [s.score]
            k = min((i for i, v in enumerate(vals) if v is not None), key=lambda i: abs(vals[i] - s.score))
            raw = s.raw[k] if s.raw else ""
            if not raw.strip():  # a judge that reads probabilities writes no justification
                stats["responses_without_text"] = stats.get("responses_without_text", 0) + 1
                continue
            examples.append({"prompt": render(g.prompt, y), "response": raw.strip(), "score": vals[k],
                             "group": g.id, "judge_id": s.judge_id, "template_hash": s.template_hash})
    stats["examples_before_rebalance"] = len(examples)
    examples, dropped = rebalance(examples, rebalance_ratio, seed=seed)
    stats["rebalance_dropped"] = dropped
    stats["examples"] = len(examples)
    stats["score_counts"] = {str(k): v for k, v in sorted(Counter(e["score"] for e in examples).items())}
    return examples, stats


def rubric_renderer(judge) -> Callable[[str, str], str]:
    """The EFT input of a (prompt, response): the judge prompt exactly as the rubric judge
    renders it, so M1 is fine-tuned on the very prompt it will later judge with."""
    tmpl = getattr(judge, "template", None)
    if tmpl is None:
        raise ValueError("EFT data needs an LLM rubric judge (judge.kind: rubric); "
                         f"got {getattr(judge, 'id', judge)!r}")
    specials = getattr(getattr(judge, "backend", None), "special_strings", ())

    def render(prompt: str, response: str) -> str:
        return tmpl.render({"prompt": prompt, "response": response}, special_strings=specials).user
    return render


def write_eft_files(data_dir: Path, build: Sequence[RankedPrompt], held_out: Sequence[RankedPrompt], judge, *,
                    rebalance_ratio: float | None, seed: int = 0) -> None:
    """EFT data written by ``judge`` (the rubric rendered as it judges) on the ``build`` split
    -> ``eft_train.jsonl`` and ``eft_stats.json``; the held-out split -> ``rm_eval.jsonl``."""
    import json

    from pofe.jsonl import json_lines
    from pofe.runs import atomic_write_text

    rows, stats = build_eft(build, judge, rubric_renderer(judge), rebalance_ratio=rebalance_ratio, seed=seed)

    def jsonl(rs) -> str:
        return json_lines(rs)
    atomic_write_text(Path(data_dir) / "rm_eval.jsonl", jsonl(g.to_dict() for g in held_out))
    atomic_write_text(Path(data_dir) / "eft_stats.json", json.dumps(stats, indent=2, default=str))
    atomic_write_text(Path(data_dir) / "eft_train.jsonl", jsonl(rows))
