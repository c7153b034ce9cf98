"""AI feedback: pairwise and pointwise judges behind one protocol.

``build_judge(LLMJudgeConfig(...), **runtime)`` builds any judge (the config class of each
kind is in :mod:`pofe.judges.config`; ``JudgeConfig`` is their discriminated union, the type
of every command's ``judge:`` section); ``pairwise_probability`` turns two ordered choice
log-prob pairs into the debiased P(A better); ``summarize_judgments`` is the one summary
every command reports. Importing this package loads no torch.
"""

from pofe.judges.base import (
    Capability,
    EndpointError,
    JudgeBackend,
    JudgeCapabilityError,
    JudgeConfigError,
    JudgeError,
    PairwiseJudge,
    PointwiseJudge,
    as_pairwise,
    has_capability,
    require_capability,
)
from pofe.judges.config import JUDGE_CONFIGS, JudgeConfig, parse_judge_config
from pofe.judges.probability import PairwiseProbability, pairwise_probability
from pofe.judges.registry import JUDGES, build_judge
from pofe.judges.summary import summarize_judgments, summarize_scores

__all__ = [
    "Capability",
    "EndpointError",
    "JudgeBackend",
    "JudgeCapabilityError",
    "JudgeConfigError",
    "JudgeError",
    "PairwiseJudge",
    "PointwiseJudge",
    "as_pairwise",
    "has_capability",
    "require_capability",
    "PairwiseProbability",
    "pairwise_probability",
    "JUDGES",
    "JUDGE_CONFIGS",
    "JudgeConfig",
    "parse_judge_config",
    "build_judge",
    "summarize_judgments",
    "summarize_scores",
]
