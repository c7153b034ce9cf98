"""Invariant (c) for the labelling commands on CPU processes (torchrun, gloo): ``pofe label``,
``pofe judge``, ``pofe eval``, ``pofe audit`` and ``pofe cai revise`` under 2 processes write
what 1 process writes -- every row equal and in input order, one run folder (or one output
file), and ``processes: 2`` in the summary or result.

The items are split into contiguous blocks (``DataParallel.map``); batches of 3 over 7 items
leave the last batch with one item, so one process has an empty block there and must still
join the gather. Judges are programmatic (``length``: deterministic) and generation is greedy
one prompt at a time (``sampling.batch_size: 1``), the parts that do not depend on how many
processes split the work (sampled texts do: each block draws from its own seed).

Also: SIGKILL of a 2-process ``pofe label`` mid-batch (or of ``pofe cai revise``, sampling),
then ``--resume`` with 2 processes, equals the uninterrupted run; two processes share one judge
cache file (SQLite in WAL mode, a connection each) without losing or corrupting an entry.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import configs
from _cli import env, pofe, torchrun
from harness import _drop, assert_same_rows, one_run_folder, rows, run_pofe, summary

pytestmark = pytest.mark.slow

LENGTH = {"kind": "length", "prefer": "shorter", "temperature": 10.0}
# what differs between any two runs (where and when), and the count of processes itself
RUN_FIELDS = ("seconds", "run_dir", "files", "phase_seconds", "labels_per_second", "items_per_s", "output",
              "judge_summary.seconds", "processes")


# prompts that share no wording, so that the varied model answers each differently
PROMPTS = ["cat", "Tell me about the sea and the mountains.", "12345 67890", "Why?", "Quantum chromodynamics explained",
           "hello world", "A B C D E F G"]


def _pairs(work: Path, n: int = 7) -> str:
    """``n`` pairs of different lengths (soft length-judge labels that differ row to row)."""
    path = work / f"pairs-{n}.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Question {i}?", "response_a": "short " * (1 + i % 3),
                                        "response_b": "a longer answer " * (1 + i % 2), "id": f"r{i}"}) + "\n"
                            for i in range(n)))
    return str(path)


def _both(argv, one: dict, two: dict):
    """The 1-process and the 2-process run, side by side."""
    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(run_pofe, argv, config=one)
        f2 = pool.submit(run_pofe, argv, config=two, processes=2)
        a, b = f1.result(), f2.result()
    assert a.rc == 0, a.stderr[-3000:]
    assert b.rc == 0, b.stderr[-3000:]
    return a, b


def _label(work: Path, name: str, over: dict | None = None) -> dict:
    cfg = {"data": {"pairs": _pairs(work)}, "judge": LENGTH, "train": {"batch_size": 3},
           "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(work), "name": name}}
    return configs.finish(cfg, over)


def _same_summary(one: Path, two: Path) -> None:
    a, b = summary(one), summary(two)
    assert (a["processes"], b["processes"]) == (1, 2)
    assert_same_rows([_drop(b, RUN_FIELDS)], [_drop(a, RUN_FIELDS)], "summary.json")


def test_label_two_processes_equal_one(tmp_path):
    one, two = _both(("label",), _label(tmp_path, "one"), _label(tmp_path, "two"))
    for name in ("labels.jsonl", "pairs.jsonl", "preferences.jsonl"):
        assert_same_rows(rows(two.run_dir / name), rows(one.run_dir / name), name)
    got = rows(two.run_dir / "labels.jsonl")
    # input order, every pair once: the prompts of the input file, 0..6
    assert [r["prompt"] for r in got] == [f"Question {i}?" for i in range(7)]
    assert len({r["p"] for r in got}) > 2  # labels that differ row to row, else order proves nothing
    assert [r["step"] for r in rows(two.run_dir / "metrics.jsonl")] == [1, 2, 3]
    _same_summary(one.run_dir, two.run_dir)
    one_run_folder(tmp_path, "two")


def test_label_two_process_sigkill_mid_batch_then_resume_equals_one_process(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        f_full = pool.submit(run_pofe, ("label",), config=_label(tmp_path, "full"))
        f_crash = pool.submit(run_pofe, ("label",), config=_label(tmp_path, "crash"), processes=2, fault="2:row_1")
        full, crash = f_full.result(), f_crash.result()
    assert full.rc == 0, full.stderr[-3000:]
    assert crash.rc != 0 and not (crash.run_dir / "summary.json").exists(), crash.stderr[-3000:]
    # killed after the first row of batch 2: batch 1's three rows and that one row are on disk
    assert len(rows(crash.run_dir / "labels.jsonl")) in (3, 4)  # 4 unless the other process's kill came first
    resumed = run_pofe(("label",), resume=crash.run_dir, processes=2)
    assert resumed.rc == 0, resumed.stderr[-3000:]
    assert_same_rows(rows(crash.run_dir / "labels.jsonl"), rows(full.run_dir / "labels.jsonl"), "labels.jsonl")
    assert_same_rows(rows(crash.run_dir / "preferences.jsonl"), rows(full.run_dir / "preferences.jsonl"),
                     "preferences.jsonl")
    s = summary(crash.run_dir)
    assert s["processes"] == 2 and s["resumed_from"] == 1 and s["steps"] == 3


def _judge(work: Path, name: str, judge: dict, cache: Path | None = None) -> dict:
    cfg = {"data": {"input": _pairs(work)}, "batch_size": 3, "judge": judge,
           "log": {"progress": False}, "run": {"output_dir": str(work), "name": name}}
    if cache is not None:
        cfg["judge"] = {**judge, "cache": {"path": str(cache)}}
    return cfg


def test_judge_two_processes_equal_one(tmp_path):
    one, two = _both(("judge",), _judge(tmp_path, "one", LENGTH), _judge(tmp_path, "two", LENGTH))
    got = rows(two.run_dir / "verdicts.jsonl", configs.TIMING)
    assert_same_rows(got, rows(one.run_dir / "verdicts.jsonl", configs.TIMING), "verdicts.jsonl")
    assert [r["index"] for r in got] == list(range(7)) and [r["id"] for r in got] == [f"r{i}" for i in range(7)]
    _same_summary(one.run_dir, two.run_dir)
    assert summary(two.run_dir)["n"] == 7
    one_run_folder(tmp_path, "two")


def test_two_processes_share_one_judge_cache(tmp_path, tiny_model_dir):
    """An LLM judge on the tiny model, a cache file shared by both processes: the 2-process run
    writes every ordered read once (7 pairs x 2 orders), a 1-process run reads all of them back."""
    cache = tmp_path / "cache.sqlite"
    llm = {"kind": "llm", "model": str(tiny_model_dir), "template": "helpful"}
    first = run_pofe(("judge",), config=_judge(tmp_path, "first", llm, cache), processes=2)
    assert first.rc == 0, first.stderr[-3000:]
    s1 = summary(first.run_dir)
    assert (s1["cache_hits"], s1["cache_misses"], s1["processes"]) == (0, 14, 2)
    second = run_pofe(("judge",), config=_judge(tmp_path, "second", llm, cache))  # one process reads them all
    assert second.rc == 0, second.stderr[-3000:]
    s2 = summary(second.run_dir)
    assert (s2["cache_hits"], s2["cache_misses"]) == (14, 0)
    drop = (*configs.TIMING, "cached", "tokens", "extra.cache_hits", "extra.cache_misses")
    assert_same_rows(rows(second.run_dir / "verdicts.jsonl", drop), rows(first.run_dir / "verdicts.jsonl", drop),
                     "verdicts from the cache")
    with sqlite3.connect(cache) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0] == 14


# One writer: waits for the go file, opens the cache (a fresh file: both switch on WAL at once),
# then writes 200 entries one transaction each -- half its own keys, half keys both write.
_WRITER = """
import pathlib, sys, time
from pofe.judges.cache import JudgeCache
path, worker, go = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
go.with_name(f"ready-{worker}").touch()
while not go.exists():
    time.sleep(0.001)
