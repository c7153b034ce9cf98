"""``pofe eval``: head-to-head win rates of two policies under a judge, with length control;
a pairwise matrix and Bradley-Terry ratings for 3+ policies; MT-Bench-style two-turn
evaluation.

Counting is :mod:`pofe.evaluation.winrate` (the one tie rule every command uses: both
orders must agree for a win, otherwise a tie; ``(W + T/2)/N`` with a Wilson interval).
Reported for two policies: W/T/L, win rate, tie-adjusted win rate, mean lengths, the
tie-adjusted rate by length bucket of A's responses (OAIF Fig. 4b groups responses by length
to show quality at fixed length), AlpacaEval 2's length-controlled win rate with the
instruction-difficulty term (``lc_win_rate``), and pofe's earlier simplified LC
(``lc_win_rate_simple``). Lengths are characters by default, as in AlpacaEval.

Three or more policies (``policies: [a, b, c, ...]``, OAIF's 4-way comparison): every pair
is judged on the same prompts; the result is the pairwise win matrix and Bradley-Terry
ratings with bootstrap intervals over prompts.

Two-turn evaluation (MT-Bench, Zheng et al. 2023): when the prompt file is FastChat's
``question.jsonl`` (rows with ``turns``), each policy answers turn 1, then is asked turn 2
after *its own* first answer; the judge compares the second answers with both transcripts
in view (FastChat's ``pair-v2-multi-turn``), and both turns are counted.

Data parallel (``torchrun --nproc_per_node N``): each process generates its block of the
prompts and judges its block of the pairs (:meth:`~pofe.runtime.parallel.DataParallel.map`);
every process counts the gathered outcomes (in input order, so the result is the one-process
run's; sampled responses depend on N, see :func:`~pofe.runtime.seeds.block_seed`) and rank 0
writes ``output``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import Field

from pofe.config import ConfigError, PofeConfig, Seed
from pofe.evaluation.winrate import (
    compare_policies, count_outcomes, length_controlled_win_rate, length_controlled_win_rate_simple, outcome_value,
)
from pofe.generation import SamplingConfig
from pofe.judges.config import JudgeConfig, LLMJudgeConfig
from pofe.runtime import DeviceConfig
from pofe.runtime.parallel import DataParallel, launched
from pofe.runtime.seeds import block_seed

log = logging.getLogger(__name__)

__all__ = ["EvalConfig", "EvalDataConfig", "run_eval", "summarise_outcomes"]


# --------------------------------------------------------------------------- pure statistics


def length_buckets(outcomes: np.ndarray, len_a: np.ndarray, n_buckets: int = 4) -> list[dict[str, Any]]:
    """Tie-adjusted win rate of A grouped by the length of A's response (quantile buckets),
    each with its Wilson interval."""
    if len(outcomes) == 0:
        return []
    edges = np.unique(np.quantile(len_a, np.linspace(0, 1, n_buckets + 1)))
    if len(edges) < 2:
        edges = np.array([len_a.min(), len_a.max()])
    idx = np.clip(np.searchsorted(edges, len_a, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for k in range(len(edges) - 1):
        m = idx == k
        if not m.any():
            continue
        c = count_outcomes(list(outcomes[m]))
        rows.append({"lo": float(edges[k]), "hi": float(edges[k + 1]), "n": c["n"], "wins": c["wins"],
                     "ties": c["ties"], "losses": c["losses"], "win_rate_adjusted": c["win_rate_adjusted"],
                     "win_rate_adjusted_ci95": c["win_rate_adjusted_ci95"]})
    return rows


def summarise_outcomes(
    outcomes: Sequence[int | None],
    len_a: Sequence[float],
    len_b: Sequence[float],
    *,
    instructions: Sequence[Any] | None = None,
    n_buckets: int = 4,
) -> dict[str, Any]:
    """All of ``pofe eval``'s statistics from per-pair outcomes and response lengths.

    ``instructions`` (one key per outcome) groups rows of the same instruction for the LC
    difficulty term (MT-Bench's two turns); default one instruction per row."""
    keep = [i for i, o in enumerate(outcomes) if o is not None]
    o = np.array([outcomes[i] for i in keep], dtype=int)
    la = np.array([len_a[i] for i in keep], dtype=float)
    lb = np.array([len_b[i] for i in keep], dtype=float)
    n = len(o)
    out: dict[str, Any] = count_outcomes(list(outcomes))
    out["mean_len_a"] = float(la.mean()) if n else None
    out["mean_len_b"] = float(lb.mean()) if n else None
    y = np.array([outcome_value(int(v)) for v in o])
    out["by_length_bucket"] = length_buckets(o, la, n_buckets)
    keys = None if instructions is None else [instructions[i] for i in keep]
    out.update(length_controlled_win_rate(y, la - lb, keys))
    out.update(length_controlled_win_rate_simple(y, la - lb))
    return out


# --------------------------------------------------------------------------- inputs


class EvalDataConfig(PofeConfig):
    """The prompts compared on."""

    prompts: str | None = None
    """Prompt file (.txt one per line, .jsonl/.json with prompt/instruction/input/text, or FastChat
    MT-Bench question.jsonl with ``turns`` for two-turn evaluation); default: the prompts of a responses file."""
    max_prompts: int | None = Field(None, ge=1)
    """Use only the first N prompts (MT-Bench: the first N questions, both turns each); None = all.
    The cut is reported in the result's ``prompts`` (``available``, ``used``, ``limited``)."""


class EvalConfig(PofeConfig):
    """``pofe eval``: policy A against policy B (or 3+ policies against each other) on a prompt set."""

    policy_a: str | None = None
    """Model name/path, a run folder, or a JSONL file of {prompt, response}."""
    policy_b: str | None = None
    """The baseline: model name/path, run folder or responses file."""
    policies: list[str] = []
    """Three or more policies to compare pairwise (win matrix + Bradley-Terry ratings; the
    first is the rating reference). Use instead of policy_a/policy_b."""
    data: EvalDataConfig = EvalDataConfig()
    """The prompts compared on (``data.prompts``, ``data.max_prompts``)."""
    judge: JudgeConfig = LLMJudgeConfig()
    model: DeviceConfig = DeviceConfig()
    """Device and dtype of the policies generated here (``model.device``: auto|cpu|cuda|mps)."""
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.7)
    length_unit: Literal["chars", "words"] = "chars"
    n_buckets: int = Field(4, ge=1)
    n_boot: int = Field(200, ge=1)
    """Bootstrap resamples of the Bradley-Terry intervals (3+ policies)."""
    seed: Seed = 0
    refusal: bool = True
    """Report each policy's refusal rate on these prompts (phrase-pattern detector of
    pofe.evaluation.refusal): on benign prompts (e.g. XSTest safe) it measures over-refusal."""
    output: str | None = None
    """Write per-pair rows (prompt, responses, p_ab, p_ba, outcome) to this JSONL file."""


