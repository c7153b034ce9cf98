"""Nothing silently dropped by ``label`` / ``eval`` / ``report``, and no row lost at a resume
boundary: a limit that cuts input is logged and counted in summary.json; ``eval`` refuses
policies that do not answer the same prompts, and duplicated prompts; the report of a run
whose labels are all p = 1 is written; a kill between a batch's last row and its metrics row
loses nothing after ``--resume``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from _cli import error_lines, invoke, pofe
from pofe.runs import read_jsonl

pytestmark = pytest.mark.faults


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _pairs(path: Path, n: int) -> Path:
    # response_a is always the shorter one: the length judge (prefer shorter, temperature 0) gives p = 1.0
    return _jsonl(path, [{"prompt": f"Question {i}?", "response_a": "short" + "!" * (i % 3),
                          "response_b": "a much longer answer " * (1 + i % 3)} for i in range(n)])


def _label(pairs: Path, out: Path, name: str, *extra: str) -> list[str]:
    sets = ["judge.kind=length", "log.progress=false", "log.tensorboard=false", *extra]
    return ["label", "--pairs", str(pairs), "--output-dir", str(out), "--name", name,
            *[a for s in sets for a in ("--set", s)]]


def _one_error(res) -> str:
    lines = error_lines(res)
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
    return lines[0]


# ----------------------------------------------------------------------------- label limits


def test_label_pairs_labels_every_pair_by_default(tmp_path):
    res = invoke(*_label(_pairs(tmp_path / "pairs.jsonl", 40), tmp_path, "r"))
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["pairs"] == 40
    assert len(read_jsonl(tmp_path / "r" / "labels.jsonl")) == 40
    assert s["input"] == {"source": str(tmp_path / "pairs.jsonl"), "available": 40, "used": 40, "limited": 0,
                          "max_prompts": None}


def test_label_max_prompts_cut_is_logged_and_counted(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pofe.loops.label"):
        res = invoke("label", "--max-prompts", "10", *_label(_pairs(tmp_path / "pairs.jsonl", 40), tmp_path, "r")[1:])
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["pairs"] == 10
    assert s["input"] == {"source": str(tmp_path / "pairs.jsonl"), "available": 40, "used": 10, "limited": 30,
                          "max_prompts": 10}
    assert any("30 of 40" in r.getMessage() and "max_prompts" in r.getMessage() for r in caplog.records)


def test_label_sampled_prompts_cut_by_max_prompts_is_counted(tmp_path, tiny_model_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Question {i}: what is {i} plus {i}?\n" for i in range(5)))
    res = invoke("label", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--max-prompts", "3",
                 "--output-dir", str(tmp_path), "--name", "r",
                 *[a for s in ("judge.kind=length", "sampling.max_new_tokens=3", "log.progress=false",
                               "log.tensorboard=false") for a in ("--set", s)])
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["input"] == {"source": str(prompts), "available": 5, "used": 3, "limited": 2, "max_prompts": 3}


def test_cai_revise_max_prompts_cut_is_counted(tmp_path):
    from pofe.loops.cai_revise import CaiReviseConfig, run

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"How do I do thing {i}?\n" for i in range(5)))
    cfg = CaiReviseConfig.model_validate({
        "data": {"prompts": str(prompts), "max_prompts": 3}, "train": {"batch_size": 2}, "refusal": {"enabled": False},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path), "name": "c"}})
    s = run(cfg, generate_fn=lambda msgs, samp, seed: [f"reply {len(m)}" for m in msgs])
    assert s["prompts"] == 3
    assert s["input"] == {"source": str(prompts), "available": 5, "used": 3, "limited": 2, "max_prompts": 3}
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["input"]["limited"] == 2


# ----------------------------------------------------------------------------- eval: the same prompts on both sides


def _responses(path: Path, tag: str, idx, *, extra=()) -> Path:
    return _jsonl(path, [{"prompt": f"Question {i}?", "response": f"{tag} answer {i}" * (1 + i % 3)} for i in idx]
                  + list(extra))


def _eval(a: Path, b: Path, *extra: str):
    return invoke("eval", str(a), str(b), "--judge", "length", "--set", "refusal=false", *extra)


def test_eval_refuses_when_b_lacks_prompts_of_a(tmp_path):
    a = _responses(tmp_path / "a.jsonl", "A", range(10))
    b = _responses(tmp_path / "b.jsonl", "B", range(4))
    res = _eval(a, b)
    assert res.returncode == 2
    line = _one_error(res)
    assert "b.jsonl" in line and "6 of the 10 prompts" in line and "a.jsonl" in line and "Question 4?" in line


def test_eval_refuses_when_b_has_prompts_a_lacks(tmp_path):
    a = _responses(tmp_path / "a.jsonl", "A", range(4))
    b = _responses(tmp_path / "b.jsonl", "B", range(6))
    res = _eval(a, b)
    assert res.returncode == 2
    line = _one_error(res)
    assert "b.jsonl" in line and "2 prompts" in line and "a.jsonl" in line and "Question 4?" in line


def test_eval_with_a_prompt_file_takes_its_prompts_from_longer_response_files(tmp_path):
    """With --prompts the prompt set is explicit: responses to other prompts are not compared
    (and nothing is missing), so this is a comparison on exactly the 3 given prompts."""
    a = _responses(tmp_path / "a.jsonl", "A", range(6))
    b = _responses(tmp_path / "b.jsonl", "B", range(5))
    p = tmp_path / "p.txt"
    p.write_text("Question 0?\nQuestion 1?\nQuestion 2?\n")
    res = _eval(a, b, "--prompts", str(p), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["n"] == 3


def test_eval_refuses_a_duplicated_prompt_in_a_responses_file(tmp_path):
    a = _responses(tmp_path / "a.jsonl", "A", range(3), extra=[{"prompt": "Question 1?", "response": "another"}])
    b = _responses(tmp_path / "b.jsonl", "B", range(3))
    res = _eval(a, b)
    assert res.returncode == 2
    line = _one_error(res)
    assert "'Question 1?'" in line and f"{a}:2" in line and f"{a}:4" in line


def test_eval_refuses_a_duplicated_prompt_in_the_prompt_file(tmp_path):
    a = _responses(tmp_path / "a.jsonl", "A", range(3))
    b = _responses(tmp_path / "b.jsonl", "B", range(3))
    p = tmp_path / "p.txt"
    p.write_text("Question 0?\nQuestion 2?\nQuestion 0?\n")
    res = _eval(a, b, "--prompts", str(p))
    assert res.returncode == 2
    line = _one_error(res)
    assert "'Question 0?'" in line and "p.txt" in line and "1 and 3" in line


def test_eval_limit_cut_is_counted(tmp_path):
    a = _responses(tmp_path / "a.jsonl", "A", range(6))
    b = _responses(tmp_path / "b.jsonl", "B", range(6))
    res = _eval(a, b, "--limit", "4", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["n"] == 4 and out["prompts"] == {"available": 6, "used": 4, "limited": 2}


# ----------------------------------------------------------------------------- report of p = 1.0 labels


def test_wilson_interval_contains_its_point_at_the_ends():
    from pofe.evaluation.winrate import wilson_interval

    for n in range(1, 201):
        assert wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0, n
    lo, hi = wilson_interval(12, 12)
    assert round(lo, 4) == 0.7575 and hi == 1.0


def test_report_of_a_label_run_with_every_p_one_is_written(tmp_path):
    res = invoke(*_label(_pairs(tmp_path / "pairs.jsonl", 6), tmp_path, "r"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert {r["p"] for r in read_jsonl(tmp_path / "r" / "labels.jsonl")} == {1.0}
    rep = invoke("report", str(tmp_path / "r"), "--json")
    assert rep.returncode == 0, rep.stderr[-2000:]
    out = json.loads(rep.stdout)
    assert out["plots"][:2] == ["p_hist", "judge_fitness"]
    assert (tmp_path / "r" / "report" / "report.html").is_file()


def test_report_of_a_label_run_with_every_p_one_half_is_written(tmp_path):
    """Equal lengths: the length judge ties every pair (p = 0.5), so no pair has a longer
    response to pick; the judge-fitness plot shows the two rates it has, with their labels."""
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"Q{i}?", "response_a": f"aaaa{i}", "response_b": f"bbbb{i}"}
                                             for i in range(4)])
    res = invoke(*_label(pairs, tmp_path, "r"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert {r["p"] for r in read_jsonl(tmp_path / "r" / "labels.jsonl")} == {0.5}
    rep = invoke("report", str(tmp_path / "r"), "--json")
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert json.loads(rep.stdout)["plots"][:2] == ["p_hist", "judge_fitness"]


# ----------------------------------------------------------------------------- kills at the metrics boundary


def _metrics(d: Path) -> list[dict]:
    return read_jsonl(d / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("n, point", [(6, "2:before_metrics"), (5, "3:row_1")])
def test_label_kill_between_batch_rows_and_metrics_row_resumes_with_every_metrics_row(tmp_path, n, point):
    """6 (or 5) pairs in batches of 2; killed after batch 2's (the last, 1-pair batch 3's) last
    row was written but before its metrics row: the resume sets that batch's rows aside (kept,
    never deleted) and judges the batch again after the last checkpoint, so metrics.jsonl is
    the uninterrupted run's, once each, in order."""
    pairs = _pairs(tmp_path / "pairs.jsonl", n)
    full = invoke(*_label(pairs, tmp_path, "full", "train.batch_size=2"))
    assert full.returncode == 0, full.stderr[-2000:]
    crashed = pofe(*_label(pairs, tmp_path, "crash", "train.batch_size=2"), POFE_FAULT=point)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    run, ref = tmp_path / "crash", tmp_path / "full"
    step = int(point.split(":")[0])
    assert [r["step"] for r in _metrics(run)] == list(range(1, step))  # the row the kill cost
    resumed = invoke("label", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3]
    assert _metrics(run) == _metrics(ref)
    assert len(read_jsonl(run / "labels.jsonl")) == n
    assert (run / "preferences.jsonl").read_text() == (ref / "preferences.jsonl").read_text()
    kept = [r for f in run.glob("labels.after-crash-*.jsonl") for r in read_jsonl(f)]
    assert len(kept) == (2 if point == "2:before_metrics" else 1)  # the killed batch's rows, set aside


