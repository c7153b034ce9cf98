"""Juries (``judge.kind: jury``): members pooled in log-odds, by hand; opposite position biases
cancel; calibration maps and agreement weights from the members' audit reports; unreadable
members left out and counted, never invented; config errors naming the key; the audit's
member rows next to the pooled jury's, in the JSON, the text table, the HTML page and the CLI."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app
from pofe.config import ConfigError, dump_config, load_config
from pofe.data.calibration import CalibrationItem
from pofe.errors import PofeError
from pofe.evaluation.report import audit_html
from pofe.evaluation.audit import (
    AuditConfig, AuditError, audit_from_config, format_audit, guard_audit_outputs, judge_identity, require_audit,
    run_audit, write_audit,
)
from pofe.judges import build_judge, parse_judge_config
from pofe.judges.base import Capability, JudgeConfigError
from pofe.judges.jury import JuryJudge, pool
from pofe.judges.probability import is_consistent
from pofe.records import Judgment

runner = CliRunner()


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


# ----------------------------------------------------------------------------- planted judges
TRUTH = {"r+1": 1.0, "r-1": -1.0, "r+2": 2.0, "r-2": -2.0, "r+.5": 0.5, "r-.5": -0.5, "r+3": 3.0, "r-3": -3.0}
"""Each item's response A is the key, response B is "base": t = the true log-odds of A over B."""


class PositionBiased:
    """P(first shown better) = sigma(t_first - t_second + bias): p_ab = sigma(t + bias) and
    p_ba = sigma(t - bias) as P(A better); ``bias > 0`` favours the first position."""

    capabilities = frozenset({Capability.PAIRWISE})

    def __init__(self, judge_id: str, bias: float):
        self.id, self.bias = judge_id, bias

    def judge(self, prompts, a, b, *, references=None):
        out = []
        for ra, rb in zip(a, b):
            t = TRUTH.get(ra, 0.0) - TRUTH.get(rb, 0.0)
            p_ab, p_ba = sigmoid(t + self.bias), sigmoid(t - self.bias)
            out.append(Judgment(p=(p_ab + p_ba) / 2, p_ab=p_ab, p_ba=p_ba, consistent=is_consistent(p_ab, p_ba),
                                parse_ok=True, judge_id=self.id))
        return out


class Fixed:
    """The same verdict for every pair (None: unreadable)."""

    capabilities = frozenset({Capability.PAIRWISE})

    def __init__(self, judge_id, p):
        self.id, self.p = judge_id, p

    def judge(self, prompts, a, b, *, references=None):
        return [Judgment(p=self.p, p_ab=self.p, p_ba=self.p, consistent=None if self.p is None else True,
                         parse_ok=self.p is not None, judge_id=self.id) for _ in prompts]


ITEMS = [CalibrationItem(f"q{k}", r, "base", "A" if t > 0 else "B", "planted") for k, (r, t) in enumerate(TRUTH.items())]


def test_opposite_position_biases_cancel_in_the_pool_by_hand():
    first, last = PositionBiased("first", 1.5), PositionBiased("last", -1.5)
    jury = JuryJudge([first, last])
    j = jury.judge(["q"], ["r+1"], ["base"])[0]
    # t = 1: "first" reads p_ab = sigma(2.5) = 0.924142, p_ba = sigma(-0.5) = 0.377541, p = 0.650841;
    # "last" the two orders swapped, the same p. Per order the pool is sigma((2.5 - 0.5) / 2) = sigma(1).
    assert j.p_ab == pytest.approx(0.731059, abs=1e-6) and j.p_ba == pytest.approx(0.731059, abs=1e-6)
    assert j.p == pytest.approx(0.650841, abs=1e-6)  # the pool of the members' own p (equal here)
    assert j.consistent is True and j.parse_ok and j.extra["dropped"] == 0
    assert [r["p_ab"] for r in j.extra["members"]] == pytest.approx([0.924142, 0.377541], abs=1e-6)
    json.dumps(j.to_dict())  # the ledger row carries the members' reads


