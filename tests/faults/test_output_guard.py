"""No output overwrites an input, another output or a live run's files: every command with a
user-given output path goes through :func:`pofe.outputs.guard_outputs` (resolved path and
inode against every input, and against every folder whose run lock another live process
holds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import env, error_lines, invoke

pytestmark = pytest.mark.faults


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _pairs(path: Path, n: int = 4) -> Path:
    return _jsonl(path, [{"prompt": f"Question {i}?", "response_a": "short" + "!" * i,
                          "response_b": "a much longer answer " * (1 + i % 3)} for i in range(n)])


def _prefs(path: Path, n: int = 6) -> Path:
    return _jsonl(path, [{"prompt": f"Question {i}?", "chosen": f"Answer {i}.",
                          "rejected": f"A long wrong answer number {i} " * 2, "p": 0.8} for i in range(n)])


def _one_error(res) -> str:
    lines = [ln for ln in error_lines(res) if "Warning" not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
    return lines[0]


@pytest.fixture
def live_run(tmp_path):
    """A run folder whose lock another live process holds (what a running ``pofe label`` does)."""
    run = tmp_path / "runs" / "live"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    labels = _jsonl(run / "labels.jsonl", [{"prompt": "kept", "p": 0.9}])
    code = ("import sys, time\nfrom pofe.runs import lock_run\nlock_run(sys.argv[1])\nprint('locked', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield run, labels, proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------- audit


def test_audit_output_onto_the_calibration_file_is_refused_and_the_file_is_kept(tmp_path):
    cal = _prefs(tmp_path / "cal.jsonl")
    before = cal.read_bytes()
    res = invoke("audit", str(cal), "--judge", "length", "-o", str(cal))
    assert res.returncode == 2
    line = _one_error(res)
    assert "-o" in line and "cal.jsonl" in line and "input file" in line
    assert cal.read_bytes() == before


def test_audit_html_onto_the_calibration_file_is_refused_and_the_file_is_kept(tmp_path):
    cal = _prefs(tmp_path / "cal.jsonl")
    before = cal.read_bytes()
    res = invoke("audit", str(cal), "--judge", "length", "-o", str(tmp_path / "audit.json"),
                 "--set", f"html={cal}")
    assert res.returncode == 2
    line = _one_error(res)
    assert "html" in line and "cal.jsonl" in line and "input file" in line
    assert cal.read_bytes() == before
    assert not (tmp_path / "audit.json").exists()  # refused before anything was written


def test_audit_output_and_html_on_one_path_is_refused(tmp_path):
    cal = _prefs(tmp_path / "cal.jsonl")
    res = invoke("audit", str(cal), "--judge", "length", "-o", str(tmp_path / "a.json"),
                 "--set", f"html={tmp_path / 'a.json'}")
    assert res.returncode == 2
    assert "also the output of -o" in _one_error(res)
    assert not (tmp_path / "a.json").exists()


def test_audit_output_onto_a_file_inside_a_calibration_folder_is_refused(tmp_path):
    folder = tmp_path / "cal"
    folder.mkdir()
    cal = _prefs(folder / "part.jsonl")
    before = cal.read_bytes()
    res = invoke("audit", str(folder), "--judge", "length", "-o", str(cal))
    assert res.returncode == 2
    assert "inside the input folder" in _one_error(res)
    assert cal.read_bytes() == before


# ----------------------------------------------------------------------------- judge


@pytest.mark.slow
def test_judge_output_into_a_live_run_folder_is_refused_naming_the_pid(tmp_path, live_run):
    run, labels, pid = live_run
    before = labels.read_bytes()
    res = invoke("judge", str(_pairs(tmp_path / "pairs.jsonl")), "--judge", "length", "-o", str(labels),
                 "--set", f"run.output_dir={tmp_path / 'jr'}")
    assert res.returncode == 2
    line = _one_error(res)
    assert str(run) in line and f"PID {pid}" in line and "-o" in line
    assert labels.read_bytes() == before


def test_judge_output_on_a_hard_link_to_the_input_is_refused(tmp_path):
    pairs = _pairs(tmp_path / "pairs.jsonl")
    link = tmp_path / "other-name.jsonl"
    os.link(pairs, link)
    before = pairs.read_bytes()
    res = invoke("judge", str(pairs), "--judge", "length", "-o", str(link), "--set", f"run.output_dir={tmp_path / 'r'}")
    assert res.returncode == 2
    assert "input file" in _one_error(res)
    assert pairs.read_bytes() == before


def test_judge_output_into_a_finished_run_folder_is_allowed(tmp_path):
    """A run folder whose process has exited keeps its .lock file but nobody holds the lock."""
    done = tmp_path / "runs" / "done"
    done.mkdir(parents=True)
    (done / ".lock").write_text("99999999\n")
    res = invoke("judge", str(_pairs(tmp_path / "pairs.jsonl")), "--judge", "length", "-o", str(done / "v.jsonl"),
                 "--set", f"run.output_dir={tmp_path / 'r'}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert len((done / "v.jsonl").read_text().splitlines()) == 4


# ----------------------------------------------------------------------------- eval, export, report


def _responses(path: Path, tag: str, n: int = 3) -> Path:
    return _jsonl(path, [{"prompt": f"Question {i}?", "response": f"{tag} answer {i}" * (1 + i)} for i in range(n)])


def test_eval_output_on_a_symlink_to_a_policy_file_is_refused(tmp_path):
    a, b = _responses(tmp_path / "a.jsonl", "A"), _responses(tmp_path / "b.jsonl", "B")
    (tmp_path / "out.jsonl").symlink_to(b)
    before = b.read_bytes()
    res = invoke("eval", str(a), str(b), "--judge", "length", "-o", str(tmp_path / "out.jsonl"), "--set", "refusal=false")
    assert res.returncode == 2
    line = _one_error(res)
    assert "b.jsonl" in line and "input file" in line
    assert b.read_bytes() == before


@pytest.mark.slow
def test_eval_output_into_a_live_run_folder_is_refused(tmp_path, live_run):
    run, _, pid = live_run
    a, b = _responses(tmp_path / "a.jsonl", "A"), _responses(tmp_path / "b.jsonl", "B")
    res = invoke("eval", str(a), str(b), "--judge", "length", "-o", str(run / "eval.jsonl"), "--set", "refusal=false")
    assert res.returncode == 2
    assert f"PID {pid}" in _one_error(res)
    assert not (run / "eval.jsonl").exists()


def test_export_output_on_a_hard_link_to_the_pair_file_is_refused(tmp_path):
    prefs = _prefs(tmp_path / "prefs.jsonl")
    link = tmp_path / "copy.jsonl"
    os.link(prefs, link)
    before = prefs.read_bytes()
    res = invoke("export", str(prefs), "-o", str(link))
    assert res.returncode == 2
    assert "input file" in _one_error(res)
    assert prefs.read_bytes() == before


@pytest.mark.slow
def test_report_out_into_a_live_run_folder_is_refused(tmp_path, live_run):
    run, labels, pid = live_run
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.yaml").write_text("seed: 0\n")
    _jsonl(src / "metrics.jsonl", [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}])
    res = invoke("report", str(src), "--output", str(run / "report"))
    assert res.returncode == 2
    assert f"PID {pid}" in _one_error(res)
    assert not (run / "report").exists()


# ----------------------------------------------------------------------------- the guard itself


def test_guard_skips_the_run_folder_this_process_holds(tmp_path):
    from pofe.errors import DataError
    from pofe.outputs import guard_outputs
    from pofe.runs import lock_run, release_run

    own = tmp_path / "own"
    own.mkdir()
    lock_run(own)
    try:
        guard_outputs({"-o": own / "x.jsonl"}, [])  # our own run: allowed
        with pytest.raises(DataError, match=r"-o .*: is a folder; give a file path"):
            guard_outputs({"-o": own}, [])
    finally:
        release_run(own)


def test_guard_refuses_a_path_under_a_regular_file(tmp_path):
    from pofe.errors import DataError
    from pofe.outputs import guard_outputs

    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match=r"afile is a file, not a folder"):
        guard_outputs({"-o": tmp_path / "afile" / "v.jsonl"}, [])


@pytest.mark.slow
def test_guard_lock_test_does_not_disturb_the_live_run(tmp_path, live_run):
    """After the guard test-locked the live run's .lock, the owner still holds it: a second
    lock attempt from this process is still refused."""
    from pofe.errors import DataError
    from pofe.outputs import guard_outputs
    from pofe.runs import RunError, lock_run

    run, _, pid = live_run
    for _ in range(3):
        with pytest.raises(DataError, match=f"PID {pid}"):
            guard_outputs({"--output": run / "sub" / "deeper"}, [], folders={"--output"})
    with pytest.raises(RunError, match=f"PID {pid}"):
        lock_run(run)


def test_cache_export_onto_a_hard_link_to_the_cache_is_refused(tmp_path):
    from pofe.judges.cache import JudgeCache, cache_key

    path = tmp_path / "c.sqlite"
    c = JudgeCache(path)
    c.put(cache_key("k", 0), {"lp": [0, -1.0], "raw": "x"})
    c.close()
    link = tmp_path / "export.jsonl"
    os.link(path, link)
    before = path.read_bytes()
    res = invoke("cache", "export", "--path", str(path), "-o", str(link))
    assert res.returncode == 2
    line = _one_error(res)
    assert "c.sqlite" in line and "input file" in line
    assert path.read_bytes() == before


def test_eval_output_beside_a_policy_model_in_its_run_folder_is_allowed_and_rewritten(tmp_path, tiny_model_dir):
    """A run folder stands for the model folder it holds: -o next to that model is no input,
    so the same command can be run twice (the second run rewrites its own output)."""
    import shutil

    run = tmp_path / "runs" / "sft-1"
    shutil.copytree(tiny_model_dir, run / "final")
    (run / "config.yaml").write_text("seed: 0\n")
    b = _responses(tmp_path / "b.jsonl", "B")
    out = run / "eval.jsonl"
    for _ in range(2):
        res = invoke("eval", str(run), str(b), "--judge", "length", "-o", str(out),
                     "--set", "refusal=false", "--set", "sampling.max_new_tokens=2")
        assert res.returncode == 0, res.stderr[-2000:]
        assert len(out.read_text().splitlines()) == 3
    res = invoke("eval", str(run), str(b), "--judge", "length", "-o", str(run / "final" / "config.json"),
                 "--set", "refusal=false")
    assert res.returncode == 2
    assert "inside the input folder" in _one_error(res)
