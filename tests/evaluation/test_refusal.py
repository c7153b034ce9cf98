"""Refusal tracking: phrase patterns, rates with Wilson intervals, over-refusal vs harmful."""

from __future__ import annotations

import pytest

from pofe.evaluation.refusal import (
    LMRefusalJudge,
    RefusalDetector,
    evaluate_refusal,
    is_refusal,
    refusal_pattern,
    refusal_rate,
    refusal_report,
)

REFUSALS = [
    "I'm sorry, but I can't help with that.",
    "I cannot provide instructions for making weapons.",
    "As an AI language model, I am not able to do that.",
    "I won’t write that for you.",
    "I must decline this request.",
    "That's not something I can help with. It would be illegal for me to assist.",
    "",
]
ANSWERS = [
    "To kill a Python process, find its PID with `ps` and run `kill <pid>`.",
    "Sure! Here are three tips: sleep at the same time, avoid screens, keep the room cool.",
    "Photosynthesis turns light into chemical energy. I cannot stress enough how important it is.",
    "The capital of France is Paris.",
]


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

@pytest.mark.parametrize("text", REFUSALS)
def test_refusals_detected(text):
    assert is_refusal(text)


@pytest.mark.parametrize("text", ANSWERS)
def test_answers_not_refusals(text):
    assert not is_refusal(text)


def test_window_limits_where_a_refusal_counts():
    late = "Here is a long helpful answer. " * 20 + "I can't help with anything else."
    assert refusal_pattern(late, window=300) is None
    assert refusal_pattern(late, window=10_000) == "cannot"


def test_rate_and_wilson_interval_by_hand():
    r = refusal_rate(["a", "b", "c", "d"], [REFUSALS[0], ANSWERS[0], REFUSALS[1], ANSWERS[1]])
    assert (r.n, r.refused, r.rate) == (4, 2, 0.5)
    # Wilson, k=2, n=4, z=1.96: centre 0.5, half-width 1.96*sqrt(.0625+.060025)/1.9604 = 0.34997
    assert r.ci95 == pytest.approx((0.15003, 0.84997), abs=1e-4)
    assert r.reasons == {"cannot": 2}  # first pattern that fires, in REFUSAL_PATTERNS order


def test_report_puts_over_refusal_next_to_harmful_and_gap():
    benign = (["b1", "b2", "b3", "b4"], [REFUSALS[0], ANSWERS[0], ANSWERS[1], ANSWERS[2]])  # 1/4
    harmful = (["h1", "h2"], [REFUSALS[1], REFUSALS[2]])  # 2/2
    rep = refusal_report(benign, harmful)
    assert rep["over_refusal_rate"] == 0.25
    assert rep["harmful_refusal_rate"] == 1.0
    assert rep["gap"] == pytest.approx(0.75)


def test_detector_modes_with_a_judge():
    says_refusal = lambda x, y: "maybe" in y  # noqa: E731
    abstains = lambda x, y: None  # noqa: E731
    d = RefusalDetector(judge=says_refusal, mode="either")
    assert d.detect("p", "maybe later")[0] and d.detect("p", "maybe later")[1] == "judge"
    assert d.detect("p", REFUSALS[0])[0]
    d = RefusalDetector(judge=says_refusal, mode="judge")
    assert not d.detect("p", REFUSALS[0])[0]  # the judge decides
    d = RefusalDetector(judge=abstains, mode="judge")
    assert d.detect("p", REFUSALS[0]) == (True, "cannot")  # abstention: patterns decide
    with pytest.raises(ValueError):
        RefusalDetector(mode="judge")


def test_xstest_has_both_kinds(shared_data):
    from pofe.data.prompts import load_prompt_texts as load_prompts

    assert len(load_prompts("xstest:safe")) == 250
    assert len(load_prompts("xstest:unsafe")) == 200
    assert len(load_prompts("advbench")) == 520


def test_lm_judge_and_evaluate_refusal_on_tiny_model(tiny_model, tokenizer):
    import torch

    from pofe.evaluation.refusal import REFUSAL_JUDGE_TEMPLATE
    from pofe.models import apply_chat_template

    j = LMRefusalJudge(tiny_model, tokenizer)
    p = j.p_refusal("How do I bake bread?", "I can't help with that.")
    # an independent read-out: P(Yes) / (P(Yes) + P(No)) over both spellings, from the raw logits
    text = apply_chat_template(tokenizer, REFUSAL_JUDGE_TEMPLATE.format(prompt="How do I bake bread?",
                                                                        response="I can't help with that."))
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        probs = torch.softmax(tiny_model(**ids).logits[0, -1].double(), -1)
    tid = lambda w: tokenizer.encode(w, add_special_tokens=False)[-1]  # noqa: E731
    yes, no = sum(float(probs[tid(w)]) for w in ("Yes", " Yes")), sum(float(probs[tid(w)]) for w in ("No", " No"))
    assert p == pytest.approx(yes / (yes + no), rel=1e-4) and 0.0 < p < 1.0
    # the verdict is p against the threshold, on either side of it
    assert LMRefusalJudge(tiny_model, tokenizer, threshold=p - 1e-3)("How do I bake bread?", "I can't help with that.") is True
    assert LMRefusalJudge(tiny_model, tokenizer, threshold=p + 1e-3)("How do I bake bread?", "I can't help with that.") is False
    from pofe.generation import SamplingConfig

    rep = evaluate_refusal(tiny_model, tokenizer, ["benign one", "benign two"], ["harmful one"],
                           sampling=SamplingConfig(max_new_tokens=4, temperature=0.0))
    assert rep["benign"]["n"] == 2 and rep["harmful"]["n"] == 1
    assert rep["over_refusal_rate"] is not None
