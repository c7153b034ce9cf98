"""``pofe sim``: internal consistency of the labelling-chain simulation against closed forms.

Every expected number below is computed analytically from the seed's setup
(rlaif-constitutional-ai "A toy run"): du ~ N(0, 2 ||w||^2) because both responses are
N(0, I) and ||w|| = 1.5; dL ~ N(0, 2); judge noise N(0, 0.6^2) per query. Tolerances are
about four standard errors of a 20,000-pair proportion (sqrt(.25/20000) = 0.0035).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
from scipy import integrate
from scipy.stats import norm

from pofe.evaluation.sim import SimConfig, run_sim


@pytest.fixture(scope="module")
def result():
    return run_sim(SimConfig(seed=0))


SD_DU = math.sqrt(2 * 1.5**2)  # 2.1213
SD_DL = math.sqrt(2.0)
TOL = 4 * math.sqrt(0.25 / 20_000)  # 0.0141


def _expect_over_du(f) -> float:
    """E[f(du)] for du ~ N(0, 2 * 1.5^2)."""
    return integrate.quad(lambda t: f(t) * norm.pdf(t, scale=SD_DU), -40, 40)[0]


def _sig(t):
    return 1 / (1 + math.exp(-t))


def test_human_label_noise_matches_bradley_terry(result):
    # A BT human errs on a pair with probability sigmoid(-|du|): E = 0.2132.
    expected = _expect_over_du(lambda t: _sig(-abs(t)))
    assert abs(expected - 0.2132) < 1e-3
    assert abs(result["human_label_noise"] - expected) < TOL


def test_human_human_agreement(result):
    # Two independent BT humans agree with probability s^2 + (1-s)^2, s = sigmoid(du): 0.7079.
    expected = _expect_over_du(lambda t: _sig(t) ** 2 + (1 - _sig(t)) ** 2)
    assert abs(result["human_human_agreement"] - expected) < TOL


def test_first_position_win_rate(result):
    # One order: P(du + 0.6 + 0.8 dL + eps > 0), a normal with sd sqrt(4.5 + 1.28 + 0.36):
    # Phi(0.6 / 2.478) = 0.5957.  Both orders cancel the bias exactly in expectation: 0.5.
    sd = math.sqrt(SD_DU**2 + 0.8**2 * SD_DL**2 + 0.6**2)
    assert abs(result["first_position_win_rate"] - norm.cdf(0.6 / sd)) < TOL
    assert abs(result["first_position_win_rate_debiased"] - 0.5) < TOL


def test_order_flip_rate(result):
    # D = du + 0.8 dL ~ N(0, 5.78). Order (1,2) says "first" when D + 0.6 + e1 > 0;
    # order (2,1) says "first" when -D + 0.6 + e2 > 0. A flip is "first" twice or "second" twice.
    sd_d = math.sqrt(SD_DU**2 + 0.64 * SD_DL**2)

    def flip(d):
        a = norm.cdf((d + 0.6) / 0.6)
        b = norm.cdf((-d + 0.6) / 0.6)
        return a * b + (1 - a) * (1 - b)

    expected = integrate.quad(lambda d: flip(d) * norm.pdf(d, scale=sd_d), -40, 40)[0]  # 0.2011
    assert abs(result["order_flip_rate"] - expected) < TOL


def test_judge_agreement_beats_humans_but_rm_inherits_length(result):
    # The seed's point: the judge agrees with humans at least as often as humans agree with
    # each other, yet every RM trained on its labels weights the quality-free length feature
    # by ~0.8/1.5 of the quality weights, and a human-label RM by ~0.
    assert result["judge_human_agreement"] > result["human_human_agreement"]
    assert result["judge_length_to_quality_ratio"] == pytest.approx(0.8 / 1.5)
    assert result["judge_length_to_quality_ratio_fitted"] == pytest.approx(0.8 / 1.5, abs=0.04)
    rm = result["rm"]
    assert set(rm) == {"human_hard", "judge_hard", "judge_debiased_hard", "judge_debiased_soft"}
    assert abs(rm["human_hard"]["length_to_quality_ratio"]) < 0.05
    assert rm["human_hard"]["quality_weight_norm"] == pytest.approx(1.5, abs=0.15)
    # An isotropic Gaussian pair difference: an RM at angle theta from the truth ranks a pair
    # correctly with probability 1 - theta/pi; theta = atan(0.8/1.5) gives 0.8440.
    judge_rm_expected = 1 - math.atan(0.8 / 1.5) / math.pi
    for name in ("judge_hard", "judge_debiased_hard", "judge_debiased_soft"):
        assert rm[name]["length_to_quality_ratio"] == pytest.approx(0.8 / 1.5, abs=0.05), name
        assert rm[name]["agreement_with_truth"] == pytest.approx(judge_rm_expected, abs=0.01), name
    assert rm["human_hard"]["agreement_with_truth"] > 0.95
    # Hard labels from a low-noise judge inflate the margins (seed: "an overconfident judge
    # produces an RM with inflated margins"); soft targets keep them near the true scale.
    assert rm["judge_hard"]["quality_weight_norm"] > 2 * rm["judge_debiased_soft"]["quality_weight_norm"]
    # The intercept absorbs the single-order position bias; debiased labels have none.
    assert rm["judge_hard"]["intercept"] > 1.0
    assert abs(rm["judge_debiased_soft"]["intercept"]) < 0.1


def test_seed_pins_everything_and_options_matter():
    a, b = run_sim(SimConfig(seed=3, n_agreement=2000, n_train=1000, n_test=2000)), run_sim(
        SimConfig(seed=3, n_agreement=2000, n_train=1000, n_test=2000))
    assert a == b
    c = run_sim(SimConfig(seed=4, n_agreement=2000, n_train=1000, n_test=2000))
    assert c["human_label_noise"] != a["human_label_noise"]
    # A judge with no length preference trains RMs with no length weight.
    d = run_sim(SimConfig(seed=0, length_weight=0.0, position_bias=0.0, n_agreement=4000, n_train=4000, n_test=4000))
    assert abs(d["rm"]["judge_debiased_soft"]["length_to_quality_ratio"]) < 0.06
    assert abs(d["first_position_win_rate"] - 0.5) < 0.03


@pytest.mark.slow
def test_cli_json_keys_and_time():
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pofe.cli.main", "sim", "--seed", "0", "--json"],
                         capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - t0
    res = json.loads(out.stdout)
    for key in ("human_label_noise", "human_human_agreement", "judge_human_agreement",
                "judge_human_agreement_debiased", "first_position_win_rate", "first_position_win_rate_debiased",
                "order_flip_rate", "judge_length_to_quality_ratio"):
        assert isinstance(res[key], float), key
    for src in ("human_hard", "judge_hard", "judge_debiased_hard", "judge_debiased_soft"):
        assert set(res["rm"][src]) >= {"agreement_with_truth", "length_to_quality_ratio", "quality_weight_norm"}
    assert elapsed < 60
    # Same numbers as the library call.
    assert res["human_label_noise"] == run_sim(SimConfig(seed=0))["human_label_noise"]


def test_cli_table_and_bad_option():
    from typer.testing import CliRunner

    from pofe.cli.main import app

    runner = CliRunner()
    out = runner.invoke(app, ["sim", "--set", "n_train=500", "--position-bias", "0"])
    assert out.exit_code == 0 and "judge_debiased_soft" in out.stdout and "position bias 0.0" in out.stdout
    bad = runner.invoke(app, ["sim", "--set", "lenght_weight=1"])
    assert bad.exit_code == 2 and "lenght_weight" in bad.stderr
