"""Every text pofe writes, pofe (and any JSON Lines reader) reads back unchanged: line
separators pofe did not write as line breaks (U+2028, U+2029, U+0085), NUL and other
control characters, lone surrogates, right-to-left marks and 20 MB fields, through each
writer -> reader pair reachable here: ``pofe judge`` verdicts -> ``pofe export`` /
preference loading (``pofe rm``'s reader); ``pofe label --pairs`` preferences -> export /
preference loading; export output -> preference loading; calibration files -> ``pofe
audit``'s reader; the shared JSON Lines / TXT / CSV readers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from _cli import error_lines, invoke
from pofe.data.calibration import CalibrationItem, load_calibration_file, write_calibration
from pofe.data.io import read_rows
from pofe.jsonl import iter_jsonl_lines, json_line, json_lines
from pofe.data.preferences import load_preferences

pytestmark = pytest.mark.faults

HOSTILE = {
    "line-separator": "one\u2028two",
    "paragraph-separator": "one\u2029two",
    "next-line": "one\x85two",
    "nul": "a\x00b",
    "controls": "\x01\x07\x08\x0b\x0c\x1b\x1c\x1d\x1e\x1f\x7f end",
    "crlf-and-cr": "a\r\nb\rc",
    "rtl-marks": "\u202eevil\u202c \u200f\u061c",
    "lone-high-surrogate": "x\ud800y",
    "lone-low-surrogate": "x\udfffy",
    "bom-and-zwsp": "\ufeffa\u200bb",
}
BIG = "0123456789\u2028" * (20 * 1024 * 1024 // 11)  # ~20 MB with a line separator every 11 chars
WRITE_SAFE = {k: v for k, v in HOSTILE.items() if "surrogate" not in k}


def _pairs(texts: dict[str, str]) -> list[dict]:
    return [{"prompt": f"Q {k} {t}", "response_a": f"short {t}", "response_b": f"a much longer answer {t} " * 3,
             "id": k} for k, t in texts.items()]


def _foreign_jsonl(path: Path, rows: list[dict]) -> Path:
    """JSON Lines as another tool writes it: non-ASCII raw (json.dumps ensure_ascii=False),
    so U+2028 / U+0085 sit raw inside strings."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- shared reader / writer

@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_json_line_round_trips_and_is_one_utf8_line(name):
    row = {"text": HOSTILE[name], HOSTILE[name]: [HOSTILE[name]]}
    line = json_line(row)
    data = line.encode("utf-8")  # never raises: a lone surrogate is escaped
    assert len(line.splitlines()) == 1 and "\n" not in line  # any line splitter sees one line
    assert json.loads(data.decode("utf-8")) == row


@pytest.mark.slow
def test_json_lines_of_a_20mb_field_read_back_equal(tmp_path):
    f = tmp_path / "big.jsonl"
    f.write_text(json_lines([{"text": BIG}, {"text": "next"}]), encoding="utf-8")
    assert [r["text"] for r in read_rows(f)] == [BIG, "next"]


def test_iter_jsonl_lines_splits_on_newline_only():
    assert list(iter_jsonl_lines('{"a": 1}\r\n{"b": "x\u2028y\x85z"}\n')) == [
        (1, '{"a": 1}'), (2, '{"b": "x\u2028y\x85z"}'), (3, "")]


@pytest.mark.parametrize("name", sorted(WRITE_SAFE))
def test_read_rows_reads_raw_separators_from_other_tools(tmp_path, name):
    rows = _pairs({name: WRITE_SAFE[name]})
    f = _foreign_jsonl(tmp_path / "in.jsonl", rows + [{"prompt": "last", "response_a": "a", "response_b": "b"}])
    assert read_rows(f) == rows + [{"prompt": "last", "response_a": "a", "response_b": "b"}]


def test_read_rows_reads_escaped_lone_surrogates(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text('{"text": "x\\ud800y"}\n{"text": "\\udfff"}\n', encoding="utf-8")
    assert read_rows(f) == [{"text": "x\ud800y"}, {"text": "\udfff"}]


def test_txt_prompts_keep_a_line_separator_inside_a_line(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("first\u2028still first\nsecond\x85still second\r\nthird\n", encoding="utf-8")
    assert [r["text"] for r in read_rows(f)] == ["first\u2028still first", "second\x85still second", "third"]


def test_csv_fields_with_hostile_text_and_a_200kib_field_read_back(tmp_path):
    texts = {**WRITE_SAFE, "long": "x" * 200_000}
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["prompt", "chosen", "rejected"])
    for k, t in texts.items():
        w.writerow([f"Q {k}", f"yes {t}", f"no {t}"])
    f = tmp_path / "prefs.csv"
    f.write_text(buf.getvalue(), encoding="utf-8", newline="")
    got = [(q.chosen, q.rejected) for q in load_preferences(f).pairs]
    assert got == [(f"yes {t}", f"no {t}") for t in texts.values()]


def test_calibration_write_then_read_keeps_every_text(tmp_path):
    items = [CalibrationItem(f"Q {t}", f"A {t}", f"B {t}", "A", "s", k) for k, t in HOSTILE.items()]
    f = tmp_path / "calib.jsonl"
    write_calibration(items, f)
    back = load_calibration_file(f)
    assert [(i.prompt, i.response_a, i.response_b, i.id) for i in back] == \
        [(i.prompt, i.response_a, i.response_b, i.id) for i in items]


# ----------------------------------------------------------------------------- CLI writers -> readers

def _ok(res):
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]


