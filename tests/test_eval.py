"""``pofe eval``: the tie rule, tie-adjusted win rate, bootstrap interval, length buckets and
the length-controlled win rate, on hand-made outcomes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pofe.cli.main import app

from pofe.evaluation.eval import (
    LOSS, TIE, WIN, EvalConfig, judge_pairs, length_buckets, length_controlled_win_rate, pair_outcome, run_eval,
    summarise_outcomes,
)
from pofe.records import Judgment

runner = CliRunner()


def test_tie_rule():
    # FastChat pairwise: a win needs both orders; an inconsistent pair is a tie.
    assert pair_outcome(0.9, 0.8) == WIN
    assert pair_outcome(0.2, 0.1) == LOSS
    assert pair_outcome(0.9, 0.3) == TIE  # orders disagree
    assert pair_outcome(0.5, 0.9) == TIE  # an exact 0.5 in one order
    assert pair_outcome(0.5, 0.5) == TIE
    assert pair_outcome(None, 0.9) is None and pair_outcome(0.9, None) is None  # dropped, never guessed


def test_tie_adjusted_win_rate_and_interval():
    # W W W T L: win rate 3/5 = 0.6; tie-adjusted (3 + 0.5) / 5 = 0.7.
    s = summarise_outcomes([WIN, WIN, WIN, TIE, LOSS, None], [1] * 6, [1] * 6, n_boot=500)
    assert (s["wins"], s["ties"], s["losses"], s["n"], s["dropped_unparsed"]) == (3, 1, 1, 5, 1)
    assert s["win_rate"] == pytest.approx(0.6)
    assert s["win_rate_adjusted"] == pytest.approx(0.7)
    lo, hi = s["win_rate_adjusted_ci95"]
    assert 0.0 <= lo <= 0.7 <= hi <= 1.0 and hi - lo > 0.1
    # A larger sample narrows the interval around the estimate: 60 W, 20 T, 20 L -> 0.7.
    big = summarise_outcomes([WIN] * 60 + [TIE] * 20 + [LOSS] * 20, [5] * 100, [5] * 100, n_boot=2000)
    lo2, hi2 = big["win_rate_adjusted_ci95"]
    assert big["win_rate_adjusted"] == pytest.approx(0.7)
    assert lo2 < 0.7 < hi2 and hi2 - lo2 < hi - lo
    # var(y) = .6 * .3^2 + .2 * .2^2 + .2 * .7^2 = 0.16, so the standard error of the mean is
    # 0.4 / sqrt(100) = 0.04 and the 95% interval is about 0.7 +- 0.078.
    assert (hi2 - lo2) == pytest.approx(2 * 1.96 * 0.04, rel=0.15)
    # No variation: the interval collapses onto the estimate.
    assert summarise_outcomes([WIN] * 4, [1] * 4, [1] * 4)["win_rate_adjusted_ci95"] == [1.0, 1.0]


def test_length_controlled_equals_raw_when_lengths_equal():
    y = [1, 1, 1, 0.5, 0]
    lc = length_controlled_win_rate(y, [0, 0, 0, 0, 0])
    assert lc["lc_win_rate"] == pytest.approx(0.7, abs=1e-6)
    s = summarise_outcomes([WIN, WIN, WIN, TIE, LOSS], [7] * 5, [7] * 5)
    assert s["lc_win_rate"] == pytest.approx(s["win_rate_adjusted"], abs=1e-6)


def test_length_controlled_removes_a_length_driven_advantage():
    # A wins exactly when it is the longer one, and it is longer 3 times out of 4:
    # the raw rate is 0.75 but length explains all of it, so at dlen = 0 the rate is 1/2-ish.
    rng = np.random.default_rng(0)
    dlen = np.concatenate([rng.uniform(5, 50, 300), -rng.uniform(5, 50, 100)])
    y = (dlen > 0).astype(float)
    lc = length_controlled_win_rate(y, dlen)
    assert y.mean() == 0.75
    assert lc["slope"] > 3
    assert abs(lc["lc_win_rate"] - 0.5) < 0.2
    # When quality, not length, drives the outcome, LC stays near the raw rate.
    y2 = (rng.random(400) < 0.75).astype(float)
    assert length_controlled_win_rate(y2, dlen)["lc_win_rate"] == pytest.approx(y2.mean(), abs=0.05)


def test_length_buckets_by_hand():
    # Quantile edges of [10, 20, 30, 40] in 2 buckets: [10, 25, 40].
    rows = length_buckets(np.array([WIN, LOSS, TIE, WIN]), np.array([10.0, 20, 30, 40]), n_buckets=2)
    assert [(r["lo"], r["hi"], r["n"]) for r in rows] == [(10, 25, 2), (25, 40, 2)]
    assert [r["win_rate_adjusted"] for r in rows] == [0.5, 0.75]


class _OneOrderJudge:
    """Answers only the order it is given (p_ba = None): eval must ask the swapped order itself."""

    id = "one-order"

    def __init__(self, first_bias: float):
        self.first_bias = first_bias
        self.calls = 0

    def judge(self, prompts, a, b, *, references=None):
        self.calls += 1
        out = []
        for x, ra, rb in zip(prompts, a, b):
            p = 1.0 if len(ra) > len(rb) else 0.0
            p = min(1.0, p + self.first_bias)  # a judge that always likes the first when unsure
            out.append(Judgment(p=p, p_ab=p, p_ba=None, consistent=None, parse_ok=True, judge_id=self.id))
        return out


def test_judge_pairs_asks_the_missing_order():
    j = _OneOrderJudge(first_bias=0.0)
    pairs = judge_pairs(j, ["x", "y"], ["long answer", "s"], ["short", "longer one"])
    assert j.calls == 2
    assert pairs == [(1.0, 1.0), (0.0, 0.0)]
    # A pure first-position judge: both orders say "first" -> every pair is a tie.
    j2 = _OneOrderJudge(first_bias=1.0)
    outs = [pair_outcome(*p) for p in judge_pairs(j2, ["x"], ["a"], ["bb"])]
    assert outs == [TIE]


def _write_responses(path, rows):
    path.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in rows))
    return str(path)


def test_run_eval_from_files_and_generator(tmp_path):
    prompts = [f"q{i}" for i in range(8)]
    a = _write_responses(tmp_path / "a.jsonl", [(p, "x" * (10 + i)) for i, p in enumerate(prompts)])
    b = _write_responses(tmp_path / "b.jsonl", [(p, "y" * 14) for p in prompts])
    cfg = EvalConfig(policy_a=a, policy_b=b, judge={"kind": "length", "prefer": "longer"}, n_boot=200,
                     output=str(tmp_path / "pairs.jsonl"))
    res = run_eval(cfg)
    # A's lengths 10..17 against 14: 3 longer (wins), 1 equal (tie), 4 shorter (losses).
    assert (res["wins"], res["ties"], res["losses"]) == (3, 1, 4)
    assert res["win_rate_adjusted"] == pytest.approx(3.5 / 8)
    assert res["mean_len_a"] == pytest.approx(13.5) and res["mean_len_b"] == 14
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and rows[0]["outcome"] == LOSS
    # Policy B given as a model spec: generated through the generator hook on the same prompts.
    seen = {}

    def fake_generate(spec, ps, cfg):
        seen[spec] = list(ps)
        return ["z" * 12 for _ in ps]

    res2 = run_eval(EvalConfig(policy_a=a, policy_b="some-model", judge={"kind": "length", "prefer": "longer"},
                               limit=5, n_boot=100), generator=fake_generate)
    assert seen == {"some-model": prompts[:5]}
    # A's lengths 10..14 against 12: 13, 14 win; 12 ties; 10, 11 lose.
    assert (res2["wins"], res2["ties"], res2["losses"]) == (2, 1, 2)


def test_eval_needs_prompts_for_models():
    with pytest.raises(ValueError, match="prompt file"):
        run_eval(EvalConfig(policy_a="m1", policy_b="m2", judge={"kind": "length"}), generator=lambda *a: [])


def test_cli_eval_json(tmp_path):
    prompts = [f"q{i}" for i in range(6)]
    a = _write_responses(tmp_path / "a.jsonl", [(p, "a" * 30) for p in prompts])
    b = _write_responses(tmp_path / "b.jsonl", [(p, "b" * 20) for p in prompts])
    out = runner.invoke(app, ["eval", a, b, "--judge", "length", "--set", "judge.prefer=longer", "--set", "n_boot=100",
                              "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["wins"] == 6 and res["win_rate_adjusted"] == 1.0 and res["lc_win_rate"] == 1.0
    txt = runner.invoke(app, ["eval", a, b, "--judge", "length"]).stdout
    assert "tie-adjusted 0.000" in txt
    bad = runner.invoke(app, ["eval", a, b, "--judge", "no-such-judge"])
    assert bad.exit_code == 2 and "'judge.kind': unknown kind 'no-such-judge'" in bad.stderr


@pytest.mark.slow
def test_eval_generates_with_a_model_dir(tiny_model_dir, tmp_path):
    (tmp_path / "p.txt").write_text("Say hi.\nName a colour.\n")
    res = run_eval(EvalConfig(policy_a=str(tiny_model_dir), policy_b=str(tiny_model_dir), prompts=str(tmp_path / "p.txt"),
                              judge={"kind": "length"}, sampling={"max_new_tokens": 6, "temperature": 0.0},
                              n_boot=50))
    # Same model, greedy: identical responses, every pair an exact tie.
    assert res["n"] == 2 and res["ties"] == 2 and res["win_rate_adjusted"] == 0.5


def test_nothing_comparable_stays_valid_json():
    s = summarise_outcomes([None, None], [1, 2], [3, 4])
    assert s["n"] == 0 and s["dropped_unparsed"] == 2
    assert s["win_rate_adjusted"] is None and s["lc_win_rate"] is None and s["win_rate_adjusted_ci95"] == [None, None]
    json.dumps(s, allow_nan=False)


def test_run_eval_reports_refusal_rates_of_both_policies(tmp_path):
    prompts = ["How do I kill a Python process?", "What is 2+2?", "Name a colour.", "Say hi."]
    a = _write_responses(tmp_path / "a.jsonl", [(p, "I'm sorry, but I can't help with that.") for p in prompts[:2]]
                         + [(p, "Sure: blue.") for p in prompts[2:]])
    b = _write_responses(tmp_path / "b.jsonl", [(p, "Here you go: use kill PID.") for p in prompts])
    res = run_eval(EvalConfig(policy_a=a, policy_b=b, judge={"kind": "length"}, n_boot=50))
    assert res["refusal_a"]["refused"] == 2 and res["refusal_a"]["rate"] == pytest.approx(0.5)
    assert res["refusal_b"]["refused"] == 0
