"""The audit against a planted judge, and calibration: a planted judge's biases are recovered within their intervals,
temperature scaling lowers held-out ECE, hand-computed kappa / ECE / Brier / human-human
agreement, per-principle flags, and the HTML page."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit

from pofe.data.calibration import CalibrationItem
from pofe.evaluation.audit import (
    AuditConfig, calibration_metrics, cohen_kappa, human_human_agreement, run_audit, write_audit,
)
from pofe.evaluation.calibrate import brier, ece, fit_temperature
from pofe.labels import apply_calibration, load_calibration_map
from pofe.evaluation.sim import PlantedJudge, PlantedWorld
from pofe.records import Judgment


def _truth(position_bias, length_weight, list_weight, noise, list_rate, n=400_000, seed=123):
    """The planted judge's rates computed straight from its generative model (numpy, no pofe
    audit code): the world's utility differences, lengths (240 + 40 L chars, +8 chars for
    the bullet markup of a list), and both-order logits with fresh noise."""
    rng = np.random.default_rng(seed)
    du = rng.normal(0, 1.5, n) - rng.normal(0, 1.5, n)  # u = w.x with ||w|| = 1.5: u ~ N(0, 1.5^2)
    la, lb = rng.normal(size=n), rng.normal(size=n)
    lista, listb = rng.random(n) < list_rate, rng.random(n) < list_rate
    ca = np.maximum(24, np.round(240 + 40 * la)) + 8 * lista
    cb = np.maximum(24, np.round(240 + 40 * lb)) + 8 * listb
    d_len, d_list = (ca - cb) / 40, lista.astype(float) - listb

    def logit(sign):
        return sign * (du + length_weight * d_len + list_weight * d_list) + position_bias + noise * rng.standard_normal(n)

    l_ab, l_ba = logit(1), logit(-1)
    choice_a = 0.5 * (expit(l_ab) + 1 - expit(l_ba)) > 0.5
    human_a = rng.random(n) < expit(du)
    diff_len, diff_list = ca != cb, lista != listb
    return {
        "p_prefers_first": float(np.mean(np.concatenate([l_ab > 0, l_ba > 0]))),
        "p_prefers_longer": float(np.mean((ca > cb)[diff_len] == choice_a[diff_len])),
        "p_prefers_lists": float(np.mean(lista[diff_list] == choice_a[diff_list])),
        "agreement": float(np.mean(human_a == choice_a)),
    }


def test_audit_recovers_a_planted_judges_biases_within_their_intervals():
    planted = dict(position_bias=0.6, length_weight=0.8, list_weight=0.5, noise=0.6)
    world = PlantedWorld(400, seed=1, list_rate=0.3)
    rep = run_audit(PlantedJudge(world, seed=2, **planted), world.items, AuditConfig(contrasts=False, seeds=2))
    m, ci = rep["metrics"], rep["metrics"]["ci95"]
    truth = _truth(list_rate=0.3, **planted)
    # The planted biases are real: P(first) ~ 0.595, P(longer) ~ 0.656, P(lists) ~ 0.608.
    assert truth["p_prefers_first"] > 0.58 and truth["p_prefers_longer"] > 0.63 and truth["p_prefers_lists"] > 0.58
    for key, want in truth.items():
        lo, hi = ci[key]
        assert lo <= want <= hi, f"{key}: planted {want:.3f} outside the audit's interval [{lo:.3f}, {hi:.3f}]"
        assert lo > 0.5, f"{key}: the interval [{lo:.3f}, {hi:.3f}] should exclude no bias"
    # Fresh noise per query: the verdicts vary across the two seeds.
    assert m["n_seeds"] == 2 and 0 < m["variance"] < 0.2
    assert rep["checks"]["length_correlation"]["passed"] is False


def test_audit_of_an_unbiased_judge_covers_one_half():
    world = PlantedWorld(400, seed=4, list_rate=0.3)
    rep = run_audit(PlantedJudge(world, position_bias=0.0, length_weight=0.0, seed=5), world.items,
                    AuditConfig(contrasts=False))
    ci = rep["metrics"]["ci95"]
    for key in ("p_prefers_first", "p_prefers_longer", "p_prefers_lists"):
        assert ci[key][0] <= 0.5 <= ci[key][1], key


def test_temperature_scaling_lowers_held_out_ece_of_the_planted_judge():
    def labelled(seed, n):
        world = PlantedWorld(n, seed=seed)
        js = PlantedJudge(world, seed=seed + 100).judge([it.prompt for it in world.items],
                                                         [it.response_a for it in world.items],
                                                         [it.response_b for it in world.items])
        return np.array([j.p for j in js]), np.array([float(it.label == "A") for it in world.items])

    p_fit, y_fit = labelled(11, 1000)
    p_test, y_test = labelled(12, 2000)
    t = fit_temperature(p_fit, y_fit)
    cal = [apply_calibration(float(v), {"method": "temperature", "temperature": t}) for v in p_test]
    # The judge's extra noise and biases make it overconfident: T > 1 softens it.
    assert t > 1.2
    before, after = ece(p_test, y_test), ece(cal, y_test)
    assert after < before - 0.02, (t, before, after)
    assert brier(cal, y_test) <= brier(p_test, y_test)


def test_calibration_maps_and_scores_by_hand():
    # T = 2: logit(0.8) = ln 4, halved is ln 2, sigmoid(ln 2) = 2/3.
    assert apply_calibration(0.8, {"method": "temperature", "temperature": 2.0}) == pytest.approx(2 / 3)
    assert apply_calibration(0.3, {"method": "isotonic", "x": [0.0, 0.5, 1.0], "y": [0.1, 0.3, 0.9]}) == pytest.approx(0.22)
    assert apply_calibration(None, {"method": "temperature", "temperature": 2.0}) is None
    assert apply_calibration(0.7, None) == 0.7
    with pytest.raises(ValueError, match="unknown method"):
        apply_calibration(0.5, {"method": "platt"})
    # ECE with 10 bins: p = .05,.05 (y 0,1) -> bin 0 |.5 - .05| * 2/4; p = .95,.95 (y 1,1) -> |1 - .95| * 2/4.
    assert ece([0.05, 0.05, 0.95, 0.95], [0, 1, 1, 1]) == pytest.approx(0.45 * 0.5 + 0.05 * 0.5)
    assert brier([0.05, 0.05, 0.95, 0.95], [0, 1, 1, 1]) == pytest.approx((0.0025 + 0.9025 + 0.0025 + 0.0025) / 4)


def test_cohen_kappa_and_human_human_by_hand():
    # p_o = 3/4; p_e = (2/4 * 3/4) + (2/4 * 1/4) = 0.5; kappa = (0.75 - 0.5) / 0.5 = 0.5.
    assert cohen_kappa(["A", "A", "B", "B"], ["A", "A", "B", "A"]) == pytest.approx(0.5)
    items = [CalibrationItem("q1", "x", "y", "A"), CalibrationItem("q1", "y", "x", "B"),  # agree (swapped order)
             CalibrationItem("q2", "u", "v", "A"), CalibrationItem("q2", "u", "v", "B"),  # disagree
             CalibrationItem("q3", "s", "t", "A")]  # one annotator: not counted
    hh = human_human_agreement(items)
    assert (hh["n_pairs_multi"], hh["n_label_pairs"], hh["agreement"]) == (2, 2, 0.5)


def test_per_principle_agreement_flags_the_outlier():
    items = [CalibrationItem(f"q{i}", "a" * 10, "b" * 10, "A") for i in range(60)]
    js = []
    for i in range(60):
        pid = ("harmless", "honest", "contrarian")[i % 3]
        p = 0.1 if pid == "contrarian" else 0.9  # the "contrarian" principle always disagrees with humans
        js.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=True, parse_ok=True, judge_id="j", principle_id=pid))
    m = calibration_metrics(items, js)
    assert m["principles_flagged"] == ["contrarian"]
    assert m["by_principle"]["contrarian"]["agreement"] == 0.0 and m["by_principle"]["honest"]["agreement"] == 1.0


def test_audit_writes_json_and_html_with_the_calibration_map(tmp_path):
    world = PlantedWorld(120, seed=3)
    rep = run_audit(PlantedJudge(world, seed=3), world.items, AuditConfig(contrast_limit=10))
    out = write_audit(rep, tmp_path / "audit.json")
    assert set(out) == {"json", "html"}
    page = (tmp_path / "audit.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Reliability diagram" in page and "Cohen" in page
    assert "one_token_colon" in page and "answer_for_judge" in page
    cmap = load_calibration_map(tmp_path / "audit.json")
    assert cmap["method"] == "temperature" and cmap["temperature"] > 0
    assert json.loads((tmp_path / "audit.json").read_text())["calibration"]["sha256"] == rep["calibration"]["sha256"]


def test_audit_of_a_pofe_annotate_file_measures_human_human_agreement(tmp_path):
    from pofe.evaluation.audit import audit_from_config

    pairs = [("q1", "short", "a much longer answer"), ("q2", "tiny", "another long answer here"), ("q3", "x", "yy")]
    rows = []
    for who, labels in (("alice", "BBA"), ("bob", "BAA")):
        rows.append({"event": "open", "annotator": who})
        for (q, a, b), lab in zip(pairs, labels):
            rows.append({"event": "label", "annotator": who, "pair_id": q, "prompt": q, "response_a": a,
                         "response_b": b, "label": lab})
    f = tmp_path / "calibration.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = audit_from_config(AuditConfig(data={"calibration": [str(f)]}, judge={"kind": "length", "prefer": "longer"},
                                        contrasts=False, output=str(tmp_path / "audit.json")))
    hh = rep["metrics"]["human_human"]
    # alice and bob agree on q1 and q3, not on q2: 2 of 3.
    assert (hh["n_pairs_multi"], hh["n_label_pairs"]) == (3, 3) and hh["agreement"] == pytest.approx(2 / 3)
    # The longer-preferring judge picks B on q1, q2, q3: alice B B A -> 2/3, bob B A A -> 1/3.
    assert rep["metrics"]["agreement"] == pytest.approx(0.5)
    assert rep["judge_identity"]["kind"] == "length" and rep["judge_identity"]["prefer"] == "longer"
    assert (tmp_path / "audit.html").exists()
