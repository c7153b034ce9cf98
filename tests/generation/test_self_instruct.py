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
    completion_fn,
    is_preamble,
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
    assert stats["rejected"] == {"empty": 0, "preamble": 0, "too_short": 1, "too_long": 0, "format": 0,
                                 "blocklist": 1, "duplicate": 0, "rouge": 2}
    assert stats["candidates"] == stats["kept"] + sum(stats["rejected"].values()) + stats["surplus"]


def test_generate_prompts_stops_at_target():
    def fake(prompts, sampling, seed):
        return ["Task 9: Explain what a leap year is.\nTask 10: Describe the water cycle in simple words."
                for _ in prompts]

    cfg = SelfInstructConfig(num_prompts=1, sampling={"batch_size": 1})
    kept, stats = generate_prompts(fake, ["Tell me a joke about cats."], cfg)
    assert kept == ["Explain what a leap year is."] and stats["surplus"] == 1 and stats["generations"] == 1


def test_preambles_are_filtered_not_kept():
    """With the chat template SmolLM2-Instruct answers the list, and its "Sure, here are the
    tasks:" lead-ins would be kept as prompts (3 of 3 once were)."""
    for text in ("Sure, here are the tasks:", "Here are some more tasks for you:", "Certainly! Below are 5 new tasks",
                 "Okay, I will write three new instructions.", "A list of new tasks follows:",
                 "Here's a new task: write a poem"):
        assert is_preamble(text), text
    for text in ("Translate the following sentence into French:", "Write a poem about the sea.",
                 "Summarise the plot of Hamlet in three sentences.", "Here and there: describe a city at dawn",
                 "Explain why the sky is blue to a child"):
        assert not is_preamble(text), text
    filt = InstructionFilter(SelfInstructConfig(), [])
    assert filt.check("Sure, here are the tasks:") == "preamble"
    outputs = iter(["Sure, here are the tasks:", "Write a haiku about autumn leaves falling."])
    kept, stats = generate_prompts(lambda ps, s, seed: [next(outputs) for _ in ps], ["Tell me a joke about cats."],
                                   SelfInstructConfig(num_prompts=2, max_generations=2, sampling={"batch_size": 1}))
    assert kept == ["Write a haiku about autumn leaves falling."] and stats["rejected"]["preamble"] == 1


def test_generated_shots_come_only_from_earlier_iterations():
    """Self-instruct's 2 "generated" demonstrations are drawn from the earlier
    iterations' pool; prompts kept earlier in this very call are never shown back."""
    seen = []
    fresh = iter(f"Task 9: Describe fresh topic number {w} in detail." for w in
                 ("one", "two", "three", "four", "five", "six", "seven", "eight"))

    def fake(prompts, sampling, seed):
        seen.extend(prompts)
        return [next(fresh) for _ in prompts]

    machine = ["Earlier generated task about tides.", "Earlier generated task about volcanoes."]
    seeds = [f"Seed task number {w} about cooking." for w in ("one", "two", "three", "four", "five", "six")]
    cfg = SelfInstructConfig(num_prompts=4, max_generations=4, rouge_threshold=1.0, sampling={"batch_size": 1})
    kept, _ = generate_prompts(fake, seeds, cfg, machine=machine, seed=3)
    assert len(kept) == 4 and len(seen) == 4
    for p in seen:
        shots = [line.split(": ", 1)[1] for line in p.splitlines() if line.startswith("Task ") and ": " in line]
        assert len(shots) == 8 and sum(s in machine for s in shots) == 2 and not set(shots) & set(kept)
    # with no earlier iterations, all 8 come from the seeds (6 seeds here: all of them)
    seen.clear()
    fresh = iter(f"Task 9: Explain brand new idea {w} clearly." for w in ("a", "b", "c"))
    generate_prompts(fake, seeds, SelfInstructConfig(num_prompts=3, max_generations=3, sampling={"batch_size": 1}))
    for p in seen:
        shots = [line.split(": ", 1)[1] for line in p.splitlines() if line.startswith("Task ") and ": " in line]
        assert set(shots) <= set(seeds)


@pytest.mark.slow
def test_completion_fn_sends_a_raw_prompt_not_the_chat_template(tokenizer, tiny_model):
    """The few-shot list reaches the model as written (no system prompt, no user turn)."""
    import torch

    from pofe.generation import SamplingConfig, generate

    text = build_fewshot_prompt(["Write a poem about the sea.", "Name three rivers in Africa."])
    [[c]] = generate(tiny_model, tokenizer, [text], n=1, sampling=SamplingConfig(max_new_tokens=2, temperature=0.0),
                     chat_template=False)
    assert list(c.prompt_token_ids) == tokenizer(text)["input_ids"]
    assert "<|im_start|>" not in tokenizer.decode(c.prompt_token_ids)
    [[templated]] = generate(tiny_model, tokenizer, [text], n=1, sampling=SamplingConfig(max_new_tokens=2, temperature=0.0))
    assert "<|im_start|>" in tokenizer.decode(templated.prompt_token_ids)  # the default (chat) path differs
    torch.manual_seed(0)
    out = completion_fn(tiny_model, tokenizer)([text], SelfInstructConfig().sampling, 0)
    assert len(out) == 1 and isinstance(out[0], str)