_RESPONSE_KEYS = ("response", "output", "completion", "answer", "generated")


def load_prompts(path: str | Path) -> list[str]:
    """Prompts from any source the data layer reads (:mod:`pofe.data.prompts`); a chat
    prompt is its transcript, so two policies answer (and the judge reads) every turn."""
    from pofe.data.prompts import load_prompt_texts

    return load_prompt_texts(path)


def load_responses(path: str | Path) -> dict[str, str]:
    """prompt -> response from a file of {prompt, response} rows (alpaca_eval outputs'
    ``instruction``/``output`` too), read by the data layer; errors name the row."""
    from pofe.data.io import read_located
    from pofe.errors import DataError
    from pofe.data.prompts import to_prompt

    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for where, r in read_located(path):
        key = next((k for k in _RESPONSE_KEYS if k in r), None)
        if key is None or not isinstance(r[key], str):
            raise DataError(f"{where}: no response field (looked for {', '.join(_RESPONSE_KEYS)}); fields: {sorted(r)}")
        prompt = to_prompt({k: v for k, v in r.items() if k != key}, where).text
        if prompt in seen:
            # A win rate counts each prompt once; which of two answers is "the" response is
            # not ours to pick (a dict kept the last one without a word).
            raise DataError(f"{where}: prompt {_short(prompt)} again (first at {seen[prompt]}); a responses file "
                            "gives one response per prompt")
        seen[prompt] = where
        out[prompt] = r[key]
    return out