cache = JudgeCache(path)
for k in range(200):
    key = f"w{worker}-{k}" if k % 2 else f"both-{k}"
    assert cache.put_many([(key, {"k": k})]) == 1, (worker, k, "write failed")
assert cache.writable and cache.write_failures == 0
cache.close()
"""


def test_two_processes_write_one_cache_file_at_once(tmp_path):
    """The judge cache's concurrency contract without torch: two processes open a new cache file
    and write 200 entries each at the same time; every write lands (none degrades the cache to
    uncached), the shared keys are stored once, and the file passes SQLite's integrity check."""
    path, go = tmp_path / "c.sqlite", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w), str(go)], env=env(),
                              stderr=subprocess.PIPE, text=True) for w in (0, 1)]
    deadline = time.time() + 60
    while not all((tmp_path / f"ready-{w}").exists() for w in (0, 1)) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()  # both are polling: they open the new file and write at the same moment
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        n = db.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]
        both = db.execute("SELECT COUNT(*) FROM judge_cache WHERE key LIKE 'both-%'").fetchone()[0]
    assert (n, both) == (100 + 100 + 100, 100)


def _cli_json(out: str) -> list[dict]:
    """Every JSON object a command printed (one per process)."""
    dec, objs, i = json.JSONDecoder(), [], 0
    while True:
        i = out.find("{", i)
        if i < 0:
            return objs
        obj, i = dec.raw_decode(out, i)
        objs.append(obj)


