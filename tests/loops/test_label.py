"""pofe label (RL-CAI labels): orientation, judge-fitness statistics, the run, and the cache."""

from __future__ import annotations

import json

import pytest

from pofe.loops.label import LabelConfig, label_stats, run, to_preference
from pofe.records import Judgment
from pofe.runs import RunError


# Tiny models run much faster single-threaded (shared fixture in conftest.py).

def _row(p, p_ab=None, p_ba=None, a="aa", b="b", consistent=None):
    return {"prompt": "x", "response_a": a, "response_b": b, "p": p, "p_ab": p_ab, "p_ba": p_ba, "consistent": consistent,
            "judge_id": "j", "principle_id": "pr", "constitution_version": "1", "template_id": "t", "template_hash": "h"}


def test_to_preference_orients_to_the_favourite():
    q = to_preference(_row(0.581, 0.711, 0.450, consistent=False))  # the seed's worked example
    assert (q.chosen, q.rejected, q.p) == ("aa", "b", 0.581)
    q = to_preference(_row(0.2))
    assert (q.chosen, q.rejected) == ("b", "aa") and q.p == pytest.approx(0.8) and q.provenance["swapped"]
    assert to_preference(_row(None)) is None  # no label invented


def test_label_stats_by_hand():
    rows = [
        _row(0.581, 0.711, 0.450, a="aaaa", b="b", consistent=False),  # first-shown wins: (0.711 + 0.55)/2 = 0.6305
        _row(0.9, 0.95, 0.85, a="a", b="bbbb", consistent=True),       # (0.95 + 0.15)/2 = 0.55
        _row(0.1, 0.05, 0.15, a="aa", b="bb", consistent=True),        # (0.05 + 0.85)/2 = 0.45
        _row(None),
    ]
    s = label_stats(rows)
    assert s["pairs"] == 4 and s["parsed"] == 3 and s["parse_failures"] == 1
    assert s["consistency_rate"] == pytest.approx(2 / 3)
    assert s["first_position_win_rate"] == pytest.approx((0.6305 + 0.55 + 0.45) / 3)
    assert s["p_histogram"]["counts"] == [0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    assert s["mean_confidence"] == pytest.approx((0.081 + 0.4 + 0.4) / 3)
    # p - 1/2 = (.081, .4, -.4) against len diff (3, -3, 0): longer loses here -> negative r
    assert s["length_correlation"] < 0


def _pairs_file(tmp_path, n=6):
    f = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"Question {i}?", "response_a": "short" * (1 + i % 2), "response_b": "a much longer answer " * (1 + i % 3)}
            for i in range(n)]
    rows.append({"prompt": "same", "response_a": "x", "response_b": "x"})  # identical: dropped
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f


def test_run_with_length_judge_writes_soft_labels(tmp_path):
    cfg = LabelConfig(data={"pairs": str(_pairs_file(tmp_path))}, judge={"kind": "length", "prefer": "shorter", "temperature": 10.0},
                      run={"output_dir": str(tmp_path), "name": "lab"})
    s = run(cfg)
    assert s["pairs"] == 6 and s["identical_dropped"] == 1 and s["preference_pairs"] == 6
    assert s["consistency_rate"] == 1.0 and s["labels_per_second"] > 0
    labels = [json.loads(x) for x in open(s["files"]["labels"])]
    import math

    r0 = labels[0]  # len(a)=5, len(b)=21 -> sigmoid(16/10)
    assert r0["p"] == pytest.approx(1 / (1 + math.exp(-1.6)))
    prefs = [json.loads(x) for x in open(s["files"]["preferences"])]
    assert all(q["p"] >= 0.5 for q in prefs) and prefs[0]["chosen"] == r0["response_a"]


class Scripted:
    """A judge returning given (p, p_ab, p_ba, consistent, text_fallback) verdicts in turn; raises
    Crash on the ``crash_at``-th call (a fault in the middle of a run)."""

    id = "scripted"

    def __init__(self, verdicts, crash_at=None):
        self.verdicts, self.i, self.calls, self.crash_at = list(verdicts), 0, 0, crash_at

    def judge(self, prompts, a, b, references=None):
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            raise Crash("injected fault")
        out = []
        for _ in prompts:
            p, pab, pba, cons, fb = self.verdicts[self.i % len(self.verdicts)]
            self.i += 1
            out.append(Judgment(p=p, p_ab=pab, p_ba=pba, consistent=cons, parse_ok=p is not None, judge_id=self.id,
                                hard_label_fallback=fb))
        return out


class Crash(Exception):
    pass


