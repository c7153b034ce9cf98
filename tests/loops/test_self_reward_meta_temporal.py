"""Self-rewarding's newer variants with planted judges: Meta-Rewarding (length-controlled actor pairs, judge
pairs from meta-judged judgments) and Temporal Self-Rewarding's future-guided chosen. Every
expectation below is worked out by hand in the comments."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pofe.config import ConfigError, load_config
from pofe.judges.templates import load_template
from pofe.loops.self_reward import SelfRewardConfig
from pofe.records import Judgment, Score
from pofe.runs import read_jsonl
from pofe.loops.self_reward.meta_rewarding import (MetaJudgeSettings, judge_pair, length_controlled_pair, meta_context,
                                          most_uncertain, win_scores)
from pofe.loops.self_reward.self_reward_variants import replace_chosen, variant_pairs


class PlantedWriter:
    """The judge role: K judgments per response, looked up in a table ``response -> [(text, score)]``."""

    id = "planted-writer"
    max_response_chars = None

    def __init__(self, table):
        self.table, self.calls = table, 0
        self.template = load_template("rubric")

    def score(self, prompts, responses, *, references=None):
        self.calls += 1
        out = []
        for y in responses:
            js = self.table[y]
            ok = [s for _, s in js if s is not None]
            out.append(Score(sum(ok) / len(ok) if ok else None, bool(ok), self.id,
                             samples=tuple(s for _, s in js), raw=tuple(t for t, _ in js)))
        return out


class PlantedMeta:
    """The meta-judge role: P(A better) = 0.5 + (q_A - q_B) / 4 from a planted quality of each
    judgment text; a pair listed in ``unreadable`` gives p None (never a verdict)."""

    id = "planted-meta"

    def __init__(self, quality, unreadable=()):
        self.quality, self.unreadable, self.seen = quality, set(unreadable), []

    def judge(self, prompts, a, b, *, references=None):
        self.seen += list(zip(prompts, a, b))
        out = []
        for x, y in zip(a, b):
            p = None if (x, y) in self.unreadable else 0.5 + (self.quality[x] - self.quality[y]) / 4
            out.append(Judgment(p, p, p, True, p is not None, self.id))
        return out


# ----------------------------------------------------------------------------- actor pairs

def test_length_controlled_actor_pair_hand_computed():
    # scores 5, 4, 1; tokens 30, 10, 20. rho 0.25: floor = 5 - 0.25 * (5 - 1) = 4 -> top tier {0, 1};
    # the shortest of it is candidate 1 (10 tokens); the rejected is the worst, candidate 2
    pair, why = length_controlled_pair("x", ["a0", "a1", "a2"], [5.0, 4.0, 1.0], [30, 10, 20], 0.25)
    assert why == "kept" and (pair["chosen"], pair["rejected"]) == ("a1", "a2")
    assert (pair["chosen_score"], pair["rejected_score"], pair["chosen_length"], pair["role"]) == (4.0, 1.0, 10, "actor")
    # rho 0: best vs worst (the top tier is the best alone)
    pair, _ = length_controlled_pair("x", ["a0", "a1", "a2"], [5.0, 4.0, 1.0], [30, 10, 20], 0.0)
    assert (pair["chosen"], pair["rejected"]) == ("a0", "a2")
    # rho 0.2: floor = 5 - 0.8 = 4.2 -> candidate 1 (4) is out of the tier
    pair, _ = length_controlled_pair("x", ["a0", "a1", "a2"], [5.0, 4.0, 1.0], [30, 10, 20], 0.2)
    assert pair["chosen"] == "a0"
    # equal worst: the longest of them is the rejected (9 tokens beats 7)
    pair, _ = length_controlled_pair("x", ["b0", "b1", "b2"], [4.0, 1.0, 1.0], [5, 7, 9], 0.25)
    assert (pair["chosen"], pair["rejected"], pair["rejected_length"]) == ("b0", "b2", 9)
    assert length_controlled_pair("x", ["c0", "c1"], [2.0, 2.0], [1, 2], 0.5) == (None, "tie")
    assert length_controlled_pair("x", ["c0", "c1"], [2.0, None], [1, 2], 0.5) == (None, "fewer_than_2_scored")
    assert length_controlled_pair("x", ["s", "s"], [3.0, 1.0], [1, 1], 0.5) == (None, "identical_text")


# ----------------------------------------------------------------------------- judge pairs

def test_win_scores_and_judge_pair_hand_computed():
    # p(0>1) = 0.8, p(0>2) unreadable, p(1>2) = 0.3: w0 = 0.8, w1 = (0.2 + 0.3) / 2 = 0.25, w2 = 0.7
    comps = [(0, 1, 0.8), (0, 2, None), (1, 2, 0.3)]
    assert win_scores(3, comps) == pytest.approx([0.8, 0.25, 0.7])
    pair, why = judge_pair("JP", ["j0", "j1", "j2"], [4.0, 2.0, 3.0], comps)
    assert why == "kept" and (pair["chosen"], pair["rejected"], pair["prompt"], pair["role"]) == ("j0", "j1", "JP", "judge")
    assert (pair["chosen_win"], pair["rejected_win"]) == pytest.approx((0.8, 0.25))
    # the best and worst judgments give the same score: dropped (they agree on the verdict)
    assert judge_pair("JP", ["j0", "j1", "j2"], [4.0, 4.0, 3.0], comps) == (None, "same_score")
    # equal best win scores: the shorter judgment is the chosen; equal worst: the longer is the rejected
    comps = [(0, 1, 0.5), (0, 2, 1.0), (1, 2, 1.0), (0, 3, 1.0), (1, 3, 1.0), (2, 3, 0.5)]
    # w = [0.8333, 0.8333, 0.1667, 0.1667]
    pair, _ = judge_pair("JP", ["long judgment", "short", "mid one", "much longer one"], [5.0, 4.0, 1.0, 2.0], comps)
    assert (pair["chosen"], pair["rejected"]) == ("short", "much longer one")
    # nothing read, or every judgment winning as often: no pair
    assert judge_pair("JP", ["j0", "j1"], [1.0, 2.0], [(0, 1, None)]) == (None, "unreadable")
    assert judge_pair("JP", ["j0", "j1"], [1.0, 2.0], [(0, 1, 0.5)]) == (None, "tied_wins")


def test_most_uncertain_response():
    # variances 0, 8/3, 1 (the unscored judgment left out): response 1
    assert most_uncertain([[3, 3, 3], [5, 1, 3], [4, 2, None]]) == 1
    assert most_uncertain([[2, 2, 2], [4, None, 4]]) == 0  # equal variance: the first
    assert most_uncertain([[None, 2], [None, None]]) is None


ROWS = [
    # actor scores 5, 4, 1, tokens 30, 10, 20 (rho 0.25: chosen a1, rejected a2, as above)
    {"index": 0, "prompt": "p0", "responses": ["a0", "a1", "a2"], "scores": [5.0, 4.0, 1.0], "tokens": [30, 10, 20]},
    # scores 4, 1, 1: chosen b0, rejected the longer worst b2
    {"index": 1, "prompt": "p1", "responses": ["b0", "b1", "b2"], "scores": [4.0, 1.0, 1.0], "tokens": [5, 7, 9]},
]
JUDGMENTS = {  # K = 3 judgments of every candidate
    "a0": [("a0-j0", 3), ("a0-j1", 3), ("a0-j2", 3)],          # variance 0
    "a1": [("a1-j0", 5), ("a1-j1", 1), ("a1-j2", 3)],          # variance 8/3: judged by the meta-judge
    "a2": [("a2-j0", 4), ("a2-j1", 2), ("a2-j2", None)],       # variance 1
    "b0": [("b0-j0", 2), ("b0-j1", 2), ("b0-j2", 2)],          # variance 0, the first: judged
    "b1": [("b1-j0", 4), ("b1-j1", None), ("b1-j2", 4)],
    "b2": [("b2-j0", None), ("b2-j1", None), ("b2-j2", None)],
}
QUALITY = {"a1-j0": 1.0, "a1-j1": 0.0, "a1-j2": 2.0, "b0-j0": 2.0, "b0-j1": 1.0, "b0-j2": 0.0}


def _meta_cfg(rho=0.25, cream=False):
    return SimpleNamespace(meta_judge=MetaJudgeSettings(enabled=True, length_control=rho),
                           cream=SimpleNamespace(enabled=cream), temporal=SimpleNamespace(anchor="none", future=False))


def test_meta_rewarding_pairs_with_planted_judge_and_meta_judge(tmp_path):
    (tmp_path / "data").mkdir()
    writer = PlantedWriter(JUDGMENTS)
    meta = PlantedMeta(QUALITY, unreadable={("b0-j0", "b0-j1")})
    pairs, counts, info = variant_pairs(_meta_cfg(), ROWS, t=2, it_dir=tmp_path, anchor_rows=None, prev_judge=None,
                                        meta_roles=lambda: (writer, meta))
    actor = [p for p in pairs if p["role"] == "actor"]
    judge = [p for p in pairs if p["role"] == "judge"]
    assert [(p["chosen"], p["rejected"]) for p in actor] == [("a1", "a2"), ("b0", "b2")]
    assert counts == {"prompts": 2, "kept": 2, "tie": 0, "fewer_than_2_scored": 0, "identical_text": 0}
    # p0: a1's judgments, p = 0.5 + (q_m - q_n) / 4: p(0>1) = 0.75, p(0>2) = 0.25, p(1>2) = 0.0
    # -> w = [0.5, 0.125, 0.875]: chosen a1-j2 (score 3), rejected a1-j1 (score 1)
    # p1: b0's judgments all give 2: the best and worst agree on the score -> dropped (same_score)
    assert [(p["chosen"], p["rejected"]) for p in judge] == [("a1-j2", "a1-j1")]
    assert (judge[0]["chosen_win"], judge[0]["rejected_win"]) == pytest.approx((0.875, 0.125))
    assert (judge[0]["chosen_score"], judge[0]["rejected_score"]) == (3, 1)
    # the judge pair's prompt is the rubric prompt the judgments answered (request p0, reply a1)
    assert judge[0]["prompt"] == load_template("rubric").render({"prompt": "p0", "response": "a1"}).user
    # the meta-judge saw the request and the judged reply, every pair of scored judgments once
    assert {x for x, _, _ in meta.seen} == {meta_context("p0", "a1"), meta_context("p1", "b0")}
    assert len(meta.seen) == 6
    m = info["meta_judge"]
    assert (m["actor_pairs"], m["judge_pairs"], m["meta_judgments"], m["meta_unreadable"]) == (2, 1, 6, 1)
    assert (m["judgments"], m["judgments_unscored"]) == (18, 5)
    assert m["judge_pair_counts"] == {"kept": 1, "no_judged_response": 0, "unreadable": 0, "tied_wins": 0,
                                      "same_score": 1, "identical_text": 0}
    assert m["length_mean"] == {"chosen": 7.5, "rejected": 14.5}  # (10 + 5) / 2, (20 + 9) / 2
    # both stages are files, read back on a rerun: no judgment or meta-judgment is made twice
    assert len(read_jsonl(tmp_path / "data" / "judgments.jsonl")) == 2
    assert [r["response_index"] for r in read_jsonl(tmp_path / "data" / "meta_judgments.jsonl")] == [1, 0]
    w2, m2 = PlantedWriter({}), PlantedMeta({})
    again, _, info2 = variant_pairs(_meta_cfg(), ROWS, t=2, it_dir=tmp_path, anchor_rows=None, prev_judge=None,
                                    meta_roles=lambda: (w2, m2))
    assert again == pairs and info2 == info and w2.calls == 0 and m2.seen == []


def test_meta_rewarding_with_cream_softens_only_actor_pairs(tmp_path):
    (tmp_path / "data").mkdir()

    class Prev:
        id = "prev"

        def score(self, prompts, responses, *, references=None):  # ranks p0 a0 > a2 > a1 (tau 1/3), p1 reversed
            t = {"a0": 3.0, "a1": 1.0, "a2": 2.0, "b0": 1.0, "b1": 2.0, "b2": 3.0}
            return [Score(t[y], True, self.id) for y in responses]

    pairs, _, info = variant_pairs(_meta_cfg(cream=True), ROWS, t=3, it_dir=tmp_path, anchor_rows=None,
                                   prev_judge=lambda: Prev(), meta_roles=lambda: (PlantedWriter(JUDGMENTS), PlantedMeta(QUALITY)))
    # p0: (5,4,1) vs (3,1,2): pairs (0,1) C, (0,2) C, (1,2) D -> tau 1/3; p1: (4,1,1) vs (1,2,3): tau-b with a tie
    c = info["cream"]["C"]
    assert info["cream"]["applied"] and 0 < c < 1
    assert {p["role"]: p["p"] for p in pairs} == {"actor": c, "judge": 1.0}


# ----------------------------------------------------------------------------- future-guided chosen

def test_replace_chosen_hand_computed():
    pairs = [{"prompt": "p0", "chosen": "c0", "chosen_score": 3.0, "rejected": "r0", "rejected_score": 1.0},
             {"prompt": "p1", "chosen": "c1", "chosen_score": 3.0, "rejected": "r1", "rejected_score": 1.0},
             {"prompt": "p2", "chosen": "c2", "chosen_score": 2.0, "rejected": "r2", "rejected_score": 1.0},
             {"prompt": "p3", "chosen": "c3", "chosen_score": 2.0, "rejected": "r3", "rejected_score": 1.0}]
    future = [{"prompt": "p0", "responses": ["f0", "f1", "f2"], "scores": [2.0, 4.0, 4.0]},  # best 4 > 3: f1 (first)
              {"prompt": "p1", "responses": ["g0", "g1"], "scores": [3.0, 1.0]},          # best 3 = 3: kept
              {"prompt": "p2", "responses": ["r2", "h1"], "scores": [5.0, 1.0]},          # best is the rejected's text
              {"prompt": "p3", "responses": ["k0", "k1"], "scores": [None, None]}]        # unscored
    out, counts = replace_chosen(pairs, future, "M3'")
    assert [p["chosen"] for p in out] == ["f1", "c1", "c2", "c3"]
    assert counts == {"pairs": 4, "replaced": 1, "kept_chosen": 2, "unscored": 1}
    assert (out[0]["chosen_score"], out[0]["chosen_from"], out[0]["replaced_chosen"], out[0]["rejected"]) == \
        (4.0, "M3'", "c0", "r0")
    assert out[1:] == pairs[1:]
    with pytest.raises(ValueError, match="prompt"):
        replace_chosen(pairs[:1], [{**future[0], "prompt": "other"}], "M3'")


def test_future_guided_chosen_runs_after_the_anchored_pairs(tmp_path):
    rows = [{"index": 0, "prompt": "p0", "responses": ["c1", "c2"], "scores": [4.0, 2.0]}]
    anchor = [{"prompt": "p0", "responses": ["a1", "a2"], "scores": [3.0, 0.0]}]
    seen = []

    def future(pairs):
        seen.append([(p["chosen"], p["rejected"]) for p in pairs])
        return replace_chosen(pairs, [{"prompt": "p0", "responses": ["f"], "scores": [5.0]}], "M2'")

    cfg = SimpleNamespace(cream=SimpleNamespace(enabled=False), temporal=SimpleNamespace(anchor="m1", future=True))
    pairs, _, info = variant_pairs(cfg, rows, t=2, it_dir=tmp_path, anchor_rows=lambda: anchor, prev_judge=None,
                                   future=future)
    assert seen == [[("c1", "a2")]]  # M_t' trains on the anchored pair
    assert [(p["chosen"], p["rejected"], p["chosen_from"]) for p in pairs] == [("f", "a2", "M2'")]
    assert info["temporal"]["future"] == {"pairs": 1, "replaced": 1, "kept_chosen": 0, "unscored": 0}


# ----------------------------------------------------------------------------- config

def test_v2_config_defaults_off_and_bad_combinations_refused():
    cfg = SelfRewardConfig()
    assert cfg.meta_judge.enabled is False and cfg.temporal.future is False
    assert cfg.meta_judge.meta.template == "meta-judge" and cfg.meta_judge.judge.kind == "rubric"
    for sets, key in ((["temporal.future=true"], "temporal.future"),
                      (["meta_judge.enabled=true", "temporal.anchor=m1"], "meta_judge.enabled"),
                      (["meta_judge.judge.rubric.samples=1"], "meta_judge.judge.rubric.samples"),
                      (["meta_judge.meta.kind=rubric"], "meta_judge.meta"),
                      (["meta_judge.enabled=true", "meta_judge.meta.kind=openai"], "meta_judge.meta"),
                      (["meta_judge.length_control=1"], "meta_judge.length_control"),
                      (["meta_judge.judge.kind=expected-score"], "meta_judge.judge.kind"),
                      (["meta_judge.lenght_control=0.1"], "meta_judge.lenght_control")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            load_config(SelfRewardConfig, None, sets)
        assert e.value.exit_code == 2 and "\n" not in str(e.value)
    ok = load_config(SelfRewardConfig, None, ["temporal.anchor=m1", "temporal.future=true", "cream.enabled=true"])
    assert ok.temporal.future and ok.cream.enabled
    ok = load_config(SelfRewardConfig, None, ["meta_judge.enabled=true", "judge_model=fixed", "meta_judge.meta.kind=openai"])
    assert ok.meta_judge.meta.kind == "openai"


def test_judgments_after_an_answer_prefix_are_read_with_it(tmp_path):
    """With a template whose answer starts "Score: " (the score-first rubric), a judgment is the
    prefix plus the generated text and its score is read from that: "4 ..." -> 4, "99 ..." is out
    of the 0-5 range -> unscored, as the rubric judge reads its own text."""
    from pathlib import Path

    from pofe.loops.self_reward.meta_rewarding import judgments_stage

    writer = PlantedWriter({"y": [("4\nIt answers.", None), ("99 points", None), ("2.5, partly", None)]})
    writer.template = load_template(str(Path(__file__).resolve().parents[2] / "examples" / "templates" /
                                        "rubric-score-first.yaml"))
    writer.lo, writer.hi = 0.0, 5.0
    rows = judgments_stage(tmp_path / "j.jsonl", [{"index": 7, "prompt": "x", "responses": ["y"]}], writer)
    assert rows == [{"index": 7, "prompt": "x", "judge_id": "planted-writer",
                     "texts": [["Score: 4\nIt answers.", "Score: 99 points", "Score: 2.5, partly"]],
                     "scores": [[4.0, None, 2.5]]}]
    assert read_jsonl(tmp_path / "j.jsonl") == rows


def test_meta_example_parses():
    from pathlib import Path

    cfg = load_config(SelfRewardConfig, Path(__file__).resolve().parents[2] / "examples" / "self-reward-meta.yaml")
    assert cfg.meta_judge.enabled and cfg.meta_judge.judge.rubric.samples == 4 and cfg.meta_judge.meta.kind == "llm"
    assert cfg.meta_judge.judge.template.endswith("rubric-score-first.yaml") and cfg.meta_judge.length_control == 0.25
