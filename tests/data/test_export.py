"""``pofe export``: outputs load in the consuming libraries (datasets, TRL 1.16's DPOTrainer),
from every pair file pofe writes; ``pofe judge`` verdicts carry their texts; outputs never
overwrite inputs; run files are world-readable."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app

runner = CliRunner()

SYS = {"role": "system", "content": "Answer in one word."}
CONV = [SYS, {"role": "user", "content": "Name a fruit."}]


def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _label_run(tmp_path: Path) -> Path:
    """A run folder as ``pofe label`` / ``cai revise`` leave it: preferences.jsonl."""
    run = tmp_path / "label-run"
    _jsonl(run / "preferences.jsonl", [
        {"prompt": "Name a fruit.", "chosen": "Apple.", "rejected": "A rock.", "p": 0.8, "provenance": {"judge_id": "j"}},
        {"prompt": "Say hi.", "chosen": "Hello there.", "rejected": "Go away.", "p": 0.6, "provenance": {}},
        {"prompt": "Count to two.", "chosen": "One, two.", "rejected": "Three.", "p": 1.0, "provenance": {}},
        {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven.", "p": 0.9, "provenance": {}},
    ])
    return run


def _ledger_run(tmp_path: Path) -> Path:
    """An online run's ledger: annotation rows (one unlabelled), loss rows."""
    run = tmp_path / "online-run"
    _jsonl(run / "ledger.jsonl", [
        {"kind": "annotation", "pair_id": "s1-0", "step": 1, "prompt": "Name a fruit.", "response_a": "Rock.",
         "response_b": "Apple.", "p": 0.25, "judge_id": "length"},
        {"kind": "annotation", "pair_id": "s1-1", "step": 1, "prompt": "Say hi.", "response_a": "Hello.",
         "response_b": "No.", "p": None},
        {"kind": "loss", "pair_id": "s1-0", "step": 1, "loss": 0.6},
    ])
    return run


def test_export_trl_formats_orient_and_keep_soft_p(tmp_path):
    run = _ledger_run(tmp_path)
    out = tmp_path / "trl.jsonl"
    r = runner.invoke(app, ["export", str(run), "--format", "trl", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["pairs"] == 1 and s["skipped"] == {"unlabelled": 1, "other-row-kind": 1}
    # p = 0.25 for A means B is preferred: chosen = B, p = 0.75 (BCE(-d, 1-p) = BCE(d, p)).
    assert [json.loads(x) for x in out.read_text().splitlines()] == [
        {"prompt": "Name a fruit.", "chosen": "Apple.", "rejected": "Rock.", "p": 0.75}]
    conv_run = tmp_path / "conv"
    _jsonl(conv_run / "preferences.jsonl", [{"prompt": CONV, "chosen": [{"role": "assistant", "content": "Pear."}],
                                             "rejected": [{"role": "assistant", "content": "No."}], "p": 0.9}])
    out2 = tmp_path / "conv.jsonl"
    assert runner.invoke(app, ["export", str(conv_run), "--format", "trl-conversational", "-o", str(out2)]).exit_code == 0
    assert json.loads(out2.read_text()) == {"prompt": CONV, "chosen": [{"role": "assistant", "content": "Pear."}],
                                            "rejected": [{"role": "assistant", "content": "No."}], "p": 0.9}


def test_export_alpaca_eval_annotations(tmp_path):
    out = tmp_path / "annotations.json"
    r = runner.invoke(app, ["export", str(_ledger_run(tmp_path)), "--format", "alpaca_eval", "-o", str(out)])
    assert r.exit_code == 0, r.output
    # alpaca_eval: preference 1 = output_1 better, 2 = output_2 better; p(A) = 0.25 -> 1.75.
    assert json.loads(out.read_text()) == [{"instruction": "Name a fruit.", "output_1": "Rock.", "output_2": "Apple.",
                                            "preference": 1.75}]


def test_export_datasets_and_json_load_in_datasets(tmp_path):
    import datasets

    run = _label_run(tmp_path)
    assert runner.invoke(app, ["export", str(run), "--format", "datasets", "-o", str(tmp_path / "ds")]).exit_code == 0
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    assert ds.column_names == ["prompt", "chosen", "rejected", "p"] and ds.num_rows == 4
    assert ds[0] == {"prompt": "Name a fruit.", "chosen": "Apple.", "rejected": "A rock.", "p": 0.8}
    assert runner.invoke(app, ["export", str(run), "--format", "trl", "-o", str(tmp_path / "t.jsonl")]).exit_code == 0
    js = datasets.load_dataset("json", data_files=str(tmp_path / "t.jsonl"), split="train")
    assert js["p"] == [0.8, 0.6, 1.0, 0.9]
    # the datasets folder is itself a pair source for the data layer
    from pofe.data.preferences import load_pairs

    assert [q.p for q in load_pairs(str(tmp_path / "ds"))] == [0.8, 0.6, 1.0, 0.9]


def test_export_from_judge_verdicts_run(tmp_path):
    rows = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "q1", "response_a": "short", "response_b": "much longer answer"},
                                            {"prompt": "q2", "response_a": "a long long answer", "response_b": "tiny"}])
    r = runner.invoke(app, ["judge", str(rows), "--judge", "length", "--json", "--set", f"run.output_dir={tmp_path}",
                            "--set", "run.name=j"])
    assert r.exit_code == 0, r.output
    verdicts = [json.loads(x) for x in (tmp_path / "j" / "verdicts.jsonl").read_text().splitlines()]
    # verdicts carry the texts they judged
    assert [(v["prompt"], v["response_a"], v["response_b"], v["p"]) for v in verdicts] == [
        ("q1", "short", "much longer answer", 1.0), ("q2", "a long long answer", "tiny", 0.0)]
    out = tmp_path / "v.jsonl"
    assert runner.invoke(app, ["export", str(tmp_path / "j"), "--format", "trl", "-o", str(out)]).exit_code == 0
    assert [json.loads(x) for x in out.read_text().splitlines()] == [
        {"prompt": "q1", "chosen": "short", "rejected": "much longer answer", "p": 1.0},
        {"prompt": "q2", "chosen": "tiny", "rejected": "a long long answer", "p": 1.0}]
    # run files are world-readable (mkstemp's 0600 is not kept)
    for f in ("config.yaml", "summary.json"):
        assert stat.S_IMODE((tmp_path / "j" / f).stat().st_mode) == 0o644, f


