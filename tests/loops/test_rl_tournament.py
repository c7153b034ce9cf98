"""Pairwise tournament rewards (``reward.kind: pairwise`` of ``pofe rl``): matchup patterns,
scores and the Bradley-Terry fit by hand, a planted judge with a position bias ranked by
both orders vs one order, judge-call counts, masking of unreadable comparisons, calibration,
config errors, and two real rl steps with the length judge."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import kendalltau

from pofe.judges.base import Capability
from pofe.records import Completion, Judgment
from pofe.loops.rl.tournament import (
    Tournament,
    bradley_terry,
    group_scores,
    groups_of,
    matchups,
)


def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class PlantedJudge:
    """One order per verdict: P(first shown better) = sigma((v_first - v_second)/tau + bias + noise),
    the noise drawn per ordered read from a seeded generator. ``unreadable`` pairs of texts
    (in the order shown) give p=None. Counts every ordered comparison it is asked for."""

    capabilities = frozenset({Capability.PAIRWISE})
    both_orders = False

    def __init__(self, values: dict[str, float], *, tau: float = 1.0, bias: float = 0.0, noise: float = 0.0,
                 seed: int = 0, unreadable=()):
        self.values, self.tau, self.bias, self.noise = values, tau, bias, noise
        self.rng = np.random.default_rng(seed)
        self.unreadable = set(unreadable)
        self.calls = 0
        self.id = "planted"

    def judge(self, prompts, responses_a, responses_b, *, references=None):
        out = []
        for a, b in zip(responses_a, responses_b):
            self.calls += 1
            if (a, b) in self.unreadable:
                out.append(Judgment(p=None, p_ab=None, p_ba=None, consistent=None, parse_ok=False, judge_id=self.id))
                continue
            z = (self.values[a] - self.values[b]) / self.tau + self.bias + self.noise * self.rng.standard_normal()
            p = _sig(z)
            out.append(Judgment(p=p, p_ab=p, p_ba=None, consistent=None, parse_ok=True, judge_id=self.id))
        return out


# ----------------------------------------------------------------------------- pure pieces

def test_matchup_patterns_by_hand():
    assert matchups(4, "all-pairs") == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert matchups(4, "circular") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert matchups(2, "circular") == [(0, 1)]  # not (0, 1) and (1, 0): the same matchup twice
    # chunks {0,1,2} {3,4,5} {6,7}
    assert matchups(8, "chunked", 3) == [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), (6, 7)]
    # chunks {0,1,2} {3,4,5} {6}: the lone sample meets the first of the chunk before it
    assert matchups(7, "chunked", 3) == [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), (3, 6)]
    assert matchups(1, "all-pairs") == []
    assert [list(r) for r in groups_of(["x", "x", "y", "y", "y", "x"])] == [[0, 1], [2, 3, 4], [5]]


def test_bradley_terry_three_players_by_hand_and_against_scipy():
    # Soft outcomes equal to sigma(theta_i - theta_j) for theta = (1, 0, -1): the likelihood's
    # gradient is zero there, so with a negligible ridge the fit is exactly (1, 0, -1).
    games = [(0, 1, _sig(1.0)), (1, 2, _sig(1.0)), (0, 2, _sig(2.0))]
    assert bradley_terry(3, games, l2=1e-9).tolist() == pytest.approx([1.0, 0.0, -1.0], abs=1e-6)
    # Hard 0/1 outcomes (a sample winning everything) stay finite under the ridge; scipy's
    # L-BFGS on the same objective is the independent implementation.
    rng = np.random.default_rng(3)
    games = [(0, 1, 1.0), (0, 2, 1.0), (1, 2, 0.7), (2, 3, 0.4), (3, 4, 1.0), (1, 4, 0.55), (0, 4, 0.0)]

    def f(t):
        d = np.array([t[a] - t[b] for a, b, _ in games])
        y = np.array([g[2] for g in games])
        return float(np.sum(y * np.logaddexp(0, -d) + (1 - y) * np.logaddexp(0, d)) + 0.05 * t @ t)

    want = minimize(f, rng.normal(size=5), method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15}).x
    got = bradley_terry(5, games, l2=0.1)
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-5)
    assert abs(got.sum()) < 1e-9  # the ridge centres the strengths of a connected group


def test_mean_scores_masking_and_the_group_mean_fill_by_hand():
    pairs = [(0, 1), (0, 2), (1, 2)]
    r = group_scores(3, pairs, [0.8, 0.6, None])
    # 0: (0.8 + 0.6)/2; 1: 1 - 0.8; 2: 1 - 0.6. The unreadable (1, 2) counts for neither, not as 0 or 0.5.
    assert r.rewards == pytest.approx([0.7, 0.2, 0.4]) and r.unreadable == 1 and r.readable == 2
    r = group_scores(3, pairs, [0.9, None, None])
    # sample 2 has no readable comparison: the mean of the others, (0.9 + 0.1)/2, so its advantage is 0
    assert r.rewards == pytest.approx([0.9, 0.1, 0.5]) and r.no_comparison == 1 and r.unreadable == 2
    r = group_scores(3, pairs, [None, None, None])
    assert r.rewards == [None, None, None] and r.no_comparison == 3 and r.bt_spread is None
    r = group_scores(2, [(0, 1)], [0.5])
    assert r.rewards == [0.5, 0.5] and r.ties == 1 and r.bt_spread == pytest.approx(0.0)
    # bt: two players, theta_0 - theta_1 solves logit(sigmoid(d)) ridge equation; symmetric around 0
    r = group_scores(2, [(0, 1)], [_sig(1.0)], score="bt", l2=1e-9)
    assert r.rewards == pytest.approx([0.5, -0.5], abs=1e-6) and r.bt_spread == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------- planted judge

def _planted(k=8, groups=25, seed=0, **judge_kw):
    rng = np.random.default_rng(seed)
    values, prompts, texts = {}, [], []
    for g in range(groups):
        for i in range(k):
            t = f"g{g}-s{i}"
            values[t] = float(rng.normal())
            prompts.append(f"prompt {g}")
            texts.append(t)
    return PlantedJudge(values, **judge_kw), prompts, texts


def _mean_kendall(prompts, texts, rewards, values, k):
    taus = []
    for s in range(0, len(texts), k):
        taus.append(kendalltau([values[t] for t in texts[s:s + k]], rewards[s:s + k]).statistic)
    return float(np.mean(taus))


@pytest.mark.parametrize("score", ["mean", "bt"])
def test_planted_position_bias_both_orders_rank_by_true_value_one_order_does_not(score):
    """Acceptance: p = sigma((v_a - v_b)/tau) + a planted position bias (+1.5 logits for the
    first-shown response) and read noise (sd 0.5 logits), k = 8, 25 groups, all pairs.
    Measured mean Kendall tau of the group rewards vs the true values: both orders 0.917, one
    order 0.403, for the mean score and for bt alike (in a complete round robin the
    Bradley-Terry fit ranks by total score)."""
    kw = {"tau": 1.0, "bias": 1.5, "noise": 0.5}
    judge, prompts, texts = _planted(**kw)
    both, m_both = Tournament(judge, pattern="all-pairs", both_orders=True, score=score)(prompts, texts)
    tau_both = _mean_kendall(prompts, texts, both, judge.values, 8)
    judge1, _, _ = _planted(**kw)
    one, m_one = Tournament(judge1, pattern="all-pairs", both_orders=False, score=score)(prompts, texts)
    tau_one = _mean_kendall(prompts, texts, one, judge.values, 8)
    assert tau_both >= 0.9
    assert tau_both == pytest.approx(0.917, abs=0.005) and tau_one == pytest.approx(0.403, abs=0.005), (tau_both, tau_one)
    # both orders: 2 ordered comparisons per matchup, 28 matchups; one order: 28
    assert m_both["reward/judge_calls_per_group"] == 56 and judge.calls == 25 * 56
    assert m_one["reward/judge_calls_per_group"] == 28 and judge1.calls == 25 * 28


@pytest.mark.parametrize("pattern,m,k,calls", [("circular", 3, 8, 16), ("chunked", 3, 8, 14), ("chunked", 2, 8, 8),
                                               ("chunked", 3, 7, 14), ("circular", 3, 5, 10), ("all-pairs", 3, 8, 56)])
def test_judge_calls_per_group(pattern, m, k, calls):
    """Counted as ordered comparisons: each matchup read in both orders costs 2 (here the judge
    reads one order per verdict, so the tournament sends both and the judge counts them).
    Circular and chunked (m <= 3) stay within 2k; all-pairs is k(k-1)."""
    judge, prompts, texts = _planted(k=k, groups=3)
    _, metrics = Tournament(judge, pattern=pattern, group_size=m)(prompts, texts)
    assert judge.calls == 3 * calls and metrics["reward/judge_calls_per_group"] == calls
    assert pattern == "all-pairs" or calls <= 2 * k


def test_unreadable_comparisons_are_masked_counted_and_never_scored():
    """Group of 3, all pairs, both orders sent by the tournament. (a, c) is unreadable in one
    order, so the whole matchup is masked (one order alone keeps its position bias)."""
    values = {"a": 1.0, "b": 0.0, "c": 0.0}
    judge = PlantedJudge(values, bias=0.5, unreadable={("c", "a")})
    rewards, m = Tournament(judge)(["x"] * 3, ["a", "b", "c"])
    # (a, b): both orders p = (sigma(1.5) + 1 - sigma(-1 + 0.5))/2 = (sigma(1.5) + sigma(0.5))/2; (b, c): 1/2 exactly
    p_ab = (_sig(1.5) + _sig(0.5)) / 2
    assert rewards == pytest.approx([p_ab, ((1 - p_ab) + 0.5) / 2, 0.5])
    assert m["reward/unreadable"] == 1 and m["reward/no_comparison"] == 0 and m["reward/tie_rate"] == pytest.approx(0.5)
    # every comparison of "c" unreadable: c gets the mean of a and b (advantage 0), and is counted
    judge = PlantedJudge(values, unreadable={("c", "a"), ("b", "c")})
    rewards, m = Tournament(judge)(["x"] * 3, ["a", "b", "c"])
    pa = (_sig(1.0) + _sig(1.0)) / 2
    assert rewards == pytest.approx([pa, 1 - pa, 0.5]) and m["reward/no_comparison"] == 1 and m["reward/unreadable"] == 2
    # nothing readable at all: the group is unscored (None), not 0
    judge = PlantedJudge(values, unreadable={("a", "b"), ("c", "a"), ("b", "c")})
    rewards, m = Tournament(judge)(["x"] * 3, ["a", "b", "c"])
    assert rewards == [None, None, None] and m["reward/unreadable"] == 3 and m["reward/tie_rate"] is None


def test_non_numbers_from_a_judge_are_unreadable_not_scores():
    class Odd(PlantedJudge):
        def judge(self, prompts, a, b, *, references=None):
            self.calls += len(a)
            bad = [float("nan"), 1.7, "0.9", None]
            return [Judgment(p=bad[i % 4], p_ab=None, p_ba=None, consistent=None, parse_ok=True, judge_id="odd")
                    for i in range(len(a))]

    rewards, m = Tournament(Odd({}), both_orders=True)(["x"] * 3, ["a", "b", "c"])
    assert rewards == [None, None, None] and m["reward/unreadable"] == 3


def test_identical_responses_tie_without_a_judge_call_and_length_judge_reads_both_orders_once():
    from pofe.judges.programmatic import length_judge

    calls = []
    j = length_judge(prefer="shorter", unit="chars")
    inner = j.judge
    j.judge = lambda p, a, b, references=None: calls.append(len(a)) or inner(p, a, b, references=references)
    rewards, m = Tournament(j)(["x"] * 3, ["aa", "aa", "a"])
    # (0,1) identical: 1/2 without asking; (0,2), (1,2): the shorter "a" wins with p = 0 for A
    assert rewards == pytest.approx([0.25, 0.25, 1.0]) and calls == [2]
    assert m["reward/judge_calls_per_group"] == 4  # 2 matchups judged, both orders each (one verdict holds both)


def test_calibration_map_is_applied_to_every_verdict(tmp_path):
    from pofe.loops.rl import RLConfig, build_reward

    rep = tmp_path / "audit.json"
    rep.write_text(json.dumps({"metrics": {"calibration": {"map": {"method": "temperature", "temperature": 2.0}}}}))
    cfg = RLConfig(reward={"kind": "pairwise", "judge": {"kind": "length", "temperature": 1.0},
                           "pairwise": {"calibration": str(rep)}})
    rf = build_reward(cfg.reward, max_new_tokens=8)
    comps = [Completion(prompt="x", text=t) for t in ("ab", "abcd")]
    rewards, info = rf(["x", "x"], comps)
    # length judge (prefer shorter, temperature 1): p = sigmoid(-2 - (-4)) = sigmoid(2); T = 2 -> sigmoid(1)
    assert rewards == pytest.approx([_sig(1.0), 1 - _sig(1.0)])
    assert info["metrics"]["reward/judge_calls_per_group"] == 2
    uncal = build_reward(RLConfig(reward={"kind": "pairwise", "judge": {"kind": "length", "temperature": 1.0}}).reward,
                         max_new_tokens=8)
    assert uncal(["x", "x"], comps)[0] == pytest.approx([_sig(2.0), 1 - _sig(2.0)])


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize("sets,key", [
    (["reward.kind=pairwise"], "reward.judge"),
    (["reward.kind=pairwise", "reward.judge.kind=rubric"], "not pairwise"),
    (["reward.pairwise.pattern=circular"], "reward.pairwise"),
    (["reward.kind=pairwise", "reward.judge.kind=length", "reward.pairwise.group_size=4"], "reward.pairwise.group_size"),
    (["reward.kind=pairwise", "reward.judge.kind=length", "reward.pairwise.bt_l2=1.0"], "reward.pairwise.bt_l2"),
    (["reward.kind=pairwise", "reward.judge.kind=llm", "reward.pairwise.both_orders=false"], "reward.pairwise.both_orders"),
    (["reward.kind=pairwise", "reward.judge.kind=length", "reward.pairwise.pattern=chunked",
      "reward.pairwise.group_size=4", "train.group_size=4"], "reward.pairwise.group_size"),
    (["reward.kind=pairwise", "reward.judge.kind=length", "reward.pairwise.calibration=/nope/audit.json"],
     "reward.pairwise.calibration"),
    (["reward.kind=pairwise", "reward.judge.kind=length", "reward.pairwise.pattern=round-robin"], "reward.pairwise.pattern"),
    (["reward.kind=pairwise", "reward.judge.kind=length", "reward.pairwise.score=elo"], "reward.pairwise.score"),
])
def test_bad_pairwise_configs_are_one_line_errors_naming_the_key(sets, key):
    from pofe.config import ConfigError, load_config
    from pofe.loops.rl import RLConfig

    with pytest.raises(ConfigError, match=re.escape(key)) as e:
        load_config(RLConfig, None, sets)
    assert "\n" not in str(e.value)


def test_good_pairwise_configs_parse():
    from pofe.config import load_config
    from pofe.loops.rl import RLConfig

    c = load_config(RLConfig, None, ["reward.kind=pairwise", "reward.judge.kind=llm", "reward.judge.both_orders=false",
                                     "reward.pairwise.both_orders=false", "reward.pairwise.score=bt",
                                     "reward.pairwise.bt_l2=0.5"])
    assert c.reward.pairwise.score == "bt" and not c.reward.judge.both_orders
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "rl-pairwise-length.yaml"
    c = load_config(RLConfig, example, ["reward.pairwise.pattern=chunked",
                                        "reward.pairwise.group_size=2"])
    assert c.reward.kind == "pairwise" and c.reward.judge.kind == "length" and c.reward.pairwise.group_size == 2


def test_cli_config_error_exits_2():
    from typer.testing import CliRunner

    from pofe.cli.main import app

    res = CliRunner().invoke(app, ["rl", "--set", "reward.kind=pairwise", "--set", "reward.judge.kind=rubric",
                                   "--print-config"])
    assert res.exit_code == 2 and "not pairwise" in res.output


# ----------------------------------------------------------------------------- two rl steps

def test_two_rl_steps_with_the_pairwise_length_judge_log_tournament_metrics(tmp_path, tokenizer):
    from tests.loops.test_rl import _prompts, stopping_lm  # by package path: works whatever pytest collected first

    from pofe.judges.programmatic import length_judge
    from pofe.loops.rl import RLConfig, run

    items = []
    j = length_judge(prefer="shorter", unit="chars")
    inner = j.judge
    j.judge = lambda p, a, b, references=None: items.append(len(a)) or inner(p, a, b, references=references)
    cfg = RLConfig(data={"prompts": _prompts(tmp_path, 6)}, train={"steps": 2, "batch_size": 2, "group_size": 4}, eval={"num_prompts": 0},
                   sampling={"max_new_tokens": 6, "temperature": 1.0},
                   reward={"kind": "pairwise", "judge": {"kind": "length"}, "pairwise": {"pattern": "circular"}},
                   optim={"lr": 1e-3, "warmup_steps": 0}, run={"output_dir": str(tmp_path), "name": "rl"})
    s = run(cfg, policy=stopping_lm(tokenizer), tokenizer=tokenizer, judge=j)
    with open(f"{s['run_dir']}/metrics.jsonl") as f:
        rows = [json.loads(x) for x in f]
    assert [r["step"] for r in rows] == [1, 2] and s["reward"].startswith("pairwise:circular:mean:length")
    assert len(items) == 2  # one batched judge call per step
    for r, n in zip(rows, items):
        # circular over 4 samples: 4 matchups, both orders in one length verdict = 2 each; identical pairs are not sent
        # (2 groups: 2n ordered comparisons / 2)
        assert r["reward/judge_calls_per_group"] == n <= 8
        assert r["reward/unreadable"] == 0 and r["reward/no_comparison"] == 0 and r["unscored"] == 0
        assert 0.0 <= r["reward/tie_rate"] <= 1.0 and r["reward/bt_spread"] >= 0.0
        assert r["objective/scores"] == pytest.approx(0.5)  # mean win scores of a group average 1/2


def test_require_audit_names_the_pairwise_judge():
    # --require-audit gates a pairwise reward on the audit of that judge, as for reward.kind=judge
    from pofe.evaluation.audit import judge_identity, reward_identity
    from pofe.loops.rl import RLConfig

    cfg = RLConfig.model_validate({"reward": {"kind": "pairwise", "judge": {"kind": "length", "prefer": "shorter"}}})
    assert reward_identity(cfg.reward) == judge_identity(cfg.reward.judge)
    assert reward_identity(cfg.reward)["kind"] == "length"
