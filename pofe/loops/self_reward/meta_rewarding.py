"""Meta-Rewarding (Wu et al. 2024, "Meta-Rewarding Language Models", arXiv 2407.19594) in
``pofe self-reward`` (``meta_judge.enabled``, off by default).

The model M_{t-1} plays three roles in iteration t (pofe's numbering: iteration t samples and
judges with M_{t-1}, see :mod:`pofe.loops.self_reward.self_reward_variants`):

* **actor** -- the N candidates per prompt of :mod:`pofe.generation.candidates`, scored by
  ``judge``. Their pairs are **length-controlled** (Sec. 2.3): with S_max / S_min the best and
  worst scores of a prompt, the candidates scoring at least ``S_max - rho (S_max - S_min)``
  form the top tier and the *shortest* of them (tokens) is the chosen; the rejected is the
  worst-scored (the longest among equal worst). ``rho = 0`` is the plain best-vs-worst rule;
  a larger ``rho`` trades score for brevity against the judge's length bias.
* **judge** -- ``meta_judge.judge`` (the additive rubric, sampled) writes K judgments of every
  candidate, each ending in "Score: N" (``data/judgments.jsonl``). A judgment without a
  readable score is counted and never used.
* **meta-judge** -- for each prompt, the candidate whose K judgment scores vary most (the
  judge is least sure of it, Sec. 2.2) has every pair of its scored judgments compared by
  ``meta_judge.meta`` (a pairwise judge; the ``meta-judge`` template), both orders
  (``data/meta_judgments.jsonl``). The paper fits Elo ratings to the matchups (Sec. 2.2);
  pofe ranks by the mean win score ``w_m`` = mean over m's read comparisons of
  P(m better) (position-debiased over both orders). Every pair of judgments is compared
  once, so the tournament is a balanced round robin, where the Bradley-Terry / Elo maximum
  likelihood ratings order the players exactly as their total wins (Zermelo 1929: the
  likelihood equations set each player's expected wins equal to its observed wins, and the
  expected wins increase with the rating); the best and worst by ``w`` are the best and
  worst by Elo, without an iterative fit. An unreadable comparison (``p`` None) is counted
  in ``meta_unreadable`` and dropped, never scored.
  The **judge pair** is chosen = the highest-``w`` judgment (the shorter among equal),
  rejected = the lowest-``w`` (the longer among equal); as in the paper, a pair whose two
  judgments give the same score is dropped (``same_score``): they agree on the verdict and
  DPO would learn only their wording. Its prompt is the judge prompt the judgments answered
  (the rendered rubric), so DPO trains the judge role on it.

DPO trains on actor pairs and judge pairs together (``role: actor`` / ``role: judge`` in
``data/aift.jsonl``); the iteration's record holds the counts (``meta_judge``).

Stages keep the rule of :mod:`pofe.loops.self_reward.self_reward_stages`: each output is a file under
``iter_t/data/`` skipped when present, work is split by prompt block (``dp.map``) and only
rank 0 writes.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import Field, field_validator

from pofe.config import PofeConfig
from pofe.judges.base import Capability, require_capability
from pofe.judges.config import JudgeConfig, LLMJudgeConfig, RubricJudgeConfig
from pofe.judges.pointwise import parse_rubric_score
from pofe.runs import read_jsonl
from pofe.runtime.guards import fault_point
from pofe.runtime.parallel import DataParallel
from pofe.loops.self_reward.stages import write_jsonl
from pofe.stats import mean

ONE = DataParallel()


class MetaJudgeSettings(PofeConfig):
    """Meta-Rewarding (Wu et al. 2024): the model also judges its own judgments."""

    enabled: bool = False
    """Add judge pairs (meta-judged judgments) to every iteration's DPO and length-control the actor pairs."""
    judge: JudgeConfig = RubricJudgeConfig()
    """The judge role writing judgments (kind rubric, the additive rubric, sampled: justification + "Score: N"); its
    ``rubric.samples`` is K, the judgments per candidate (at least 2). Runs on M_{t-1} with ``judge_model: self``."""
    meta: JudgeConfig = LLMJudgeConfig(template="meta-judge")
    """The meta-judge role: a pairwise judge comparing two judgments of one response (both orders);
    runs on M_{t-1} with ``judge_model: self``."""
    length_control: float = Field(0.25, ge=0, lt=1)
    """rho of the actor pairs' length control (Sec. 2.3): the chosen is the shortest candidate scoring at
    least S_max - rho (S_max - S_min); the rejected is the worst-scored (the longest among equal worst).
    0 = best vs worst."""

    @field_validator("judge", mode="before")
    @classmethod
    def _rubric_by_default(cls, v):
        return {"kind": "rubric", **v} if isinstance(v, dict) and "kind" not in v else v  # the one kind it can be

    @field_validator("judge")
    @classmethod
    def _k_judgments(cls, v):
        if not isinstance(v, RubricJudgeConfig):  # the judgments are rubric texts with a score the meta-judge compares
            raise ValueError(f"meta_judge.judge must be kind rubric (it writes scored judgments), not {v.kind!r}")
        if v.rubric.samples < 2:
            raise ValueError("meta_judge.judge.rubric.samples is K, the judgments per candidate: need at least 2 to compare")
        if getattr(v, "budget", None) is not None:
            raise ValueError("meta_judge.judge.budget is not read by pofe self-reward; remove it")
        return v

    @field_validator("meta")
    @classmethod
    def _meta_pairwise(cls, v):
        require_capability(v, Capability.PAIRWISE, where="meta_judge.meta (it compares two judgments)")
        if getattr(v, "budget", None) is not None:
            raise ValueError("meta_judge.meta.budget is not read by pofe self-reward; remove it")
        return v