def test_the_pooled_position_bias_is_below_each_members_in_the_audit():
    rep = run_audit(JuryJudge([PositionBiased("first", 1.5), PositionBiased("last", -1.5)]), ITEMS,
                    AuditConfig(contrasts=False))
    rows = rep["jury"]["rows"]
    assert [(r["judge"], r["role"]) for r in rows] == [("first", "member"), ("last", "member"),
                                                        ("jury(0.5*first + 0.5*last)", "jury")]
    # "first": the first shown wins both queries when |t| < 1.5 (t = +-1, +-0.5) and one of two
    # otherwise: 12 of 16 queries; "last" 4 of 16; the jury reads sigma(t) in both orders: 8 of 16.
    assert [r["first_position_win_rate"] for r in rows] == pytest.approx([0.75, 0.25, 0.5])
    assert [r["position_bias"] for r in rows] == pytest.approx([0.25, 0.25, 0.0])
    assert rows[2]["position_bias"] < min(rows[0]["position_bias"], rows[1]["position_bias"])
    # both orders agree only when |t| > 1.5 for a member (4 of 8), always for the jury
    assert [r["position_consistency"] for r in rows] == pytest.approx([0.5, 0.5, 1.0])
    assert [r["agreement"] for r in rows] == [1.0, 1.0, 1.0]
    assert rep["metrics"]["first_position_win_rate"] == pytest.approx(0.5)  # the report's own metrics are the jury's
    assert [m["judge"] for m in rep["jury"]["members"]] == ["first", "last"]
    assert not rep["jury"]["members"][0]["checks"]["first_position_bias"]["passed"]  # |0.25| > 0.1
    assert rep["checks"]["first_position_bias"]["passed"]
    # all three rows in the text table and on the page
    lines = [line.split() for line in format_audit(rep).splitlines()]
    assert ["first", "0.500", "1.000", "0.500", "0.750", "0.250"] in [x[:6] for x in lines]
    assert ["last", "0.500", "1.000", "0.500", "0.250", "0.250"] in [x[:6] for x in lines]
    assert ["jury(0.5*first", "+", "0.5*last)", "1.000", "1.000", "1.000", "0.500", "0.000"] in [x[:8] for x in lines]
    page = audit_html(rep)
    assert all(f"<tr><td>{name}</td><td>{role}</td>" in page
               for name, role in (("first", "member"), ("last", "member"), ("jury(0.5*first + 0.5*last)", "jury")))


def test_weights_shift_the_pool_by_hand():
    # weights 3:1 of biases +1.5 / -1.5: the pool per order is t + (3 * 1.5 - 1.5) / 4 = t + 0.75
    jury = JuryJudge([PositionBiased("first", 1.5), PositionBiased("last", -1.5)], weights=[3, 1])
    assert jury.weights == [0.75, 0.25] and jury.id == "jury(0.75*first + 0.25*last)"
    j = jury.judge(["q"], ["r+1"], ["base"])[0]
    assert (j.p_ab, j.p_ba) == pytest.approx((0.851953, 0.562177), abs=1e-6)  # sigma(1.75), sigma(0.25)
    rows = run_audit(jury, ITEMS, AuditConfig(contrasts=False))["jury"]["rows"]
    # the first shown wins both queries only when |t| < 0.75 (t = +-0.5): (2 * 2 + 6 * 1) / 16
    assert rows[2]["first_position_win_rate"] == pytest.approx(0.625)
    assert rows[2]["position_bias"] == pytest.approx(0.125)
    assert rows[2]["position_bias"] < min(rows[0]["position_bias"], rows[1]["position_bias"])
    # p = 0.8 and 0.4 at 3:1: 1 / (1 + (0.2/0.8)^(3/4) (0.6/0.4)^(1/4)) = 0.718767
    assert JuryJudge([Fixed("a", 0.8), Fixed("b", 0.4)], weights=[3, 1]).judge(["q"], ["x"], ["y"])[0].p == \
        pytest.approx(0.718767, abs=1e-6)
    assert pool([0.8, 0.4], [0.75, 0.25]) == pytest.approx(0.718767, abs=1e-6)


def test_hard_votes_are_clipped_not_infinite():
    # p = 1 counts as 0.999 (logit 6.9068): against p = 0.5 at equal weight, sigma(6.9068 / 2) = 0.969347
    assert pool([1.0, 0.5], [0.5, 0.5]) == pytest.approx(sigmoid(math.log(0.999 / 0.001) / 2))
    assert pool([1.0, 0.0], [0.5, 0.5]) == pytest.approx(0.5)


