"""AI feedback: pairwise and pointwise judges behind one protocol."""

from pofe.judges.base import PairwiseJudge, PointwiseJudge

__all__ = ["PairwiseJudge", "PointwiseJudge"]
