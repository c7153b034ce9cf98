"""Where ``pofe rl``'s reward comes from (``reward:`` of its config) and how it is built:
a programmatic function of the response, a ``pofe rm`` reward model, a pointwise judge's score
(direct RLAIF), or a tournament of each prompt's samples under a pairwise judge."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pofe.config import ConfigError, PofeConfig
from pofe.judges.base import Capability, require_capability
from pofe.judges.config import JudgeConfig
from pofe.loops.rl.policy_gradient import JudgeScoreReward, LengthReward, RewardFn, RewardFunctionName, plugin_reward


class PairwiseRewardConfig(PofeConfig):
    """``reward.kind: pairwise``: how each prompt's samples are compared (``pofe.loops.rl.tournament``)."""

    pattern: Literal["all-pairs", "circular", "chunked"] = "all-pairs"
    """Matchups per group of k samples: all-pairs (k(k-1)/2), circular (i vs i+1 mod k: k) or chunked
    (chunks of group_size, all pairs inside each: linear in k)."""
    group_size: int = Field(3, ge=2)
    """chunked: samples per chunk m; m <= 3 keeps the cost within 2k ordered comparisons per group."""
    both_orders: bool = True
    """Read every matchup as (a, b) and (b, a) and average (position bias cancels); false halves the cost and keeps it."""
    score: Literal["mean", "bt"] = "mean"
    """A sample's reward: its mean soft win score (0..1) or its per-group Bradley-Terry strength (logit scale)."""
    bt_l2: float = Field(0.1, gt=0)
    """score bt: ridge on the strengths (keeps them finite when a sample wins every comparison)."""
    calibration: str | None = None
    """An audit report (``pofe audit`` output) whose fitted calibration map is applied to every verdict's p;
    checked when the config is parsed."""

    @field_validator("calibration")
    @classmethod
    def _readable_map(cls, v: str | None) -> str | None:
        if v is not None:
            from pofe.labels import load_calibration_map

            try:
                load_calibration_map(v)
            except (OSError, ValueError) as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _applicable(self):
        # A setting the chosen pattern or score never reads would silently do nothing.
        if self.pattern != "chunked" and self.group_size != 3:
            raise ConfigError(f"bad value for 'reward.pairwise.group_size': it applies only to pattern chunked "
                              f"(pattern is {self.pattern}); remove it")
        if self.score != "bt" and self.bt_l2 != 0.1:
            raise ConfigError("bad value for 'reward.pairwise.bt_l2': it applies only to score bt (score is mean); remove it")
        return self


class RewardShapingConfig(PofeConfig):
    """Group length and style shaping of the optimised reward (``pofe.loops.rl.policy_gradient.group_shaping``):
    each term is coefficient x feature, centred within each prompt's group of k samples, so a group's
    mean reward is unchanged and only the ranking inside it moves."""

    length: float = Field(0.0, allow_inf_nan=False)
    """Added per response token (e.g. -0.01 against a judge that prefers longer answers; see the audit's
    length_correlation / length_slope)."""
    lists: float = Field(0.0, allow_inf_nan=False)
    """Added per markdown list item (a line starting with -, *, + or 1.; e.g. -0.05 against a judge that
    prefers bulleted answers: the audit's bullets contrast)."""

    @property
    def active(self) -> bool:
        return bool(self.length or self.lists)


