"""Honest audit numbers and page: a temperature fitted at its bound is "no information" (never
"calibrated", and refused by labels.calibration), the reliability legend sits outside the data,
and a small calibration set is said to be small."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import Field

import pofe.evaluation.report.audit_page as audit_page
from pofe.config import ConfigError, PofeConfig, load_config
from pofe.evaluation.audit import AuditConfig, audit_from_config, format_audit
from pofe.evaluation.calibrate import calibration_report, fit_temperature
from pofe.labels import load_calibration_map
from pofe.evaluation.report.audit_page import audit_html
from pofe.judges.config import JuryJudgeConfig
from pofe.labels import LabelPolicy, calibration_map

NO_INFO = ("the fitted temperature T = 100.00 is at its bound (100): the judge's p carries no information about "
           "the human labels (every calibrated p would be about 0.5)")


REFUSED = "refused: applied to labels it would make every one a coin flip"


class _LabelsOnly(PofeConfig):
    labels: LabelPolicy = Field(default_factory=LabelPolicy)


def test_informative_fit_is_a_temperature_by_hand():
    # p = 0.8 right 3 times of 4 (and 0.2 mirrored): the MLE sends logit(0.8) = ln 4 to logit(0.75) = ln 3,
    # so T = ln 4 / ln 3 = 1.2619.
    p, y = [0.8] * 4 + [0.2] * 4, [1, 1, 1, 0, 0, 0, 0, 1]
    assert fit_temperature(p, y) == pytest.approx(math.log(4) / math.log(3), abs=1e-4)
    rep = calibration_report(p, y)
    assert rep["map"] == {"method": "temperature", "temperature": rep["temperature"]} and "no_information" not in rep


def test_a_fit_at_the_bound_is_no_information_not_a_map():
    # p = 0.8 right 2 times of 4: agreement is chance, the likelihood rises all the way to T = 100.
    p, y = [0.8] * 4 + [0.2] * 4, [1, 0, 1, 0, 1, 0, 1, 0]
    rep = calibration_report(p, y)
    t = rep["temperature"]
    assert 99.99 < t <= 100.0
    assert rep["no_information"] is True
    assert rep["map"] == {"method": "none", "no_information": True, "fitted_temperature": t, "reason": NO_INFO}
    assert "calibrated_reliability" not in rep  # nothing "calibrated" to draw


@pytest.mark.parametrize("cmap", [
    {"method": "none", "no_information": True, "fitted_temperature": 100.0, "reason": NO_INFO},
    {"method": "temperature", "temperature": 100.0},  # a report written before the marker
])
def test_labels_calibration_refuses_a_no_information_map(tmp_path, cmap):
    calibration_map.cache_clear()
    path = tmp_path / "audit.json"
    path.write_text(json.dumps({"judge": "length", "metrics": {"calibration": {"map": cmap}}}))
    with pytest.raises(ConfigError) as e:
        load_config(_LabelsOnly, extra={"labels.calibration": str(path)})
    assert str(e.value) == (f"option labels.calibration: bad value for 'labels.calibration': calibration: {path}: "
                            f"{NO_INFO}; {REFUSED} (got '{path}')")
    assert e.value.exit_code == 2
    # T = 99 is still within 1% of the bound; T = 50 is a (very soft) map and is loaded
    path.write_text(json.dumps({"metrics": {"calibration": {"map": {"method": "temperature", "temperature": 50.0}}}}))
    assert load_calibration_map(path)["temperature"] == 50.0


def test_a_jury_member_map_with_no_information_is_refused(tmp_path):
    calibration_map.cache_clear()
    path = tmp_path / "audit.json"
    path.write_text(json.dumps({"judge": "length", "metrics": {"calibration": {"map": {
        "method": "temperature", "temperature": 100.0}}}}))
    with pytest.raises(ConfigError) as e:
        JuryJudgeConfig(members=[{"kind": "length"}, {"kind": "length", "prefer": "longer"}], calibration=[str(path), None])
    assert str(e.value) == f"bad value for 'judge.calibration.0': calibration: {path}: {NO_INFO}; {REFUSED}"
    assert e.value.exit_code == 2


def _length_audit(tmp_path, n_each: int):
    """The ``length`` judge (prefers longer, p = 0/1) on 2 * n_each pairs where humans chose the
    longer answer n_each times and the shorter n_each times: agreement exactly 1/2."""
    rows = []
    for i in range(n_each):
        rows.append({"prompt": f"q{i}", "response_a": "short", "response_b": "a much longer answer", "label": "B"})
        rows.append({"prompt": f"r{i}", "response_a": "short", "response_b": "a much longer answer", "label": "A"})
    f = tmp_path / "calibration.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return audit_from_config(AuditConfig(data={"calibration": [str(f)]}, judge={"kind": "length", "prefer": "longer"},
                                         contrasts=False, output=str(tmp_path / "audit.json")))


def test_audit_of_a_chance_judge_says_no_information_in_text_json_and_page(tmp_path):
    rep = _length_audit(tmp_path, 4)
    cal = rep["metrics"]["calibration"]
    assert rep["metrics"]["agreement"] == 0.5 and cal["no_information"] is True and cal["map"]["method"] == "none"
    saved = json.loads((tmp_path / "audit.json").read_text())["metrics"]["calibration"]
    assert saved["no_information"] is True and saved["map"]["reason"] == NO_INFO
    text = format_audit(rep)
    assert ("  calibration                       no information   (T at its bound 100: every calibrated p would be "
            "~0.5; no map saved, labels.calibration refuses this report)") in text.splitlines()
    page = audit_html(rep)
    assert "Calibration: <b>no information</b>. The fitted temperature (T = 100.00) is at its bound (100)" in page
    assert "calibrated (T =" not in page


def _captured(monkeypatch):
    figs = []

    def grab(fig):  # what _png does before saving, then keep the figure to inspect
        fig.tight_layout()
        fig.canvas.draw()
        figs.append(fig)
        return b"png"

    monkeypatch.setattr(audit_page, "_png", grab)
    return figs


def test_reliability_legend_lies_outside_the_data_area(monkeypatch):
    figs = _captured(monkeypatch)
    p = [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95] * 4
    y = [0, 0, 0, 1, 0, 1, 1, 1, 1, 1] * 4
    assert audit_page.reliability_png(calibration_report(p, y)) == b"png"
    ax = figs[0].axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()][0] == "perfectly calibrated"
    box, data = legend.get_window_extent(), ax.get_window_extent()
    assert box.y1 < data.y0  # wholly below the axes: no point or bar can be under it


def _page(n_labelled: int) -> str:
    return audit_html({"judge": "j", "metrics": {"n": n_labelled, "n_labelled": n_labelled}})


def test_a_small_calibration_set_is_said_to_be_small():
    note = ("<p class='flag'>Only 7 human-labelled pairs (fewer than 30): the 95% intervals are wide and every "
            "number on this page is indicative, not a measurement.</p>")
    assert note in _page(7)
    assert "human-labelled pairs (fewer than" not in _page(40)