def test_label_resume_of_a_finished_run_keeps_the_last_partial_batch_metrics_row(tmp_path):
    pairs = _pairs(tmp_path / "pairs.jsonl", 5)
    full = invoke(*_label(pairs, tmp_path, "r", "train.batch_size=2"))
    assert full.returncode == 0, full.stderr[-2000:]
    before = _metrics(tmp_path / "r")
    again = invoke("label", "--resume", str(tmp_path / "r"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["step"] for r in before] == [1, 2, 3] and _metrics(tmp_path / "r") == before


@pytest.mark.slow
def test_cai_revise_kill_between_chunk_rows_and_metrics_row_resumes_with_every_metrics_row(tmp_path, tiny_model_dir):
    """3 prompts in chunks of 2, killed after chunk 1's revisions were written but before its
    metrics row (and its checkpoint): the resume sets them aside and revises chunk 1 again; the
    reference and the resume run in-process (one torch thread, as the killed subprocess)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"How do I do thing {i}?\n" for i in range(3)))

    def args(name):
        sets = ["train.batch_size=2", "rounds=1", "sampling.max_new_tokens=3", "critique_sampling.max_new_tokens=3",
                "refusal.enabled=false", "log.progress=false", "log.tensorboard=false"]
        return ["cai", "revise", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--output-dir", str(tmp_path),
                "--name", name, *[a for s in sets for a in ("--set", s)]]

    full = invoke(*args("full"))
    assert full.returncode == 0, full.stderr[-2000:]
    crashed = pofe(*args("crash"), POFE_FAULT="1:before_metrics")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    run, ref = tmp_path / "crash", tmp_path / "full"
    assert _metrics(run) == [] and len(read_jsonl(run / "revisions.jsonl")) == 2
    resumed = invoke("cai", "revise", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in _metrics(run)] == [1, 2]
    assert _metrics(run) == _metrics(ref)
    assert read_jsonl(run / "revisions.jsonl") == read_jsonl(ref / "revisions.jsonl")
    assert len([r for f in run.glob("revisions.after-crash-*.jsonl") for r in read_jsonl(f)]) == 2
