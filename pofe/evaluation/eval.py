"""``pofe eval``: head-to-head win rates of two policies under a judge, with length control.

Protocol (FastChat MT-Bench pairwise, shared/docs/anchor-selfreward-cai-judges.md section 3):
every pair is judged in both orders; a pair is a *win* for A only when both orders prefer
A, a *loss* only when both prefer B, and a *tie* otherwise (the orders disagree, or a
verdict is exactly 0.5). Reported: W/T/L, win rate W/N, tie-adjusted win rate
(W + T/2)/N with a percentile-bootstrap 95% interval, mean lengths, the tie-adjusted win
rate by length bucket of A's responses (OAIF Fig. 4b groups responses by length to show
quality at fixed length), and a length-controlled win rate.

Length control (AlpacaEval LC, ``glm_winrate.py``, simplified): regress the outcome
y in {1, 1/2, 0} on ``tanh(dlen / sd(dlen))`` with an intercept by soft-target logistic
regression; the LC win rate is the prediction at ``dlen = 0``, i.e. ``sigmoid(intercept)``.
Lengths are characters, as in AlpacaEval. With equal lengths the slope term is identically
zero and the fit is the intercept-only MLE, whose prediction is exactly the mean outcome, so
LC equals the tie-adjusted rate. Unlike AlpacaEval there is no instruction-difficulty term
(it needs per-instruction data from many models) and no L1 cross-validation; a tiny ridge
on the slope keeps it finite when length separates the outcomes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np

from pofe.config import PofeConfig
from pofe.evaluation.stats import bootstrap_ci, fit_logistic, sigmoid
from pofe.generation import SamplingConfig
from pofe.judges.registry import JudgeConfig

log = logging.getLogger(__name__)

WIN, TIE, LOSS = 1, 0, -1


# --------------------------------------------------------------------------- pure statistics


def _verdict(p: float | None) -> int | None:
    if p is None:
        return None
    if p > 0.5:
        return WIN
    if p < 0.5:
        return LOSS
    return TIE


def pair_outcome(p_ab: float | None, p_ba: float | None) -> int | None:
    """Outcome for A from its two per-order verdicts (both expressed as P(A better)).

    Win only if both orders prefer A, loss only if both prefer B, otherwise a tie
    (FastChat: "an inconsistent pair is a tie"). ``None`` when an order failed to parse:
    such a pair is dropped and counted, never guessed.
    """
    a, b = _verdict(p_ab), _verdict(p_ba)
    if a is None or b is None:
        return None
    if a == b and a != TIE:
        return a
    return TIE


def length_controlled_win_rate(y: Sequence[float], dlen: Sequence[float], *, l2: float = 1e-3) -> dict[str, float]:
    """LC win rate: fit ``y ~ sigmoid(a + b * tanh(dlen / sd))``, predict at dlen = 0.

    ``y`` is the outcome for A (1, 0.5, 0); ``dlen`` is len(A) - len(B).
    """
    y = np.asarray(y, dtype=float)
    dlen = np.asarray(dlen, dtype=float)
    if y.size == 0:
        return {"lc_win_rate": None, "slope": None, "length_sd": None}
    sd = float(np.std(dlen))
    z = np.tanh(dlen / sd) if sd > 0 else np.zeros_like(dlen)
    mean = float(y.mean())
    if mean in (0.0, 1.0):  # all losses / all wins: the intercept MLE is at infinity
        return {"lc_win_rate": mean, "slope": 0.0, "length_sd": sd}
    fit = fit_logistic(z, y, l2=l2)
    return {"lc_win_rate": float(sigmoid(fit.intercept)), "slope": float(fit.coef[0]), "length_sd": sd}


def length_buckets(outcomes: np.ndarray, len_a: np.ndarray, n_buckets: int = 4) -> list[dict[str, Any]]:
    """Tie-adjusted win rate of A grouped by the length of A's response (quantile buckets)."""
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
        o = outcomes[m]
        rows.append({
            "lo": float(edges[k]), "hi": float(edges[k + 1]), "n": int(m.sum()),
            "wins": int((o == WIN).sum()), "ties": int((o == TIE).sum()), "losses": int((o == LOSS).sum()),
            "win_rate_adjusted": float(((o == WIN).sum() + 0.5 * (o == TIE).sum()) / m.sum()),
        })
    return rows


