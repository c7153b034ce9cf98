"""``--require-audit``: the report must have passed *for this judge* (judge id, template hash,
constitution version) on an identified calibration set. ``label``, ``rm`` and ``rl`` refuse a
failed or mismatched report with exit 2 before any model loads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app
from pofe.evaluation.audit import AuditError, judge_identity, labels_identity, require_audit
from pofe.loops.label import LabelConfig

runner = CliRunner()


def _report(tmp_path, identity, *, passed=True, sha="c0ffee", name="audit.json"):
    checks = {"agreement": {"value": 0.8 if passed else 0.4, "threshold": 0.6, "op": ">=", "passed": passed}}
    path = tmp_path / name
    path.write_text(json.dumps({"judge": identity.get("judge_id", "j"), "judge_identity": identity,
                                "calibration": {"sha256": sha}, "checks": checks, "passed": passed}))
    return path


def test_require_audit_matches_identity_key_by_key(tmp_path):
    ident = judge_identity(LabelConfig().judge)
    assert ident["template_hash"] and ident["constitution_version"] == "hhh-1"
    ok = _report(tmp_path, ident)
    assert require_audit(ok, ident)["passed"] is True
    other = dict(ident, template_hash="0000")
    with pytest.raises(AuditError, match="template_hash: audited") as e:
        require_audit(ok, other)
    assert e.value.failed == ["judge_mismatch"]
    with pytest.raises(AuditError, match="constitution_version"):
        require_audit(ok, dict(ident, constitution_version="hhh-2"))
    with pytest.raises(AuditError, match="calibration set"):
        require_audit(ok, ident, calibration_sha256="beef")
    no_sha = _report(tmp_path, ident, sha=None, name="nosha.json")
    with pytest.raises(AuditError, match="names no calibration set"):
        require_audit(no_sha, ident)
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"judge": "j", "checks": {}, "passed": True}))
    with pytest.raises(AuditError, match="records no judge_identity"):
        require_audit(legacy, ident)
    with pytest.raises(AuditError, match="failed its audit"):
        require_audit(_report(tmp_path, ident, passed=False, name="bad.json"), ident)


def _no_run(monkeypatch, module):
    """Stop a command right after the driver's audit gate (pofe.recipe.drive gates, then reads the data):
    reaching the data means the gate let the command through; nothing is loaded or written."""
    import pofe.recipe

    calls = []

    def fake(recipe):
        calls.append(recipe.cfg)
        raise SystemExit(0)

    __import__(f"pofe.loops.{module}")  # its Recipe subclass exists from here on
    monkeypatch.setattr(pofe.recipe.Recipe, "load_data", lambda self: fake(self))
    for cls in pofe.recipe.Recipe.__subclasses__():  # a recipe's own load_data overrides the base's
        if "load_data" in vars(cls):
            monkeypatch.setattr(cls, "load_data", lambda self: fake(self))
    return calls


def test_label_refuses_a_failed_or_mismatched_report(tmp_path, monkeypatch):
    calls = _no_run(monkeypatch, "label")
    out = tmp_path / "runs"
    ident = judge_identity(LabelConfig().judge)
    base = ["label", "--output-dir", str(out)]
    r = runner.invoke(app, [*base, "--require-audit", str(_report(tmp_path, ident, passed=False))])
    assert r.exit_code == 2 and "failed its audit" in r.stderr and "agreement" in r.stderr
    r = runner.invoke(app, [*base, "--require-audit", str(_report(tmp_path, ident, name="ok.json")),
                            "--set", "judge.template=helpful"])
    assert r.exit_code == 2 and "different judge" in r.stderr and "template" in r.stderr
    r = runner.invoke(app, [*base, "--require-audit", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "not found" in r.stderr
    assert calls == [] and not out.exists()  # refused before the loop (and any model) started
    r = runner.invoke(app, [*base, "--require-audit", str(tmp_path / "ok.json")])
    assert len(calls) == 1  # the matching, passed report lets it through


def _labels(path, judge_id="llm:smol:constitution", template_hash="abc", version="hhh-1"):
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b", "p": 0.8,
             "provenance": {"judge_id": judge_id, "template_hash": template_hash, "constitution_version": version}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rm_refuses_reports_for_another_judge_or_unlabelled_data(tmp_path, monkeypatch):
    calls = _no_run(monkeypatch, "rm")
    prefs = _labels(tmp_path / "preferences.jsonl")
    ident = labels_identity([prefs])
    assert ident == {"judge_id": "llm:smol:constitution", "template_hash": "abc", "constitution_version": "hhh-1"}
    other = _report(tmp_path, dict(ident, judge_id="llm:other:helpful"), name="other.json")
    r = runner.invoke(app, ["rm", "--train", str(prefs), "--require-audit", str(other)])
    assert r.exit_code == 2 and "judge_id: audited 'llm:other:helpful'" in r.stderr
    r = runner.invoke(app, ["rm", "--train", str(prefs), "--require-audit",
                            str(_report(tmp_path, ident, passed=False, name="failed.json"))])
    assert r.exit_code == 2 and "failed its audit" in r.stderr
    human = tmp_path / "human.jsonl"
    human.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
    ok = _report(tmp_path, ident, name="ok.json")
    r = runner.invoke(app, ["rm", "--train", str(human), "--require-audit", str(ok)])
    assert r.exit_code == 2 and "names no judge_id" in r.stderr
    mixed = _labels(tmp_path / "mixed.jsonl", judge_id="llm:other:helpful")
    r = runner.invoke(app, ["rm", "--train", str(prefs), "--train", str(mixed), "--require-audit", str(ok)])
    assert r.exit_code == 2 and "2 different judges" in r.stderr
    assert calls == []
    runner.invoke(app, ["rm", "--train", str(prefs), "--require-audit", str(ok)])
    assert len(calls) == 1


def test_rl_refuses_without_an_audited_judge_behind_the_reward(tmp_path, monkeypatch):
    calls = _no_run(monkeypatch, "rl")
    prefs = _labels(tmp_path / "preferences.jsonl")
    ok = _report(tmp_path, labels_identity([prefs]))
    r = runner.invoke(app, ["rl", "--reward", "programmatic", "--require-audit", str(ok)])
    assert r.exit_code == 2 and "no judge to audit" in r.stderr
    # A reward model whose run trained on labels of another judge.
    run = tmp_path / "rm-run"
    (run / "model").mkdir(parents=True)
    other = _labels(tmp_path / "other.jsonl", judge_id="llm:other:helpful")
    (run / "config.yaml").write_text(f"data:\n  train:\n  - {other}\n")
    r = runner.invoke(app, ["rl", "--reward-model", str(run / "model"), "--require-audit", str(ok)])
    assert r.exit_code == 2 and "different judge" in r.stderr
    r = runner.invoke(app, ["rl", "--reward", "judge", "--set", "reward.judge.kind=rubric", "--require-audit", str(ok)])
    assert r.exit_code == 2 and "different judge" in r.stderr
    assert calls == []
    (run / "config.yaml").write_text(f"data:\n  train:\n  - {prefs}\n")
    runner.invoke(app, ["rl", "--reward-model", str(run / "model"), "--require-audit", str(ok)])
    assert len(calls) == 1