class RewardConfig(PofeConfig):
    """Where the reward comes from."""

    kind: Literal["programmatic", "reward-model", "judge", "pairwise"] = "programmatic"
    """programmatic (a function of the response), reward-model (a ``pofe rm`` model), judge (a pointwise judge)
    or pairwise (a tournament of each prompt's samples under a pairwise judge)."""
    model: str | None = None
    """reward-model: a ``pofe rm`` output directory (its ``final/``: AutoModelForSequenceClassification, num_labels = 1)."""
    max_length: int = Field(512, ge=1)
    """reward-model: tokens per (prompt, response) scored."""
    # judge
    judge: JudgeConfig | None = None
    """judge: a pointwise judge (kind expected-score for direct RLAIF, rubric, reward-model, length, ...);
    pairwise: any pairwise judge (llm, llamacpp, openai, vllm, length, keyword, reward-model, ...)."""

    @field_validator("judge")
    @classmethod
    def _judge_fits_kind(cls, v, info: ValidationInfo):
        if v is not None:
            if info.data.get("kind") == "pairwise":  # the tournament compares two completions
                require_capability(v, Capability.PAIRWISE, where="reward.judge")
            else:  # the reward of one completion is a pointwise score
                require_capability(v, Capability.POINTWISE, where="reward.judge")
        return v

    pairwise: PairwiseRewardConfig = PairwiseRewardConfig()
    """pairwise: matchup pattern, orders, score and calibration of the tournament."""

    @field_validator("pairwise")
    @classmethod
    def _pairwise_fits_kind(cls, v: PairwiseRewardConfig, info: ValidationInfo):
        if info.data.get("kind") != "pairwise" and v.model_dump() != PairwiseRewardConfig().model_dump():
            raise ConfigError(f"bad value for 'reward.pairwise': it applies only to reward.kind = pairwise "
                              f"(kind is {info.data.get('kind')}); remove it")
        judge = info.data.get("judge")
        if not v.both_orders and getattr(judge, "both_orders", False):
            # The judge would still read both orders and average them: one order is not what runs.
            raise ConfigError("bad value for 'reward.pairwise.both_orders': false, but reward.judge.both_orders is true "
                              "(the judge reads both orders itself); set reward.judge.both_orders=false too")
        return v
    # programmatic
    function: RewardFunctionName = "length"
    """programmatic: the function of the response: length, or a reward an installed plugin package adds (``pofe.rewards``)."""
    prefer: Literal["shorter", "longer"] = "shorter"
    """programmatic: the direction rewarded."""
    unit: Literal["tokens", "chars", "words"] = "tokens"
    """programmatic: how length is counted."""
    scale: float = Field(1.0, gt=0)
    """Programmatic: reward = ±scale · length / normaliser (max_new_tokens for tokens, 4x that for chars,
    the same for words), so rewards sit in [−scale, 0] or [0, scale]."""
    shaping: RewardShapingConfig = RewardShapingConfig()
    """Length and style terms added to the reward, zero-centred within each prompt's group (any kind)."""

    @model_validator(mode="after")
    def _source_given(self):
        # Checked when the config is parsed, not after the run folder exists and the policy loaded.
        if self.kind == "reward-model" and not self.model:
            raise ValueError("reward.kind = reward-model needs reward.model (a pofe rm output directory)")
        if self.kind == "judge" and self.judge is None:
            raise ValueError("reward.kind = judge needs reward.judge (e.g. kind: expected-score)")
        if self.kind == "pairwise" and self.judge is None:
            raise ValueError("reward.kind = pairwise needs reward.judge (any pairwise judge, e.g. kind: length or llm)")
        if self.function != "length":  # a plugin reward takes no length settings: set, they would do nothing
            fields = type(self).model_fields
            for key in ("prefer", "unit", "scale"):
                if getattr(self, key) != fields[key].default:
                    raise ConfigError(f"bad value for 'reward.{key}': it applies only to function length "
                                      f"(function is {self.function}); remove it")
        return self


def build_reward(cfg: RewardConfig, *, max_new_tokens: int, judge=None) -> RewardFn:
    # RewardConfig guarantees reward.model / reward.judge for their kinds (checked when parsed).
    if cfg.kind == "programmatic":
        if cfg.function != "length":  # a plugin's: (prompts, completions) -> (rewards, info)
            return plugin_reward(cfg.function)
        return LengthReward(prefer=cfg.prefer, unit=cfg.unit, scale=cfg.scale, max_new_tokens=max_new_tokens)
    if cfg.kind == "pairwise":
        from pofe.loops.rl.policy_gradient import PairwiseTournamentReward

        pw = cfg.pairwise
        calib = None
        if pw.calibration:
            from pofe.labels import load_calibration_map

            calib = load_calibration_map(pw.calibration)
        if judge is None:
            from pofe.judges.registry import build_judge

            judge = build_judge(cfg.judge)
        return PairwiseTournamentReward(judge, pattern=pw.pattern, group_size=pw.group_size, both_orders=pw.both_orders,
                                        score=pw.score, calibration=calib, l2=pw.bt_l2)
    if cfg.kind == "reward-model":
        # The shared reward-model judge (P(A>B) = sigma(r_A - r_B)) reads a ``pofe rm``
        # directory; its pointwise ``score`` is r(x, y), rendered exactly as in training.
        from pofe.judges.reward_model import RewardModelJudge

        return JudgeScoreReward(RewardModelJudge(cfg.model, max_length=cfg.max_length))
    if judge is None:
        from pofe.judges.registry import build_judge

        judge = build_judge(cfg.judge)
    return JudgeScoreReward(judge)


_LENGTH_BIAS = ("length_correlation", "length_slope", "longer_preferred_rate", "human_longer_preferred_rate",
                "p_prefers_lists")


def audit_length_bias(report_path) -> dict | None:
    """What the ``--require-audit`` report that gated the run measured of the judge's length and list
    bias (Somers' D, logistic slope per sd, how often it picks the longer response next to the humans,
    P(prefers lists)), with the report's path: kept in the run's summary so that ``pofe report`` can
    show reward shaping next to the bias it counters, whether or not the report file is still there."""
    if report_path is None:
        return None
    from pofe.evaluation.audit import read_audit_report

    rep = read_audit_report(report_path)  # the gate has already read and accepted it
    m = rep.get("metrics") or {}
    return {"path": str(report_path), "judge": rep.get("judge"), **{k: m.get(k) for k in _LENGTH_BIAS}}