def _trained_ledger(tmp_path: Path) -> Path:
    """An online ledger as a real run writes it: every judged pair with its status, 2 trained."""
    def ann(i, p, status):
        return {"kind": "annotation", "pair_id": f"s1-r0-{i}", "step": 1, "prompt": f"q{i}", "response_a": f"a{i}",
                "response_b": f"b{i}", "p": p, "status": status, "selected": status != "ranking"}

    run = tmp_path / "online-run"
    _jsonl(run / "ledger.jsonl", [ann(0, 0.9, "trained"), ann(1, 0.5, "ties"), ann(2, 0.55, "low_margin"),
                                  ann(3, 0.2, "trained"), ann(4, 0.8, "ranking"), ann(5, 0.5, "ties"),
                                  {"kind": "loss", "pair_id": "s1-r0-0", "step": 1, "loss": 0.6}])
    return run


def test_export_writes_the_trained_pairs_and_says_what_it_left_out(tmp_path):
    run = _trained_ledger(tmp_path)
    out = tmp_path / "trl.jsonl"
    r = runner.invoke(app, ["export", str(run), "-o", str(out)])
    assert r.exit_code == 0, r.output
    # 6 judged pairs, 2 trained on (it exported all 6, the two ties as chosen/rejected pairs)
    assert [json.loads(x) for x in out.read_text().splitlines()] == [
        {"prompt": "q0", "chosen": "a0", "rejected": "b0", "p": 0.9},
        {"prompt": "q3", "chosen": "b3", "rejected": "a3", "p": 0.8}]
    assert r.stdout == (f"exported 2 pairs from {run / 'ledger.jsonl'} as trl -> {out}; left out 5 rows (2 "
                        "not-trained:ties, 1 not-trained:low_margin, 1 not-trained:ranking, 1 other-row-kind)\n")
    # every judged pair but the ties: a tie is no preference, never a chosen/rejected pair
    r = runner.invoke(app, ["export", str(run), "-o", str(tmp_path / "all.jsonl"), "--include", "all", "--json"])
    s = json.loads(r.stdout)
    assert (s["pairs"], s["include"], s["skipped"], s["left_out"]) == (4, "all", {"tie": 2, "other-row-kind": 1}, 3)
    # alpaca_eval has its own tie: preference 1.5
    r = runner.invoke(app, ["export", str(run), "-f", "alpaca_eval", "-o", str(tmp_path / "a.json"), "--include", "all"])
    assert [a["preference"] for a in json.loads((tmp_path / "a.json").read_text())] == \
        pytest.approx([1.1, 1.5, 1.45, 1.8, 1.2, 1.5])
    # a pair file of ties only: one line naming the file and what was left out
    _jsonl(tmp_path / "ties.jsonl", [{"prompt": "q", "chosen": "x", "rejected": "y", "p": 0.5}])
    r = runner.invoke(app, ["export", str(tmp_path / "ties.jsonl"), "-o", str(tmp_path / "t.jsonl")])
    assert r.exit_code == 2
    assert r.stderr == f"error: {tmp_path / 'ties.jsonl'}: no pairs to export (left out: {{'tie': 1}})\n"