def test_drop_inconsistent(tmp_path):
    cfg = LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 3))}, labels={"drop_inconsistent": True}, judge={"kind": "length"},
                      run={"output_dir": str(tmp_path), "name": "lab"})
    s = run(cfg, judge=Scripted([(0.6, 0.8, 0.4, False, False)]))
    assert s["pairs"] == 3 and s["preference_pairs"] == 0 and s["consistency_rate"] == 0.0
    assert s["filter"]["dropped"] == {"unlabelled": 0, "inconsistent": 3, "low_margin": 0}
    rows = [json.loads(x) for x in open(s["files"]["labels"])]
    assert [r["dropped"] for r in rows] == ["inconsistent"] * 3  # kept in labels.jsonl, with the reason


def test_label_hygiene_margin_filter_counts_and_text_fallback_flag(tmp_path):
    """Label hygiene: |p - 1/2| under a margin is dropped and counted; the default keeps all
    and says so in the summary; text-fallback (no log-prob) labels are flagged in every output."""
    verdicts = [(0.55, 0.6, 0.5, True, False), (0.9, 0.9, 0.9, True, False), (1.0, 1.0, 1.0, True, True),
                (0.45, 0.4, 0.5, False, False), (None, None, None, None, False), (0.2, 0.1, 0.3, True, False)]
    cfg = LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 6))}, judge={"kind": "length"}, labels={"min_margin": 0.1},
                      train={"batch_size": 4}, run={"output_dir": str(tmp_path), "name": "lab"})
    s = run(cfg, judge=Scripted(verdicts))
    # 0.55 and 0.45 sit within 0.1 of 1/2; None is unlabelled; 0.9, 1.0 and 0.2 are kept
    assert s["filter"] == {"drop_inconsistent": False, "min_margin": 0.1,
                           "dropped": {"unlabelled": 1, "inconsistent": 0, "low_margin": 2}}
    assert s["preference_pairs"] == 3 and s["text_fallback_labels"] == 1
    prefs = [json.loads(x) for x in open(s["files"]["preferences"])]
    assert [q["p"] for q in prefs] == pytest.approx([0.9, 1.0, 0.8])
    assert [q["provenance"]["text_fallback"] for q in prefs] == [False, True, False]
    labels = [json.loads(x) for x in open(s["files"]["labels"])]
    assert [r["text_fallback"] for r in labels] == [False, False, True, False, False, False]
    metrics = [json.loads(x) for x in open(tmp_path / "lab" / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2] and [m["pairs"] for m in metrics] == [4, 2]
    assert [m["text_fallback"] for m in metrics] == [1, 0] and [m["dropped"] for m in metrics] == [2, 1]
    # the margin is inclusive at its edge: |0.4 - 1/2| = 0.1 is kept (0.5 - 0.4 is 0.0999... in floats)
    from pofe.labels import LabelPolicy

    assert LabelPolicy(min_margin=0.1).drop_reason(0.4, True) is None
    assert LabelPolicy(min_margin=0.1000001).drop_reason(0.4, True) == "low_margin"
    # the default: nothing filtered, and the summary shows it
    d = run(LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 6))}, judge={"kind": "length"},
                        run={"output_dir": str(tmp_path), "name": "lab2"}), judge=Scripted(verdicts))
    assert d["filter"]["drop_inconsistent"] is False and d["filter"]["min_margin"] == 0.0
    assert d["filter"]["dropped"] == {"unlabelled": 1, "inconsistent": 0, "low_margin": 0} and d["preference_pairs"] == 5


def test_crash_mid_run_then_resume_labels_each_pair_once(tmp_path):
    verdicts = [(0.1 * (i + 1), 0.1 * (i + 1), 0.1 * (i + 1), True, False) for i in range(6)]
    cfg = LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 6))}, judge={"kind": "length"}, train={"batch_size": 2},
                      run={"output_dir": str(tmp_path), "name": "lab"})
    with pytest.raises(Crash):
        run(cfg, judge=Scripted(verdicts, crash_at=3))  # batches 1 and 2 written, batch 3 crashes
    d = tmp_path / "lab"
    assert len(open(d / "labels.jsonl").readlines()) == 4
    with open(d / "labels.jsonl", "a") as f:
        f.write('{"prompt": "torn')  # a torn last line from the crash
    judge = Scripted(verdicts[4:])
    s = run(cfg, resume=d, judge=judge)
    assert judge.calls == 1 and s["resumed_after"] == 4  # only the last batch was judged
    labels = [json.loads(x) for x in open(d / "labels.jsonl")]
    prefs = [json.loads(x) for x in open(d / "preferences.jsonl")]
    assert [r["p"] for r in labels] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert [r["prompt"] for r in labels] == [f"Question {i}?" for i in range(6)]
    assert len(prefs) == 6 and s["preference_pairs"] == 6
    assert [json.loads(x)["step"] for x in open(d / "metrics.jsonl")] == [1, 2, 3]
    kept = list(d.glob("labels.after-crash-*.jsonl"))  # what followed the last checkpoint is set aside, never deleted
    assert len(kept) == 1 and kept[0].read_text() == '{"prompt": "torn'
    with pytest.raises(RunError):
        run(cfg, resume=tmp_path / "typo", judge=judge)