def test_an_unreadable_member_is_left_out_and_counted_and_none_readable_is_unreadable():
    j = JuryJudge([Fixed("a", None), Fixed("b", 0.4), Fixed("c", 0.8)]).judge(["q", "q"], ["x", "x"], ["y", "y"])
    # b and c pooled alone: sigma((logit 0.4 + logit 0.8) / 2) = 1 / (1 + sqrt(1.5 * 0.25)) = 0.620204
    assert j[0].p == pytest.approx(1 / (1 + math.sqrt(1.5 * 0.25)))
    assert j[0].extra["dropped"] == 1 and [r["pooled"] for r in j[0].extra["members"]] == [False, True, True]
    none = JuryJudge([Fixed("a", None), Fixed("b", math.nan)]).judge(["q"], ["x"], ["y"])[0]
    assert none.p is None and none.p_ab is None and not none.parse_ok and none.extra["dropped"] == 2
    assert "unreadable" in none.extra["error"]
    rep = run_audit(JuryJudge([Fixed("a", None), Fixed("b", 0.7)]), ITEMS, AuditConfig(contrasts=False))
    assert rep["jury"]["dropped_member_verdicts"] == len(ITEMS) and rep["jury"]["unreadable_verdicts"] == 0
    assert [r["parse_failure_rate"] for r in rep["jury"]["rows"]] == [1.0, 0.0, 0.0]



def test_opposite_judges_pool_to_an_exact_tie():
    # 1 - 0.999 is 0.0010000000000000009 in floats: the clipped 1 and 0 once pooled to
    # 0.4999999999999999, a "B" on every pair. Cancelling members are a tie, exactly.
    assert pool([1.0, 0.0], [0.5, 0.5]) == 0.5
    assert pool([0.1, 1 - 0.1], [0.5, 0.5]) == 0.5
    assert pool([0.8, 0.2, 0.3, 0.7], [0.25] * 4) == 0.5
    j = JuryJudge([Fixed("yes", 1.0), Fixed("no", 0.0)]).judge(["q"], ["x"], ["y"])[0]
    assert (j.p, j.p_ab, j.p_ba) == (0.5, 0.5, 0.5)
    # symmetric: every member's p -> 1 - p gives 1 - the pool (0.8 and 0.4 at 3:1: 0.718767)
    assert pool([0.2, 0.6], [0.75, 0.25]) == pytest.approx(1 - 0.718767, abs=1e-6)


# 7 of 10 human labels "B": a judge that always says "B" agrees 0.7 and carries no information
UNBALANCED = [CalibrationItem(f"q{k}", f"a{k}", f"b{k}", "B" if k < 7 else "A", "planted") for k in range(10)]


def test_a_jury_carrying_no_information_fails_the_agreement_gate():
    tie = run_audit(JuryJudge([Fixed("yes", 1.0), Fixed("no", 0.0)]), UNBALANCED, AuditConfig(contrasts=False))
    # every verdict a tie (each counts one half): agreement 0.5; kappa (0 - 0) / (1 - 0) = 0
    assert tie["checks"]["agreement"] == {"value": 0.5, "threshold": 0.6, "op": ">=", "passed": False}
    assert tie["checks"]["cohen_kappa"] == {"value": 0.0, "threshold": 0.2, "op": ">=", "passed": False}
    assert tie["passed"] is False
    always_b = run_audit(JuryJudge([Fixed("b1", 0.2), Fixed("b2", 0.3)]), UNBALANCED, AuditConfig(contrasts=False))
    # agreement 7/10 passes its bar; kappa: p_o = 0.7, p_e = 1.0 * 0.7 = 0.7, (0.7 - 0.7) / 0.3 = 0
    assert always_b["checks"]["agreement"]["value"] == pytest.approx(0.7)
    assert always_b["checks"]["agreement"]["passed"] is True
    assert always_b["checks"]["cohen_kappa"] == {"value": 0.0, "threshold": 0.2, "op": ">=", "passed": False}
    assert always_b["passed"] is False
    assert "    [FAIL] cohen_kappa = 0.000 (needs >= 0.2)" in format_audit(always_b).splitlines()