def test_eval_two_processes_equal_one(tmp_path, varied_model_dir):
    """Policy A generated by a tiny model (greedy, one prompt per generate call), policy B a
    responses file; the length judge compares them."""
    prompts = PROMPTS
    (tmp_path / "p.txt").write_text("".join(p + "\n" for p in prompts))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"prompt": p, "response": "x" * (3 * i)}) + "\n"
                                              for i, p in enumerate(prompts)))
    argv = [str(varied_model_dir), str(tmp_path / "b.jsonl"), "--prompts", str(tmp_path / "p.txt"), "--judge", "length",
            "--json", "--set", "sampling.temperature=0", "--set", "sampling.batch_size=1",
            "--set", "sampling.max_new_tokens=6", "--set", "model.device=cpu"]
    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(pofe, "eval", *argv, "-o", str(tmp_path / "one.jsonl"))
        f2 = pool.submit(torchrun, "eval", *argv, "-o", str(tmp_path / "two.jsonl"))
        one, two = f1.result(), f2.result()
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    got, want = rows(tmp_path / "two.jsonl"), rows(tmp_path / "one.jsonl")
    assert_same_rows(got, want, "eval -o rows")
    assert [r["prompt"] for r in got] == prompts and len({r["response_a"] for r in got}) == 7
    (a,), results = _cli_json(one.stdout), _cli_json(two.stdout)
    assert 1 <= len(results) <= 2 and all(r == results[0] for r in results)  # every process, one result
    assert (a["processes"], results[0]["processes"]) == (1, 2)
    assert {**results[0], "processes": 1} == a and a["n"] == 7


