"""Worlds where the truth is known, so that the seeds' claims can be checked in miniature on a
CPU where no judge is better than chance (the embedded 135M judge picks position 1).

* The truth is a programmatic oracle that does not saturate: a response is better the closer its
  length in words is to a target (OAIF's evaluator is a stronger LLM than the annotator; here it
  is the oracle itself, and "closer to a window", unlike "shorter wins", has an optimum a policy
  can overshoot).
* Annotators are planted programs behind the judge protocol, each with one known knob: an
  accuracy (:class:`NoisyAnnotator`, OAIF Sec. 4.5's annotator size as a planted error rate) or
  an instruction in its prompt (:class:`InstructedAnnotator`, Sec. 4.6's three prompts). They
  stand in for an LLM annotator that follows its prompt; they are not one.
* The policy is a tiny random Llama over the embedded model's tokenizer, trained in seconds.
"""

from __future__ import annotations

import random
from pathlib import Path

from pofe.judges.programmatic import ValueJudge
from pofe.records import Judgment


def words(text: str) -> int:
    return len(text.split())


def target_length_oracle(target: int) -> ValueJudge:
    """The truth: P(A better) = 1, 0 or 0.5 as A's length in words is closer to ``target`` than B's."""
    return ValueJudge(lambda prompt, response, reference=None: -abs(words(response) - target),
                      f"oracle:length~{target}")


class NoisyAnnotator:
    """The oracle's verdict, flipped with probability ``1 - accuracy`` (a tie stays a tie): an
    annotator whose agreement with the truth is planted. Seeded, and a function of the call
    sequence only, so a run is reproducible."""

    def __init__(self, oracle: ValueJudge, accuracy: float, seed: int = 0):
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy {accuracy} is not in [0, 1]")
        self.oracle, self.accuracy, self.rng = oracle, accuracy, random.Random(seed)
        self.id = f"{oracle.id}@accuracy={accuracy:g}"

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        out = []
        for j in self.oracle.judge(prompts, responses_a, responses_b, references=references):
            flip = j.p is not None and j.p != 0.5 and self.rng.random() >= self.accuracy
            p = 1.0 - j.p if flip else j.p
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=j.consistent, parse_ok=j.parse_ok, judge_id=self.id))
        return out


# OAIF Sec. 4.6: the annotator is asked for the more helpful response, then additionally for a short
# one, then a very short one; the trained policies' mean lengths fell from ~120 to ~90 to ~40 tokens.
INSTRUCTIONS = {
    "helpful": "Which response is more helpful?",
    "short": "Which response is more helpful? Prefer short responses.",
    "very short": "Which response is more helpful? Prefer very short responses.",
}


class InstructedAnnotator:
    """A planted annotator that follows its prompt's length instruction: "short" prefers about half
    of ``helpful_words``, "very short" about a sixth, no instruction ``helpful_words`` (the
    helpfulness it reads is length up to that point, as a reader of a tiny model's text would)."""

    def __init__(self, instruction: str, helpful_words: int):
        if instruction not in INSTRUCTIONS:
            raise ValueError(f"instruction {instruction!r} is not one of {sorted(INSTRUCTIONS)}")
        self.prompt = INSTRUCTIONS[instruction]
        wants = {"helpful": 1.0, "short": 0.5, "very short": 1 / 6}[instruction]
        self.inner = target_length_oracle(max(1, round(helpful_words * wants)))
        self.id = f"instructed:{instruction}"

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        return [Judgment(p=j.p, p_ab=j.p_ab, p_ba=j.p_ba, consistent=j.consistent, parse_ok=j.parse_ok,
                         judge_id=self.id) for j in self.inner.judge(prompts, responses_a, responses_b)]


def tiny_policy(folder: Path, *, hidden_size: int = 64, seed: int = 0, stop_bias: float = 1.1) -> Path:
    """A tiny random Llama over the embedded model's tokenizer, saved to ``folder`` (once), whose
    answers end at a random point: a random model almost never samples EOS among 49k tokens, so
    every answer would run to ``max_new_tokens`` and no preference about length could be learnt.
    Every token's embedding carries a constant in dimension 0, which the final RMSNorm keeps large,
    and the (untied) output row of EOS alone reads it with weight ``stop_bias``: a planted stop
    rate that training can move (1.1: an EOS logit near 8.8 against 49k near-equal ones, about 12% a
    token, answers of 8 tokens on average)."""
    if (folder / "config.json").exists():
        return folder
    import torch

    from pofe.models import load_tokenizer, tiny_causal_lm

    tok = load_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=hidden_size, seed=seed)
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        model.lm_head = torch.nn.Linear(hidden_size, emb.shape[0], bias=False)
        model.lm_head.weight.copy_(emb)
        emb[:, 0] = 4.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tok.eos_token_id, 0] = stop_bias
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