def summarise_outcomes(
    outcomes: Sequence[int | None],
    len_a: Sequence[float],
    len_b: Sequence[float],
    *,
    n_boot: int = 2000,
    n_buckets: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """All of ``pofe eval``'s statistics from per-pair outcomes and response lengths."""
    keep = [i for i, o in enumerate(outcomes) if o is not None]
    o = np.array([outcomes[i] for i in keep], dtype=int)
    la = np.array([len_a[i] for i in keep], dtype=float)
    lb = np.array([len_b[i] for i in keep], dtype=float)
    n = len(o)
    w, t, l_ = int((o == WIN).sum()), int((o == TIE).sum()), int((o == LOSS).sum())
    y = np.where(o == WIN, 1.0, np.where(o == TIE, 0.5, 0.0))
    out: dict[str, Any] = {
        "n": n, "dropped_unparsed": len(outcomes) - n, "wins": w, "ties": t, "losses": l_,
        "win_rate": w / n if n else None,
        "win_rate_adjusted": float(y.mean()) if n else None,
        "mean_len_a": float(la.mean()) if n else None,
        "mean_len_b": float(lb.mean()) if n else None,
    }
    # None, not NaN, when nothing could be compared: --json must stay valid JSON.
    out["win_rate_adjusted_ci95"] = list(bootstrap_ci(y, n_boot=n_boot, seed=seed)) if n else [None, None]
    out["by_length_bucket"] = length_buckets(o, la, n_buckets)
    out.update(length_controlled_win_rate(y, la - lb))
    return out


# --------------------------------------------------------------------------- inputs


class EvalConfig(PofeConfig):
    """``pofe eval``: policy A against policy B on a prompt set."""

    policy_a: str | None = None
    """Model name/path, a run folder, or a JSONL file of {prompt, response}."""
    policy_b: str | None = None
    """The baseline: model name/path, run folder or responses file."""
    prompts: str | None = None
    """Prompt file (.txt one per line, .jsonl/.json with prompt/instruction/input/text); default: the prompts
    of a responses file."""
    limit: int | None = None
    """Use only the first N prompts."""
    judge: JudgeConfig = JudgeConfig()
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=64, temperature=0.7)
    length_unit: Literal["chars", "words"] = "chars"
    n_buckets: int = 4
    n_boot: int = 2000
    seed: int = 0
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
    from pofe.data.io import DataError, read_located
    from pofe.data.prompts import to_prompt

    out: dict[str, str] = {}
    for where, r in read_located(path):
        key = next((k for k in _RESPONSE_KEYS if k in r), None)
        if key is None or not isinstance(r[key], str):
            raise DataError(f"{where}: no response field (looked for {', '.join(_RESPONSE_KEYS)}); fields: {sorted(r)}")
        out[to_prompt({k: v for k, v in r.items() if k != key}, where).text] = r[key]
    return out


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


def _generate(spec: str, prompts: list[str], cfg: EvalConfig) -> list[str]:
    from pofe.generation import generate
    from pofe.models import load_model

    model, tok = load_model(resolve_policy_model(spec))
    outs = generate(model, tok, prompts, n=1, sampling=cfg.sampling, seed=cfg.seed)
    return [o[0].text for o in outs]


def _length(text: str, unit: str) -> int:
    return len(text.split()) if unit == "words" else len(text)


def collect_responses(cfg: EvalConfig, generator=None) -> tuple[list[str], list[str], list[str]]:
    """(prompts, responses of A, responses of B): read from files where given, else generated.

    ``generator(spec, prompts, cfg) -> list[str]`` replaces model generation in tests.
    """
    if not cfg.policy_a or not cfg.policy_b:
        raise ValueError("eval needs two policies: policy_a and policy_b")
    gen = generator or _generate
    files = {s: load_responses(s) for s in (cfg.policy_a, cfg.policy_b) if is_responses_file(s)}
    if cfg.prompts:
        prompts = load_prompts(cfg.prompts)
    elif files:
        prompts = list(next(iter(files.values())))
    else:
        raise ValueError("eval: give a prompt file (prompts=...) when neither policy is a responses file")
    for spec, table in files.items():
        missing = [p for p in prompts if p not in table]
        if missing:
            if cfg.prompts:
                raise ValueError(f"{spec}: no response for {len(missing)} of {len(prompts)} prompts "
                                 f"(first: {missing[0][:60]!r})")
            prompts = [p for p in prompts if p in table]
    if cfg.limit is not None:
        prompts = prompts[: cfg.limit]
    if not prompts:
        raise ValueError("eval: no prompts to compare on")
    sides = []
    for spec in (cfg.policy_a, cfg.policy_b):
        sides.append([files[spec][p] for p in prompts] if spec in files else gen(spec, prompts, cfg))
    return prompts, sides[0], sides[1]


