"""``pofe reproduce --fast``: every claim's direction holds on the CI tier, and a planted break of
the mechanism a claim rests on makes that claim fail (the harness can fail)."""

from __future__ import annotations

import copy
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_the_fast_tier_holds_every_claim(tmp_path):
    from tests._cli import invoke

    r = invoke("reproduce", "--fast", "--output", str(tmp_path), "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((tmp_path / "reproduce.json").read_text())
    from pofe.loops.reproduce import CLAIMS

    assert [c["id"] for c in result["claims"]] == [c.id for c in CLAIMS]
    assert result["all_hold"] and all(c["holds"] for c in result["claims"])
    online = result["claims"][0]
    assert online["ci95"][0] > 0.5 and online["detail"]["label_budget"] > 0
    dial = result["claims"][2]["value"]
    assert dial[0] > dial[1] > dial[2]


def test_sampling_from_the_initial_policy_breaks_the_online_claim(tmp_path, monkeypatch):
    """The planted break: the "online" loop samples every step's pairs from a frozen copy of pi_0
    (what offline DAP trains on), so it no longer beats offline."""
    import pofe.loops.online.pair_sources as sources
    from pofe.loops.reproduce import reproduce

    real, frozen = sources.sample_and_annotate, {}

    def from_pi0(policy, *args, **kwargs):
        frozen.setdefault("pi0", copy.deepcopy(policy))  # the first call is step 1's, before any update
        return real(frozen["pi0"], *args, **kwargs)

    monkeypatch.setattr(sources, "sample_and_annotate", from_pi0)
    r = reproduce(tmp_path, fast=True, only=["online-beats-offline"])
    claim = r["claims"][0]
    assert "pi0" in frozen and not claim["holds"] and not r["all_hold"], claim
