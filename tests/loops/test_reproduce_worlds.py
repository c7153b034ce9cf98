"""The planted worlds of ``pofe reproduce``: each annotator's knob does what it says, by hand."""

from __future__ import annotations

import pytest

from pofe.loops.reproduce.worlds import InstructedAnnotator, NoisyAnnotator, target_length_oracle


def test_the_oracle_prefers_the_length_closer_to_its_target():
    o = target_length_oracle(3)
    js = o.judge(["q"] * 3, ["a b c", "a", "a b"], ["a b c d e f", "a b c d e", "a b c d"])
    # |3-3| < |6-3|: A; |1-3| = 2 < |5-3| = 2 is a tie; |2-3| = 1 = |4-3|: a tie
    assert [j.p for j in js] == [1.0, 0.5, 0.5]


def test_a_planted_accuracy_is_the_rate_of_agreement_with_the_oracle():
    o = target_length_oracle(1)
    n = 4000
    a, b = ["x"] * n, ["x y z"] * n  # the oracle prefers A every time
    for acc in (0.6, 0.9):
        js = NoisyAnnotator(o, acc, seed=1).judge(["q"] * n, a, b)
        agree = sum(j.p == 1.0 for j in js) / n
        assert agree == pytest.approx(acc, abs=3 * (acc * (1 - acc) / n) ** 0.5)  # within 3 standard errors
    assert all(j.p == 1.0 for j in NoisyAnnotator(o, 1.0).judge(["q"] * 10, a[:10], b[:10]))
    ties = NoisyAnnotator(o, 0.0).judge(["q"] * 5, ["x y"] * 5, ["x y"] * 5)
    assert [j.p for j in ties] == [0.5] * 5  # a tie is never flipped into a preference


def test_the_instruction_sets_the_preferred_length():
    a, b = "w " * 9, "w " * 4  # 9 words against 4
    assert InstructedAnnotator("helpful", 9).judge(["q"], [a], [b])[0].p == 1.0
    assert InstructedAnnotator("short", 9).judge(["q"], [a], [b])[0].p == 0.0  # wants round(4.5) = 4
    assert InstructedAnnotator("very short", 9).judge(["q"], ["w"], [b])[0].p == 1.0  # wants round(1.5) = 2
    with pytest.raises(ValueError, match="instruction"):
        InstructedAnnotator("tiny", 9)