def test_second_run_is_served_entirely_from_the_cache(tmp_path, tiny_model_dir):
    """The llm constitution judge on a tiny model: labelling the same inputs twice costs nothing."""
    judge = {"kind": "llm", "model": str(tiny_model_dir), "template": "constitution", "constitution": "hhh",
             "cache": {"path": str(tmp_path / "cache.sqlite")}}
    pairs = str(_pairs_file(tmp_path, 4))
    s1 = run(LabelConfig(data={"pairs": pairs}, judge=judge, run={"output_dir": str(tmp_path), "name": "l1"}))
    s2 = run(LabelConfig(data={"pairs": pairs}, judge=judge, run={"output_dir": str(tmp_path), "name": "l2"}))
    # 4 pairs x 2 orders = 8 ordered reads: all misses first, all hits the second time
    assert s1["cache"]["judgments_cached"] == 0 and (s1["cache"]["hits"], s1["cache"]["misses"]) == (0, 8)
    assert s2["cache"]["judgments_cached"] == s2["pairs"] == 4
    assert (s2["cache"]["hits"], s2["cache"]["misses"]) == (8, 0) and s2["cache"]["hit_rate"] == 1.0
    l1 = [json.loads(x) for x in open(s1["files"]["labels"])]
    l2 = [json.loads(x) for x in open(s2["files"]["labels"])]
    assert [r["p"] for r in l1] == [r["p"] for r in l2]
    # provenance on every label: principle, constitution version, template hash
    assert all(r["principle_id"] and r["constitution_version"] == "hhh-1" and r["template_hash"] for r in l1)
    assert all(r["p_ab"] is not None and r["p_ba"] is not None for r in l1)


def test_sampling_pairs_with_a_tiny_policy(tmp_path, tiny_model, tokenizer):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    cfg = LabelConfig(data={"prompts": str(prompts)}, sampling={"max_new_tokens": 5, "temperature": 1.0}, judge={"kind": "length"},
                      run={"output_dir": str(tmp_path), "name": "lab"})
    s = run(cfg, policy=tiny_model, tokenizer=tokenizer)
    assert s["pairs"] + s["identical_dropped"] == 2


def test_partial_overrides_keep_the_command_defaults():
    """--set judge.cache.path=... must not drop the constitution template (a nested default
    instance would be replaced wholesale by the partial dict)."""
    from pofe.config import load_config

    cfg = load_config(LabelConfig, None, ["judge.cache.path=/tmp/x.sqlite", "sampling.top_p=0.9"])
    assert cfg.judge.template == "constitution" and cfg.judge.constitution == "hhh"
    assert cfg.sampling.temperature == 1.0 and cfg.sampling.max_new_tokens == 64
    from pofe.loops.rl import RLConfig
    from pofe.loops.rm import RMConfig

    assert load_config(RMConfig, None, ["optim.lr=0.1"]).optim.warmup_steps == 0
    assert load_config(RLConfig, None, ["optim.lr=0.1"]).optim.warmup_steps == 0
    rl = load_config(RLConfig, None, ["sampling.top_p=0.9"]).sampling
    assert (rl.temperature, rl.max_new_tokens) == (1.0, 48)
    from pofe.loops.cai_revise import CaiReviseConfig

    cai = load_config(CaiReviseConfig, None, ["sampling.top_p=0.9", "critique_sampling.top_p=0.8"])
    assert (cai.sampling.max_new_tokens, cai.sampling.temperature, cai.critique_sampling.max_new_tokens) == (96, 0.7, 64)


