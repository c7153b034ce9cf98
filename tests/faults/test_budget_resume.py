"""``--resume RUN --set judge.budget...``: the one kind of setting a resume may change. Never the
config of a run another process is running, never a bad value, never written by --print-config,
and only the budget keys."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import env, error_lines, invoke

pytestmark = pytest.mark.faults


def _finished_label(tmp_path: Path) -> Path:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response_a": "short", "response_b": "longer " * (i + 1)})
                             + "\n" for i in range(3)))
    res = invoke("label", "--pairs", str(pairs), "--set", "judge.kind=length", "--set", "judge.budget.tokens=10",
                 "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=r", "--set", "log.progress=false")
    assert res.returncode == 0, res.stderr
    return tmp_path / "runs" / "r"


def test_bad_budget_value_on_resume_is_one_line_and_changes_nothing(tmp_path):
    d = _finished_label(tmp_path)
    before = (d / "config.yaml").read_text(), (d / "run.json").read_text()
    res = invoke("label", "--resume", str(d), "--set", "judge.budget.tokens=-1")
    assert res.returncode == 2 and "judge.budget.tokens" in error_lines(res)[-1]
    shown = invoke("label", "--resume", str(d), "--set", "judge.budget.tokens=77", "--print-config")
    assert shown.returncode == 0 and "tokens: 77" in shown.stdout  # printed, not written
    other = invoke("label", "--resume", str(d), "--set", "judge.prefer=longer")
    assert other.returncode == 2 and "is refused" in error_lines(other)[-1]
    assert ((d / "config.yaml").read_text(), (d / "run.json").read_text()) == before


_HOLDER = r"""
import sys, time
from pofe.loops.label import LabelConfig
from pofe.runs import RunConfig, new_run_dir, write_config
d = new_run_dir(RunConfig(output_dir=sys.argv[1], name="held"), "label")
write_config(d, LabelConfig(judge={"kind": "length", "budget": {"tokens": 10}}))
print(d, flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_budget_of_a_running_run_is_never_rewritten(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=env())
    try:
        d = Path(holder.stdout.readline().strip())
        before = (d / "config.yaml").read_text()
        res = invoke("label", "--resume", str(d), "--set", "judge.budget.tokens=99")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert res.returncode == 2 and f"PID {holder.pid}" in error_lines(res)[-1]
    assert (d / "config.yaml").read_text() == before


def test_only_budget_keys_are_resumable():
    from pofe.cli.common import resumable_setting

    assert resumable_setting("judge.budget") and resumable_setting("judge.budget.tokens")
    assert resumable_setting("reward.judge.budget.cost")
    assert not resumable_setting("judge.budget_x") and not resumable_setting("judge.price.input_per_million")
    assert not resumable_setting("judge.members.0.budget.tokens") and not resumable_setting("eval.judge.budget.tokens")