def _short(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def is_responses_file(spec: str) -> bool:
    """A responses table (a data file or a ``save_to_disk`` folder), not a model or run folder."""
    from pofe.data.io import FILE_SUFFIXES

    p = Path(spec)
    name = p.name[:-3] if p.name.endswith(".gz") else p.name
    if p.is_dir():
        return (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()
    return p.is_file() and name.endswith(FILE_SUFFIXES) and not name.endswith(".txt")


def resolve_policy_model(spec: str) -> str:
    """A model name/path for ``load_model``: a run folder resolves to its saved policy.

    Run folders of pofe's loops hold the policy in a model directory (one with a
    ``config.json``); the newest of ``final``/``model``/``policy``/``checkpoint*``/``step*``
    /``iter_*`` is taken.
    """
    p = Path(spec)
    if not p.is_dir() or (p / "config.json").exists():
        return spec
    cands = [d for d in p.rglob("config.json") if d.parent != p]
    if not cands:
        raise ValueError(f"{spec}: a folder with no saved model in it (no config.json below it)")
    preferred = [d for d in cands if d.parent.name in ("final", "model", "policy")]
    best = max(preferred or cands, key=lambda d: d.stat().st_mtime)
    return str(best.parent)


_MODELS: dict[str, Any] = {}  # the last loaded policy, kept for the second MT-Bench turn


def _generate(spec: str, prompts: list, cfg: EvalConfig) -> list[str]:
    from pofe.generation import generate
    from pofe.models import load_model

    if spec not in _MODELS:
        _MODELS.clear()  # one policy in memory at a time
        _MODELS[spec] = load_model(resolve_policy_model(spec), dtype=cfg.model.dtype, device=cfg.model.device)
    model, tok = _MODELS[spec]
    outs = generate(model, tok, prompts, n=1, sampling=cfg.sampling, seed=cfg.seed)
    return [o[0].text for o in outs]


def _sharded(generator, dp: DataParallel):
    """``generator`` (``(spec, prompts, cfg) -> responses``) over this process's block of the
    prompts, under the block's seed, every block's responses gathered in input order."""
    gen = generator or _generate

    def run(spec: str, prompts: list, cfg: EvalConfig) -> list[str]:
        own = cfg if dp.rank == 0 else cfg.model_copy(update={"seed": block_seed(cfg.seed, dp.rank)})
        return dp.map(lambda part: gen(spec, part, own), prompts)

    return run


def _length(text: str, unit: str) -> int:
    return len(text.split()) if unit == "words" else len(text)


def policy_specs(cfg: EvalConfig) -> list[str]:
    """The policies to compare: [policy_a, policy_b] or ``policies`` (3+), never both."""
    if cfg.policies:
        if cfg.policy_a or cfg.policy_b:
            raise ValueError("eval: give either policy_a/policy_b or policies, not both")
        if len(cfg.policies) < 2 or len(set(cfg.policies)) != len(cfg.policies):
            raise ValueError(f"eval: policies needs at least two distinct entries, got {cfg.policies}")
        return list(cfg.policies)
    if not cfg.policy_a or not cfg.policy_b:
        raise ValueError("eval needs two policies: policy_a and policy_b (or policies: [a, b, c, ...])")
    return [cfg.policy_a, cfg.policy_b]


def collect_responses(cfg: EvalConfig, generator=None) -> tuple[list[str], list[list[str]]]:
    """(prompts, one response list per policy): read from files where given, else generated.

    ``generator(spec, prompts, cfg) -> list[str]`` replaces model generation in tests.
    """
    prompts, sides, _ = collect_counted(cfg, generator)
    return prompts, sides


def collect_counted(cfg: EvalConfig, generator=None) -> tuple[list[str], list[list[str]], dict[str, int]]:
    """:func:`collect_responses` plus how many prompts there were and how many ``data.max_prompts`` left
    out (``{available, used, limited}``, reported as the result's ``prompts``).

    Every responses file must answer exactly the prompts compared (the prompt file's, else
    the first file's): a missing or extra prompt is an error naming the count and the side,
    and a prompt given twice is an error naming it -- a win rate counts each prompt once."""
    specs = policy_specs(cfg)
    gen = generator or _generate
    files = {s: load_responses(s) for s in specs if is_responses_file(s)}
    if cfg.data.prompts:
        prompts = load_prompts(cfg.data.prompts)
        first_at: dict[str, int] = {}
        for i, p in enumerate(prompts, 1):
            if p in first_at:  # a win rate counts each prompt once: a repeated one would weigh double
                raise ValueError(f"{cfg.data.prompts}: prompt {_short(p)} is given twice (prompts {first_at[p]} and "
                                 f"{i}); a win rate counts each prompt once")
            first_at[p] = i
        source = f"the prompt file {cfg.data.prompts}"
    elif files:
        source_spec = next(iter(files))
        prompts = list(files[source_spec])
        source = f"{source_spec}"
    else:
        raise ValueError("eval: give a prompt file (--prompts / data.prompts=...) when no policy is a responses file")
    # Both sides must answer the same prompts: comparing on the overlap silently changes
    # what the win rate is over (4 of 10 prompts once went by without a word).
    wanted = set(prompts)
    for spec, table in files.items():
        missing = [p for p in prompts if p not in table]
        if missing:
            raise ValueError(f"{spec}: no response for {len(missing)} of the {len(prompts)} prompts of {source} "
                             f"(first: {_short(missing[0])}); give both sides the same prompts, or --prompts to "
                             "compare on a chosen set")
        extra = [p for p in table if p not in wanted] if not cfg.data.prompts else []
        if extra:
            raise ValueError(f"{spec}: {len(extra)} prompts that {source} has no response for (first: "
                             f"{_short(extra[0])}); give both sides the same prompts, or --prompts to compare on "
                             "a chosen set")
    available = len(prompts)
    if cfg.data.max_prompts is not None:
        prompts = prompts[: cfg.data.max_prompts]
        if len(prompts) < available:
            log.info("eval: data.max_prompts=%d compares the first %d of %d prompts", cfg.data.max_prompts,
                     len(prompts), available)
    if not prompts:  # name the file that gave none (an empty responses or prompt file)
        raise ValueError(f"{source}: no prompts to compare on (an empty file?)")
    counts = {"available": available, "used": len(prompts), "limited": available - len(prompts)}
    sides = [[files[spec][p] for p in prompts] if spec in files else gen(spec, prompts, cfg) for spec in specs]
    return prompts, sides, counts


# --------------------------------------------------------------------------- two turns (MT-Bench)


def load_turns(source: str | Path) -> list[dict[str, Any]] | None:
    """FastChat ``question.jsonl`` rows ``{question_id, category, turns: [t1, t2]}`` (a file or
    the ``mt-bench`` adapter, read by the data layer), or None when the source is not one (no
    ``turns`` in its first row)."""
    from pofe.data.io import read_located
    from pofe.errors import DataError

    rows = read_located(source).items
    if not rows or "turns" not in rows[0][1]:
        return None
    out = []
    for k, (where, r) in enumerate(rows, 1):
        t = r.get("turns")
        if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
            raise DataError(f"{where}: 'turns' must be a non-empty list of strings")
        out.append({"id": r.get("question_id", k), "category": r.get("category"), "turns": t[:2]})
    return out


def _generate_turns(spec: str, questions: list[dict[str, Any]], cfg: EvalConfig, generator=None) -> list[list[str]]:
    """Each question's answers, turn by turn: turn 2 is asked after the policy's *own* turn-1
    answer (the conversation so far is the prompt, as MT-Bench's ``gen_model_answer``)."""
    gen = generator or _generate
    convs: list[list[dict[str, str]]] = [[] for _ in questions]
    answers: list[list[str]] = [[] for _ in questions]
    for turn in range(max(len(q["turns"]) for q in questions)):
        idx = [i for i, q in enumerate(questions) if len(q["turns"]) > turn]
        for i in idx:
            convs[i].append({"role": "user", "content": questions[i]["turns"][turn]})
        outs = gen(spec, [list(convs[i]) for i in idx], cfg)
        for i, o in zip(idx, outs):
            convs[i].append({"role": "assistant", "content": o})
            answers[i].append(o)
    return answers


def _turn_pair(q: dict[str, Any], turn: int, ans_a: list[str], ans_b: list[str]) -> tuple[str, str, str]:
    """(judge prompt, A, B) for one turn. Turn 2 shows each policy's own transcript and asks
    about the follow-up (FastChat ``pair-v2-multi-turn``: focus on the second answer)."""
    if turn == 0:
        return q["turns"][0], ans_a[0], ans_b[0]
    prompt = (f"First question: {q['turns'][0]}\nFollow-up question: {q['turns'][1]}\n"
              "Judge which assistant answers the follow-up question better, given its own first answer.")

    def transcript(a):
        return f"[Answer to the first question]\n{a[0]}\n\n[Answer to the follow-up question]\n{a[1]}"

    return prompt, transcript(ans_a), transcript(ans_b)


# --------------------------------------------------------------------------- running


def _judge_outcomes(judge, prompts, ra, rb, dp: DataParallel = DataParallel()):
    """(p_ab, p_ba) and the outcome of every pair, in input order; each process judges its block."""
    from pofe.evaluation.winrate import head_to_head

    rows = dp.map(lambda part: head_to_head(judge, *zip(*part))["pairs"], list(zip(prompts, ra, rb)))
    return [(r["p_ab"], r["p_ba"]) for r in rows], [r["outcome"] for r in rows]


def _write_rows(path: str | None, rows, dp: DataParallel) -> None:
    """The per-pair rows to ``output`` (rank 0 alone: one file whatever the processes)."""
    if not path or not dp.main:
        return
    from pofe.runs import JsonlWriter

    Path(path).unlink(missing_ok=True)
    with JsonlWriter(path) as w:
        for r in rows:
            w.write(r)


def _build_judge(cfg: EvalConfig, judge, built: list | None = None):
    if judge is None:
        from pofe.judges.registry import build_judge

        judge = build_judge(cfg.judge)
    if built is not None:
        built.append(judge)  # its usage goes into the result
    return judge


def guard_eval_output(cfg: EvalConfig, specs: list[str]) -> None:
    """``-o`` must never land on what eval reads: the prompt file, a responses file, a policy's
    saved model (a run folder stands for the model folder it resolves to, so ``-o`` may sit
    beside it in the run folder), the judge's files; nor inside a live run's folder."""
    from pofe.outputs import guard_outputs, judge_inputs

    reads: list[str] = []
    for s in specs:
        if not is_responses_file(s) and Path(s).is_dir():
            try:
                s = resolve_policy_model(s)
            except ValueError:  # no model in it: refused later with its own message
                pass
        reads.append(s)
    guard_outputs({"-o": cfg.output}, [cfg.data.prompts, *reads, *judge_inputs(cfg.judge)])


def run_eval(cfg: EvalConfig, *, judge=None, generator=None, dp: DataParallel | None = None) -> dict[str, Any]:
    """Generate where needed, judge both orders, and summarise (the ``--json`` object, with
    ``processes`` and ``judge_usage``: calls, cache hits, tokens in and out, cost, over every
    process). ``dp``: the processes to split the work over (default: as launched)."""
    from pofe.judges.usage import budget_of, usage_sum

    if budget_of(cfg.judge) is not None:  # nothing would read it: one pass, no steps to stop after
        raise ConfigError("bad value for 'judge.budget': pofe eval judges in one pass with no step to stop after "
                          "(budgets apply to label, judge, online and rl); remove it")
    specs = policy_specs(cfg)
    guard_eval_output(cfg, specs)
    dp = dp if dp is not None else launched(cfg.model.device, command="pofe eval")  # before any model loads
    built: list = []  # the judge the evaluation used, for its usage
    res = _evaluate(cfg, specs, judge, generator, dp, built)
    return {**res, "judge_usage": usage_sum(built, dp).to_dict()}


def _evaluate(cfg: EvalConfig, specs: list[str], judge, generator, dp: DataParallel, built: list) -> dict[str, Any]:
    gen = _sharded(generator, dp)
    questions = load_turns(cfg.data.prompts) if cfg.data.prompts else None
    if questions is not None:
        return {**_run_two_turn(cfg, specs, questions, judge, gen, dp, built), "processes": dp.world}
    prompts, sides, counts = collect_counted(cfg, gen)
    judge = _build_judge(cfg, judge, built)  # after the policies answered (not both in memory)
    jid = getattr(judge, "id", str(cfg.judge.kind))
    if len(specs) > 2:
        return {**_run_many(cfg, specs, prompts, sides, judge, jid, dp), "prompts": counts, "processes": dp.world}
    ra, rb = sides
    pairs, outcomes = _judge_outcomes(judge, prompts, ra, rb, dp)
    la = [_length(r, cfg.length_unit) for r in ra]
    lb = [_length(r, cfg.length_unit) for r in rb]
    summary = summarise_outcomes(outcomes, la, lb, n_buckets=cfg.n_buckets)
    _write_rows(cfg.output, ({"prompt": x, "response_a": a, "response_b": b, "p_ab": ab, "p_ba": ba, "outcome": o}
                             for x, a, b, (ab, ba), o in zip(prompts, ra, rb, pairs, outcomes)), dp)
    if cfg.refusal:
        # A policy that wins by refusing less (or more) should be visible next to its win
        # rate: the RLAIF seed's guard against a constitution that only teaches refusal.
        from pofe.evaluation.refusal import refusal_rate

        summary["refusal_a"] = refusal_rate(prompts, ra, max_examples=0).to_dict()
        summary["refusal_b"] = refusal_rate(prompts, rb, max_examples=0).to_dict()
    return {"policy_a": cfg.policy_a, "policy_b": cfg.policy_b, "judge": jid, "length_unit": cfg.length_unit,
            "prompts": counts, **summary, "processes": dp.world}


def _run_many(cfg, specs, prompts, sides, judge, jid, dp: DataParallel) -> dict[str, Any]:
    """Every pair of policies on the same prompts -> win matrix + Bradley-Terry ratings."""
    outcomes: dict[tuple[int, int], list[int | None]] = {}
    rows = []
    for i in range(len(specs)):
        for j in range(i + 1, len(specs)):
            pairs, outs = _judge_outcomes(judge, prompts, sides[i], sides[j], dp)
            outcomes[(i, j)] = outs
            rows += [{"prompt": x, "policy_a": specs[i], "policy_b": specs[j], "response_a": a, "response_b": b,
                      "p_ab": ab, "p_ba": ba, "outcome": o}
                     for x, a, b, (ab, ba), o in zip(prompts, sides[i], sides[j], pairs, outs)]
    res = compare_policies(specs, outcomes, n_boot=cfg.n_boot, seed=cfg.seed)
    res["mean_len"] = {s: float(np.mean([_length(r, cfg.length_unit) for r in side])) for s, side in zip(specs, sides)}
    _write_rows(cfg.output, rows, dp)
    return {"mode": "compare", "judge": jid, "n_prompts": len(prompts), "length_unit": cfg.length_unit, **res}


def _run_two_turn(cfg, specs, questions, judge, generator, dp: DataParallel,
                  built: list | None = None) -> dict[str, Any]:
    if len(specs) != 2:
        raise ValueError("eval: two-turn (MT-Bench) evaluation compares exactly two policies")
    available = len(questions)
    if cfg.data.max_prompts is not None:
        questions = questions[: cfg.data.max_prompts]
        if len(questions) < available:
            log.info("eval: data.max_prompts=%d compares the first %d of %d questions", cfg.data.max_prompts,
                     len(questions), available)
    answers = [_generate_turns(s, questions, cfg, generator) for s in specs]
    judge = _build_judge(cfg, judge, built)
    jid = getattr(judge, "id", str(cfg.judge.kind))
    per_turn = {}
    all_o, all_la, all_lb, all_q = [], [], [], []
    rows = []
    for turn in (0, 1):
        idx = [i for i, q in enumerate(questions) if len(q["turns"]) > turn]
        if not idx:
            continue
        trip = [_turn_pair(questions[i], turn, answers[0][i], answers[1][i]) for i in idx]
        pairs, outs = _judge_outcomes(judge, [t[0] for t in trip], [t[1] for t in trip], [t[2] for t in trip], dp)
        la = [_length(answers[0][i][turn], cfg.length_unit) for i in idx]
        lb = [_length(answers[1][i][turn], cfg.length_unit) for i in idx]
        per_turn[f"turn_{turn + 1}"] = summarise_outcomes(outs, la, lb, n_buckets=cfg.n_buckets)
        all_o += outs
        all_la += la
        all_lb += lb
        all_q += [questions[i]["id"] for i in idx]
        rows += [{"question_id": questions[i]["id"], "turn": turn + 1, "prompt": t[0], "response_a": t[1],
                  "response_b": t[2], "p_ab": ab, "p_ba": ba, "outcome": o}
                 for i, t, (ab, ba), o in zip(idx, trip, pairs, outs)]
    # Both turns of a question share its difficulty term in the LC fit.
    overall = summarise_outcomes(all_o, all_la, all_lb, instructions=all_q, n_buckets=cfg.n_buckets)
    _write_rows(cfg.output, rows, dp)
    return {"mode": "two-turn", "policy_a": specs[0], "policy_b": specs[1], "judge": jid,
            "length_unit": cfg.length_unit, "n_questions": len(questions),
            "prompts": {"available": available, "used": len(questions), "limited": available - len(questions)},
            **overall, "by_turn": per_turn}


def _fmt(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def format_eval(res: dict[str, Any]) -> str:
    if res.get("mode") == "compare":
        return format_compare(res)
    if not res["n"]:
        return (f"{res['policy_a']}  vs  {res['policy_b']}: no pair could be compared "
                f"({res['dropped_unparsed']} dropped: the judge parsed neither order)")
    lo, hi = res["win_rate_adjusted_ci95"]
    lines = [
        f"{res['policy_a']}  vs  {res['policy_b']}   (judge {res['judge']}, both orders; disagreement = tie)",
        f"  pairs {res['n']} (dropped unparsed {res['dropped_unparsed']}): W {res['wins']} / T {res['ties']} / L {res['losses']}",
        f"  win rate {res['win_rate']:.3f}   tie-adjusted {res['win_rate_adjusted']:.3f} [95% Wilson CI {lo:.3f}, {hi:.3f}]",
        f"  length-controlled win rate (AlpacaEval-2 GLM, difficulty fitted here) {_fmt(res['lc_win_rate'])}"
        f"   simplified LC {_fmt(res['lc_win_rate_simple'])} (slope on tanh(dlen/sd) {res['slope']:+.2f})",
        f"  mean length ({res['length_unit']}): A {res['mean_len_a']:.1f}, B {res['mean_len_b']:.1f}",
        "  by length of A's response:",
    ]
    for b in res["by_length_bucket"]:
        blo, bhi = b["win_rate_adjusted_ci95"]
        lines.append(f"    [{b['lo']:.0f}, {b['hi']:.0f}]  n={b['n']:<4} adjusted win rate {b['win_rate_adjusted']:.3f}"
                     f" [{blo:.3f}, {bhi:.3f}]")
    for name, t in (res.get("by_turn") or {}).items():
        tlo, thi = t["win_rate_adjusted_ci95"]
        lines.append(f"  {name.replace('_', ' ')}: n={t['n']} W {t['wins']} / T {t['ties']} / L {t['losses']}, "
                     f"tie-adjusted {_fmt(t['win_rate_adjusted'])} [{_fmt(tlo)}, {_fmt(thi)}]")
    return "\n".join(lines)


def format_compare(res: dict[str, Any]) -> str:
    names = res["policies"]
    short = [f"P{i + 1}" for i in range(len(names))]
    lines = [f"{len(names)} policies on {res['n_prompts']} prompts (judge {res['judge']}, both orders; "
             "disagreement = tie)"]
    lines += [f"  {s} = {n}" for s, n in zip(short, names)]
    lines.append("  tie-adjusted win rate of row over column:")
    lines.append("        " + "".join(f"{s:>8}" for s in short))
    for s, row in zip(short, res["win_matrix"]):
        lines.append(f"  {s:<6}" + "".join(f"{'-' if v is None else f'{v:.3f}':>8}" for v in row))
    bt = res["bradley_terry"]
    lines.append(f"  Bradley-Terry ratings (logit scale, {bt['reference']} = 0, 95% bootstrap CI over prompts, "
                 f"{bt['n_boot']} resamples):")
    for n in res["ranking"]:
        lo, hi = bt["ci95"][n]
        lines.append(f"    {short[names.index(n)]:<4}{bt['ratings'][n]:+.3f}  [{_fmt(lo)}, {_fmt(hi)}]")
    return "\n".join(lines)
