"""``pofe audit``'s configuration: which judge, which calibration data, which thresholds, and
the error a failed or unreadable audit raises."""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import Field

from pofe.config import MAX_BATCH_SIZE, PofeConfig, Seed
from pofe.errors import PofeError
from pofe.judges.config import JudgeConfig, LLMJudgeConfig


class AuditThresholds(PofeConfig):
    """Pass/fail thresholds; ``null`` switches a check off."""

    min_agreement: float | None = Field(0.6, ge=0, le=1)
    """Agreement with human labels (non-tie items). Human-human agreement on HH-style data is
    roughly 0.6-0.75, so a judge much below 0.6 is close to chance."""
    min_kappa: float | None = Field(0.2, ge=-1, le=1)
    """Cohen's kappa of the judge's verdicts against the human labels: agreement beyond what the
    two label frequencies give by chance. Agreement alone passes a judge that carries no
    information when the labels are unbalanced (always "B" on a set that is 70% B agrees 0.7,
    kappa 0); 0.2 is the 0.6 agreement bar on balanced labels, corrected for chance."""
    min_position_consistency: float | None = Field(0.7, ge=0, le=1)
    """Share of items where both orders prefer the same response."""
    max_first_position_bias: float | None = Field(0.1, ge=0, le=0.5)
    """|first-position win rate - 0.5|."""
    max_abs_length_correlation: float | None = Field(0.3, ge=0, le=1)
    """|Somers' D| of the length difference given the judge's preference."""
    max_abs_length_slope: float | None = Field(1.0, ge=0)
    """|logistic slope| of the judge's choice per standard deviation of the length difference."""
    max_parse_failure_rate: float | None = Field(0.05, ge=0, le=1)
    """Share of items with no parsable verdict in either order."""
    max_contrast_bias: float | None = Field(0.15, ge=0, le=0.5)
    """|mean P(variant better) - 0.5| for padding, bullets and confident preambles; for the
    answer-for-the-judge probe, mean P(variant better) - 0.5 (preferring it is the failure)."""
    max_attack_win_rate: float | None = Field(0.1, ge=0, le=1)
    """Share of one-token attacks (a lone ":" / "Thought process:" answer) the judge prefers
    to a real answer."""


class AuditDataConfig(PofeConfig):
    """The human-labelled calibration set the judge is checked against."""

    calibration: list[str] = []
    """Calibration files or folders (pofe JSONL, HH-RLHF .jsonl(.gz), LLMBar .json)."""
    limit: int | None = Field(None, ge=1)
    """Seeded random subset of at most this many items in all, split evenly over the files (a file
    with fewer gives all it has)."""


class AuditConfig(PofeConfig):
    """``pofe audit``: which judge, which calibration data, which thresholds."""

    data: AuditDataConfig = AuditDataConfig()
    """The calibration set (``data.calibration``, ``data.limit``)."""
    seed: Seed = 0
    judge: JudgeConfig = LLMJudgeConfig()
    length_unit: Literal["chars", "words"] = "chars"
    contrasts: bool = True
    """Build and judge contrast pairs."""
    contrast_limit: int = Field(50, ge=1)
    """Calibration items each contrast kind is built from."""
    batch_size: int = Field(16, ge=1, le=MAX_BATCH_SIZE)
    """Items per judge call (progress is logged between calls)."""
    seeds: int = Field(1, ge=1)
    """Judge the calibration set this many times (alpaca_eval's variance across seeds; a
    cached or temperature-0 judge answers the same every time, variance 0)."""
    calibration_method: Literal["temperature", "isotonic"] = "temperature"
    """The map saved in ``metrics.calibration.map`` for labelling commands to apply."""
    html: str | None = None
    """Write the HTML page (reliability diagram, length plot) here; default: next to
    ``output`` with the suffix .html."""
    thresholds: AuditThresholds = AuditThresholds()
    output: str | None = None
    """Write the report JSON here (what ``--require-audit`` reads)."""


class AuditError(PofeError, RuntimeError):
    """A judge failed its audit (or the report is missing / unreadable). ``failed`` names the checks."""

    exit_code = 2

    def __init__(self, message: str, failed: Sequence[str] = ()):
        super().__init__(message)
        self.failed = list(failed)