def test_audit_two_processes_equal_one(tmp_path):
    """Seven labelled pairs in batches of 3, two seed passes and the contrast probes; no
    thresholds (the report, not a verdict on the length judge, is compared)."""
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"prompt": f"Q{i}? Say more.", "response_a": "Yes. " * (1 + i % 3) + "It works.",
                                       "response_b": "No. " * (1 + i % 2) + "It does not.", "label": "AB"[i % 2]}) + "\n"
                           for i in range(7)))
    thresholds = {k: None for k in ("min_agreement", "min_kappa", "min_position_consistency", "max_first_position_bias",
                                    "max_abs_length_correlation", "max_abs_length_slope", "max_parse_failure_rate",
                                    "max_contrast_bias", "max_attack_win_rate")}

    def cfg(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"data": {"calibration": [str(cal)]}, "judge": LENGTH, "batch_size": 3,
                                        "seeds": 2, "contrast_limit": 7, "thresholds": thresholds,
                                        "output": str(tmp_path / f"{name}.json")}))
        return path

    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(pofe, "audit", "--config", str(cfg("one")))
        f2 = pool.submit(torchrun, "audit", "--config", str(cfg("two")))
        one, two = f1.result(), f2.result()
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert (a["processes"], b["processes"]) == (1, 2)
    drop = ("seconds", "processes")  # the phases' wall times (metrics.seconds, judge_summary.seconds)
    assert_same_rows([_drop(b, drop)], [_drop(a, drop)], "audit report")
    assert a["calibration"]["n_items"] == 7 and a["metrics"]["contrasts"]["padding"]["n"] > 0


def test_cai_revise_two_processes_equal_one(tmp_path, varied_model_dir):
    """One critique principle (its draw cannot depend on the blocks) and greedy decoding, one
    prompt per generate call: 3 red-team prompts in chunks of 2 and 1 benign prompt."""
    red = tmp_path / "red.txt"
    red.write_text("".join(p + "\n" for p in PROMPTS[:3]))
    over = {"data.prompts": str(red), "principles": ["privacy"],
            "sampling": {"temperature": 0.0, "batch_size": 1, "max_new_tokens": 3},
            "critique_sampling": {"temperature": 0.0, "batch_size": 1, "max_new_tokens": 3}}
    cmd = configs.COMMANDS["cai revise"]
    one, two = _both(cmd.argv, configs.cai_revise(tmp_path, varied_model_dir, "one", over),
                     configs.cai_revise(tmp_path, varied_model_dir, "two", over))
    for name in ("revisions.jsonl", "sft.jsonl", "preferences.jsonl"):
        assert_same_rows(rows(two.run_dir / name), rows(one.run_dir / name), name)
    got = rows(two.run_dir / "revisions.jsonl")
    assert [r["set"] for r in got] == ["red-team"] * 3 + ["benign"] and [r["chunk"] for r in got] == [0, 0, 1, 2]
    assert [r["prompt"] for r in got[:3]] == PROMPTS[:3] and len({r["responses"][0] for r in got}) == 4
    _same_summary(one.run_dir, two.run_dir)
    one_run_folder(tmp_path, "two")


def test_cai_revise_two_process_sigkill_then_resume_equals_the_uninterrupted_run(tmp_path, tiny_model_dir):
    """Sampled (T 0.7) revisions: each block draws from its chunk's seed and its rank, so a
    2-process run killed after chunk 2's rows and resumed with 2 processes writes what the
    uninterrupted 2-process run wrote."""
    cmd = configs.COMMANDS["cai revise"]
    with ThreadPoolExecutor(2) as pool:
        f_full = pool.submit(run_pofe, cmd.argv, config=cmd.config(tmp_path, tiny_model_dir, "full"), processes=2)
        f_crash = pool.submit(run_pofe, cmd.argv, config=cmd.config(tmp_path, tiny_model_dir, "crash"), processes=2,
                              fault="2:before_metrics")
        full, crash = f_full.result(), f_crash.result()
    assert full.rc == 0, full.stderr[-3000:]
    assert crash.rc != 0 and not (crash.run_dir / "summary.json").exists(), crash.stderr[-3000:]
    resumed = run_pofe(cmd.argv, resume=crash.run_dir, processes=2)
    assert resumed.rc == 0, resumed.stderr[-3000:]
    for name in ("revisions.jsonl", "sft.jsonl", "preferences.jsonl"):
        assert_same_rows(rows(crash.run_dir / name), rows(full.run_dir / name), name)
    got = rows(full.run_dir / "revisions.jsonl")
    assert len({r["responses"][0] for r in got}) == 4  # sampled answers that differ, else order proves nothing
    s = summary(crash.run_dir)
    assert s["processes"] == 2 and s["resumed_from"] == 1 and s["steps"] == 3
