"""``pofe reproduce --fast``: the claims that reproduce hold on the CI tier, the one that does not
yet is reported as not holding (not hidden), and a planted break of the mechanism a claim rests
on makes that claim fail (the harness can fail)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow]

# Measured 2026-12-07 (fast tier): online beats offline head to head (14-1-1), but because offline
# DPO degrades below pi_0 (win rate 0.0), not because online improves on it (0.34); sampling from
# a frozen pi_0 still beats offline 13-3. So the claim is not reproduced yet, and says so.
NOT_YET = {"online-beats-offline"}


def test_the_fast_tier(tmp_path):
    from pofe.loops.reproduce import CLAIMS, reproduce, table

    result = reproduce(tmp_path, fast=True)
    rows = {c["id"]: c for c in result["claims"]}
    assert list(rows) == [c.id for c in CLAIMS]
    assert all(c["holds"] for k, c in rows.items() if k not in NOT_YET), table(result)
    for k in NOT_YET:  # reported with its numbers, whichever way it came out on this CPU
        assert rows[k]["value"] is not None and rows[k]["ci95"][0] is not None
    fig3 = rows["online-beats-offline"]["detail"]["fig3"]  # win rate vs pi_0 at 4, 8, 12 and 16 of 16 steps
    for run in ("online", "offline"):
        assert [s for s, _ in fig3[run]] == [4, 8, 12, 16] and all(0.0 <= w <= 1.0 for _, w in fig3[run]), fig3
    d = rows["online-beats-offline"]["detail"]
    assert (fig3["online"][-1][1], fig3["offline"][-1][1]) == (d["online_vs_initial"], d["offline_vs_initial"])
    assert result["all_hold"] == all(c["holds"] for c in rows.values())
    assert (tmp_path / "results.md").read_text().count("| **no** |") == sum(not c["holds"] for c in rows.values())
    h, s, v = rows["length-dial"]["value"]
    assert h > s > v
    q = rows["annotator-quality"]["detail"]["distance_by_accuracy"]
    assert q["0.6"] > max(q["0.8"], q["1"])
    assert rows["labelling-chain"]["value"] > 0.4


def test_an_annotator_the_loop_ignores_breaks_the_length_dial(tmp_path, monkeypatch):
    """The planted break: the online loop trains on its configured judge instead of the annotator
    it is given, so the annotator's instruction can no longer move the policy."""
    import pofe.loops.online.annotator as annotator
    from pofe.loops.reproduce import reproduce

    real = annotator.build_judges

    def ignore_given(cfg, reference, tokenizer, *, judge=None, eval_judge=None, check=None):
        return real(cfg, reference, tokenizer, judge=None, eval_judge=eval_judge, check=check)

    monkeypatch.setattr(annotator, "build_judges", ignore_given)
    r = reproduce(tmp_path, fast=True, only=["length-dial"])
    assert not r["claims"][0]["holds"], r["claims"][0]