# ----------------------------------------------------------------------------- from config
@pytest.fixture
def values(tmp_path, monkeypatch):
    """Callable members whose value difference is the log-odds they read (temperature 1)."""
    (tmp_path / "jury_values.py").write_text(textwrap.dedent("""
        import math
        def m1(x, y, r): return {"good": math.log(4), "bad": 0.0}.get(y)      # p(good > bad) = 0.8
        def m2(x, y, r): return {"good": math.log(2 / 3), "bad": 0.0}.get(y)  # p(good > bad) = 0.4
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "jury_values"


def _report(path, judge, agreement, cmap):
    path.write_text(json.dumps({"judge": judge, "passed": True, "checks": {}, "calibration": {"sha256": "0" * 64},
                                "metrics": {"agreement": agreement, "calibration": {"map": cmap}}}))
    return str(path)


def _jury(values, **more):
    members = [{"kind": "callable", "callable": f"{values}:m1", "temperature": 1.0},
               {"kind": "callable", "callable": f"{values}:m2", "temperature": 1.0}]
    return parse_judge_config({"kind": "jury", "members": members, **more})


def test_a_built_jury_applies_each_members_calibration_map_by_hand(values, tmp_path):
    plain = build_judge(_jury(values))
    assert plain.judge(["q"], ["good"], ["bad"])[0].p == pytest.approx(1 / (1 + math.sqrt(0.25 * 1.5)))
    r1 = _report(tmp_path / "m1.json", f"callable:{values}:m1", 0.8, {"method": "temperature", "temperature": 2.0})
    cfg = _jury(values, calibration=[r1, None])
    j = build_judge(cfg).judge(["q"], ["good"], ["bad"])[0]
    # member 1: sigma(logit(0.8) / 2) = 2/3; pooled with 0.4: sigma((ln 2 + ln(2/3)) / 2) = 1 / (1 + sqrt(3/4))
    assert j.extra["members"][0]["p_calibrated"] == pytest.approx(2 / 3)
    assert j.p == pytest.approx(1 / (1 + math.sqrt(3 / 4)))
    assert "[cal " in build_judge(cfg).id and build_judge(cfg).id != plain.id
    # a response neither member has a value for: no verdict, both members counted
    j2 = build_judge(cfg).judge(["q"], ["other"], ["bad"])[0]
    assert j2.p is None and j2.extra["dropped"] == 2
    wrong = _report(tmp_path / "wrong.json", "length:shorter:chars", 0.8, {"method": "none"})
    with pytest.raises(JudgeConfigError, match=r"judge.calibration.1: .*audit of judge 'length:shorter:chars'"):
        build_judge(_jury(values, calibration=[None, wrong]))


def test_agreement_weights_are_the_margins_over_chance(values, tmp_path):
    r1 = _report(tmp_path / "m1.json", f"callable:{values}:m1", 0.8, {"method": "temperature", "temperature": 2.0})
    r2 = _report(tmp_path / "m2.json", f"callable:{values}:m2", 0.6, {"method": "none"})
    cfg = _jury(values, calibration=[r1, r2], weights="agreement")
    assert cfg.member_weights() == pytest.approx([0.75, 0.25])  # (0.8 - 0.5) : (0.6 - 0.5)
    j = build_judge(cfg).judge(["q"], ["good"], ["bad"])[0]
    # sigma(0.75 ln 2 + 0.25 ln(2/3)) = 1 / (1 + 2^(-3/4) (3/2)^(1/4)) = 0.603123
    assert j.p == pytest.approx(0.603123, abs=1e-6)
    assert cfg.identity()["weights"] == pytest.approx([0.75, 0.25])
    assert cfg.identity()["calibration"][0]["temperature"] == 2.0 and "source" not in cfg.identity()["calibration"][0]


def test_jury_config_errors_name_the_key(values, tmp_path):
    def err(data):
        with pytest.raises(ConfigError) as e:
            load_config(AuditConfig, overrides=[f"judge={json.dumps(data)}"])
        return str(e.value)

    two = [{"kind": "length"}, {"kind": "length", "prefer": "longer"}]
    assert "missing required key 'judge.members'" in err({"kind": "jury"})
    assert "'judge.members'" in err({"kind": "jury", "members": two[:1]})
    assert "unknown key 'judge.members.1.prefer'" in err({"kind": "jury", "members": [{"kind": "length"},
                                                                                     {"kind": "llm", "prefer": "x"}]})
    assert "'judge.members.1.kind'" in err({"kind": "jury", "members": [{"kind": "length"}, {"kind": "lenght"}]})
    assert "'judge.members.1.kind': a jury cannot be a member of a jury" in err(
        {"kind": "jury", "members": [{"kind": "length"}, {"kind": "jury", "members": two}]})
    assert "'judge.members.0.kind': rubric is not a pairwise judge" in err(
        {"kind": "jury", "members": [{"kind": "rubric"}, {"kind": "length"}]})
    assert "'judge.members.1.cot.max_new_tokens'" in err(
        {"kind": "jury", "members": [{"kind": "length"}, {"kind": "llm", "cot": {"max_new_tokens": 3}}]})
    assert "unknown key 'judge.bogus'" in err({"kind": "jury", "members": two, "bogus": 1})
    assert "'judge.weights': 1 weights for 2 members" in err({"kind": "jury", "members": two, "weights": [1]})
    assert "'judge.weights'" in err({"kind": "jury", "members": two, "weights": [1, -1]})
    assert "'judge.weights'" in err({"kind": "jury", "members": two, "weights": "best"})
    assert "'judge.calibration': 1 entries for 2 members" in err({"kind": "jury", "members": two, "calibration": [None]})
    assert "'judge.calibration.0'" in err({"kind": "jury", "members": two, "calibration": [str(tmp_path / "no.json"),
                                                                                          None]})
    assert "'agreement' reads each member's agreement from its audit report, and 'judge.calibration.0' is not set" \
        in err({"kind": "jury", "members": two, "weights": "agreement"})
    chance = _report(tmp_path / "chance.json", "length:shorter:chars", 0.5, {"method": "none"})
    noagree = _report(tmp_path / "noagree.json", "length:longer:chars", None, {"method": "none"})
    assert "'judge.calibration.0'" in err({"kind": "jury", "members": two, "weights": "agreement",
                                           "calibration": [chance, chance]})
    assert "'judge.calibration.1'" in err({"kind": "jury", "members": two, "weights": "agreement",
                                           "calibration": [_report(tmp_path / "ok.json", "length:shorter:chars", 0.7,
                                                                   {"method": "none"}), noagree]})


def test_the_jury_is_a_pairwise_judge_with_its_members_identity():
    cfg = parse_judge_config({"kind": "jury", "members": [{"kind": "length"}, {"kind": "llm"}]})
    assert cfg.capabilities == {Capability.PAIRWISE, Capability.NEEDS_LOGPROBS}  # no shared weights
    ident = cfg.identity()
    assert ident["kind"] == "jury" and ident["weights"] == [0.5, 0.5] and ident["calibration"] == [None, None]
    assert ident["members"][1]["template_hash"] == parse_judge_config({"kind": "llm"}).identity()["template_hash"]


def test_a_jury_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(AuditConfig, overrides=["judge.kind=jury", "judge.weights=[2, 1]",
                                              "judge.members=[{kind: llm, template: helpful-short}, {kind: length}]"])
    (tmp_path / "c.yaml").write_text(dump_config(cfg))
    assert load_config(AuditConfig, tmp_path / "c.yaml") == cfg


def test_audit_of_a_configured_jury_gates_on_its_weights_and_guards_the_reports(tmp_path):
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"prompt": "q", "response_a": "a" * (1 + k), "response_b": "b" * (4 - k),
                                       "label": "AB"[k % 2]}) + "\n" for k in range(4)))
    two = [{"kind": "length"}, {"kind": "length", "prefer": "longer"}]
    cfg = AuditConfig(data={"calibration": [str(cal)]}, judge={"kind": "jury", "members": two, "weights": [2, 1]},
                      contrasts=False, output=str(tmp_path / "jury.json"))
    rep = audit_from_config(cfg)
    saved = json.loads((tmp_path / "jury.json").read_text())
    assert len(saved["jury"]["rows"]) == 3 and saved["judge_identity"]["weights"] == pytest.approx([2 / 3, 1 / 3])
    page = (tmp_path / "jury.html").read_text()
    assert "Jury: members and the pooled verdict" in page
    assert all(r["judge"] in page for r in rep["jury"]["rows"])
    table = format_audit(rep)
    assert "length:shorter:chars" in table and "length:longer:chars" in table and rep["judge"][:20] in table
    other = parse_judge_config({"kind": "jury", "members": two})
    with pytest.raises(AuditError, match="weights"):
        require_audit({**saved, "passed": True, "checks": {}}, judge_identity(other))
    # the jury's output may not overwrite a member's audit report
    member = _report(tmp_path / "member.json", "length:shorter:chars", 0.7, {"method": "none"})
    guarded = AuditConfig(data={"calibration": [str(cal)]}, output=member,
                          judge={"kind": "jury", "members": two, "calibration": [member, None]})
    with pytest.raises(PofeError):
        guard_audit_outputs(guarded)
    assert write_audit(rep, tmp_path / "again.json")["json"].endswith("again.json")


def test_cli_audit_with_a_jury(tmp_path):
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"prompt": it.prompt, "response_a": it.response_a, "response_b": it.response_b,
                                       "label": it.label}) + "\n" for it in ITEMS))
    r = runner.invoke(app, ["audit", str(cal), "--judge", "jury", "--set",
                            "judge.members=[{kind: length}, {kind: length, prefer: longer}]", "--set", "contrasts=false",
                            "--json"])
    assert r.exit_code in (0, 1), r.output
    rep = json.loads(r.stdout)
    assert [row["role"] for row in rep["jury"]["rows"]] == ["member", "member", "jury"]
    r2 = runner.invoke(app, ["audit", str(cal), "--judge", "jury", "--set", "judge.members=[{kind: length}]"])
    assert r2.exit_code == 2 and "judge.members" in r2.stderr
