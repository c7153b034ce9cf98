"""Self-rewarding variants with planted judges and candidate sets: CREAM's Kendall tau and
consistency soft label, and Temporal Self-Rewarding's anchored rejection."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from scipy.stats import kendalltau

from pofe.loops.self_reward import SelfRewardConfig
from pofe.config import ConfigError, load_config
from pofe.records import Score
from pofe.runs import read_jsonl
from pofe.stats import kendall_tau_b
from pofe.loops.self_reward.self_reward_variants import (build_anchored_pair, build_anchored_pairs, consistency,
                                                variant_pairs)


class PlantedJudge:
    """A pointwise judge whose score of a response is looked up in a table (None = unscored)."""

    id = "planted"

    def __init__(self, table: dict[str, float | None]):
        self.table, self.calls = table, 0

    def score(self, prompts, responses, *, references=None):
        self.calls += 1
        return [Score(self.table[r], self.table[r] is not None, self.id) for r in responses]


# ----------------------------------------------------------------------------- Kendall tau

def test_kendall_tau_hand_computed():
    # one swapped neighbour among 4: 5 concordant, 1 discordant of 6 pairs -> (5 - 1) / 6
    assert kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # a tie in x: C = 2, D = 0, Tx = 1, Ty = 0 -> 2 / sqrt(3 * 2)
    assert kendall_tau_b([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    # undefined: one ranking all ties, or fewer than two items
    assert kendall_tau_b([2, 2, 2], [1, 2, 3]) is None
    assert kendall_tau_b([1], [1]) is None


def test_kendall_tau_matches_scipy_tau_b():
    cases = [([4.0, 1.0, 3.0, 3.0, 2.0], [5.0, 2.0, 2.0, 4.0, 1.0]), ([1, 2, 2, 3], [3, 3, 1, 2]),
             ([0.5, 0.1, 0.9], [0.4, 0.2, 0.1])]
    for x, y in cases:
        assert kendall_tau_b(x, y) == pytest.approx(kendalltau(x, y, variant="b").statistic)


def test_consistency_mean_tau_and_c():
    cur = [[1, 2, 3, 4], [5, 1], [None, 2, 3]]
    prev = [[1, 3, 2, 4], [4, 2], [1, None, 3]]
    c = consistency(cur, prev)
    # tau 2/3 and 1; the third prompt has only one candidate scored by both -> undefined
    assert c["prompts"] == 2 and c["undefined"] == 1
    assert c["tau_mean"] == pytest.approx(5 / 6)
    assert c["C"] == pytest.approx(11 / 12)  # (5/6 + 1) / 2
    assert consistency([[3, 3]], [[1, 2]]) == {"prompts": 0, "undefined": 1, "tau_mean": None, "C": None}


# ----------------------------------------------------------------------------- CREAM in step 4

def _cfg(cream=False, anchor="none"):
    return SimpleNamespace(cream=SimpleNamespace(enabled=cream), temporal=SimpleNamespace(anchor=anchor))


ROWS = [{"index": 0, "prompt": "p0", "responses": ["a", "b", "c", "d"], "scores": [1.0, 2.0, 3.0, 4.0]},
        {"index": 1, "prompt": "p1", "responses": ["e", "f"], "scores": [5.0, 1.0]}]


def test_cream_soft_label_is_the_consistency(tmp_path):
    (tmp_path / "data").mkdir()
    prev = PlantedJudge({"a": 1.0, "b": 3.0, "c": 2.0, "d": 4.0, "e": 4.0, "f": 2.0})
    pairs, counts, info = variant_pairs(_cfg(cream=True), ROWS, t=3, it_dir=tmp_path, anchor_rows=None,
                                        prev_judge=lambda: prev)
    # tau 2/3 (p0) and 1 (p1): tau_mean 5/6, C = 11/12
    assert info["cream"]["applied"] and info["cream"]["labels"] == "soft" and info["cream"]["judge"] == "M1"
    assert info["cream"]["tau_mean"] == pytest.approx(5 / 6) and info["cream"]["C"] == pytest.approx(11 / 12)
    # chosen / rejected as the current judge ranks them, target p = C
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("d", "a"), ("e", "f")]
    assert [p["p"] for p in pairs] == [pytest.approx(11 / 12)] * 2 and counts["kept"] == 2
    # the previous judge's scores are a stage file: read back, never rescored
    assert [r["scores"] for r in read_jsonl(tmp_path / "data" / "cream_scores.jsonl")] == [[1.0, 3.0, 2.0, 4.0], [4.0, 2.0]]
    again = PlantedJudge({})
    _, _, info2 = variant_pairs(_cfg(cream=True), ROWS, t=3, it_dir=tmp_path, anchor_rows=None, prev_judge=lambda: again)
    assert again.calls == 0 and info2["cream"]["C"] == info["cream"]["C"]


def test_cream_without_a_previous_judge_keeps_hard_labels(tmp_path):
    pairs, _, info = variant_pairs(_cfg(cream=True), ROWS, t=2, it_dir=tmp_path, anchor_rows=None,
                                   prev_judge=lambda: None)
    assert info["cream"]["applied"] is False and info["cream"]["labels"] == "hard" and "reason" in info["cream"]
    assert [p["p"] for p in pairs] == [1.0, 1.0]
    # a reversed previous judge: tau -1 everywhere, C = 0 (DPO is then pushed the other way)
    (tmp_path / "data").mkdir()
    rev = PlantedJudge({"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0, "e": 1.0, "f": 2.0})
    pairs, _, info = variant_pairs(_cfg(cream=True), ROWS, t=4, it_dir=tmp_path, anchor_rows=None, prev_judge=lambda: rev)
    assert info["cream"]["tau_mean"] == -1.0 and info["cream"]["C"] == 0.0 and info["cream"]["judge"] == "M2"
    assert [p["p"] for p in pairs] == [0.0, 0.0]


def test_variants_off_is_best_vs_worst_with_hard_labels(tmp_path):
    pairs, counts, info = variant_pairs(_cfg(), ROWS, t=3, it_dir=tmp_path, anchor_rows=None, prev_judge=None)
    assert info == {} and [(p["chosen"], p["rejected"], p["p"]) for p in pairs] == [("d", "a", 1.0), ("e", "f", 1.0)]


# ----------------------------------------------------------------------------- anchored rejection

def test_anchored_rejected_comes_from_the_anchor_set():
    # current best "c1" (4); the anchor's worst "a2" (1) -- not the current worst "c2" (2)
    pair, why = build_anchored_pair("x", ["c1", "c2"], [4.0, 2.0], ["a1", "a2", "a3"], [3.0, 1.0, 2.0])
    assert why == "kept" and (pair["chosen"], pair["rejected"]) == ("c1", "a2")
    assert (pair["chosen_index"], pair["rejected_index"], pair["rejected_from"]) == (0, 1, "M1")
    assert (pair["chosen_score"], pair["rejected_score"]) == (4.0, 1.0)
    # unscored anchor candidates are excluded, never taken as the worst
    pair, _ = build_anchored_pair("x", ["c1"], [4.0], ["a1", "a2"], [None, 3.0])
    assert pair["rejected"] == "a2"
    assert build_anchored_pair("x", ["c1"], [3.0], ["a1"], [5.0]) == (None, "anchor_better")
    assert build_anchored_pair("x", ["c1"], [3.0], ["a1"], [3.0]) == (None, "tie")
    assert build_anchored_pair("x", ["c1"], [None], ["a1"], [3.0]) == (None, "unscored")
    assert build_anchored_pair("x", ["same"], [4.0], ["same"], [1.0]) == (None, "identical_text")


def test_anchored_pairs_and_counts(tmp_path):
    rows = [{"index": 0, "prompt": "p0", "responses": ["c1", "c2"], "scores": [4.0, 2.0]},
            {"index": 1, "prompt": "p1", "responses": ["c3", "c4"], "scores": [3.0, 1.0]}]
    anchor = [{"prompt": "p0", "responses": ["a1", "a2"], "scores": [3.0, 0.0]},
              {"prompt": "p1", "responses": ["a3", "a4"], "scores": [5.0, 4.0]}]
    pairs, counts = build_anchored_pairs(rows, anchor)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("c1", "a2")]
    assert counts == {"prompts": 2, "kept": 1, "tie": 0, "unscored": 0, "anchor_better": 1, "identical_text": 0}
    got, counts2, info = variant_pairs(_cfg(anchor="m1"), rows, t=3, it_dir=tmp_path, anchor_rows=lambda: anchor,
                                       prev_judge=None)
    assert got == pairs and counts2 == counts and info["temporal"]["anchor"] == "m1"
    with pytest.raises(ValueError, match="prompt 1"):
        build_anchored_pairs(rows, [anchor[0], {**anchor[1], "prompt": "other"}])


# ----------------------------------------------------------------------------- config

def test_config_defaults_off_and_unknown_keys_refused():
    cfg = SelfRewardConfig()
    assert cfg.cream.enabled is False and cfg.temporal.anchor == "none"
    for bad, key in (("cream.enable=true", "cream.enable"), ("temporal.anchr=m1", "temporal.anchr"),
                     ("temporal.anchor=m0", "temporal.anchor")):
        with pytest.raises(ConfigError, match=key) as e:
            load_config(SelfRewardConfig, None, [bad])
        assert e.value.exit_code == 2 and "\n" not in str(e.value)
    cfg = load_config(SelfRewardConfig, None, ["cream.enabled=true", "temporal.anchor=m1"])
    assert cfg.cream.enabled is True and cfg.temporal.anchor == "m1"