# ============================================================================ actor pairs

def length_controlled_pair(prompt: str, responses: Sequence[str], scores: Sequence[float | None],
                           lengths: Sequence[int], rho: float) -> tuple[dict | None, str]:
    """The length-controlled actor pair of one prompt (module docstring), or why there is none:
    ``fewer_than_2_scored``, ``tie`` (all scored candidates equal), ``identical_text``."""
    scored = [(i, s) for i, s in enumerate(scores) if s is not None]
    if len(scored) < 2:
        return None, "fewer_than_2_scored"
    hi, lo = max(s for _, s in scored), min(s for _, s in scored)
    if hi == lo:
        return None, "tie"
    floor = hi - rho * (hi - lo)
    # shortest of the top tier; among equal lengths the higher score, then the first
    c = min((i for i, s in scored if s >= floor), key=lambda i: (lengths[i], -scores[i], i))
    # the worst-scored; among equal worst the longest, then the first
    r = min((i for i, s in scored if s == lo), key=lambda i: (-lengths[i], i))
    if responses[c] == responses[r]:
        return None, "identical_text"
    return {"prompt": prompt, "chosen": responses[c], "rejected": responses[r], "p": 1.0, "role": "actor",
            "chosen_score": scores[c], "rejected_score": lo, "chosen_index": c, "rejected_index": r,
            "chosen_length": lengths[c], "rejected_length": lengths[r]}, "kept"


def length_controlled_pairs(rows: Sequence[dict], rho: float) -> tuple[list[dict], dict[str, int]]:
    """Actor pairs of every candidate row (lengths: the rows' generated ``tokens``, else characters)."""
    counts = {"prompts": len(rows), "kept": 0, "tie": 0, "fewer_than_2_scored": 0, "identical_text": 0}
    pairs = []
    for row in rows:
        lengths = row.get("tokens") or [len(y) for y in row["responses"]]
        pair, why = length_controlled_pair(row["prompt"], row["responses"], row["scores"], lengths, rho)
        counts[why] += 1
        if pair is not None:
            pair["provenance"] = {"judge_id": row.get("judge_id"), "prompt_index": row.get("index")}
            pairs.append(pair)
    return pairs, counts


# ============================================================================ judge pairs

def most_uncertain(scores: Sequence[Sequence[float | None]]) -> int | None:
    """The response whose judgment scores vary most (population variance over its scored
    judgments; the first among equal), among those with at least two; None when there is none."""
    var = [(statistics.pvariance([s for s in ss if s is not None]), i) for i, ss in enumerate(scores)
           if sum(s is not None for s in ss) >= 2]
    return max(var, key=lambda v: (v[0], -v[1]))[1] if var else None


