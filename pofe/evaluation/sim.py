"""``pofe sim``: the labelling-chain simulation of rlaif-constitutional-ai ("A toy run:
agreement hides systematic bias").

What it shows before any compute is spent: a judge can agree with humans about as often as
humans agree with each other, and still hand its biases (here a position bias and a
preference for a quality-free "length" feature) to every reward model trained on its labels.

Setup, exactly as in the seed:

* a response is ``x ~ N(0, I_d)`` (d = 12) with an independent length feature ``L ~ N(0, 1)``;
  true utility ``u = w.x`` with ``w`` a random direction scaled to ``||w|| = 1.5``; L has
  zero weight in u;
* a pair compares two independent responses, the first shown first;
* human label ``~ Bernoulli(sigmoid(du))`` (Bradley-Terry on u);
* judge logit for "first is better" ``= du + 0.6 + 0.8 dL + eps``, ``eps ~ N(0, 0.6^2)``
  drawn fresh for every query; judge probability ``sigmoid(logit)``; hard label
  ``1[logit > 0]``;
* the debiased label queries both orders (fresh noise each) and averages P(first of the
  original pair better) as the judges do: ``p = (p_ab + p_ba) / 2`` (seed "debiasing by both
  orders"; OAIF Appendix E);
* linear Bradley-Terry reward models: logistic regression on ``[dx, dL]`` with an intercept
  (the intercept absorbs the position bias, so the 13 feature weights are the RM), trained on
  the same 5,000 pairs labelled by each source, tested on 20,000 fresh pairs against
  ``sign(du)``.

Every draw comes from one ``numpy.random.default_rng(seed)`` stream in a fixed order, so a
seed pins every number.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pydantic import Field

from pofe.config import PofeConfig, Seed
from pofe.errors import PofeError
from pofe.stats import fit_logistic, sigmoid


class SimConfig(PofeConfig):
    """The toy run's knobs (defaults = rlaif-constitutional-ai "A toy run")."""

    # Bounds refused when parsed (``--dim 0`` / ``-3``, ``--n-train 0`` and ``--position-bias 1e308``
    # were internal errors, ``n_test=0`` a NaN with exit 0): past |position_bias| = 20 the judge
    # says "first" for every pair (P = 1 - 2e-9) and no reward model can be fitted to its labels.
    seed: Seed = 0
    dim: int = Field(12, ge=1, le=1000)
    """Quality features per response."""
    w_norm: float = Field(1.5, gt=0, le=100)
    """||w||, the scale of the true utility."""
    position_bias: float = Field(0.6, ge=-20, le=20)
    """Judge logit bonus for the first-shown response."""
    length_weight: float = Field(0.8, ge=-100, le=100)
    """Judge logit weight on the length difference (the true utility gives length zero weight)."""
    noise: float = Field(0.6, ge=0, le=100)
    """Standard deviation of the judge's per-query logit noise."""
    n_agreement: int = Field(20_000, ge=1, le=1_000_000)
    """Pairs for the agreement statistics."""
    n_train: int = Field(5_000, ge=1, le=1_000_000)
    """Pairs each reward model is trained on."""
    n_test: int = Field(20_000, ge=1, le=1_000_000)
    """Fresh pairs each reward model is tested on."""


SIM_MAX_CELLS = 20_000_000


class SimError(PofeError):
    """A simulation too large for memory, or whose labels leave a reward model nothing to fit
    (every label one way)."""

    exit_code = 2


def _ratio(num: float, norm: float, what: str) -> float:
    if not norm > 0:
        raise SimError(f"sim: the {what} has no quality weight to compare with (its labels are all one way: raise "
                       f"n_train or lower |position_bias|)")
    return num / norm


RM_SOURCES = ("human_hard", "judge_hard", "judge_debiased_hard", "judge_debiased_soft")


