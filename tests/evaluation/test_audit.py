"""``pofe audit``: hand-computed metrics, contrast pairs, thresholds, the training gate, the
calibration adapters, and the acceptance audit of the ``length`` judge on shared data."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app

from pofe.data.calibration import (
    CalibrationItem, load_calibration, load_calibration_file, normalise_label, split_hh_transcript,
)
from pofe.evaluation.audit import (
    AuditConfig, AuditError, AuditThresholds, calibration_metrics, contrast_pairs, evaluate_checks, require_audit,
    run_audit,
)
from pofe.judges.config import LengthJudgeConfig, LLMJudgeConfig
from pofe.judges.registry import build_judge
from pofe.records import Judgment

runner = CliRunner()


def J(p_ab, p_ba):
    p = None if p_ab is None or p_ba is None else (p_ab + p_ba) / 2
    return Judgment(p=p, p_ab=p_ab, p_ba=p_ba, consistent=None, parse_ok=p is not None, judge_id="fake")


ITEMS = [
    CalibrationItem("x0", "aaaa", "bb", "A", "s1"),
    CalibrationItem("x1", "a", "bbb", "B", "s1"),
    CalibrationItem("x2", "aa", "bbbbb", "A", "s2"),
    CalibrationItem("x3", "aaa", "b", "tie", "s2"),
    CalibrationItem("x4", "aa", "b", "A", "s2"),
]
JUDGMENTS = [J(0.84, 0.6), J(0.7, 0.2), J(0.9, 0.1), J(0.64, 0.8), J(None, None)]


def test_calibration_metrics_by_hand():
    m = calibration_metrics(ITEMS, JUDGMENTS)
    # p = 0.72, 0.45, 0.5, 0.72, None.
    assert (m["n"], m["n_parsed"], m["parse_failures"], m["order_parse_failures"]) == (5, 4, 1, 2)
    assert m["parse_failure_rate"] == pytest.approx(0.2)
    # Labelled, parsed: x0 (A, judge A), x1 (B, judge B), x2 (A, judge tie -> 1/2): 2.5 / 3.
    assert m["n_labelled"] == 3
    assert m["agreement"] == pytest.approx(2.5 / 3)
    assert m["agreement_strict"] == pytest.approx(2 / 3)
    # First order alone: 0.84 -> A (right), 0.7 -> A (wrong), 0.9 -> A (right).
    assert m["agreement_single_order"] == pytest.approx(2 / 3)
    assert m["human_ties"] == {"n": 1, "judge_tie_rate": 0.0, "mean_abs_p_minus_half": pytest.approx(0.22)}
    # Both orders agree for x0 (A, A) and x3 (A, A); x1 (A, B) and x2 (A, B) flip.
    assert m["position_consistency"] == pytest.approx(0.5)
    # Queries where the first shown won: x0 (1, 0), x1 (1, 1), x2 (1, 1), x3 (1, 0) -> 6 / 8.
    assert m["first_position_win_rate"] == pytest.approx(0.75)
    assert m["mean_p_first"] == pytest.approx((0.84 + 0.4 + 0.7 + 0.8 + 0.9 + 0.9 + 0.64 + 0.2) / 8)
    # dlen = 2, -2, -3, 2 against p = .72, .45, .5, .72: of the 5 pairs with different p,
    # 4 are concordant and 1 ((x1, x2): p up, dlen down) discordant -> D = 3 / 5.
    assert m["length_correlation"] == pytest.approx(0.6)
    # Non-tie verdicts with unequal lengths: x0, x1, x3 all pick the longer response.
    assert m["longer_preferred_rate"] == 1.0
    # Humans: x0 longer chosen, x1 longer chosen, x2 shorter chosen, x4 longer chosen -> 3/4.
    assert m["human_longer_preferred_rate"] == pytest.approx(0.75)
    assert m["p_histogram"]["counts"] == [0, 0, 0, 0, 1, 1, 0, 2, 0, 0]
    s1 = dict(m["by_source"]["s1"])
    # Wilson on 2 of 2: [1 / (1 + z^2 / 2), 1] = [0.3424, 1].
    assert s1.pop("agreement_ci95") == pytest.approx([1 / (1 + 1.959964**2 / 2), 1.0], abs=1e-5)
    assert s1 == {"n": 2, "agreement": 1.0, "position_consistency": 0.5, "parse_failures": 0}


def test_checks_and_thresholds():
    m = calibration_metrics(ITEMS, JUDGMENTS)
    checks = evaluate_checks(m, AuditThresholds())
    assert checks["agreement"] == {"value": pytest.approx(2.5 / 3), "threshold": 0.6, "op": ">=", "passed": True}
    assert not checks["position_consistency"]["passed"]  # 0.5 < 0.7
    assert checks["first_position_bias"]["value"] == pytest.approx(0.25) and not checks["first_position_bias"]["passed"]
    assert not checks["parse_failure_rate"]["passed"]  # 0.2 > 0.05
    # null switches a check off; an unmeasurable metric fails.
    off = evaluate_checks(m, AuditThresholds(min_position_consistency=None))
    assert "position_consistency" not in off
    assert evaluate_checks({"agreement": None}, AuditThresholds(min_agreement=0.5))["agreement"]["passed"] is False


def test_contrast_pairs_construction():
    items = [CalibrationItem("Why?", "Worse answer.", "First point. Second point here.", "B")]
    cp = contrast_pairs(items, limit=5)
    (x, v, plain), = cp["bullets"]
    assert (x, v, plain) == ("Why?", "- First point.\n- Second point here.", "First point. Second point here.")
    (_, v, plain), = cp["padding"]
    assert v.startswith("First point. Second point here. ") and len(v) > len(plain) + 50
    (_, v, plain), = cp["confident_preamble"]
    assert v.endswith(plain) and v != plain
    # One-sentence responses make no bullet contrast.
    assert contrast_pairs([CalibrationItem("q", "Just one.", "x", "A")], 5)["bullets"] == []


class ConstantJudge:
    """p = 0.5 in both orders: no position, length or style preference at all."""

    id = "constant"

    def judge(self, prompts, a, b, *, references=None):
        return [J(0.5, 0.5) for _ in prompts]


class FirstJudge:
    """Always prefers whatever is shown first: p_ab = 0.9, p_ba = 0.1."""

    id = "first"

    def judge(self, prompts, a, b, *, references=None):
        return [J(0.9, 0.1) for _ in prompts]


def _items(n=40):
    # Made-up pairs with varied lengths and labels (no data-set text).
    out = []
    for i in range(n):
        a = "Alpha sentence one. " * (1 + i % 5)
        b = "Beta clause. " * (1 + (i * 3) % 7)
        out.append(CalibrationItem(f"question {i}", a.strip(), b.strip(), "A" if i % 3 else "B", "synthetic"))
    return out


def test_unbiased_judge_contrasts_sit_at_half_and_position_judge_fails():
    th = AuditThresholds(min_agreement=None, min_position_consistency=0.7)
    rep = run_audit(ConstantJudge(), _items(), AuditConfig(thresholds=th, contrast_limit=10))
    c = rep["metrics"]["contrasts"]
    assert c["padding"]["mean_p_variant"] == 0.5 and c["confident_preamble"]["n"] == 10 and c["bullets"]["n"] == 10
    assert rep["checks"]["contrast_padding"]["passed"]
    assert rep["metrics"]["first_position_win_rate"] == 0.5
    # A constant p has no rank correlation with length: unmeasurable -> that check fails.
    assert rep["metrics"]["length_correlation"] is None and not rep["checks"]["length_correlation"]["passed"]
    first = run_audit(FirstJudge(), _items(), AuditConfig(thresholds=th, contrasts=False))
    assert first["metrics"]["first_position_win_rate"] == 1.0
    assert first["metrics"]["position_consistency"] == 0.0
    assert not first["passed"]
    assert {n for n, c in first["checks"].items() if not c["passed"]} >= {"first_position_bias", "position_consistency"}


def test_length_judge_on_synthetic_set_correlates_and_fails():
    rep = run_audit(build_judge(LengthJudgeConfig(prefer="longer")), _items(), AuditConfig(contrast_limit=10))
    m = rep["metrics"]
    assert m["length_correlation"] == 1.0 and m["longer_preferred_rate"] == 1.0
    assert m["position_consistency"] == 1.0 and m["first_position_win_rate"] == 0.5
    assert m["length_slope"] > 5
    assert not rep["checks"]["length_correlation"]["passed"] and not rep["passed"]
    assert all(m["contrasts"][k]["mean_p_variant"] == 1.0 for k in ("padding", "bullets", "confident_preamble"))
    shorter = run_audit(build_judge(LengthJudgeConfig()), _items(), AuditConfig(contrasts=False))
    assert shorter["metrics"]["length_correlation"] == -1.0


def test_audit_without_a_config_names_the_judge_it_audited(tmp_path):
    # run_audit(judge, items) with no AuditConfig wrote AuditConfig's default judge (kind llm)
    # into the report of a length judge.
    from pofe.evaluation.audit import write_audit

    rep = run_audit(build_judge({"kind": "length"}), ITEMS)
    write_audit(rep, tmp_path / "audit.json")
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["judge"] == "length:shorter:chars"
    assert saved["judge_config"]["kind"] == "length" and saved["judge_config"]["prefer"] == "shorter"
    assert "llm" not in json.dumps({k: saved[k] for k in ("judge", "judge_config", "judge_identity")})
    # shorter wins x0 (B), x1 (A), x2 (A), x4 (B) against the labels A, B, A, A; x3 is a tie: 1 of 4
    assert saved["metrics"]["agreement"] == 0.25
    # a judge made by hand has no config to report: its id names it, and nothing is made up
    by_hand = run_audit(ConstantJudge(), ITEMS, AuditConfig(contrasts=False))
    assert by_hand["judge"] == "constant" and by_hand["judge_config"] is None


def test_require_audit(tmp_path):
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"judge": "j", "passed": True, "checks": {"agreement": {"value": 0.7, "threshold": 0.6,
                                                                                     "op": ">=", "passed": True}}}))
    assert require_audit(ok)["judge"] == "j"
    rep = run_audit(build_judge(LengthJudgeConfig(prefer="longer")), _items(), AuditConfig(contrasts=False))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(rep))
    with pytest.raises(AuditError, match=r"length_correlation = 1\.000 \(needs <= 0\.3\)") as e:
        require_audit(bad)
    assert "length_correlation" in e.value.failed and "length_slope" in e.value.failed
    with pytest.raises(AuditError, match="not found"):
        require_audit(tmp_path / "missing.json")
    with pytest.raises(AuditError, match="audited judge 'j', not 'other'"):
        require_audit(ok, judge_id="other")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(AuditError, match="not a pofe audit report"):
        require_audit(tmp_path / "junk.json")


# ------------------------------------------------------------------ calibration adapters


def test_hh_transcript_split_and_adapter(tmp_path):
    # Made-up dialogue in the HH transcript format.
    ctx = "\n\nHuman: Tell me about cats.\n\nAssistant: They purr.\n\nHuman: And dogs?"
    rows = [{"chosen": ctx + "\n\nAssistant: They bark.", "rejected": ctx + "\n\nAssistant: No idea."}] * 40
    rows.append({"chosen": "\n\nHuman: hi\n\nAssistant: same", "rejected": "\n\nHuman: hi\n\nAssistant: same"})
    assert split_hh_transcript(rows[0]["chosen"]) == (ctx, "They bark.")
    path = tmp_path / "test.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    items = load_calibration_file(path, seed=0)
    assert len(items) == 40  # the identical-replies pair is skipped
    assert items[0].prompt.startswith("Human: Tell me about cats.") and "Assistant: They purr." in items[0].prompt
    # Random order: the human-chosen reply sits in A about half the time, and the label follows it.
    n_a = sum(it.label == "A" for it in items)
    assert 10 < n_a < 30
    assert all((it.response_a == "They bark.") == (it.label == "A") for it in items)
    assert load_calibration_file(path, seed=0) == items  # seeded
    assert len(load_calibration_file(path, limit=7)) == 7


def test_llmbar_and_pofe_forms(tmp_path):
    (tmp_path / "dataset.json").write_text(json.dumps([
        {"input": "q", "output_1": "o1", "output_2": "o2", "label": 2},
        {"input": "q2", "output_1": "p1", "output_2": "p2", "label": 1}]))
    items = load_calibration([tmp_path])
    assert [(i.response_a, i.label) for i in items] == [("o1", "B"), ("p1", "A")]
    pf = tmp_path / "cal.jsonl"
    pf.write_text(json.dumps({"prompt": "p", "response_a": "a", "response_b": "b", "label": "tie"}) + "\n")
    assert load_calibration_file(pf)[0].label == "tie"
    assert [normalise_label(x, "t") for x in ("a", "B", 1, 2, 0.5, "TIE")] == ["A", "B", "A", "B", "tie", "tie"]
    with pytest.raises(ValueError, match="label must be"):
        normalise_label(0, "cal.jsonl:3")
    with pytest.raises(ValueError, match="unknown calibration format"):
        (tmp_path / "x.jsonl").write_text('{"foo": 1}\n')
        load_calibration_file(tmp_path / "x.jsonl")


def test_cli_audit_exit_status_and_report(tmp_path):
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"prompt": it.prompt, "response_a": it.response_a, "response_b": it.response_b,
                                       "label": it.label}) + "\n" for it in _items()))
    out = tmp_path / "report.json"
    r = runner.invoke(app, ["audit", str(cal), "--judge", "length", "--set", "judge.prefer=longer",
                            "--contrast-limit", "5", "--output", str(out), "--json"])
    assert r.exit_code == 1, r.output
    rep = json.loads(r.stdout)
    assert rep["passed"] is False and json.loads(out.read_text())["checks"] == rep["checks"]
    off = ["--set", "thresholds.min_agreement=null", "--set", "thresholds.min_kappa=null",
           "--set", "thresholds.max_abs_length_correlation=null",
           "--set", "thresholds.max_abs_length_slope=null", "--set", "contrasts=false"]
    r2 = runner.invoke(app, ["audit", str(cal), "--judge", "length", *off])
    assert r2.exit_code == 0, r2.output
    assert "audit PASSED" in r2.stdout and "[pass] position_consistency" in r2.stdout
    r3 = runner.invoke(app, ["audit", "--judge", "length"])
    assert r3.exit_code == 2 and "calibration" in r3.stderr


def test_cli_calibration_and_limit_are_the_data_keys_and_the_old_keys_are_unknown(tmp_path):
    import yaml

    r = runner.invoke(app, ["audit", "c.jsonl", "--calibration", "d.jsonl", "--limit", "4", "--print-config"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["data"] == {"calibration": ["c.jsonl", "d.jsonl"], "limit": 4}
    for old in ("calibration=[c.jsonl]", "limit=4"):
        r = runner.invoke(app, ["audit", "c.jsonl", "--set", old, "--print-config"])
        assert r.exit_code == 2 and f"unknown key '{old.split('=')[0]}'" in r.stderr, (old, r.output)
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"prompt": it.prompt, "response_a": it.response_a, "response_b": it.response_b,
                                       "label": it.label}) + "\n" for it in _items()))
    assert len(_items()) > 3
    r = runner.invoke(app, ["audit", str(cal), "--judge", "length", "--limit", "3", "--set", "contrasts=false", "--json"])
    assert json.loads(r.stdout)["calibration"]["n_items"] == 3, r.output


# ------------------------------------------------------------------ acceptance on ../shared/data


def test_length_judge_audit_on_shared_data(shared_data):
    """Acceptance: the programmatic length judge audited on HH-RLHF + LLMBar reports a length
    correlation of 1 and fails the length threshold."""
    cfg = AuditConfig(data={"calibration": [str(shared_data / "hh-rlhf"), str(shared_data / "llmbar")], "limit": 250},
                      judge=LengthJudgeConfig(prefer="longer"), contrast_limit=20)
    from pofe.evaluation.audit import audit_from_config

    rep = audit_from_config(cfg)
    m = rep["metrics"]
    assert rep["calibration"]["n_items"] == 25 * 10  # 25 from each of 2 HH splits + 8 LLMBar files
    assert set(rep["calibration"]["by_source"].values()) == {25}
    assert {"hh-rlhf/helpful-base", "hh-rlhf/harmless-base", "LLMBar/Natural", "Adversarial/Neighbor",
            "Processed/MT-Bench"} <= set(rep["calibration"]["by_source"])
    assert m["length_correlation"] == pytest.approx(1.0)
    assert m["length_spearman"] > 0.8
    assert rep["checks"]["length_correlation"]["passed"] is False
    assert rep["passed"] is False
    # A hard, deterministic judge is perfectly consistent and has no position bias.
    assert m["position_consistency"] == 1.0 and m["first_position_win_rate"] == 0.5
    # Humans on these sets do not simply pick the longer response.
    assert m["human_longer_preferred_rate"] < 0.7


@pytest.mark.slow
def test_llm_judge_audit_small_subset(shared_data):
    """The embedded SmolLM2 judge on a tiny subset: runs end to end and yields a full report."""
    from pofe.judges.registry import JUDGES

    if "llm" not in JUDGES:
        pytest.skip("the llm judge kind is not registered yet")
    from pofe.evaluation.audit import audit_from_config

    cfg = AuditConfig(data={"calibration": [str(shared_data / "hh-rlhf" / "helpful-base")], "limit": 4},
                      judge=LLMJudgeConfig(max_response_chars=400), contrast_limit=1)
    rep = audit_from_config(cfg)
    m = rep["metrics"]
    assert rep["calibration"]["n_items"] == 4
    assert m["n_parsed"] + m["parse_failures"] == 4
    assert m["judge_summary"]["n"] == 4
    assert set(rep["checks"]) >= {"agreement", "position_consistency", "length_correlation"}
    assert isinstance(rep["passed"], bool)


def test_pointwise_judge_is_audited_as_pairwise():
    from pofe.records import Score

    class LengthScorer:  # a rubric-style judge: score = number of words, None for empty text
        id = "words-scorer"

        def score(self, prompts, responses, *, references=None):
            return [Score(score=float(len(r.split())) if r else None, parse_ok=bool(r), judge_id=self.id)
                    for r in responses]

    items = [CalibrationItem("q", "one two three", "one", "A"), CalibrationItem("q", "a", "b c", "A"),
             CalibrationItem("q", "same", "same", "B"), CalibrationItem("q", "", "x", "B")]
    rep = run_audit(LengthScorer(), items, AuditConfig(contrasts=False))
    m = rep["metrics"]
    # p = 1, 0, 0.5, None: agreement (1 + 0 + 0.5) / 3; scoring is order-free, so fully consistent.
    assert rep["judge"] == "words-scorer"
    assert m["agreement"] == pytest.approx(0.5) and m["parse_failures"] == 1
    assert m["position_consistency"] == 1.0 and m["first_position_win_rate"] == 0.5


def test_limit_is_the_size_of_the_whole_calibration_set(tmp_path):
    from pofe.data.calibration import shares

    def write(name, n):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"prompt": f"{name} q{k}", "response_a": "short", "response_b": "longer one",
                                            "label": "A"}) + "\n" for k in range(n)))
        return path

    a, b, c = write("a.jsonl", 100), write("b.jsonl", 100), write("c.jsonl", 20)
    # --limit 50 over two files of 100 once gave 100 pairs (50 per file): 25 + 25 now
    items = load_calibration([a, b], limit=50, seed=0)
    assert len(items) == 50
    sa, sb, sc = (f"{tmp_path.name}/{n}.jsonl" for n in "abc")  # source names: folder/file
    assert [it.source for it in items].count(sa) == 25 and [it.source for it in items].count(sb) == 25
    # one source draws exactly as before (its own seeded subset)
    assert load_calibration([a], limit=7, seed=0) == load_calibration_file(a, limit=7, seed=0)
    # evenly, a small file giving all it has: 25 + 25 wants 30 + 20 when one file holds 20
    assert shares([100, 20], 50) == [30, 20] and shares([3, 3, 3], 4) == [2, 1, 1] and shares([5, 2], 50) == [5, 2]
    assert [it.source for it in load_calibration([a, c], limit=50, seed=0)].count(sc) == 20
    r = runner.invoke(app, ["audit", str(a), str(b), "--judge", "length", "--limit", "50", "--set", "contrasts=false",
                            "--json"])
    rep = json.loads(r.stdout)
    assert rep["calibration"]["n_items"] == 50 and rep["calibration"]["limit"] == 50
    assert rep["calibration"]["by_source"] == {sa: 25, sb: 25}
