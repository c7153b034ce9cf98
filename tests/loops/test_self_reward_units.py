"""Self-rewarding building blocks: pair construction, EFT builder, head-to-head, ranked data."""

from __future__ import annotations

import json

import pytest

from pofe.data.eft import RankedPrompt, agrees, build_eft, load_ranked, rebalance, split_ranked
from pofe.data.aift import build_pair, build_pairs
from pofe.evaluation.self_reward import head_to_head, rm_eval
from pofe.judges.base import PointwiseAsPairwise
from pofe.records import Judgment, Score


# ----------------------------------------------------------------------------- pairs (Step 4)

def test_pair_is_highest_vs_lowest_mean_score():
    pair, why = build_pair("x", ["a", "b", "c", "d"], [3.0, 4.6666, 1.3333, 2.0])
    assert why == "kept" and pair["chosen"] == "b" and pair["rejected"] == "c"
    assert pair["chosen_score"] == 4.6666 and pair["rejected_score"] == 1.3333


def test_pair_ties_unscored_and_identical():
    # all four tie -> dropped ("discard the prompt entirely")
    assert build_pair("x", ["a", "b", "c", "d"], [4.0, 4.0, 4.0, 4.0]) == (None, "tie")
    # unscored candidates are excluded, not treated as 0: the two scored ones tie -> dropped
    assert build_pair("x", ["a", "b", "c", "d"], [None, 3.0, None, 3.0]) == (None, "tie")
    # ...and with one scored candidate there is no pair
    assert build_pair("x", ["a", "b", "c", "d"], [None, None, 5.0, None]) == (None, "fewer_than_2_scored")
    # unscored excluded: best 5 (#3) vs worst 2 (#1), the None at #0 is not "lowest"
    pair, why = build_pair("x", ["a", "b", "c", "d"], [None, 2.0, 3.0, 5.0])
    assert why == "kept" and (pair["chosen"], pair["rejected"]) == ("d", "b")
    # equal top scores: the first one is chosen (deterministic)
    pair, _ = build_pair("x", ["a", "b", "c", "d"], [5.0, 5.0, 1.0, 1.0])
    assert (pair["chosen_index"], pair["rejected_index"]) == (0, 2)
    # the same text sampled twice and scored differently is not a preference
    assert build_pair("x", ["same", "same"], [5.0, 1.0]) == (None, "identical_text")


def test_build_pairs_counts_every_drop():
    rows = [
        {"prompt": "p0", "responses": ["a", "b", "c", "d"], "scores": [1, 2, 3, 4], "index": 0, "judge_id": "j"},
        {"prompt": "p1", "responses": ["a", "b", "c", "d"], "scores": [2, 2, 2, 2], "index": 1},
        {"prompt": "p2", "responses": ["a", "b", "c", "d"], "scores": [None, None, None, 3], "index": 2},
        {"prompt": "p3", "responses": ["a", "b", "c", "d"], "scores": [None, None, None, None], "index": 3},
        {"prompt": "p4", "responses": ["z", "z", "y", "y"], "scores": [4, 1, 4, 1], "index": 4},
        {"prompt": "p5", "responses": ["a", "b", "c", "d"], "scores": [0, None, 5, 1], "index": 5},
    ]
    pairs, counts = build_pairs(rows)
    assert counts == {"prompts": 6, "kept": 2, "tie": 1, "fewer_than_2_scored": 2, "identical_text": 1}
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [("p0", "d", "a"), ("p5", "c", "a")]
    assert pairs[0]["provenance"] == {"judge_id": "j", "prompt_index": 0}


# ----------------------------------------------------------------------------- judges

class FakeScorer:
    """Pointwise judge with a fixed table; unknown responses are unscored."""

    id = "fake"

    def __init__(self, table, raw=None):
        self.table, self.raw = table, raw or {}

    def score(self, prompts, responses, *, references=None):
        out = []
        for y in responses:
            v = self.table.get(y)
            out.append(Score(score=v, parse_ok=v is not None, judge_id=self.id,
                             samples=(v,) if v is not None else (None,),
                             raw=(self.raw.get(y, f"ok.\nScore: {v}"),) if v is not None else ("",)))
        return out


class FlipJudge:
    """Pairwise judge whose second order disagrees for responses starting with '?'."""

    id = "flip"

    def judge(self, prompts, a, b, *, references=None):
        out = []
        for x, y in zip(a, b):
            p_ab = 1.0 if len(x) > len(y) else 0.0
            p_ba = 1.0 - p_ab if x.startswith("?") else p_ab
            out.append(Judgment(p=None, p_ab=p_ab, p_ba=p_ba, consistent=p_ab == p_ba, parse_ok=True, judge_id=self.id))
        return out