class _Chain:
    """The world of the toy run: the true utility and the two annotators."""

    def __init__(self, cfg: SimConfig, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng
        w = rng.standard_normal(cfg.dim)
        self.w = w * (cfg.w_norm / np.linalg.norm(w))

    def pairs(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n pairs of independent responses: returns (dx, dL, du), first minus second."""
        d = self.cfg.dim
        x1, x2 = self.rng.standard_normal((n, d)), self.rng.standard_normal((n, d))
        l1, l2 = self.rng.standard_normal(n), self.rng.standard_normal(n)
        dx, dl = x1 - x2, l1 - l2
        return dx, dl, dx @ self.w

    def human(self, du: np.ndarray) -> np.ndarray:
        """1 = first better, sampled from Bradley-Terry on u."""
        return (self.rng.random(du.shape[0]) < sigmoid(du)).astype(float)

    def judge_logit(self, du: np.ndarray, dl: np.ndarray) -> np.ndarray:
        """One query with the pair shown in the given order; logit of "first is better"."""
        c = self.cfg
        return du + c.position_bias + c.length_weight * dl + c.noise * self.rng.standard_normal(du.shape[0])

    def judge_both_orders(self, du, dl) -> tuple[np.ndarray, np.ndarray]:
        """Logits of the two queries, order (1, 2) then order (2, 1); fresh noise each."""
        return self.judge_logit(du, dl), self.judge_logit(-du, -dl)


def _debiased_p(logit_ab: np.ndarray, logit_ba: np.ndarray) -> np.ndarray:
    # p_ab = P(first better) in order (1,2); in order (2,1) the first shown is response 2,
    # so P(response 1 better) = 1 - sigmoid(logit_ba).  p = (p_ab + p_ba) / 2.
    return 0.5 * (sigmoid(logit_ab) + 1.0 - sigmoid(logit_ba))


def _rm_summary(fit, w_true, dx_test, dl_test, du_test) -> dict[str, float]:
    q = fit.coef[:-1]
    w_len = float(fit.coef[-1])
    qnorm = float(np.linalg.norm(q))
    score = dx_test @ q + w_len * dl_test  # reward difference, intercept (position) dropped
    return {
        "agreement_with_truth": float(np.mean(np.sign(score) == np.sign(du_test))),
        "length_to_quality_ratio": _ratio(w_len, qnorm, "fitted reward model"),
        "quality_weight_norm": qnorm,
        "length_weight": w_len,
        "intercept": float(fit.intercept),
        "cosine_with_true_w": float(q @ w_true / (qnorm * np.linalg.norm(w_true))),  # qnorm > 0: _ratio checked
    }


def run_sim(cfg: SimConfig | None = None) -> dict[str, Any]:
    """Run the toy labelling chain; returns the JSON-ready result (see ``pofe sim --json``)."""
    cfg = cfg or SimConfig()
    n = max(cfg.n_agreement, cfg.n_train, cfg.n_test)
    if n * cfg.dim > SIM_MAX_CELLS:  # each of the few (n, dim) arrays is n x dim doubles: 20M of them is 160 MB
        raise SimError(f"sim: {n} pairs x dim {cfg.dim} = {n * cfg.dim} features per array, over the {SIM_MAX_CELLS} "
                       f"limit; lower n_agreement / n_train / n_test or dim")
    rng = np.random.default_rng(cfg.seed)
    world = _Chain(cfg, rng)

    # --- agreement statistics on n_agreement pairs ------------------------------------
    dx, dl, du = world.pairs(cfg.n_agreement)
    truth = (du > 0).astype(float)
    h1 = world.human(du)
    h2 = world.human(du)  # a second, independent human on the same pairs
    logit_ab, logit_ba = world.judge_both_orders(du, dl)
    judge_hard = (logit_ab > 0).astype(float)  # single order: pair shown as drawn
    judge_ba_first = (logit_ba > 0)  # order (2, 1): did the first shown (response 2) win?
    p_deb = _debiased_p(logit_ab, logit_ba)
    judge_deb = (p_deb > 0.5).astype(float)
    agree = {
        "human_label_noise": float(np.mean(h1 != truth)),
        "human_human_agreement": float(np.mean(h1 == h2)),
        "judge_human_agreement": float(np.mean(judge_hard == h1)),
        "judge_human_agreement_debiased": float(np.mean(judge_deb == h1)),
        "judge_truth_agreement": float(np.mean(judge_hard == truth)),
        "judge_truth_agreement_debiased": float(np.mean(judge_deb == truth)),
        # Pairs are drawn i.i.d., so the order they are shown in is already random.
        "first_position_win_rate": float(np.mean(judge_hard)),
        "first_position_win_rate_debiased": float(np.mean(judge_deb)),
        # Verdict changes when the order is swapped: order (1,2) says 1 and order (2,1)
        # says 2 is consistent; "first wins" twice or "second wins" twice is a flip.
        "order_flip_rate": float(np.mean((logit_ab > 0) == judge_ba_first)),
        # The judge's own logit: length weight over the norm of its quality weights (= ||w||).
        "judge_length_to_quality_ratio": cfg.length_weight / cfg.w_norm,
    }
    # The same ratio as a logistic fit of the judge's single-order hard labels sees it
    # (noise shrinks all weights alike, so the ratio survives the fit).
    fit_j = fit_logistic(np.column_stack([dx, dl]), judge_hard)
    agree["judge_length_to_quality_ratio_fitted"] = float(_ratio(fit_j.coef[-1], np.linalg.norm(fit_j.coef[:-1]),
                                                                 "logistic fit of the judge's labels"))

    # --- reward models on n_train pairs, one labelling per source ---------------------
    dx_tr, dl_tr, du_tr = world.pairs(cfg.n_train)
    l_ab, l_ba = world.judge_both_orders(du_tr, dl_tr)
    p_tr = _debiased_p(l_ab, l_ba)
    targets = {
        "human_hard": world.human(du_tr),
        "judge_hard": (l_ab > 0).astype(float),
        "judge_debiased_hard": (p_tr > 0.5).astype(float),
        "judge_debiased_soft": p_tr,
    }
    feats = np.column_stack([dx_tr, dl_tr])
    dx_te, dl_te, du_te = world.pairs(cfg.n_test)
    rm = {name: _rm_summary(fit_logistic(feats, y), world.w, dx_te, dl_te, du_te) for name, y in targets.items()}

    return {
        "seed": cfg.seed,
        "config": cfg.model_dump(),
        **agree,
        "rm": rm,
        "true_w_norm": float(np.linalg.norm(world.w)),
    }


def format_sim(result: dict[str, Any]) -> str:
    """A readable summary of :func:`run_sim`'s result."""
    c = result["config"]
    lines = [
        f"labelling-chain simulation (seed {result['seed']}): d={c['dim']}, ||w||={c['w_norm']}, "
        f"position bias {c['position_bias']}, length weight {c['length_weight']}, noise sd {c['noise']}",
        "",
        f"  human label noise (vs true ranking)   {result['human_label_noise']:.3f}",
        f"  human-human agreement                 {result['human_human_agreement']:.3f}",
        f"  judge-human agreement (one order)     {result['judge_human_agreement']:.3f}",
        f"  judge-human agreement (both orders)   {result['judge_human_agreement_debiased']:.3f}",
        f"  first-position win rate (one order)   {result['first_position_win_rate']:.3f}",
        f"  first-position win rate (both orders) {result['first_position_win_rate_debiased']:.3f}",
        f"  order flip rate                       {result['order_flip_rate']:.3f}",
        f"  judge length/quality weight ratio     {result['judge_length_to_quality_ratio']:.3f}",
        "",
        f"  {'reward model trained on':<24}{'agree w/ truth':>15}{'length/quality':>16}{'|quality w|':>13}",
    ]
    for name, r in result["rm"].items():
        lines.append(f"  {name:<24}{r['agreement_with_truth']:>15.3f}{r['length_to_quality_ratio']:>16.3f}"
                     f"{r['quality_weight_norm']:>13.3f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- a planted judge on text


_WORDS = ("the", "answer", "covers", "this", "point", "with", "care", "and", "some", "detail", "about", "it")


class PlantedWorld:
    """Calibration pairs of *text* responses drawn from the toy run's world, for testing the
    audit: each response has a hidden quality vector x (utility ``u = w.x``) and a length
    feature L that sets its length in characters (``base_chars + chars_per_unit * L``);
    humans label by Bradley-Terry on u, as in :class:`_Chain`. A fraction ``list_rate`` of
    responses is written as a bulleted list (no effect on u)."""

    def __init__(self, n: int, *, seed: int = 0, dim: int = 12, w_norm: float = 1.5, base_chars: int = 240,
                 chars_per_unit: int = 40, list_rate: float = 0.0, source: str = "planted"):
        from pofe.data.calibration import CalibrationItem

        rng = np.random.default_rng(seed)
        w = rng.standard_normal(dim)
        self.w = w * (w_norm / np.linalg.norm(w))
        self.base_chars, self.chars_per_unit = base_chars, chars_per_unit
        self.utility: dict[str, float] = {}
        self.items = []
        for i in range(n):
            texts, us = [], []
            for side in "ab":
                u = float(rng.standard_normal(dim) @ self.w)
                ln = float(rng.standard_normal())
                texts.append(self._text(f"r{i}{side}", max(24, int(round(base_chars + chars_per_unit * ln))),
                                        bool(rng.random() < list_rate)))
                us.append(u)
                self.utility[texts[-1]] = u
            label = "A" if rng.random() < sigmoid(us[0] - us[1]) else "B"
            self.items.append(CalibrationItem(f"question {i}", texts[0], texts[1], label, source, f"{source}:{i}"))

    @staticmethod
    def _text(tag: str, chars: int, as_list: bool) -> str:
        words, k = [f"[{tag}]"], 0
        while len(" ".join(words)) < chars:
            words.append(_WORDS[k % len(_WORDS)])
            k += 1
        text = " ".join(words)[:chars]
        if as_list:  # same characters, three bullet lines
            third = len(text) // 3
            text = "- " + text[:third] + "\n- " + text[third:2 * third] + "\n- " + text[2 * third:]
        return text

    def length_unit(self, text: str) -> float:
        return (len(text) - self.base_chars) / self.chars_per_unit


class PlantedJudge:
    """A programmatic judge with known biases, queried in both orders with fresh noise:
    ``logit(first better) = du + position_bias + length_weight * dL + list_weight * dList + eps``
    with ``eps ~ N(0, noise^2)`` (the toy run's judge, seed "A toy run"). Texts the world does
    not know (contrast variants) have utility 0, or -3 when under 20 characters (an empty
    answer is bad)."""

    def __init__(self, world: PlantedWorld, *, position_bias: float = 0.6, length_weight: float = 0.8,
                 list_weight: float = 0.0, noise: float = 0.6, seed: int = 0, judge_id: str = "planted"):
        self.world = world
        self.position_bias, self.length_weight, self.list_weight, self.noise = position_bias, length_weight, list_weight, noise
        self.rng = np.random.default_rng(seed)
        self.id = judge_id

    def _u(self, text: str) -> float:
        if text in self.world.utility:
            return self.world.utility[text]
        return -3.0 if len(text.strip()) < 20 else 0.0

    def _logit(self, first: str, second: str) -> float:
        is_list = lambda t: float(t.lstrip().startswith("- "))  # noqa: E731
        return (self._u(first) - self._u(second) + self.position_bias
                + self.length_weight * (self.world.length_unit(first) - self.world.length_unit(second))
                + self.list_weight * (is_list(first) - is_list(second)) + self.noise * float(self.rng.standard_normal()))

    def judge(self, prompts, responses_a, responses_b, *, references=None):
        from pofe.records import Judgment

        out = []
        for a, b in zip(responses_a, responses_b):
            p_ab = float(sigmoid(self._logit(a, b)))
            p_ba = 1.0 - float(sigmoid(self._logit(b, a)))
            out.append(Judgment(p=0.5 * (p_ab + p_ba), p_ab=p_ab, p_ba=p_ba, consistent=(p_ab > 0.5) == (p_ba > 0.5),
                                parse_ok=True, judge_id=self.id))
        return out
