"""Self-Instruct prompt generation: ROUGE-L filter, other filters, extraction, the loop's counts."""

from __future__ import annotations

import pytest

from pofe.generation.self_instruct import (
    InstructionFilter,
    RougeFilter,
    SelfInstructConfig,
    build_fewshot_prompt,
    extract_instructions,
    generate_prompts,
    sample_examples,
)


def test_rouge_l_hand_computed():
    f = RougeFilter(["Write a poem about the sea"])
    # LCS = 6 tokens; candidate 7 tokens, reference 6: F1 = 2*6/(7+6) = 12/13
    score, ref = f.max_similarity("Write a short poem about the sea!")
    assert score == pytest.approx(12 / 13) and ref == "Write a poem about the sea"
    assert f.max_similarity("Explain photosynthesis to a child")[0] == pytest.approx(2 * 1 / (5 + 6))  # "a"


def test_rouge_threshold_is_inclusive():
    cfg = SelfInstructConfig(min_words=1)
    filt = InstructionFilter(cfg, ["one two three four five six seven eight nine ten"])
    # LCS 7 of 10 + 10 tokens: F1 = 14/20 = 0.7 exactly -> rejected (>= 0.7)
    assert filt.check("one two three four five six seven alpha beta gamma") == "rouge"
    # LCS 6: F1 = 0.6 -> kept
    assert filt.check("one two three four five six delta alpha beta gamma") is None


def test_filters_in_order():
    cfg = SelfInstructConfig()
    filt = InstructionFilter(cfg, ["Name three famous painters from Spain."])
    assert filt.check("") == "empty"
    assert filt.check("Say hi.") == "too_short"  # 2 words < 4
    assert filt.check(" ".join(["word"] * 151)) == "too_long"
    assert filt.check("- List some fruits that are red") == "format"
    assert filt.check("Draw a cat sitting on a mat") == "blocklist"
    assert filt.check("Describe the image of a sunset over the lake") == "blocklist"
    assert filt.check("Describe imagery in modern poetry briefly") is None  # word boundary: not "image"
    assert filt.check("name  three famous painters from spain.") == "duplicate"
    assert filt.check("Name three famous painters from Italy.") == "rouge"  # 5/6 tokens shared
    ok = "Explain how a bicycle gear system works."
    assert filt.check(ok) is None
    filt.add(ok)
    assert filt.check("explain how a bicycle gear system works.") == "duplicate"  # case/space-insensitive
    assert filt.check("Explain how a bicycle gear system works") == "rouge"  # same tokens, F1 = 1


def test_extract_plain_continuation():
    assert extract_instructions(" Write a limerick about a cat.") == ["Write a limerick about a cat."]
    assert extract_instructions("Task 9: Write a limerick about a cat.\n") == ["Write a limerick about a cat."]


def test_extract_several_tasks_then_answers():
    # The M2/M3 failure mode (App. A.5): several tasks, a separator, then answers.
    text = ("Suggest a name for a bakery.\nTask 10: Summarise the plot of Hamlet in two sentences.\n"
            "Task 11: List three uses of vinegar.\n---\nAnswer to Task 9: Sweet Crumbs.\nTask 12: ignored")
    assert extract_instructions(text) == [
        "Suggest a name for a bakery.",
        "Summarise the plot of Hamlet in two sentences.",
        "List three uses of vinegar.",
    ]


def test_extract_numbered_list():
    # SmolLM2 answers the few-shot prompt with a numbered list (Self-Instruct's old numbering)
    assert extract_instructions("1. Name three fruits that are red.\n2) Describe a sunset in one sentence.") == [
        "Name three fruits that are red.", "Describe a sunset in one sentence."]
    assert extract_instructions("3 + 4 = ? Answer with a number.") == ["3 + 4 = ? Answer with a number."]


def test_extract_cuts_answer_after_blank_line_and_markers():
    assert extract_instructions("Give me a tip for sleeping better.\n\nSure! Try to keep a regular schedule.") == [
        "Give me a tip for sleeping better."]
    assert extract_instructions('"Explain recursion to a beginner."\nResponse: Recursion is...') == [
        "Explain recursion to a beginner."]
    assert extract_instructions("### Task 9: Translate 'good morning' into French.\nOutput: Bonjour") == [
        "Translate 'good morning' into French."]
    assert extract_instructions("\n---\nHere are the answers") == []
    assert extract_instructions("   ") == []


def test_fewshot_prompt_and_sampling():
    p = build_fewshot_prompt(["A first\ntask", "Second task"])
    assert p == "Come up with a series of tasks:\n\nTask 1: A first task\nTask 2: Second task\nTask 3:"
    import random

    cfg = SelfInstructConfig()
    seeds = [f"seed {i}" for i in range(20)]
    ex = sample_examples(seeds, ["gen a", "gen b", "gen c"], cfg, random.Random(0))
    assert len(ex) == 8 and sum(e.startswith("gen") for e in ex) == 2
    ex = sample_examples(seeds, ["gen a"], cfg, random.Random(0))  # fewer generated: fill from seeds
    assert len(ex) == 8 and sum(e.startswith("gen") for e in ex) == 1


def test_generate_prompts_counts_everything():
    outputs = iter([
        "Write a haiku about autumn leaves falling.",            # kept
        "Draw a picture of a house with a garden",               # blocklist
        "Write a haiku about autumn leaves falling!",            # rouge: F1 = 1 (punctuation differs, so not a duplicate)
        "Hi.",                                                   # too_short
        "---\nAnswer: nothing",                                  # no task
        "Name three famous painters from Spain please.\nTask 10: Describe how tides work on Earth.",  # rouge + kept
    ])
    calls = []

    def fake(prompts, sampling, seed):
        calls.append((len(prompts), sampling.temperature, sampling.top_p))
        return [next(outputs) for _ in prompts]

    cfg = SelfInstructConfig(num_prompts=5, max_generations=6, sampling={"batch_size": 2, "temperature": 0.6, "top_p": 0.9})
    kept, stats = generate_prompts(fake, ["Name three famous painters from Spain."], cfg, seed=1)
    assert kept == ["Write a haiku about autumn leaves falling.", "Describe how tides work on Earth."]
    assert calls == [(2, 0.6, 0.9)] * 3
    assert stats["generations"] == 6 and stats["no_task"] == 1 and stats["candidates"] == 6
    assert stats["rejected"] == {"empty": 0, "too_short": 1, "too_long": 0, "format": 0, "blocklist": 1,
                                 "duplicate": 0, "rouge": 2}
    assert stats["candidates"] == stats["kept"] + sum(stats["rejected"].values()) + stats["surplus"]


def test_generate_prompts_stops_at_target():
    def fake(prompts, sampling, seed):
        return ["Task 9: Explain what a leap year is.\nTask 10: Describe the water cycle in simple words."
                for _ in prompts]

    cfg = SelfInstructConfig(num_prompts=1, sampling={"batch_size": 1})
    kept, stats = generate_prompts(fake, ["Tell me a joke about cats."], cfg)
    assert kept == ["Explain what a leap year is."] and stats["surplus"] == 1 and stats["generations"] == 1
