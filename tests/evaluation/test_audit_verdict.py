"""The audit's one-line verdict (``verdict_line``, the last line of ``pofe audit``) and the
online summary's win-rate interval (``pofe.cli.online._interval``): the lines `make demo`
prints, checked against hand-built reports."""

from __future__ import annotations

from pofe.cli.online import _interval
from pofe.evaluation.audit.checks import verdict_line


def _report(passed: bool, checks: dict) -> dict:
    # the keys verdict_line reads; the numbers are those of a judge that always picks the
    # first-shown reply on 24 pairs: each order agrees on 12, the pair is never consistent
    return {"passed": passed, "checks": checks,
            "metrics": {"agreement": 0.5, "n_labelled": 24, "first_position_win_rate": 1.0, "position_consistency": 0.0,
                        "ci95": {"agreement": [0.314, 0.686]}}}


def test_failed_verdict_names_the_failed_checks_and_the_gate():
    rep = _report(False, {"agreement": {"passed": False}, "position_consistency": {"passed": False},
                          "parse_failure_rate": {"passed": True}})
    assert verdict_line(rep) == ("audit FAILED: agreement 0.500 [0.314, 0.686] (n=24), first-shown reply picked in "
                                 "100% of reads, position consistency 0.000; failed: agreement, position_consistency; "
                                 "--require-audit refuses this judge")


def test_passed_verdict_and_unmeasured_numbers():
    rep = {"passed": True, "checks": {"agreement": {"passed": True}},
           "metrics": {"agreement": 1.0, "n_labelled": 24, "first_position_win_rate": None, "position_consistency": 1.0,
                       "ci95": {}}}
    assert verdict_line(rep) == ("audit PASSED: agreement 1.000 [-, -] (n=24), first-shown reply picked in - of reads, "
                                 "position consistency 1.000; --require-audit accepts this judge")


def test_winrate_interval_says_whether_it_excludes_no_change():
    # 16 wins of 16: Wilson [0.806, 1.0] (Wilson 1927, z = 1.96) lies above 0.5
    assert _interval([0.806, 1.0]) == " [0.81, 1.00] 95% Wilson, excludes 0.5 = no change"
    # 0 wins, 16 ties, 0 losses: rate 0.5, an interval around it
    assert _interval([0.3, 0.7]) == " [0.30, 0.70] 95% Wilson, includes 0.5 = no change"
    assert _interval([0.0, 0.194]) == " [0.00, 0.19] 95% Wilson, excludes 0.5 = no change"
    assert _interval([None, None]) == "" and _interval(None) == ""
