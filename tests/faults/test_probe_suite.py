"""The reliability probes (``tests/faults/probe_suite.py`` and its round-2 classes in
``probe_suite_r2/``) as tests: every probe an outside tester's fault classes produced, one test
each, asserting the probe's own verdict (the exit status, one ``error:`` line naming what it
should, inputs untouched, outputs complete; see ``judge_result``).

A probe's command runs in-process (the CLI's top-level handler through typer's test runner,
in the probe's environment and folder) unless it needs a real process: a launcher prefix
(``timeout``, torchrun), an injected SIGKILL (``POFE_FAULT``), or its own ``Popen`` (concurrent
runs, a live ``pofe annotate`` server). The script still runs them all as subprocesses
(``python tests/faults/probe_suite.py --out probes.md``), which is what an outside tester sees.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_suite as P  # noqa: E402

PROBES = P.all_probes()
_names = [p.name for p in PROBES]
assert len(set(_names)) == len(_names), "two probes share a name"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()  # build_fixtures runs the probes on one thread: not the tests after
    c = P.build_fixtures(tmp_path_factory.mktemp("probes"))
    P.D_ctx[:] = [c]  # probes_outputs' helpers copy from the data folder
    P.IN_PROCESS["on"] = True
    yield c
    P.IN_PROCESS["on"] = False
    torch.set_num_threads(threads)


def test_the_suite_holds_every_class():
    """The suite cannot pass by holding nothing: the classes the probe rounds wrote are all here."""
    classes = {p.cls for p in PROBES}
    assert {"bad input", "crash/resume", "endpoint", "concurrency", "load", "outputs", "untrusted run folder",
            "text round trip", "network/secrets/values", "annotate", "silent drop"} <= classes, classes
    assert len(PROBES) >= 300


@pytest.mark.slow
@pytest.mark.parametrize("probe", PROBES, ids=_names)
def test_probe(probe, ctx):
    outcome = P.run_one(probe, ctx)
    assert outcome.ok, f"{probe.cls}: {outcome.category}: {outcome.observed} (expected: {probe.expected})"
