"""The one win-rate module: tie rule, Wilson intervals at small n, AlpacaEval-2 LC with the
difficulty term, Bradley-Terry ratings -- on hand-computed numbers or an independent fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from pofe.stats import bootstrap_ci
from pofe.evaluation.winrate import (
    LOSS, TIE, WIN, bradley_terry, compare_policies, count_outcomes, head_to_head, length_controlled_win_rate,
    length_controlled_win_rate_simple, pair_outcome, wilson_interval,
)
from pofe.records import Judgment

Z = 1.959963984540054


def test_tie_rule_is_both_orders_or_tie():
    assert pair_outcome(0.9, 0.8) == WIN and pair_outcome(0.2, 0.1) == LOSS
    assert pair_outcome(0.9, 0.3) == TIE  # the orders disagree
    assert pair_outcome(0.5, 0.9) == TIE and pair_outcome(0.5, 0.5) == TIE
    assert pair_outcome(None, 0.9) is None and pair_outcome(0.9, None) is None


def test_wilson_at_small_n_by_hand():
    # n = 12, all wins: lower = 1 / (1 + z^2/12) = 1 / 1.320124 = 0.757505; upper = 1.
    lo, hi = wilson_interval(12, 12)
    assert lo == pytest.approx(1 / (1 + Z**2 / 12)) and lo == pytest.approx(0.7575, abs=1e-4) and hi == 1.0
    # n = 1, one win: lower = 1 / (1 + z^2) = 0.206549; one loss: upper = 1 - 0.206549.
    assert wilson_interval(1, 1) == pytest.approx((0.206549, 1.0), abs=1e-6)
    assert wilson_interval(0, 1) == pytest.approx((0.0, 0.793451), abs=1e-6)
    # n = 0: no data rules nothing out.
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # 6 of 12: centre 0.5, half-width z sqrt(1/48 + z^2/576) / (1 + z^2/12) = 0.32504 / 1.32012 = 0.24622.
    lo, hi = wilson_interval(6, 12)
    half = Z * math.sqrt(0.25 / 12 + Z**2 / (4 * 144)) / (1 + Z**2 / 12)
    assert (lo, hi) == pytest.approx((0.5 - half, 0.5 + half)) and half == pytest.approx(0.24622, abs=1e-5)


def test_bootstrap_ci_of_a_rate_no_longer_collapses():
    # The percentile bootstrap printed [1.000, 1.000] on 12 wins of 12; a rate gets Wilson.
    assert bootstrap_ci(np.ones(12)) == pytest.approx((0.757505, 1.0), abs=1e-6)
    assert bootstrap_ci(np.ones(1)) == pytest.approx((0.206549, 1.0), abs=1e-6)
    assert bootstrap_ci(np.zeros(0)) == (0.0, 1.0)
    # A statistic that is not a rate still gets the percentile bootstrap.
    lo, hi = bootstrap_ci(np.array([1.0, 5.0, 9.0, 3.0]), statistic=np.median, n_boot=300)
    assert 1.0 <= lo < hi <= 9.0


def test_count_outcomes_by_hand():
    c = count_outcomes([WIN, WIN, WIN, TIE, LOSS, None])
    assert (c["wins"], c["ties"], c["losses"], c["n"], c["dropped_unparsed"]) == (3, 1, 1, 5, 1)
    assert c["win_rate"] == 0.6 and c["win_rate_adjusted"] == 0.7
    assert c["win_rate_adjusted_ci95"] == pytest.approx(list(wilson_interval(3.5, 5)))
    assert count_outcomes([None])["win_rate_adjusted_ci95"] == [None, None]


def test_lc_equals_the_raw_rate_when_lengths_are_equal():
    y = [1, 1, 1, 0.5, 0]
    for dl in ([0] * 5, [7] * 5):  # equal lengths, or a constant offset: tanh term is constant 0 / sd = 0
        lc = length_controlled_win_rate(y, dl)
        assert lc["lc_win_rate"] == pytest.approx(0.7, abs=1e-7)
    # Grouped rows (two turns of one instruction) too: theta is free, so predictions average to the mean.
    lc = length_controlled_win_rate([1, 0, 1, 1, 0, 0.5], [0] * 6, instructions=["a", "a", "b", "b", "c", "c"])
    assert lc["lc_win_rate"] == pytest.approx(3.5 / 6, abs=1e-7) and lc["n_instructions"] == 3


def test_lc_removes_a_planted_length_advantage():
    # Hand-made: A is longer (+100 chars) on 30 instructions and wins 27 of them; shorter
    # (-100) on 10 and wins 1. Within each length group the rate is 0.9 vs 0.1, symmetric
    # about 1/2, so at equal length A is exactly as good as B: logit 0.9 = -logit 0.1 gives
    # theta = 0 in the saturated two-group model. The raw rate 0.7 is all length.
    y = [1] * 27 + [0] * 3 + [1] * 1 + [0] * 9
    dl = [100] * 30 + [-100] * 10
    assert np.mean(y) == 0.7
    lc = length_controlled_win_rate(y, dl)
    assert lc["lc_win_rate"] == pytest.approx(0.5, abs=0.002)
    assert lc["length_coef"] * math.tanh(100 / lc["length_sd"]) == pytest.approx(math.log(9), rel=0.05)
    simple = length_controlled_win_rate_simple(y, dl)
    assert simple["lc_win_rate_simple"] == pytest.approx(0.5, abs=0.002)
    # When quality, not length, drives the outcome, LC stays at the raw rate: 0.9 in both groups.
    y2 = [1] * 27 + [0] * 3 + [1] * 9 + [0] * 1
    assert length_controlled_win_rate(y2, dl)["lc_win_rate"] == pytest.approx(0.9, abs=0.005)


def test_lc_glm_matches_an_independent_fit():
    # The same penalised likelihood minimised by Nelder-Mead/BFGS without our gradient.
    rng = np.random.default_rng(3)
    n = 24
    dl = rng.normal(0, 40, n)
    y = (rng.random(n) < expit(0.4 + 1.2 * np.tanh(dl / dl.std()))).astype(float)
    y[:4] = 0.5
    t = np.tanh(dl / dl.std())

    def nll(v):
        z = v[0] + v[1] * t + v[2:]
        return (-np.sum(y * np.log(expit(z)) + (1 - y) * np.log(expit(-z))) + 0.5 * 1e-3 * v[1] ** 2
                + 0.5 * np.sum(v[2:] ** 2))

    ref = minimize(nll, np.zeros(2 + n), method="BFGS", options={"gtol": 1e-8})
    want = float(np.mean(expit(ref.x[0] + ref.x[2:])))
    assert length_controlled_win_rate(y, dl)["lc_win_rate"] == pytest.approx(want, abs=1e-4)


def test_bradley_terry_three_players_by_hand():
    # Ratings (0, 1, 2): P(1 beats 0) = sigmoid(1), P(2 beats 1) = sigmoid(1), P(2 beats 0) =
    # sigmoid(2). Soft outcomes equal to those probabilities are the likelihood's fixed point.
    games = [(1, 0, expit(1.0)), (2, 1, expit(1.0)), (2, 0, expit(2.0))]
    bt = bradley_terry(["a", "b", "c"], games)
    assert bt["ratings"] == pytest.approx([0.0, 1.0, 2.0], abs=1e-5)


def test_bradley_terry_matches_scipy_on_the_likelihood():
    rng = np.random.default_rng(0)
    true = np.array([0.0, 0.5, -0.7, 1.2])
    games = []
    for _ in range(300):
        i, j = rng.choice(4, 2, replace=False)
        u = rng.random()
        p = expit(true[i] - true[j])
        games.append((int(i), int(j), 1.0 if u < p * 0.8 else 0.5 if u < p * 0.8 + 0.2 else 0.0))

    def nll(r):
        r = np.concatenate([[0.0], r])
        z = np.array([r[i] - r[j] for i, j, _ in games])
        y = np.array([g[2] for g in games])
        return -np.sum(y * np.log(expit(z)) + (1 - y) * np.log(expit(-z)))

    ref = minimize(nll, np.zeros(3), method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 20000})
    bt = bradley_terry(list("abcd"), games)
    assert bt["ratings"][1:] == pytest.approx(list(ref.x), abs=1e-4)


def test_compare_policies_matrix_and_intervals():
    # c beats b beats a on every prompt; the matrix is antisymmetric in the adjusted rate.
    outcomes = {(0, 1): [LOSS] * 8, (0, 2): [LOSS] * 8, (1, 2): [LOSS] * 6 + [TIE] * 2}
    res = compare_policies(["a", "b", "c"], outcomes, n_boot=50)
    m = res["win_matrix"]
    assert m[0][1] == 0.0 and m[1][0] == 1.0 and m[1][2] == pytest.approx(1 / 8) and m[2][1] == pytest.approx(7 / 8)
    assert res["ranking"] == ["c", "b", "a"]
    r = res["bradley_terry"]["ratings"]
    assert r["a"] == 0.0 and r["c"] > r["b"] > 0
    for name in "abc":
        lo, hi = res["bradley_terry"]["ci95"][name]
        assert lo <= r[name] + 1e-9 and r[name] <= hi + 1e-9


class _LenJudge:
    id = "len"

    def judge(self, prompts, a, b, *, references=None):
        return [Judgment(p=float(len(x) > len(y)), p_ab=float(len(x) > len(y)), p_ba=float(len(x) > len(y)),
                         consistent=True, parse_ok=True, judge_id=self.id) for x, y in zip(a, b)]


def test_head_to_head_identical_responses_are_ties_without_a_call():
    h = head_to_head(_LenJudge(), ["x", "y", "z"], ["same", "longer!", "s"], ["same", "short", "long one"])
    assert (h["wins"], h["ties"], h["losses"]) == (1, 1, 1)
    assert h["pairs"][0] == {"p_ab": None, "p_ba": None, "outcome": TIE, "identical": True}
