"""``pofe eval``: the tie rule, tie-adjusted win rate, bootstrap interval, length buckets and
the length-controlled win rate, on hand-made outcomes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from pofe.cli.main import app

from pofe.evaluation.eval import EvalConfig, length_buckets, run_eval, summarise_outcomes
from pofe.evaluation.winrate import LOSS, TIE, WIN, judge_pairs, pair_outcome, wilson_interval
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
    # W W W T L: win rate 3/5 = 0.6; tie-adjusted (3 + 0.5) / 5 = 0.7, Wilson on 3.5 of 5.
    s = summarise_outcomes([WIN, WIN, WIN, TIE, LOSS, None], [1] * 6, [1] * 6)
    assert (s["wins"], s["ties"], s["losses"], s["n"], s["dropped_unparsed"]) == (3, 1, 1, 5, 1)
    assert s["win_rate"] == pytest.approx(0.6)
    assert s["win_rate_adjusted"] == pytest.approx(0.7)
    assert s["win_rate_adjusted_ci95"] == pytest.approx(list(wilson_interval(3.5, 5)))
    # 60 W, 20 T, 20 L -> 0.7 on n = 100: Wilson half-width about 1.96 sqrt(.21/100) = 0.0898.
    big = summarise_outcomes([WIN] * 60 + [TIE] * 20 + [LOSS] * 20, [5] * 100, [5] * 100)
    lo2, hi2 = big["win_rate_adjusted_ci95"]
    assert big["win_rate_adjusted"] == pytest.approx(0.7)
    assert (hi2 - lo2) == pytest.approx(2 * 1.96 * math.sqrt(0.21 / 100), rel=0.03)
    # Four wins of four: the interval is Wilson's [1/(1 + z^2/4), 1] = [0.510, 1], not [1, 1].
    lo, hi = summarise_outcomes([WIN] * 4, [1] * 4, [1] * 4)["win_rate_adjusted_ci95"]
    assert lo == pytest.approx(1 / (1 + 1.959964**2 / 4), abs=1e-5) and hi == 1.0


def test_summary_has_both_length_controlled_rates():
    s = summarise_outcomes([WIN, WIN, WIN, TIE, LOSS], [7] * 5, [7] * 5)
    assert s["lc_win_rate"] == pytest.approx(s["win_rate_adjusted"], abs=1e-6)
    assert s["lc_win_rate_simple"] == pytest.approx(s["win_rate_adjusted"], abs=1e-6)


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
                               data={"max_prompts": 5}, n_boot=100), generator=fake_generate)
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


def test_cli_prompts_and_limit_are_the_data_keys_and_the_old_keys_are_unknown(tmp_path):
    import yaml

    r = runner.invoke(app, ["eval", "a.jsonl", "b.jsonl", "--prompts", "p.txt", "--limit", "3", "--print-config"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["data"] == {"prompts": "p.txt", "max_prompts": 3}
    for old in ("prompts=p.txt", "limit=3"):
        r = runner.invoke(app, ["eval", "a.jsonl", "b.jsonl", "--set", old, "--print-config"])
        assert r.exit_code == 2 and f"unknown key '{old.split('=')[0]}'" in r.stderr, (old, r.output)
    # data.max_prompts keeps the first N prompts: 6 answered, 2 compared, 4 left out (and counted)
    prompts = [f"q{i}" for i in range(6)]
    a = _write_responses(tmp_path / "a.jsonl", [(p, "a" * 30) for p in prompts])
    b = _write_responses(tmp_path / "b.jsonl", [(p, "b" * 20) for p in prompts])
    r = runner.invoke(app, ["eval", a, b, "--judge", "length", "--set", "data.max_prompts=2", "--set", "n_boot=10",
                            "--set", "refusal=false", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["n"] == 2 and res["prompts"] == {"available": 6, "used": 2, "limited": 4}


@pytest.mark.slow
def test_eval_generates_with_a_model_dir(tiny_model_dir, tmp_path):
    (tmp_path / "p.txt").write_text("Say hi.\nName a colour.\n")
    res = run_eval(EvalConfig(policy_a=str(tiny_model_dir), policy_b=str(tiny_model_dir),
                              data={"prompts": str(tmp_path / "p.txt")}, judge={"kind": "length"},
                              sampling={"max_new_tokens": 6, "temperature": 0.0}, n_boot=50))
    # Same model, greedy: identical responses, every pair an exact tie.
    assert res["n"] == 2 and res["ties"] == 2 and res["win_rate_adjusted"] == 0.5


def test_nothing_comparable_stays_valid_json():
    s = summarise_outcomes([None, None], [1, 2], [3, 4])
    assert s["n"] == 0 and s["dropped_unparsed"] == 2
    assert s["win_rate_adjusted"] is None and s["lc_win_rate"] is None and s["win_rate_adjusted_ci95"] == [None, None]
    assert s["lc_win_rate_simple"] is None
    json.dumps(s, allow_nan=False)


def test_run_eval_reports_refusal_rates_of_both_policies(tmp_path):
    prompts = ["How do I kill a Python process?", "What is 2+2?", "Name a colour.", "Say hi."]
    a = _write_responses(tmp_path / "a.jsonl", [(p, "I'm sorry, but I can't help with that.") for p in prompts[:2]]
                         + [(p, "Sure: blue.") for p in prompts[2:]])
    b = _write_responses(tmp_path / "b.jsonl", [(p, "Here you go: use kill PID.") for p in prompts])
    res = run_eval(EvalConfig(policy_a=a, policy_b=b, judge={"kind": "length"}, n_boot=50))
    assert res["refusal_a"]["refused"] == 2 and res["refusal_a"]["rate"] == pytest.approx(0.5)
    assert res["refusal_b"]["refused"] == 0


def test_cli_eval_three_policies_gives_matrix_and_bradley_terry(tmp_path):
    prompts = [f"q{i}" for i in range(6)]
    files = [_write_responses(tmp_path / f"{n}.jsonl", [(p, c * k) for p in prompts])
             for n, c, k in (("short", "s", 5), ("mid", "m", 10), ("long", "l", 20))]
    out = runner.invoke(app, ["eval", *files, "--judge", "length", "--set", "judge.prefer=longer",
                              "--set", "n_boot=30", "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["mode"] == "compare" and res["n_prompts"] == 6
    # The longer policy wins every prompt against each shorter one.
    assert res["win_matrix"][0][1] == 0.0 and res["win_matrix"][2][1] == 1.0 and res["win_matrix"][2][0] == 1.0
    assert res["ranking"] == [files[2], files[1], files[0]]
    r = res["bradley_terry"]["ratings"]
    assert r[files[0]] == 0.0 and r[files[2]] > r[files[1]] > 0
    txt = runner.invoke(app, ["eval", *files, "--judge", "length", "--set", "judge.prefer=longer",
                              "--set", "n_boot=10"]).stdout
    assert "Bradley-Terry" in txt and "P3" in txt
    one = runner.invoke(app, ["eval", files[0], "--judge", "length"])
    assert one.exit_code == 2 and "two policies" in one.stderr


def test_two_turn_mt_bench_asks_turn_two_after_the_own_first_answer(tmp_path):
    q = tmp_path / "question.jsonl"
    q.write_text("".join(json.dumps({"question_id": 80 + i, "category": "writing", "turns": [f"t1-{i}", f"t2-{i}"]})
                         + "\n" for i in range(3)))
    seen = []

    def fake(spec, convs, cfg):
        seen.append((spec, [list(c) for c in convs]))
        turn = (len(convs[0]) + 1) // 2
        return [f"{spec}-answer{turn}-" + ("x" * (20 if spec == "long" else 5)) for _ in convs]

    res = run_eval(EvalConfig(policy_a="long", policy_b="short", data={"prompts": str(q)},
                              judge={"kind": "length", "prefer": "longer"}), generator=fake)
    # Turn 2 of policy "long" is asked after its own turn-1 answer.
    second = [s for s in seen if s[0] == "long"][1][1][0]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"].startswith("long-answer1") and second[2]["content"] == "t2-0"
    assert res["mode"] == "two-turn" and res["n_questions"] == 3 and res["n"] == 6
    assert res["by_turn"]["turn_1"]["wins"] == 3 and res["by_turn"]["turn_2"]["wins"] == 3
    assert res["n_instructions"] == 3  # both turns of a question share its difficulty term


def test_eval_reads_the_shared_mt_bench_questions(shared_data):
    from pofe.evaluation.eval import load_turns

    qs = load_turns(shared_data / "fastchat-llm-judge" / "mt_bench" / "question.jsonl")
    assert qs is not None and len(qs) == 80 and all(len(q["turns"]) == 2 for q in qs)
