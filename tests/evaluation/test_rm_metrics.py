"""Reward-modelling metrics on hand-made rankings; every expected number is worked out below."""

from __future__ import annotations

import math

import pytest

from pofe.evaluation.rm_metrics import RankedGroup, _spearman, rm_metrics
from pofe.stats import kendall_tau_b

# Human ranks: 0 = best. Scores: judge's, None = unscored.
A = RankedGroup(ranks=(0, 1, 2), scores=(5, 3, 4))  # pairs: 01 ok, 02 ok, 12 wrong (3 < 4)
B = RankedGroup(ranks=(0, 1), scores=(4, 4))  # judge tie -> a miss; constant judge -> rho = tau = 0
C = RankedGroup(ranks=(0, 1), scores=(5, 2))  # right; rho = tau = 1; exact match
D = RankedGroup(ranks=(0, 1, 2), scores=(5, None, 5))  # 2 pairs unscored; (0,2) is a tie
E = RankedGroup(ranks=(1, 0), scores=(5, 3))  # human prefers #1, judge #0: wrong; rho = tau = -1


def test_group_a_by_hand():
    # scores (5,3,4) -> ranks (3,1,2); -human (0,-1,-2) -> ranks (3,2,1); d = (0,-1,1)
    # rho = 1 - 6*sum d^2 / (n(n^2-1)) = 1 - 12/24 = 0.5
    assert _spearman([5, 3, 4], [0, -1, -2]) == pytest.approx(0.5)
    # concordant pairs: (0,1), (0,2); discordant: (1,2) -> tau = (2-1)/3
    assert kendall_tau_b([5, 3, 4], [0, -1, -2]) == pytest.approx(1 / 3)


def test_kendall_tau_b_with_ties_matches_formula():
    # x = (1,2,2,3), y = (1,2,3,3): pairs: 01 C, 02 C, 03 C, 12 tie x, 13 C, 23 tie y
    # C=4, D=0, tx=1, ty=1 -> 4 / sqrt(5*5) = 0.8
    assert kendall_tau_b([1, 2, 2, 3], [1, 2, 3, 3]) == pytest.approx(0.8)
    scipy_stats = pytest.importorskip("scipy.stats")
    assert scipy_stats.kendalltau([1, 2, 2, 3], [1, 2, 3, 3]).statistic == pytest.approx(0.8)


def test_rm_metrics_hand_computed():
    m = rm_metrics([A, B, C, D, E])
    # pairs with different human ranks and both scored: A 3, B 1, C 1, D 1 (0 vs 2), E 1 = 7
    assert m["n_pairs"] == 7
    assert m["n_pairs_unscored"] == 2 and m["n_unscored_responses"] == 1
    # correct: A 2, C 1 -> 3/7; judge ties: B, D -> 2/7
    assert m["pairwise_accuracy"] == pytest.approx(3 / 7)
    assert m["pairwise_ties"] == pytest.approx(2 / 7)
    # fully scored groups: A, B, C, E; only C's ordering matches exactly
    assert m["n_exact_groups"] == 4 and m["exact_match"] == pytest.approx(0.25)
    # rho: A 0.5, B 0 (constant judge), C 1, E -1 -> 0.5/4; tau: 1/3, 0, 1, -1 -> (1/3)/4
    assert m["spearman"] == pytest.approx(0.125)
    assert m["kendall_tau"] == pytest.approx(1 / 12)
    assert m["n_corr_constant_judge"] == 1
    # perfect 5s: A#0 top, C#0 top, D#0 top, D#2 not, E#0 not -> 3/5
    assert m["n_perfect"] == 5 and m["five_best_share"] == pytest.approx(0.6)
    # unique top score: A (#0, human top), C (#0, top), E (#0, not top); B and D tie -> 2/3
    assert m["top1_agreement"] == pytest.approx(2 / 3)


def test_rm_metrics_perfect_and_empty():
    m = rm_metrics([C, RankedGroup((0, 1, 2), (4, 3, 1))])
    assert m["pairwise_accuracy"] == 1.0 and m["exact_match"] == 1.0
    assert m["spearman"] == pytest.approx(1.0) and m["kendall_tau"] == pytest.approx(1.0)
    assert m["five_best_share"] == 1.0 and m["n_perfect"] == 1
    empty = rm_metrics([])
    assert empty["pairwise_accuracy"] is None and empty["five_best_share"] is None


def test_human_ties_skip_correlation_and_pairs():
    m = rm_metrics([RankedGroup((0, 0), (5, 1))])
    assert m["n_pairs"] == 0 and m["pairwise_accuracy"] is None
    assert m["n_corr_skipped_human_ties"] == 1 and m["spearman"] is None
    # Ties in both the human and the judge order: mid-ranks equal -> exact match.
    assert rm_metrics([RankedGroup((0, 1, 1), (4, 2, 2))])["exact_match"] == 1.0


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        RankedGroup((0, 1), (1.0,))
    assert math.isfinite(_spearman([1, 2, 3], [3, 2, 1]))