def test_export_bad_input_is_one_line_exit_2(tmp_path):
    r = runner.invoke(app, ["export", str(tmp_path / "nothing"), "--format", "trl", "-o", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "no such run folder" in r.stderr
    run = _label_run(tmp_path)
    r = runner.invoke(app, ["export", str(run), "--format", "trl", "-o", str(run / "preferences.jsonl")])
    assert r.exit_code == 2 and "is the input file" in r.stderr
    assert (run / "preferences.jsonl").stat().st_size > 0
    r = runner.invoke(app, ["export", str(run), "--format", "trel", "-o", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 2 and "format" in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = runner.invoke(app, ["export", str(run), "--format", "datasets", "-o", str(tmp_path / "full")])
    assert r.exit_code == 2 and "not an empty folder" in r.stderr


@pytest.mark.parametrize("cmd", ["judge", "eval"])
def test_output_never_overwrites_the_input(tmp_path, cmd):
    rows = _jsonl(tmp_path / "rows.jsonl", [{"prompt": "q", "response_a": "a", "response_b": "bb", "response": "r"}])
    before = rows.read_text()
    args = (["judge", str(rows), "--judge", "length", "--set", f"run.output_dir={tmp_path}"] if cmd == "judge" else
            ["eval", "--set", f"policy_a={rows}", "--set", f"policy_b={rows}", "--set", "judge.kind=length"])
    for out in (str(rows), str(tmp_path / "." / "rows.jsonl")):
        r = runner.invoke(app, [*args, "-o", out])
        assert r.exit_code == 2 and "is the input file" in r.stderr, r.output
        assert rows.read_text() == before
    r = runner.invoke(app, [*args, "-o", str(tmp_path)])
    assert r.exit_code == 2 and "is a folder" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_judge_bad_last_line_and_skip_bad_rows(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text('{"prompt": "q", "response_a": "a", "response_b": "bb"}\n{"prompt": "q2", "respo')
    r = runner.invoke(app, ["judge", str(f), "--judge", "length", "--set", f"run.output_dir={tmp_path}"])
    assert r.exit_code == 2 and "rows.jsonl:2: invalid JSON" in r.stderr
    r = runner.invoke(app, ["judge", str(f), "--judge", "length", "--skip-bad-rows", "--json",
                            "--set", f"run.output_dir={tmp_path}"])
    assert r.exit_code == 0 and json.loads(r.stdout)["n"] == 1
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "q", "response_a": "a", "response_b": "bb"}')  # one line, no newline
    r = runner.invoke(app, ["judge", str(bom), "--judge", "length", "--json", "--set", f"run.output_dir={tmp_path}"])
    assert r.exit_code == 0 and json.loads(r.stdout)["n"] == 1
    (tmp_path / "empty.jsonl").write_text("\n")
    r = runner.invoke(app, ["judge", str(tmp_path / "empty.jsonl"), "--judge", "length", "--set", f"run.output_dir={tmp_path}"])
    assert r.exit_code == 2 and "no rows to judge" in r.stderr
    for bad in ("batch_size=0", "data.limit=-1"):
        r = runner.invoke(app, ["judge", str(f), "--judge", "length", "--set", bad])
        assert r.exit_code == 2 and bad.split("=")[0] in r.stderr


def test_judge_inputs_are_the_data_section_and_batch_size_is_rows_per_call(tmp_path):
    """The CLI options land on ``data.*``; the old top-level spellings are unknown keys;
    ``batch_size`` cuts 5 rows into judge calls of 2, 2, 1 (one metrics row each)."""
    import yaml

    r = runner.invoke(app, ["judge", "rows.jsonl", "--limit", "5", "--skip-bad-rows", "--print-config"])
    assert r.exit_code == 0, r.output
    data = yaml.safe_load(r.stdout)["data"]
    assert (data["input"], data["limit"], data["skip_bad_rows"]) == ("rows.jsonl", 5, True)
    for old in ("input=x.jsonl", "prompt_field=q", "a_field=a", "b_field=b", "reference_field=r", "limit=3",
                "skip_bad_rows=true", "chunk_size=7"):
        r = runner.invoke(app, ["judge", "rows.jsonl", "--set", old, "--print-config"])
        assert r.exit_code == 2 and f"unknown key '{old.split('=')[0]}'" in r.stderr, (old, r.output)
    rows = _jsonl(tmp_path / "rows.jsonl", [{"q": f"q{i}", "x": "a" * (i + 1), "y": "bb"} for i in range(5)])
    r = runner.invoke(app, ["judge", str(rows), "--judge", "length", "--json", "--set", f"run.output_dir={tmp_path}",
                            "--set", "run.name=j", "--set", "batch_size=2", "--set", "data.prompt_field=q",
                            "--set", "data.a_field=x", "--set", "data.b_field=y"])
    assert r.exit_code == 0, r.output
    metrics = [json.loads(x) for x in (tmp_path / "j" / "metrics.jsonl").read_text().splitlines()]
    assert [m["rows"] for m in metrics if "rows" in m] == [2, 2, 1]
    verdicts = [json.loads(x) for x in (tmp_path / "j" / "verdicts.jsonl").read_text().splitlines()]
    # length judge, prefer shorter (the default): "a" beats "bb", ties at "aa", loses after
    assert [(v["prompt"], v["p"]) for v in verdicts] == [("q0", 1.0), ("q1", 0.5), ("q2", 0.0), ("q3", 0.0),
                                                        ("q4", 0.0)]


def _trl(kind: str, data: Path, out: Path) -> dict:
    """Run TRL on ``data`` in a fresh process (see _trl_consumer.py for why)."""
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(Path(__file__).with_name("_trl_consumer.py")), kind, str(data), str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_trl_dpo_trainer_trains_two_steps_on_exports(tmp_path):
    """Acceptance: TRL 1.16's DPOTrainer reads pofe's exports directly (the ``p`` column rides
    along) and trains 2 steps on a tiny model -- standard JSONL, conversational JSONL and a
    save_to_disk folder."""
    run = _label_run(tmp_path)
    _jsonl(tmp_path / "conv" / "preferences.jsonl", [
        {"prompt": CONV, "chosen": [{"role": "assistant", "content": "Pear."}],
         "rejected": [{"role": "assistant", "content": "No."}], "p": 0.9}] * 4)
    for src, fmt, out in ((run, "trl", "t.jsonl"), (tmp_path / "conv", "trl-conversational", "c.jsonl"),
                          (run, "datasets", "ds")):
        assert runner.invoke(app, ["export", str(src), "--format", fmt, "-o", str(tmp_path / out)]).exit_code == 0
        res = _trl("dpo", tmp_path / out, tmp_path / f"trl-{fmt}")
        assert res["global_step"] == 2 and "p" in res["columns"]
        # identical policy and reference at step 0: the DPO loss is log 2
        assert len(res["losses"]) == 2 and res["losses"][0] == pytest.approx(0.6931, abs=1e-3)


@pytest.mark.slow
def test_trl_reward_trainer_trains_two_steps_on_a_datasets_export(tmp_path):
    assert runner.invoke(app, ["export", str(_label_run(tmp_path)), "--format", "datasets",
                               "-o", str(tmp_path / "ds")]).exit_code == 0
    res = _trl("reward", tmp_path / "ds", tmp_path / "rm")
    assert res["global_step"] == 2 and len(res["losses"]) == 2