def win_scores(k: int, comparisons: Sequence[Sequence]) -> list[float | None]:
    """Mean win score of each of ``k`` judgments over the read comparisons ``(m, n, p)`` with
    ``p`` = P(m better than n); None for a judgment with no read comparison."""
    got: list[list[float]] = [[] for _ in range(k)]
    for m, n, p in comparisons:
        if p is not None:
            got[m].append(p)
            got[n].append(1.0 - p)
    return [sum(g) / len(g) if g else None for g in got]


def judge_pair(judge_prompt: str, texts: Sequence[str], scores: Sequence[float | None],
               comparisons: Sequence[Sequence]) -> tuple[dict | None, str]:
    """The judge pair of one response's judgments (module docstring), or why there is none:
    ``unreadable`` (fewer than two judgments with a read comparison), ``tied_wins`` (every
    judgment wins as often), ``same_score`` (best and worst give the same score: dropped as in
    the paper), ``identical_text``."""
    w = win_scores(len(texts), comparisons)
    ranked = [i for i, x in enumerate(w) if x is not None and scores[i] is not None]
    if len(ranked) < 2:
        return None, "unreadable"
    c = min(ranked, key=lambda i: (-w[i], len(texts[i]), i))
    r = min(ranked, key=lambda i: (w[i], -len(texts[i]), i))
    if w[c] == w[r]:
        return None, "tied_wins"
    if scores[c] == scores[r]:
        return None, "same_score"
    if texts[c] == texts[r]:
        return None, "identical_text"
    return {"prompt": judge_prompt, "chosen": texts[c], "rejected": texts[r], "p": 1.0, "role": "judge",
            "chosen_score": scores[c], "rejected_score": scores[r], "chosen_win": w[c], "rejected_win": w[r],
            "chosen_index": c, "rejected_index": r}, "kept"


def meta_context(prompt: str, response: str) -> str:
    """What the meta-judge's ``{prompt}`` slot holds: the request and the judged reply."""
    return f"Request:\n{prompt}\n\nReply:\n{response}"


# ============================================================================ stages

def judge_prompt_of(writer, prompt: str, response: str) -> str:
    """The judge prompt ``writer`` (a rubric judge) rendered for (prompt, response): the prompt a
    judge pair trains on (the response cut as the judge cut it)."""
    cut = writer.max_response_chars
    y = response[:cut] + " [...]" if cut and len(response) > cut else response
    specials = getattr(getattr(writer, "backend", None), "special_strings", ())
    return writer.template.render({"prompt": prompt, "response": y}, special_strings=specials).user


def judgments_stage(path: Path, rows: Sequence[dict], writer, dp: DataParallel = ONE) -> list[dict]:
    """K judgments of every candidate by ``writer`` (``score().raw`` the texts, ``.samples`` their
    scores; with a template whose answer starts with a prefix, e.g. "Score: ", the judgment is
    prefix + text and its score is read from that, as :func:`pofe.judges.pointwise.parse_rubric_score`
    reads a generated text), one row per prompt; read back from ``path`` when there, else made (each process its
    block of prompts) and written by rank 0."""
    if dp.from_main(path.exists()):
        return dp.from_main(read_jsonl(path) if dp.main else None)

    prefix = writer.template.answer_prefix  # a template may start the answer ("Score: "): part of the judgment

    def judgment(s) -> tuple[list[str], list]:
        if not prefix:
            return list(s.raw), list(s.samples)
        texts = [prefix + t for t in s.raw]
        return texts, [parse_rubric_score(t, writer.lo, writer.hi) for t in texts]

    def block(mine: list[dict]) -> list[dict]:
        flat = [(r["prompt"], y) for r in mine for y in r["responses"]]
        got = [judgment(s) for s in writer.score([x for x, _ in flat], [y for _, y in flat])] if flat else []
        out, k = [], 0
        for r in mine:
            n = len(r["responses"])
            out.append({"index": r.get("index"), "prompt": r["prompt"], "texts": [t for t, _ in got[k:k + n]],
                        "scores": [v for _, v in got[k:k + n]], "judge_id": getattr(writer, "id", None)})
            k += n
        return out

    out = dp.map(block, list(rows))
    if dp.main:
        write_jsonl(path, out)
    dp.wait()
    return out


