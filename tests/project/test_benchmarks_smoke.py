"""Benchmarks cannot rot (issue 40): every script in ``benchmarks/`` has a ``--smoke`` run (a tiny
random model, 1-2 steps) that is run here as a subprocess; it must exit 0 and print its numbers
lines. ``online_vs_offline.py`` crashed at HEAD ('TrainSettings' object has no attribute 'seed')
and nothing ran it.

The TRL side of a pairing runs in ``$TRL_ANCHOR_DIR`` (``venv/bin/python``, the model in
``smol135``): here a stand-in anchor, this interpreter (TRL is a test extra) and a tiny model.
Scripts that need vLLM or TRL are skipped, saying which, where it does not import."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._cli import env

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SHARED = BENCH.parent.parent / "shared"

# script -> (arguments, what it needs, the lines its numbers are on)
SMOKE = {
    "online_vs_offline.py": ([], set(), [r"^  online   win rate vs initial policy: \d\.\d{3} ",
                                         r"^  offline  win rate vs initial policy: \d\.\d{3} ",
                                         r"^  online vs offline head to head: \d\.\d{3} "]),
    "online_step.py": ([], set(), [r"^engine=hf judge=llm .*: [\d.]+ s/step wall, [\d.]+ CPU s/step",
                                   r"^  split: generate [\d.]+ s"]),
    "policy_pass.py": ([], set(), [r"^  joint sdpa +median [\d.]+ s", r"^  packed sdpa +median [\d.]+ s"]),
    "model_load.py": ([], set(), [r'^  "conversion_first_load_s": [\d.]+,', r'^  "cached_load_new_process_s": [\d.]+,']),
    "judge_throughput.py": ([], {"shared data"}, [r'^    "pairs_per_s": [\d.]+,', r'^    "first_position_win_rate": ']),
    "generation.py": ([], {"vllm"}, [r"^batch=2  new_tokens=4  hf_s=[\d.]+  hf_tok_s=[\d.]+  vllm_s=[\d.]+  "
                                     r"vllm_tok_s=[\d.]+  speedup=[\d.]+$"]),
    "judge_read.py": ([], {"vllm"}, [r"^block_size=default prefix_cache=True: [\d.]+ s per read"]),
    "push.py": ([], {"vllm"}, [r"^direct median [\d.]+ s", r"^reload median [\d.]+ s",
                               r"^probe log-probs identical after both pushes in every round$"]),
    "label_vs_prefill.py": ([], {"vllm", "shared data"}, [r"^label vs bare prefill: pofe median \d+ tokens/s \| bare vLLM "
                                                          r"median \d+ tokens/s \| ratio [\d.]+"]),
    "vs_trl.py": ([], {"trl", "shared anchors"}, [r"^round 1 pofe: [\d.]+ s/step", r"^round 1 TRL \(glibc\): [\d.]+ s/step",
                                                  r"median [\d.]+ s/step \| TRL \(glibc\) .* speed-up [\d.]+x over 1 "
                                                  r"paired rounds$"]),
    "curves.py": ([], {"trl", "shared anchors"}, [r"^\| bar \| 2 \| 2 \| 4 \| [\d.]+ \| [\d.]+ \| [\d.]+x \|"]),
    "rl_vs_trl.py": (["--algo", "rloo"], {"trl", "shared anchors"},
                     [r"^rl rloo fp32: pofe median [\d.]+ s/step \| TRL median [\d.]+ s/step \| speed-up [\d.]+x over 1 "
                      r"paired rounds"]),
    "train_vs_trl.py": (["--command", "rm"], {"trl", "shared data"},
                        [r"^rm fp32: pofe median [\d.]+ s/step \| TRL median [\d.]+ s/step \| speed-up [\d.]+x over 1 "
                         r"paired rounds"]),
}
RUN_BY = {  # the TRL sides: run by their pairing script's smoke run above
    "trl_online_shape.py": "vs_trl.py and curves.py",
    "trl_rl_side.py": "rl_vs_trl.py",
    "trl_train_side.py": "train_vs_trl.py",
}
NOT_A_SCRIPT = {  # the GPU machine's check has its own dry run (tests/project/test_device_check.py)
    "machine.py": "the helpers the scripts import", "device_check.sh": "the GPU machine's check",
    "device_check.py": "the GPU machine's check", "device_sides.py": "the GPU machine's check"}


def test_every_benchmark_script_has_a_smoke_run():
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    assert scripts == set(SMOKE) | set(RUN_BY) | set(NOT_A_SCRIPT)
    for name in SMOKE:
        assert "--smoke" in (BENCH / name).read_text(), name


def _missing(needs: set[str]) -> str | None:
    have = {"vllm": importlib.util.find_spec("vllm") is not None, "trl": importlib.util.find_spec("trl") is not None,
            "shared data": (SHARED / "data").is_dir(), "shared anchors": (SHARED / "anchors" / "trl").is_dir()}
    gone = sorted(n for n in needs if not have[n])
    return f"needs {', '.join(gone)} (not installed / not found next to the repository)" if gone else None


@pytest.fixture(scope="module")
def stand_in_anchor(tmp_path_factory):
    """``$TRL_ANCHOR_DIR`` with this interpreter as its venv's python and a tiny model as smol135."""
    d = tmp_path_factory.mktemp("trl-anchor")
    (d / "venv" / "bin").mkdir(parents=True)
    py = d / "venv" / "bin" / "python"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would lose the venv (pyvenv.cfg is by path)
    py.chmod(0o755)
    sys.path.insert(0, str(BENCH))
    try:
        from machine import smoke_model

        os.symlink(smoke_model(), d / "smol135")
    finally:
        sys.path.remove(str(BENCH))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("script", SMOKE)
def test_smoke_run(script, stand_in_anchor):
    args, needs, lines = SMOKE[script]
    why = _missing(needs)
    if why:
        pytest.skip(f"{script}: {why}")
    r = subprocess.run([sys.executable, str(BENCH / script), *args, "--smoke"], cwd=BENCH.parent, capture_output=True,
                       text=True, timeout=600, env=env(TRL_ANCHOR_DIR=str(stand_in_anchor),
                                                       POFE_SMOKE_MODEL=str((stand_in_anchor / "smol135").resolve())))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    for pattern in lines:
        assert re.search(pattern, r.stdout, re.M), (pattern, r.stdout[-3000:])
