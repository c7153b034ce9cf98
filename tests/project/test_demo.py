"""`make demo` (scripts/demo.sh) end to end on the tiny random model: the three steps print
the embedded judge's audit verdict, the length judge's, the online summary with the win
rate's interval, and the report's path last (the file exists)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_script_tells_the_story(tiny_model_dir, tmp_path):
    env = {**os.environ, "POFE": str(Path(sys.executable).parent / "pofe"), "POFE_DEMO_MODEL": str(tiny_model_dir),
           "POFE_DEMO_STEPS": "2", "POFE_DEMO_EVAL_PROMPTS": "4", "POFE_DEMO_DIR": str(tmp_path / "demo"), "POFE_HOME": str(tmp_path / "home")}
    out = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    verdict = r"audit (PASSED|FAILED): agreement \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \(n=24\), first-shown reply picked in " \
              r"\d+% of reads, position consistency \d\.\d{3}; .*--require-audit (refuses|accepts) this judge"
    # step 1: the embedded (here: tiny) LLM judge's verdict, whichever it is
    assert sum(bool(re.fullmatch(r"  " + verdict, ln)) for ln in lines) == 1, out.stdout
    # step 2: the length oracle agrees with every label (the shorter reply) and passes
    assert ("length judge audit PASSED: agreement 1.000 [0.862, 1.000] (n=24), first-shown reply picked in 50% of "
            "reads, position consistency 1.000; --require-audit accepts this judge") in lines
    # step 3: the summary's win rate with its interval, said to include or exclude no change
    assert [ln for ln in lines if re.fullmatch(r"  win rate vs the initial policy: \d\.\d\d \[\d\.\d\d, \d\.\d\d\] 95% "
                                               r"Wilson, (ex|in)cludes 0\.5 = no change \(.*\)", ln)], out.stdout
    assert lines[-1] == f"report: {tmp_path / 'demo'}/online/report/report.html"
    assert (tmp_path / "demo" / "online" / "report" / "report.html").is_file()