def test_head_to_head_order_disagreement_is_a_tie():
    a = ["long answer", "s", "?long answer", "same"]
    b = ["short", "longer one", "short", "same"]
    h = head_to_head(FlipJudge(), ["x"] * 4, a, b)
    # win (both orders prefer A), loss, tie (orders disagree), tie (identical, no judge call)
    assert (h["wins"], h["losses"], h["ties"], h["n"]) == (1, 1, 2, 4)
    assert h["win_rate_adjusted"] == pytest.approx((1 + 0.5 * 2) / 4)


def test_scores_as_pairwise_and_unscored_dropped():
    pj = PointwiseAsPairwise(FakeScorer({"good": 5, "bad": 1, "meh": 1}))
    js = pj.judge(["x"] * 3, ["good", "bad", "meh"], ["bad", "meh", "???"])
    assert [j.p for j in js] == [1.0, 0.5, None]
    h = head_to_head(FakeScorer({"good": 5, "bad": 1}), ["x"] * 2, ["good", "zzz"], ["bad", "bad"])
    assert (h["wins"], h["n"], h["dropped_unparsed"]) == (1, 1, 1)


def test_rm_eval_wires_scores_to_groups():
    groups = [RankedPrompt("x", ("best", "mid", "worst"), (0, 1, 2)), RankedPrompt("y", ("a", "b"), (0, 1))]
    m = rm_eval(FakeScorer({"best": 5, "mid": 2, "worst": 3, "a": 1, "b": 4}), groups)
    # x: pairs best>mid ok, best>worst ok, mid<worst wrong; y: wrong -> 2/4
    assert m["pairwise_accuracy"] == pytest.approx(0.5) and m["n_pairs"] == 4
    assert m["five_best_share"] == 1.0 and m["exact_match"] == 0.0


# ----------------------------------------------------------------------------- EFT

def test_agreement_is_strict():
    assert agrees([5, 3, 1], [0, 1, 2])
    assert not agrees([5, 3, 3], [0, 1, 2])  # tie where humans ordered
    assert agrees([4, 4, 1], [0, 0, 1])  # humans tied the first two: any order is fine
    assert not agrees([1, 5], [0, 1])


def test_rebalance_caps_the_most_common_score():
    ex = [{"score": 4.0}] * 6 + [{"score": 2.0}] * 2 + [{"score": 5.0}]
    kept, dropped = rebalance(ex, 1.0, seed=0)
    # most common 4 (6), runner-up 2 (2): keep ceil(1.0 * 2) = 2 fours
    assert dropped == 4 and sum(e["score"] == 4.0 for e in kept) == 2 and len(kept) == 5
    assert rebalance(ex, None) == (ex, 0)
    assert rebalance(ex, 1.5, seed=0)[1] == 3  # cap ceil(3.0) = 3


def test_build_eft_keeps_agreeing_groups_only():
    groups = [
        RankedPrompt("q1", ("best", "worst"), (0, 1), "g1"),  # 4 > 2: kept
        RankedPrompt("q2", ("b2", "w2"), (0, 1), "g2"),  # 2 < 4: disagrees
        RankedPrompt("q3", ("b3", "w3"), (0, 1), "g3"),  # w3 unscored
        RankedPrompt("q4", ("b4", "m4", "w4"), (0, 1, 2), "g4"),  # 5 > 4 > 1: kept
    ]
    judge = FakeScorer({"best": 4, "worst": 2, "b2": 2, "w2": 4, "b3": 5, "b4": 5, "m4": 4, "w4": 1},
                       raw={"best": "Relevant and complete.\nScore: 4"})
    ex, stats = build_eft(groups, judge, lambda x, y: f"JUDGE[{x}|{y}]", rebalance_ratio=None)
    assert stats["groups_kept"] == 2 and stats["groups_disagree"] == 1 and stats["groups_unscored"] == 1
    assert [e["prompt"] for e in ex] == ["JUDGE[q1|best]", "JUDGE[q1|worst]", "JUDGE[q4|b4]", "JUDGE[q4|m4]",
                                         "JUDGE[q4|w4]"]
    assert ex[0]["response"] == "Relevant and complete.\nScore: 4" and ex[0]["score"] == 4
    assert stats["score_counts"] == {"1": 1, "2": 1, "4": 2, "5": 1}
    # with rebalancing: 4 is most common (2), runner-up has 1 -> one 4 dropped
    ex2, stats2 = build_eft(groups, judge, lambda x, y: x, rebalance_ratio=1.0)
    assert stats2["rebalance_dropped"] == 1 and len(ex2) == 4


