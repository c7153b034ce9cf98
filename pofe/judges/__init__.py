"""AI feedback: pairwise and pointwise judges behind one protocol.

``build_judge(JudgeConfig(...), **runtime)`` builds any judge; ``pairwise_probability``
turns two ordered choice log-prob pairs into the debiased P(A better);
``summarize_judgments`` is the one summary every command reports.
"""

from pofe.judges.base import PairwiseJudge, PointwiseJudge
from pofe.judges.probability import PairwiseProbability, pairwise_probability
from pofe.judges.registry import JUDGES, JudgeConfig, build_judge
from pofe.judges.summary import summarize_judgments, summarize_scores

__all__ = [
    "PairwiseJudge",
    "PointwiseJudge",
    "PairwiseProbability",
    "pairwise_probability",
    "JUDGES",
    "JudgeConfig",
    "build_judge",
    "summarize_judgments",
    "summarize_scores",
]