def test_cli_commands_config_handling_and_a_label_run(tmp_path):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    runner = CliRunner()
    for cmd in (["cai", "revise"], ["cai", "refusal"], ["label"], ["rm"], ["rl"]):
        res = runner.invoke(app, [*cmd, "--print-config"])
        assert res.exit_code == 0, (cmd, res.output)
        bad = runner.invoke(app, [*cmd, "--set", "no_such_key=1"])
        assert bad.exit_code == 2 and "no_such_key" in bad.output
    res = runner.invoke(app, ["label", "--pairs", str(_pairs_file(tmp_path, 3)), "--output-dir", str(tmp_path),
                              "--name", "cli", "--set", "judge.kind=length", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output[res.output.index("{"):])
    assert s["pairs"] == 3 and s["cache"]["judgments"] == 3
    assert runner.invoke(app, ["rm", "--output-dir", str(tmp_path)]).exit_code == 2  # no training data: one-line error
    # --resume RUN_DIR on each command: a typo'd folder is a one-line error, never a fresh run
    for cmd in (["cai", "revise"], ["label"], ["rm"], ["rl"]):
        res = runner.invoke(app, [*cmd, "--resume", str(tmp_path / "no-such-run")])
        assert res.exit_code == 2 and "no config.yaml" in res.output, (cmd, res.output)
    assert not (tmp_path / "no-such-run").exists()
    # resuming the finished label run: nothing is judged again, nothing is written twice
    res = runner.invoke(app, ["label", "--resume", s["run_dir"], "--json"])
    assert res.exit_code == 0, res.output
    again = json.loads(res.output[res.output.index("{"):])
    assert again["resumed_after"] == 3 and again["cache"]["judgments"] == 0 and again["pairs"] == 3
    assert len(open(again["files"]["labels"]).readlines()) == 3 and len(open(again["files"]["preferences"]).readlines()) == 3


@pytest.mark.slow
def test_embedded_model_labels_two_pairs(tmp_path):
    """The embedded SmolLM2 as constitution judge: real soft labels with full provenance."""
    cfg = LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 2))}, judge={"kind": "llm", "template": "constitution", "constitution": "hhh",
                                                                 "cache": {"enabled": False}, "max_response_chars": 400},
                      run={"output_dir": str(tmp_path), "name": "emb"})
    s = run(cfg)
    rows = [json.loads(x) for x in open(s["files"]["labels"])]
    assert s["parsed"] == 2 and all(0.0 < r["p"] < 1.0 for r in rows)
    assert all(r["constitution_version"] == "hhh-1" and r["principle_id"] for r in rows)
    assert s["labels_per_second"] > 0 and sum(s["p_histogram"]["counts"]) == 2


def test_label_applies_the_audit_calibration_map_and_keeps_p_raw(tmp_path):
    """A temperature fitted by ``pofe audit`` is applied to every label.
    T = 2 maps p = 0.9 to expit(logit(0.9) / 2) = 3/4 exactly (logit 0.9 = ln 9; e^{ln 9 / 2} = 3),
    p = 0.2 to expit(-ln 4 / 2) = 1/3; an unparsed label stays unparsed."""
    report = tmp_path / "audit.json"
    report.write_text(json.dumps({"judge": "length", "calibration": {"sha256": "abc"},
                                  "metrics": {"calibration": {"map": {"method": "temperature", "temperature": 2.0}}}}))
    verdicts = [(0.9, 0.9, 0.9, True, False), (0.2, 0.2, 0.2, True, False), (None, None, None, None, False)]
    cfg = LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 3))}, judge={"kind": "length"}, labels={"calibration": str(report)},
                      run={"output_dir": str(tmp_path), "name": "cal"})
    s = run(cfg, judge=Scripted(verdicts))
    labels = [json.loads(x) for x in open(s["files"]["labels"])]
    assert [r["p"] for r in labels[:2]] == pytest.approx([0.75, 1 / 3]) and labels[2]["p"] is None
    assert [r["p_raw"] for r in labels] == [0.9, 0.2, None]
    assert labels[0]["calibration"] == {"method": "temperature", "source": str(report), "calibration_sha256": "abc"}
    prefs = [json.loads(x) for x in open(s["files"]["preferences"])]
    assert [q["p"] for q in prefs] == pytest.approx([0.75, 2 / 3])  # oriented: max(p, 1 - p)
    # a report without a fitted map is refused before any run folder is made
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"metrics": {}}))
    with pytest.raises(ValueError, match="no metrics.calibration.map"):
        run(LabelConfig(data={"pairs": str(_pairs_file(tmp_path, 3))}, judge={"kind": "length"}, labels={"calibration": str(bad)},
                        run={"output_dir": str(tmp_path), "name": "cal-bad"}), judge=Scripted(verdicts))
    assert not (tmp_path / "cal-bad").exists()
