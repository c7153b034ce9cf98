"""Toy plugins for pofe, one per entry-point group (see pyproject.toml): what a separate
package writes to add a loss, a judge kind, a judge backend or an RL reward without editing pofe."""

from __future__ import annotations

import time
from typing import ClassVar

import torch

from pofe.config import PofeConfig
from pofe.judges.base import BackendStats, GenOut, JudgeConfigError, check_batch
from pofe.losses import LossOutput
from pofe.records import Judgment


# -- pofe.losses: the PreferenceLoss signature ----------------------------------------------
def margin_hinge(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, *,
                 beta: float = 0.5, p=1.0) -> LossOutput:
    """max(0, 2 - beta*h) with h the log-ratio margin; soft p weights the mirrored hinge by 1 - p.
    At h = 0 (policy = reference) it is 2 whatever beta and p are."""
    chosen = beta * (policy_chosen_logps - ref_chosen_logps)
    rejected = beta * (policy_rejected_logps - ref_rejected_logps)
    z = chosen - rejected
    p = torch.as_tensor(p, dtype=z.dtype).expand_as(z)
    losses = p * torch.clamp(2.0 - z, min=0.0) + (1.0 - p) * torch.clamp(2.0 + z, min=0.0)
    return LossOutput(losses, chosen.detach(), rejected.detach(), (chosen - rejected).detach())


# -- pofe.rm_losses: (margin, p) -> per-pair losses ------------------------------------------
def rm_hinge(margin, p=1.0):
    """max(0, 1 - margin) for a hard label; soft p weights the mirrored hinge by 1 - p."""
    p = torch.as_tensor(p, dtype=margin.dtype).expand_as(margin)
    return p * torch.clamp(1.0 - margin, min=0.0) + (1.0 - p) * torch.clamp(1.0 + margin, min=0.0)


# -- pofe.judges: an options model with build() and capabilities -----------------------------
class WordJudge:
    """Prefers the response that contains ``word`` (case-insensitive): p = 1, 0, or 0.5 when
    both or neither do."""

    capabilities = frozenset({"pairwise"})

    def __init__(self, word: str):
        self.word = word.lower()
        self.id = f"toy-word:{self.word}"

    def judge(self, prompts, responses_a, responses_b, *, references=None):
        check_batch(prompts, responses_a, responses_b)
        out = []
        for a, b in zip(responses_a, responses_b):
            ha, hb = self.word in a.lower(), self.word in b.lower()
            p = 0.5 if ha == hb else (1.0 if ha else 0.0)
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=True, parse_ok=True, judge_id=self.id))
        return out


class WordJudgeOptions(PofeConfig):
    """``judge.kind: toy-word``: prefers the response containing ``judge.options.word``."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"pairwise"})
    word: str
    """The word the preferred response contains."""

    def build(self, **runtime):
        return WordJudge(self.word)


# -- pofe.judge_backends: called as backend(judge_config, **runtime) -------------------------
class FixedTextBackend:
    """Answers every generation request with the same text, 'Score: 4' (a rubric judge reads 4)."""

    kind = "toy-fixed"
    fingerprint = "toy-fixed:v1"
    cacheable = False
    special_strings = ()

    def __init__(self, judge_config, **runtime):
        self.text = "Score: 4"
        self.stats = BackendStats()

    def validate_choices(self, choices):
        pass

    def read_choices(self, requests, choices):
        raise JudgeConfigError("the toy-fixed backend only generates text")

    def generate(self, requests, *, n=1, temperature=0.0, top_p=1.0, max_new_tokens=128, seed=None):
        t0 = time.perf_counter()
        self.stats.add(calls=1, seconds=time.perf_counter() - t0)
        return [[GenOut(self.text, tokens=3) for _ in range(n)] for _ in requests]

    def close(self):
        pass


# -- pofe.rewards: (prompts, completions) -> (rewards, info) --------------------------------
def prompt_words(prompts, completions):
    """The reward of a completion is the number of words of its prompt; info counts the calls' samples."""
    return [float(len(x.split())) for x in prompts], {"metrics": {"toy/scored": len(completions)}}


prompt_words.id = "toy-prompt-words"
