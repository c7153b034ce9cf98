"""Regression tests for round 3 of the outside probes (issue 45): received reports escaped and
read from regular files only (point 3), extremes refused when the config is parsed (point 5),
plugins contained (point 6), and the leftovers of the 220 (point 8)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from _cli import error_lines, invoke

pytestmark = pytest.mark.faults

XSS = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


# ----------------------------------------------------------------------------- point 3: received reports

def _audit_report() -> dict:
    from pofe.evaluation.audit import AuditConfig, run_audit
    from pofe.evaluation.sim import PlantedJudge, PlantedWorld

    world = PlantedWorld(40, seed=0)
    return run_audit(PlantedJudge(world), world.items, AuditConfig(contrast_limit=5))


def _hostile_audit(rep: dict) -> dict:
    """Markup in the fields pofe writes as numbers (and in a few it writes as text)."""
    m = rep["metrics"]
    m["n"] = m["n_parsed"] = m["n_labelled"] = XSS
    m["agreement"] = XSS  # a metric row's value: was f"{v:.3f}" (an internal error) or raw
    m["ci95"]["cohen_kappa"] = [XSS, XSS]
    m["calibration"]["ece"] = XSS
    check = next(iter(rep["checks"].values()))
    check["op"], check["threshold"], check["value"] = XSS, XSS, XSS
    rep["checks"][XSS] = {"value": 0.5, "op": ">=", "threshold": 0.1, "passed": True}
    src = next(iter(m["by_source"].values()))
    src["n"] = XSS
    rep["calibration"]["length_unit"] = XSS
    rep["jury"] = {"dropped_member_verdicts": XSS, "unreadable_verdicts": XSS,
                   "rows": [{"judge": XSS, "role": XSS, "weight": XSS, "agreement": XSS, "passed": XSS}]}
    return rep


def test_report_of_a_received_audit_escapes_every_field_numbers_included(tmp_path):
    """``n``, ``op`` and ``threshold`` holding markup were written raw into report.html (stored
    XSS in a page meant to be opened in a browser); a string where a number belongs was an
    internal error (``f"{v:.3f}"``)."""
    d = tmp_path / "received"
    d.mkdir()
    (d / "audit.json").write_text(json.dumps(_hostile_audit(_audit_report())))
    for target, out in ((d, d / "report"), (d / "audit.json", tmp_path / "out")):
        res = invoke("report", str(target), "--output", str(out)) if target != d else invoke("report", str(target))
        assert res.returncode == 0, res.stderr
        page = (out / "report.html").read_text(encoding="utf-8")
        assert "<script" not in page
        # every planted field is on the page, as text: 3 of n / n_parsed / n_labelled, op, threshold,
        # value, the check's name, a metric, its interval (2), ECE, a source's n, the unit, jury (7)
        assert page.count(ESCAPED) >= 18, page.count(ESCAPED)
        assert f"<td>{ESCAPED} {ESCAPED}</td>" in page  # op and threshold of the first check
        assert f"on {ESCAPED} calibration pairs ({ESCAPED} parsed, {ESCAPED} with a human A/B label)" in page


def test_audit_page_formats_numbers_as_before():
    from pofe.evaluation.report.audit_page import audit_html

    rep = _audit_report()
    page = audit_html(rep)
    name, c = next(iter(rep["checks"].items()))
    assert c["op"] in (">=", "<=")  # written as text now: &gt;= / &lt;=
    assert f"<tr><td>{name}</td><td>{c['value']:.3f}</td><td>{c['op'].replace('>', '&gt;').replace('<', '&lt;')} " \
           f"{c['threshold']}</td>" in page
    assert f"on {rep['metrics']['n']} calibration pairs" in page


def _fifo_watchdog(fifo: Path, after: float = 15.0) -> tuple[threading.Thread, list[bool]]:
    """Opens ``fifo`` for writing after ``after`` seconds (ending a reader blocked on it, so a hang
    fails the test instead of stalling the suite); ``hung[0]`` says whether it had to."""
    hung = [False]
    stop = threading.Event()

    def run() -> None:
        if not stop.wait(after):
            hung[0] = True
            os.close(os.open(fifo, os.O_RDWR))  # a writer: the blocked open returns, its read sees EOF

    t = threading.Thread(target=run, daemon=True)
    t.stop = stop  # type: ignore[attr-defined]
    t.start()
    return t, hung


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.yaml", "run.json", "audit.json"])
def test_report_of_a_folder_with_a_fifo_is_one_line_and_never_blocks(tmp_path, name):
    """A ``metrics.jsonl`` that is a FIFO hung ``pofe report`` (open() waits for a writer)."""
    d = tmp_path / "received"
    d.mkdir()
    if name != "run.json":
        (d / "run.json").write_text(json.dumps({"format": 1, "command": "online"}))
    (d / "summary.json").write_text(json.dumps({"steps": 2}))
    os.mkfifo(d / name)
    t, hung = _fifo_watchdog(d / name)
    res = invoke("report", str(d))
    t.stop.set()  # type: ignore[attr-defined]
    assert not hung[0], "pofe report blocked on the FIFO"
    assert error_lines(res) == [f"error: {d / name}: not a regular file (a FIFO or device in a received run folder "
                                f"is never read)"], res.stderr
    assert res.returncode == 2
    assert not (d / "report" / "report.html").exists()


def test_an_audit_json_given_directly_that_is_a_fifo_is_one_line(tmp_path):
    fifo = tmp_path / "audit.json"
    os.mkfifo(fifo)
    t, hung = _fifo_watchdog(fifo)
    res = invoke("report", str(fifo), "--output", str(tmp_path / "out"))
    t.stop.set()  # type: ignore[attr-defined]
    assert not hung[0]
    assert error_lines(res) == [f"error: {fifo}: not a regular file (a FIFO or device in a received run folder "
                                f"is never read)"], res.stderr


def test_run_files_that_are_not_regular_are_refused_before_open(tmp_path):
    """The one reader of run files (``pofe.runs.open_run_file``) never opens a FIFO: it blocked
    there, in ``--resume``'s reads as in the report's."""
    from pofe.runs import RunError, guard_run_dir, read_run_bytes

    guard_run_dir(tmp_path)
    os.mkfifo(tmp_path / "config.yaml")
    t, hung = _fifo_watchdog(tmp_path / "config.yaml")
    with pytest.raises(RunError, match=r"config\.yaml: not a regular file \(a run file must be one\)$"):
        read_run_bytes(tmp_path / "config.yaml")
    t.stop.set()  # type: ignore[attr-defined]
    assert not hung[0]
    (tmp_path / "ok.json").write_text("{}")
    assert read_run_bytes(tmp_path / "ok.json") == b"{}"


def test_report_refuses_an_oversized_received_file(tmp_path, monkeypatch):
    from pofe.evaluation.report import run as report_run

    monkeypatch.setattr(report_run, "MAX_FILE_BYTES", 100)
    d = tmp_path / "received"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"format": 1, "command": "online"}))
    (d / "metrics.jsonl").write_bytes(b"{}\n" * 50)  # 3 x 50 = 150 bytes
    res = invoke("report", str(d))
    assert error_lines(res) == [f"error: {d / 'metrics.jsonl'}: 150 bytes, over the report's limit of 100 bytes per file"], \
        res.stderr