def _judge(tmp_path: Path, texts: dict[str, str]) -> Path:
    inp = tmp_path / "pairs.jsonl"
    inp.write_text(json_lines(_pairs(texts)), encoding="utf-8")
    out = tmp_path / "verdicts.jsonl"
    _ok(invoke("judge", str(inp), "--judge", "length", "-o", str(out), "--set", f"run.output_dir={tmp_path / 'runs'}"))
    return out


def _check_verdicts(out: Path, texts: dict[str, str]) -> None:
    raw = out.read_bytes().decode("utf-8")
    rows = [json.loads(x) for x in raw.split("\n") if x]
    assert [(r["id"], r["prompt"], r["response_a"], r["response_b"]) for r in rows] == \
        [(p["id"], p["prompt"], p["response_a"], p["response_b"]) for p in _pairs(texts)]
    # pofe rm / pofe online mode=offline read pair files with load_preferences
    pairs = load_preferences(out).pairs
    assert [(q.prompt, q.chosen, q.rejected) for q in pairs] == \
        [(p["prompt"], p["response_a"], p["response_b"]) for p in _pairs(texts)]


def _check_export(tmp_path: Path, pair_file: Path, texts: dict[str, str]) -> None:
    exported = tmp_path / "trl.jsonl"
    _ok(invoke("export", str(pair_file), "--format", "trl", "-o", str(exported)))
    rows = [json.loads(x) for x in exported.read_text(encoding="utf-8").splitlines()]
    want = {p["prompt"]: {p["response_a"], p["response_b"]} for p in _pairs(texts)}
    assert {r["prompt"]: {r["chosen"], r["rejected"]} for r in rows} == want
    assert len(load_preferences(exported).pairs) == len(texts)  # the export reads back too


def test_judge_verdicts_round_trip_to_export_and_preferences(tmp_path):
    out = _judge(tmp_path, WRITE_SAFE)
    _check_verdicts(out, WRITE_SAFE)
    _check_export(tmp_path, out, WRITE_SAFE)


def test_judge_verdicts_round_trip_lone_surrogates(tmp_path):
    texts = {k: v for k, v in HOSTILE.items() if "surrogate" in k}
    out = _judge(tmp_path, texts)
    _check_verdicts(out, texts)


def test_judge_verdicts_are_one_line_per_row_for_any_line_splitter(tmp_path):
    out = _judge(tmp_path, WRITE_SAFE)
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(WRITE_SAFE)


def test_label_preferences_round_trip_to_export_and_preferences(tmp_path):
    inp = tmp_path / "pairs.jsonl"
    inp.write_text(json_lines(_pairs(WRITE_SAFE)), encoding="utf-8")
    res = invoke("label", "--pairs", str(inp), "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=r",
                 "--set", "judge.kind=length", "--set", "log.progress=false", "--set", "log.tensorboard=false")
    _ok(res)
    run = tmp_path / "runs" / "r"
    prefs = load_preferences(run / "preferences.jsonl").pairs
    want = {p["prompt"]: {p["response_a"], p["response_b"]} for p in _pairs(WRITE_SAFE)}
    assert {q.prompt: {q.chosen, q.rejected} for q in prefs} == want
    labels = load_preferences(run / "labels.jsonl").pairs
    assert {q.prompt: {q.chosen, q.rejected} for q in labels} == want
    _check_export(tmp_path, run / "preferences.jsonl", WRITE_SAFE)


@pytest.mark.slow
def test_export_of_a_20mb_response_reads_back_equal(tmp_path):
    src = tmp_path / "prefs.jsonl"
    src.write_text(json_lines([{"prompt": "Q \u2028", "chosen": BIG, "rejected": "short"}]), encoding="utf-8")
    out = tmp_path / "trl.jsonl"
    _ok(invoke("export", str(src), "--format", "trl", "-o", str(out)))
    (q,) = load_preferences(out).pairs
    assert (q.prompt, q.chosen, q.rejected) == ("Q \u2028", BIG, "short")


def test_export_keeps_lone_surrogates_in_json_and_refuses_them_for_arrow(tmp_path):
    src = tmp_path / "prefs.jsonl"
    src.write_text('{"prompt": "Q\\ud800", "chosen": "a\\udfff", "rejected": "b"}\n', encoding="utf-8")
    out = tmp_path / "trl.jsonl"
    _ok(invoke("export", str(src), "--format", "trl", "-o", str(out)))
    (q,) = load_preferences(out).pairs
    assert (q.prompt, q.chosen) == ("Q\ud800", "a\udfff")
    res = invoke("export", str(src), "--format", "datasets", "-o", str(tmp_path / "ds"))
    assert res.returncode == 2
    (line,) = error_lines(res)
    assert line.startswith("error: ") and "surrogate" in line and "--format trl" in line