def test_load_ranked_formats(tmp_path):
    f = tmp_path / "ranked.jsonl"
    rows = [
        {"prompt": "p", "responses": ["a", "b", "c"], "ranks": [1, 0, 2]},
        {"prompt": "q", "responses": ["x", "y"]},  # ordered best first
        {"prompt": "r", "chosen": "good", "rejected": "bad"},
        {"prompt": "s", "chosen": "same", "rejected": "same"},
        {"prompt": "t", "responses": ["only"]},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    groups, skipped = load_ranked(f)
    assert [(g.prompt, g.responses, g.ranks) for g in groups] == [
        ("p", ("a", "b", "c"), (1.0, 0.0, 2.0)), ("q", ("x", "y"), (0.0, 1.0)), ("r", ("good", "bad"), (0.0, 1.0))]
    assert skipped == {"identical": 1, "fewer-than-2-responses": 1}
    build, held = split_ranked(groups, 1 / 3, seed=0)
    assert len(held) == 1 and len(build) == 2 and not set(g.prompt for g in held) & set(g.prompt for g in build)


def test_load_ranked_hh_rlhf(shared_data):
    path = shared_data / "hh-rlhf" / "helpful-base" / "test.jsonl.gz"
    if not path.exists():
        pytest.skip(f"{path} missing")
    groups, skipped = load_ranked(path, limit=50)
    assert len(groups) == 50 and all(g.ranks == (0.0, 1.0) for g in groups)
    assert all(not g.responses[0].startswith("Assistant:") and g.responses[0] != g.responses[1] for g in groups)


def test_cli_self_reward_config_errors_and_print(tmp_path):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    r = CliRunner().invoke(app, ["self-reward", "--set", "dpo.bta=0.2"])
    assert r.exit_code == 2 and "dpo.bta" in r.output
    r = CliRunner().invoke(app, ["self-reward", "--iterations", "3", "--set", "candidates.n=6", "--print-config"])
    assert r.exit_code == 0 and "iterations: 3" in r.output and "n: 6" in r.output
    # the paper's defaults
    from pofe.loops.self_reward import SelfRewardConfig

    c = SelfRewardConfig()
    assert (c.candidates.n, c.candidates.sampling.temperature, c.candidates.sampling.top_p) == (4, 0.7, 0.9)
    assert (c.judge.kind, c.judge.rubric.samples, c.judge.rubric.temperature) == ("rubric", 3, 0.7)
    assert (c.self_instruct.num_examples, c.self_instruct.num_machine_examples) == (8, 2)
    assert (c.self_instruct.sampling.temperature, c.self_instruct.rouge_threshold) == (0.6, 0.7)
    assert (c.dpo.beta, c.dpo.optim.lr, c.dpo.optim.lr * c.dpo.optim.min_lr_ratio) == (0.1, 1e-6, pytest.approx(1e-7))
    assert c.dpo.batch_size * c.dpo.grad_accum == 16


def test_cli_require_audit_refuses_a_failed_or_missing_report(tmp_path):
    import json

    from typer.testing import CliRunner

    from pofe.cli.main import app

    runner = CliRunner()
    r = runner.invoke(app, ["self-reward", "--require-audit", str(tmp_path / "none.json")])
    assert r.exit_code == 2 and "audit report not found" in r.output
    bad = tmp_path / "audit.json"
    bad.write_text(json.dumps({"judge": "self", "passed": False,
                               "checks": {"position_consistency": {"value": 0.01, "threshold": ">= 0.8", "passed": False}}}))
    r = runner.invoke(app, ["self-reward", "--require-audit", str(bad)])
    assert r.exit_code == 2 and "position_consistency" in r.output


@pytest.mark.parametrize("key,value", [("iterations", "0"), ("dpo.beta", "-0.1"), ("dpo.beta", "0"),
                                       ("dpo.batch_size", "0"), ("dpo.grad_accum", "0"), ("dpo.steps", "0"),
                                       ("candidates.n", "1"), ("candidates.chunk", "0"),
                                       ("selection.num_checkpoints", "0"), ("eval.num_prompts", "-1"),
                                       ("seed_sft.train.steps", "0"), ("data.per_iteration", "0")])
def test_nonsense_hyperparameters_are_refused_at_parse_time(key, value):
    from pofe.config import ConfigError, load_config
    from pofe.loops.self_reward import SelfRewardConfig

    with pytest.raises(ConfigError) as e:
        load_config(SelfRewardConfig, None, [f"{key}={value}"])
    assert key in str(e.value)


def test_example_config_validates():
    from pathlib import Path

    from pofe.config import load_config
    from pofe.loops.self_reward import SelfRewardConfig

    cfg = load_config(SelfRewardConfig, Path(__file__).resolve().parents[2] / "examples" / "self-reward-tiny.yaml")
    assert cfg.iterations == 2 and cfg.candidates.n == 4 and cfg.log.progress


def test_iteration_metrics_row_is_flat_and_steps_by_iteration():
    from pofe.loops.online.metrics import iteration_row

    m = {"iteration": 2, "mean_score": 3.5, "pairs": {"kept": 7, "tie": 1}, "eval_mean_score": None,
         "head_to_head_vs_prev": {"win_rate_adjusted": 0.625}, "dpo": {"loss_last": 0.61}}
    assert iteration_row(m) == {"step": 2, "iteration": 2, "mean_score": 3.5, "pairs_kept": 7,
                                "winrate_vs_prev": 0.625, "loss": 0.61}


def test_pick_checkpoint_best_tie_adjusted_rate_ties_to_the_later():
    from pofe.evaluation.self_reward import pick_checkpoint

    judge = FakeScorer({"good": 5, "bad": 1, "ok": 3})
    prev = ["ok", "ok"]
    # option a: 1 win 1 loss (0.5); b: 2 wins (1.0); c: 2 wins (1.0, later -> chosen)
    responses = {"a": ["good", "bad"], "b": ["good", "good"], "c": ["good", "good"]}
    best, results = pick_checkpoint(["a", "b", "c"], lambda o: responses[o], judge, ["x", "y"], prev)
    assert best == 2 and [r["win_rate_adjusted"] for r in results] == [0.5, 1.0, 1.0]
    assert [r["wins"] for r in results] == [1, 2, 2] and results[0]["losses"] == 1


def test_score_stats_counts_unscored_and_margins():
    from pofe.data.aift import score_stats

    rows = [{"scores": [4.0, None, 2.0]}, {"scores": [None, None]}]
    pairs = [{"chosen_score": 4.0, "rejected_score": 2.0}]
    assert score_stats(rows, pairs) == {"candidates": 5, "unscored_candidates": 3, "mean_score": 3.0,
                                        "pair_margin_mean": 2.0}
    assert score_stats([], [])["mean_score"] is None


@pytest.mark.parametrize("override,named", [("evaluation.num_prompts=2", "'evaluation'"),
                                            ("prompts.train=pool.txt", "'prompts'"),
                                            ("data.source=file", "'data.source'")])
def test_old_keys_are_unknown(override, named):
    """``evaluation`` is ``eval`` and the prompt source is ``data.prompts`` (as in every command;
    ``prompts.source: file`` is ``data.prompts`` being set); the old names are not aliases."""
    from pofe.config import ConfigError, load_config
    from pofe.loops.self_reward import SelfRewardConfig

    with pytest.raises(ConfigError) as e:
        load_config(SelfRewardConfig, None, [override])
    assert f"unknown key {named}" in str(e.value)


def test_data_prompts_is_the_pool_and_null_is_self_instruct(tmp_path):
    """``data.prompts`` is the prompt source as in every command: null = Self-Instruct (no pool
    read), a file = the pool drawn from per iteration (deduplicated, held-out prompts removed)."""
    from pofe.config import load_config
    from pofe.loops.self_reward import SelfRewardConfig, load_inputs

    assert load_inputs(load_config(SelfRewardConfig, None, ["eval.num_prompts=1"])).train_pool == []
    pool = tmp_path / "pool.txt"
    pool.write_text("first prompt\nsecond prompt\nfirst prompt\nheld out\n")
    held = tmp_path / "held.txt"
    held.write_text("held out\n")
    cfg = load_config(SelfRewardConfig, None, [f"data.prompts={pool}", f"eval.prompts={held}", "eval.num_prompts=1",
                                               "selection.enabled=false"])
    assert load_inputs(cfg).train_pool == ["first prompt", "second prompt"]