def judge_pairs(judge, prompts: list[str], resp_a: list[str], resp_b: list[str]) -> list[tuple[float | None, float | None]]:
    """(p_ab, p_ba) per pair, both as P(A better).

    A judge's :class:`~pofe.records.Judgment` already carries both orders; a judge that
    answered only one (``p_ba is None`` with ``p_ab`` set) is asked again with the order
    swapped, so every pair is judged both ways.
    """
    from pofe.evaluation.audit import as_pairwise

    judge = as_pairwise(judge)
    js = judge.judge(prompts, resp_a, resp_b)
    pairs = [(j.p_ab, j.p_ba) for j in js]
    redo = [i for i, (ab, ba) in enumerate(pairs) if ab is not None and ba is None]
    if redo:
        back = judge.judge([prompts[i] for i in redo], [resp_b[i] for i in redo], [resp_a[i] for i in redo])
        for i, j in zip(redo, back):
            pairs[i] = (pairs[i][0], None if j.p_ab is None else 1.0 - j.p_ab)
    return pairs


def run_eval(cfg: EvalConfig, *, judge=None, generator=None) -> dict[str, Any]:
    """Generate where needed, judge both orders, and summarise (the ``--json`` object)."""
    from pofe.data.io import check_output

    check_output(cfg.output, [cfg.prompts, cfg.policy_a, cfg.policy_b])
    prompts, ra, rb = collect_responses(cfg, generator)
    if judge is None:
        from pofe.judges.registry import build_judge

        judge = build_judge(cfg.judge)
    pairs = judge_pairs(judge, prompts, ra, rb)
    outcomes = [pair_outcome(ab, ba) for ab, ba in pairs]
    la = [_length(r, cfg.length_unit) for r in ra]
    lb = [_length(r, cfg.length_unit) for r in rb]
    summary = summarise_outcomes(outcomes, la, lb, n_boot=cfg.n_boot, n_buckets=cfg.n_buckets, seed=cfg.seed)
    if cfg.output:
        from pofe.runs import JsonlWriter

        Path(cfg.output).unlink(missing_ok=True)
        with JsonlWriter(cfg.output) as w:
            for x, a, b, (ab, ba), o in zip(prompts, ra, rb, pairs, outcomes):
                w.write({"prompt": x, "response_a": a, "response_b": b, "p_ab": ab, "p_ba": ba, "outcome": o})
    if cfg.refusal:
        # A policy that wins by refusing less (or more) should be visible next to its win
        # rate: the RLAIF seed's guard against a constitution that only teaches refusal.
        from pofe.evaluation.refusal import refusal_rate

        summary["refusal_a"] = refusal_rate(prompts, ra, max_examples=0).to_dict()
        summary["refusal_b"] = refusal_rate(prompts, rb, max_examples=0).to_dict()
    return {"policy_a": cfg.policy_a, "policy_b": cfg.policy_b, "judge": getattr(judge, "id", str(cfg.judge.kind)),
            "length_unit": cfg.length_unit, **summary}


def format_eval(res: dict[str, Any]) -> str:
    if not res["n"]:
        return (f"{res['policy_a']}  vs  {res['policy_b']}: no pair could be compared "
                f"({res['dropped_unparsed']} dropped: the judge parsed neither order)")
    lo, hi = res["win_rate_adjusted_ci95"]
    lines = [
        f"{res['policy_a']}  vs  {res['policy_b']}   (judge {res['judge']}, both orders; disagreement = tie)",
        f"  pairs {res['n']} (dropped unparsed {res['dropped_unparsed']}): W {res['wins']} / T {res['ties']} / L {res['losses']}",
        f"  win rate {res['win_rate']:.3f}   tie-adjusted {res['win_rate_adjusted']:.3f} [95% CI {lo:.3f}, {hi:.3f}]",
        f"  length-controlled win rate {res['lc_win_rate']:.3f} (slope on tanh(dlen/sd) {res['slope']:+.2f})",
        f"  mean length ({res['length_unit']}): A {res['mean_len_a']:.1f}, B {res['mean_len_b']:.1f}",
        "  by length of A's response:",
    ]
    for b in res["by_length_bucket"]:
        lines.append(f"    [{b['lo']:.0f}, {b['hi']:.0f}]  n={b['n']:<4} adjusted win rate {b['win_rate_adjusted']:.3f}")
    return "\n".join(lines)