def meta_stage(path: Path, rows: Sequence[dict], jrows: Sequence[dict], meta, dp: DataParallel = ONE) -> list[dict]:
    """The meta-judge's comparisons of the most uncertain candidate's scored judgments, every
    pair (m < n) once, both orders inside the pairwise judge; one row per prompt
    ``{index, response_index, comparisons: [[m, n, p], ...]}`` (``p`` None = unreadable).
    Read back from ``path`` when there, else made (each process its block) and written by rank 0."""
    if dp.from_main(path.exists()):
        return dp.from_main(read_jsonl(path) if dp.main else None)

    def block(idx: list[int]) -> list[dict]:
        plan = []
        for i in idx:
            r = most_uncertain(jrows[i]["scores"])
            ms = [] if r is None else [m for m, s in enumerate(jrows[i]["scores"][r]) if s is not None]
            plan.append((i, r, [(m, n) for a, m in enumerate(ms) for n in ms[a + 1:]]))
        items = [(i, r, m, n) for i, r, mn in plan for m, n in mn]
        verdicts = meta.judge([meta_context(rows[i]["prompt"], rows[i]["responses"][r]) for i, r, _, _ in items],
                              [jrows[i]["texts"][r][m] for i, r, m, _ in items],
                              [jrows[i]["texts"][r][n] for i, r, _, n in items]) if items else []
        it = iter(verdicts)
        return [{"index": rows[i].get("index"), "response_index": r,
                 "comparisons": [[m, n, next(it).p] for m, n in mn]} for i, r, mn in plan]

    out = dp.map(block, list(range(len(rows))))
    if dp.main:
        write_jsonl(path, out)
    dp.wait()
    return out


def judge_pairs(rows: Sequence[dict], jrows: Sequence[dict], mrows: Sequence[dict],
                judge_prompt: Callable[[str, str], str]) -> tuple[list[dict], dict[str, Any]]:
    """Judge pairs of every prompt and the meta-judge's counts."""
    counts: dict[str, Any] = {"kept": 0, "no_judged_response": 0, "unreadable": 0, "tied_wins": 0, "same_score": 0,
                              "identical_text": 0}
    pairs = []
    for row, j, m in zip(rows, jrows, mrows, strict=True):
        r = m["response_index"]
        if r is None:
            counts["no_judged_response"] += 1
            continue
        pair, why = judge_pair(judge_prompt(row["prompt"], row["responses"][r]), j["texts"][r], j["scores"][r],
                               m["comparisons"])
        counts[why] += 1
        if pair is not None:
            pair["provenance"] = {"judge_id": j.get("judge_id"), "prompt_index": row.get("index"), "response_index": r}
            pairs.append(pair)
    return pairs, counts


def meta_rewarding_pairs(cfg: MetaJudgeSettings, rows: Sequence[dict], it_dir: Path, roles: Callable[[], tuple],
                         t: int, dp: DataParallel = ONE) -> tuple[list[dict], dict[str, int], dict[str, Any]]:
    """Step 4 with Meta-Rewarding: length-controlled actor pairs + judge pairs, the actor's
    counts, and the ``meta_judge`` record. ``roles()`` gives (judgment writer, meta-judge)."""
    actor, counts = length_controlled_pairs(rows, cfg.length_control)
    writer, meta = roles()
    data = it_dir / "data"
    jrows = judgments_stage(data / "judgments.jsonl", rows, writer, dp)
    fault_point(f"sr{t}:after_judgments")
    mrows = meta_stage(data / "meta_judgments.jsonl", rows, jrows, meta, dp)
    judges, jcounts = judge_pairs(rows, jrows, mrows, lambda x, y: judge_prompt_of(writer, x, y))
    all_j = [s for j in jrows for ss in j["scores"] for s in ss]
    comps = [c for m in mrows for c in m["comparisons"]]
    info = {"actor_pairs": len(actor), "judge_pairs": len(judges), "length_control": cfg.length_control,
            "judgments": len(all_j), "judgments_unscored": sum(s is None for s in all_j),
            "meta_judgments": len(comps), "meta_unreadable": sum(c[2] is None for c in comps),
            "judge_pair_counts": jcounts,
            "length_mean": {"chosen": mean([p["chosen_length"] for p in actor]),
                            "rejected": mean([p["rejected_length"] for p in actor])}}
    return actor + judges, counts, info


