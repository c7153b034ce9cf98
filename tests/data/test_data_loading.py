"""Prompt and preference loading: formats, errors that name file/line/field, cursors."""

from __future__ import annotations

import gzip
import json

import pytest

from pofe.data.preferences import load_preferences
from pofe.data.prompts import (
    DEFAULT_PROMPTS,
    DataError,
    PromptCursor,
    load_prompts,
    split_heldout,
)


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_prompts_jsonl_fields_messages_and_hh(tmp_path):
    p = _write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "a?", "id": 7},
        {"instruction": "b!"},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "c?"}]},
        {"chosen": "\n\nHuman: d?\n\nAssistant: yes", "rejected": "\n\nHuman: d?\n\nAssistant: no"},
        json.dumps("e"),
    ])
    got = load_prompts(p)
    assert [x.text for x in got] == ["a?", "b!", "System: s\n\nHuman: c?", "d?", "e"]
    assert got[0].id == "7"
    assert got[2].messages[0]["role"] == "system"


def test_prompts_txt_gz_and_field(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert [x.text for x in load_prompts(tmp_path / "p.txt")] == ["one", "two"]
    with gzip.open(tmp_path / "p.jsonl.gz", "wt") as f:
        f.write(json.dumps({"q": "x", "prompt": "ignored"}) + "\n")
    assert [x.text for x in load_prompts(tmp_path / "p.jsonl.gz", field="q")] == ["x"]


def test_prompts_csv_through_datasets(tmp_path):
    (tmp_path / "p.csv").write_text("prompt,other\nhello,1\nworld,2\n")
    assert [x.text for x in load_prompts(tmp_path / "p.csv")] == ["hello", "world"]


def test_prompt_errors_name_file_line_and_field(tmp_path):
    p = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"nope": 1}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: no prompt field.*nope"):
        load_prompts(p)
    p2 = _write_jsonl(tmp_path / "bad2.jsonl", [{"prompt": "ok"}, "{not json"])
    with pytest.raises(DataError, match=r"bad2.jsonl:2: invalid JSON"):
        load_prompts(p2)
    with pytest.raises(DataError, match=r"missing field 'q'"):
        load_prompts(_write_jsonl(tmp_path / "f.jsonl", [{"prompt": "x"}]), field="q")
    with pytest.raises(DataError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_default_prompts_and_heldout_split():
    prompts = load_prompts(None)
    assert len(prompts) == len(DEFAULT_PROMPTS) >= 64
    train, held = split_heldout(prompts, 16, seed=0)
    assert len(held) == 16 and len(train) == len(prompts) - 16
    assert not {p.text for p in held} & {p.text for p in train}
    assert split_heldout(prompts, 16, seed=0) == (train, held)  # deterministic


def test_prompt_cursor_is_deterministic_and_resumable():
    items = list(range(5))
    a = PromptCursor(items, seed=3)
    first = a.take(7)
    assert sorted(first[:5]) == items  # one epoch = a permutation
    b = PromptCursor(items, seed=3, position=4)
    assert b.take(3) == first[4:7]


def test_preferences_formats_and_skips(tmp_path):
    p = _write_jsonl(tmp_path / "prefs.jsonl", [
        {"prompt": "x", "chosen": "good", "rejected": "bad"},
        {"prompt": "x", "chosen": "good", "rejected": "bad", "p": 0.7},
        {"chosen": [{"role": "user", "content": "y"}, {"role": "assistant", "content": "c"}],
         "rejected": [{"role": "user", "content": "y"}, {"role": "assistant", "content": "r"}]},
        {"chosen": "\n\nHuman: z\n\nAssistant: long", "rejected": "\n\nHuman: z\n\nAssistant: short"},
        {"prompt": "x", "chosen": "same", "rejected": "same"},
        # a pofe ledger: annotation rows (one unlabelled), loss rows ignored
        {"kind": "annotation", "prompt": "q", "response_a": "A", "response_b": "B", "p": 0.25, "judge_id": "j", "step": 1},
        {"kind": "annotation", "prompt": "q", "response_a": "A", "response_b": "B", "p": None},
        {"kind": "loss", "pair_id": "s1", "loss": 0.69},
    ])
    data = load_preferences(p)
    got = [(x.prompt, x.chosen, x.rejected, x.p) for x in data.pairs]
    assert got == [("x", "good", "bad", 1.0), ("x", "good", "bad", 0.7), ("y", "c", "r", 1.0),
                   ("z", "long", "short", 1.0), ("q", "A", "B", 0.25)]
    assert data.pairs[-1].provenance["judge_id"] == "j"
    assert data.skipped == {"identical": 1, "unlabelled": 1, "other-row-kind": 1}


def test_preference_errors(tmp_path):
    with pytest.raises(DataError, match=r"p.jsonl:1: missing field 'rejected'"):
        load_preferences(_write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x", "chosen": "c"}]))
    with pytest.raises(DataError, match=r"'p' must be in \[0, 1\]"):
        load_preferences(_write_jsonl(tmp_path / "q.jsonl", [{"prompt": "x", "chosen": "c", "rejected": "r", "p": 2}]))
    with pytest.raises(DataError, match="no usable preference pairs"):
        load_preferences(_write_jsonl(tmp_path / "r.jsonl", [{"prompt": "x", "chosen": "c", "rejected": "c"}]))
