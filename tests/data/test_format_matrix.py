"""Format x command matrix: every input format through the loading function each command
uses (not the whole command), asserting what was loaded -- every turn and the system message
kept, soft p kept, nothing stringified -- plus the bad-input cases (a typo'd field, a torn row, a wrong type).

The fixtures are small made-up rows written in each format; the shared-data adapters are
read from ../shared/data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pofe.data.io import read_located, read_rows
from pofe.errors import DataError

SYS = {"role": "system", "content": "Answer in one word."}
U1 = {"role": "user", "content": "Name a fruit."}
A1 = {"role": "assistant", "content": "Apple."}
U2 = {"role": "user", "content": "Another one?"}
CONV = [SYS, U1, A1, U2]  # a prompt: system message, two user turns, one assistant turn
CONV_TEXT = "System: Answer in one word.\n\nHuman: Name a fruit.\n\nAssistant: Apple.\n\nHuman: Another one?"
HH_HEAD = "\n\nHuman: Name a fruit.\n\nAssistant: Apple.\n\nHuman: Another one?"
HH_TEXT = "Human: Name a fruit.\n\nAssistant: Apple.\n\nHuman: Another one?"


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _no_repr(texts):
    """No command may ever turn a message list into its Python repr."""
    for t in texts:
        assert "{'role'" not in t and '{"role"' not in t, t


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _saved(path: Path, rows: list[dict]) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


# ============================================================================ prompts

# format -> (writer(tmp) -> source, expected [(text, messages or None)])
def _prompt_formats():
    plain = [("Name a fruit.", None), ("Say hi.", None)]
    conv = [(CONV_TEXT, tuple(CONV))]
    hh = [(HH_TEXT, tuple(m for m in CONV if m["role"] != "system"))]
    return {
        "jsonl": (lambda t: _jsonl(t / "p.jsonl", [{"prompt": "Name a fruit."}, {"prompt": "Say hi."}]), plain),
        "jsonl-bom-gz": (lambda t: _gz_bom(t / "p.jsonl.gz", [{"prompt": "Name a fruit."}, {"prompt": "Say hi."}]), plain),
        "json-list": (lambda t: _write(t / "p.json", json.dumps([{"prompt": "Name a fruit."}, {"prompt": "Say hi."}])), plain),
        "txt": (lambda t: _write(t / "p.txt", "Name a fruit.\n\nSay hi.\n"), plain),
        "csv": (lambda t: _write(t / "p.csv", "prompt,category\nName a fruit.,food\nSay hi.,chat\n"), plain),
        "parquet": (lambda t: _parquet(t / "p.parquet", [{"prompt": "Name a fruit."}, {"prompt": "Say hi."}]), plain),
        "save_to_disk": (lambda t: _saved(t / "ds", [{"prompt": "Name a fruit."}, {"prompt": "Say hi."}]), plain),
        "arrow": (lambda t: next(_saved(t / "ds", [{"prompt": "Name a fruit."}, {"prompt": "Say hi."}]).glob("*.arrow")),
                  plain),
        "trl-conversational": (lambda t: _jsonl(t / "c.jsonl", [{"prompt": CONV}]), conv),
        "messages": (lambda t: _jsonl(t / "m.jsonl", [{"messages": CONV + [{"role": "assistant", "content": "Pear."}]}]), conv),
        "hh-rlhf": (lambda t: _jsonl(t / "hh.jsonl", [{"chosen": HH_HEAD + "\n\nAssistant: Pear.",
                                                        "rejected": HH_HEAD + "\n\nAssistant: No."}]), hh),
        "trl-implicit-pref": (lambda t: _jsonl(t / "i.jsonl", [{"chosen": CONV + [{"role": "assistant", "content": "Pear."}],
                                                                 "rejected": CONV + [{"role": "assistant", "content": "No."}]}]), conv),
        "fastchat-turns": (lambda t: _jsonl(t / "question.jsonl", [{"question_id": 81, "category": "writing",
                                                                     "turns": ["Name a fruit.", "Now a vegetable."]}]),
                           [("Name a fruit.", None)]),
        "alpaca_eval-outputs": (lambda t: _write(t / "out.json", json.dumps([{"instruction": "Name a fruit.", "output": "Apple.",
                                                                               "generator": "m", "dataset": "x"}])),
                                [("Name a fruit.", None)]),
        "alpaca-instruction-input": (lambda t: _jsonl(t / "a.jsonl", [{"instruction": "Name a fruit.", "input": "Red.",
                                                                        "output": "Apple."}]),
                                     [("Name a fruit.\n\nRed.", None)]),
    }


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _gz_bom(path: Path, rows: list) -> Path:
    with gzip.open(path, "wb") as f:
        f.write(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    return path


def _online(src):
    from pofe.loops.online import OnlineConfig, load_data

    train, _ = load_data(OnlineConfig.model_validate({"data": {"prompts": str(src)}, "eval": {"enabled": False}}))
    return [(p.text, p.messages) for p in train]


def _self_reward(src):
    from pofe.loops.self_reward import SelfRewardConfig, load_inputs

    cfg = SelfRewardConfig.model_validate({"eval": {"prompts": str(src), "num_prompts": 100},
                                           "selection": {"enabled": False}})
    return [(t, None) for t in load_inputs(cfg).eval_prompts]


def _text_loader(src):  # label, rl and cai revise load prompts with this function
    from pofe.data.prompts import load_prompt_texts

    return [(t, None) for t in load_prompt_texts(str(src))]


def _eval(src):
    from pofe.evaluation.eval import load_prompts

    return [(t, None) for t in load_prompts(str(src))]


PROMPT_COMMANDS = {"online": _online, "self-reward": _self_reward, "label/rl/cai-revise": _text_loader, "eval": _eval}
KEEPS_MESSAGES = {"online"}  # the others take one prompt string: the transcript, every turn in it


@pytest.mark.parametrize("fmt", list(_prompt_formats()))
@pytest.mark.parametrize("command", list(PROMPT_COMMANDS))
def test_prompt_formats_through_every_command(tmp_path, fmt, command):
    make, expected = _prompt_formats()[fmt]
    got = PROMPT_COMMANDS[command](make(tmp_path))
    if command in KEEPS_MESSAGES:
        assert got == expected
    else:
        assert [t for t, _ in got] == [t for t, _ in expected]
    _no_repr(t for t, _ in got)


def test_conversation_keeps_system_and_every_turn_for_generation(tmp_path, tokenizer):
    """online renders the kept messages with the chat template: the system message and the
    earlier turns reach the policy."""
    from pofe.data.chat import model_input
    from pofe.data.prompts import load_prompts
    from pofe.models import apply_chat_template

    [p] = load_prompts(_jsonl(tmp_path / "c.jsonl", [{"prompt": CONV}]))
    rendered = apply_chat_template(tokenizer, model_input(p))
    for m in CONV:
        assert m["content"] in rendered
    assert rendered.index("Answer in one word.") < rendered.index("Name a fruit.") < rendered.index("Another one?")


@pytest.mark.parametrize("name,n,first", [("advbench", 520, None), ("xstest:safe", 250, None),
                                          ("xstest:unsafe", 200, None), ("mt-bench", 80, None),
                                          ("self-instruct", 175, None), ("koala", 180, None)])
def test_shared_adapters_in_every_prompt_command(shared_data, name, n, first):
    for command in ("online", "label/rl/cai-revise", "eval"):
        got = PROMPT_COMMANDS[command](name)
        assert len(got) == n, (command, name)
        _no_repr(t for t, _ in got)


def test_hh_rlhf_adapter_prompts_are_dialogues(shared_data):
    from pofe.data.prompts import load_prompts

    ps = load_prompts("hh-rlhf:harmless", limit=50)
    assert len(ps) == 50 and all(p.messages[-1]["role"] == "user" for p in ps if p.messages)
    multi = [p for p in ps if p.messages and len(p.messages) > 1]
    assert multi and all(p.text.startswith("Human: ") for p in multi)


def test_csv_header_is_not_a_prompt_in_eval(tmp_path):
    from pofe.evaluation.eval import load_prompts

    assert load_prompts(_write(tmp_path / "p.csv", "prompt\nfirst\nsecond\n")) == ["first", "second"]


# ============================================================================ preference pairs

def _pair_formats():
    std = [("Name a fruit.", "Apple.", "Rock.", 1.0, None)]
    soft = [("Name a fruit.", "Apple.", "Rock.", 0.7, None)]
    conv = [(CONV_TEXT, "Pear.", "No.", 1.0, tuple(CONV))]
    std_rows = [{"prompt": "Name a fruit.", "chosen": "Apple.", "rejected": "Rock.", "p": 0.7}]
    return {
        "standard": (lambda t: _jsonl(t / "s.jsonl", [{"prompt": "Name a fruit.", "chosen": "Apple.", "rejected": "Rock."}]), std),
        "standard-soft-p": (lambda t: _jsonl(t / "s.jsonl", std_rows), soft),
        "csv": (lambda t: _write(t / "s.csv", "prompt,chosen,rejected,p\nName a fruit.,Apple.,Rock.,0.7\n"), soft),
        "parquet": (lambda t: _parquet(t / "s.parquet", std_rows), soft),
        "save_to_disk": (lambda t: _saved(t / "ds", std_rows), soft),
        "conversational-explicit": (lambda t: _jsonl(t / "c.jsonl", [{"prompt": CONV,
                                                                       "chosen": [{"role": "assistant", "content": "Pear."}],
                                                                       "rejected": [{"role": "assistant", "content": "No."}]}]), conv),
        "conversational-implicit": (lambda t: _jsonl(t / "c.jsonl", [{"chosen": CONV + [{"role": "assistant", "content": "Pear."}],
                                                                       "rejected": CONV + [{"role": "assistant", "content": "No."}]}]), conv),
        "hh-rlhf": (lambda t: _jsonl(t / "hh.jsonl", [{"chosen": HH_HEAD + "\n\nAssistant: Pear.",
                                                        "rejected": HH_HEAD + "\n\nAssistant: No."}]),
                    [(HH_TEXT, "Pear.", "No.", 1.0, tuple(m for m in CONV if m["role"] != "system"))]),
        "online-ledger": (lambda t: _jsonl(t / "ledger.jsonl", [
            {"kind": "annotation", "pair_id": "s1-0", "step": 1, "prompt": "Name a fruit.", "response_a": "Apple.",
             "response_b": "Rock.", "p": 0.7, "judge_id": "length"},
            {"kind": "annotation", "pair_id": "s1-1", "step": 1, "prompt": "x", "response_a": "a", "response_b": "b", "p": None},
            {"kind": "loss", "pair_id": "s1-0", "step": 1, "loss": 0.6}]), soft),
        "judge-verdicts": (lambda t: _jsonl(t / "verdicts.jsonl", [
            {"index": 0, "prompt": "Name a fruit.", "response_a": "Apple.", "response_b": "Rock.", "p": 0.7, "p_ab": 0.8,
             "p_ba": 0.6, "consistent": True, "parse_ok": True, "judge_id": "length"}]), soft),
        "label-preferences": (lambda t: _jsonl(t / "preferences.jsonl", [
            {"prompt": "Name a fruit.", "chosen": "Apple.", "rejected": "Rock.", "p": 0.7,
             "provenance": {"source": "pofe-label"}, "messages": None}]), soft),
    }


def _rm(src):
    from pofe.data.preferences import load_pairs  # what loops/rm.py calls

    return [(q.prompt, q.chosen, q.rejected, q.p, q.messages) for q in load_pairs(str(src))]


def _online_offline(src):
    from pofe.loops.online import OnlineConfig, load_data

    pairs, _ = load_data(OnlineConfig.model_validate({"mode": "offline", "data": {"preferences": str(src)},
                                                      "eval": {"enabled": False}}))
    return [(q.prompt, q.chosen, q.rejected, q.p, q.messages) for q in pairs]


def _export(src):
    from pofe.data.export import export_rows, find_pair_file
    from pofe.data.preferences import load_preferences

    rows = export_rows(load_preferences(find_pair_file(src)).pairs, "trl-conversational")
    out = []
    for r in rows:
        msgs = tuple(r["prompt"])
        out.append((CONV_TEXT if msgs == tuple(CONV) else HH_TEXT if len(msgs) > 1 else msgs[0]["content"],
                    r["chosen"][0]["content"], r["rejected"][0]["content"], r["p"],
                    msgs if len(msgs) > 1 else None))
    return out


def _label_pairs(src):
    from pofe.loops.label import read_pairs

    return [(x, a, b, None, None) for x, a, b in read_pairs(str(src))]


def _ranked(src):  # self-reward's EFT builder reads human-ranked pairs with this
    from pofe.data.eft import load_ranked

    groups, _ = load_ranked(str(src))
    return [(g.prompt, g.responses[0], g.responses[1], None, None) for g in groups]


PAIR_COMMANDS = {"rm": _rm, "online-offline": _online_offline, "export": _export, "label --pairs": _label_pairs,
                 "self-reward eft": _ranked}


@pytest.mark.parametrize("fmt", list(_pair_formats()))
@pytest.mark.parametrize("command", list(PAIR_COMMANDS))
def test_pair_formats_through_every_command(tmp_path, fmt, command):
    make, expected = _pair_formats()[fmt]
    got = PAIR_COMMANDS[command](make(tmp_path))
    if command in ("label --pairs", "self-reward eft"):  # text triples: no p, no messages
        expected = [(x, a, b, None, None) for x, a, b, _, _ in expected]
        if command == "label --pairs" and fmt == "online-ledger":
            expected.append(("x", "a", "b", None, None))  # an unlabelled ledger pair is worth (re)labelling
    assert got == expected
    _no_repr(x for x, *_ in got)


# ============================================================================ calibration (audit)

def _audit(src):
    from pofe.data.calibration import load_calibration

    return load_calibration([src])


@pytest.mark.parametrize("fmt", ["standard", "csv", "parquet", "save_to_disk", "conversational-explicit",
                                 "conversational-implicit", "hh-rlhf"])
def test_pair_formats_in_audit(tmp_path, fmt):
    """Preference pairs are calibration pairs (the human label is chosen > rejected); a
    standard row is never mistaken for an HH transcript ("calibration set is empty")."""
    make, [(prompt, chosen, rejected, p, _)] = _pair_formats()[fmt]
    [it] = _audit(make(tmp_path))
    assert it.prompt == prompt and {it.response_a, it.response_b} == {chosen, rejected}
    assert it.label == ("A" if it.response_a == chosen else "B") if p > 0.5 else it.label == "tie"


def test_audit_calibration_forms_and_named_source(tmp_path, shared_data):
    cal = _jsonl(tmp_path / "cal.jsonl", [{"prompt": [SYS, U1], "response_a": "a", "response_b": "b", "label": "B"}])
    [it] = _audit(cal)
    assert it.prompt == "System: Answer in one word.\n\nHuman: Name a fruit." and it.label == "B"
    natural = _audit("llmbar:Natural")
    assert len(natural) == 100 and {i.label for i in natural} == {"A", "B"}


def test_audit_refuses_a_judge_ledger_as_human_labels(tmp_path):
    make, _ = _pair_formats()["online-ledger"]
    with pytest.raises(DataError, match="unknown calibration format"):
        _audit(make(tmp_path))


# ============================================================================ SFT examples

def _sft_formats():
    plain = [("Name a fruit.", "Apple.")]
    conv = [(tuple(CONV), "Pear.")]
    return {
        "prompt-completion": (lambda t: _jsonl(t / "s.jsonl", [{"prompt": "Name a fruit.", "completion": "Apple."}]), plain),
        "prompt-response-csv": (lambda t: _write(t / "s.csv", "prompt,response\nName a fruit.,Apple.\n"), plain),
        "parquet": (lambda t: _parquet(t / "s.parquet", [{"prompt": "Name a fruit.", "response": "Apple."}]), plain),
        "save_to_disk": (lambda t: _saved(t / "ds", [{"prompt": "Name a fruit.", "completion": "Apple."}]), plain),
        "messages": (lambda t: _jsonl(t / "m.jsonl", [{"messages": CONV + [{"role": "assistant", "content": "Pear."}]}]), conv),
        "conversational-prompt-completion": (lambda t: _jsonl(t / "c.jsonl", [
            {"prompt": CONV, "completion": [{"role": "assistant", "content": "Pear."}]}]), conv),
        "alpaca": (lambda t: _jsonl(t / "a.jsonl", [{"instruction": "Name a fruit.", "input": "", "output": "Apple."}]), plain),
        "self-instruct": (lambda t: _jsonl(t / "si.jsonl", [{"instruction": "Name a fruit.",
                                                            "instances": [{"input": "", "output": "Apple."}]}]), plain),
        "hh-rlhf": (lambda t: _jsonl(t / "hh.jsonl", [{"chosen": HH_HEAD + "\n\nAssistant: Pear.",
                                                        "rejected": HH_HEAD + "\n\nAssistant: No."}]),
                    [(tuple(m for m in CONV if m["role"] != "system"), "Pear.")]),
        "standard-preference": (lambda t: _jsonl(t / "p.jsonl", [{"prompt": "Name a fruit.", "chosen": "Apple.",
                                                                   "rejected": "Rock."}]), plain),
        "conversational-preference": (lambda t: _jsonl(t / "c.jsonl", [
            {"prompt": CONV, "chosen": [{"role": "assistant", "content": "Pear."}],
             "rejected": [{"role": "assistant", "content": "No."}]}]), conv),
    }


def _sft(src):
    from pofe.data.sft import load_sft_data
    from pofe.loops.sft import SFTDataConfig

    ex, _ = load_sft_data(SFTDataConfig(ift=[str(src)]))
    return [(e.prompt, e.response) for e in ex]


def _cai_helpful(src):  # cai revise's helpful_data and self-reward's seed_sft use the same function
    from pofe.data.sft import load_examples

    return [(e.prompt, e.response) for e in load_examples(str(src))]


@pytest.mark.parametrize("fmt", list(_sft_formats()))
@pytest.mark.parametrize("loader", [_sft, _cai_helpful])
def test_sft_formats(tmp_path, fmt, loader):
    make, expected = _sft_formats()[fmt]
    assert loader(make(tmp_path)) == expected


# ============================================================================ pofe judge input

def test_judge_reads_formats_and_keeps_conversations_as_transcripts(tmp_path):
    from pofe.loops.judge import JudgeCommandConfig, load_rows

    rows = [{"prompt": CONV, "response_a": "Pear.", "response_b": "No.", "id": "r1"}]
    for src in (_jsonl(tmp_path / "j.jsonl", rows), _saved(tmp_path / "ds", rows)):
        got = load_rows(JudgeCommandConfig(data={"input": str(src)}), pointwise=False)
        assert got == [{"prompt": CONV_TEXT, "response_a": "Pear.", "response_b": "No.", "reference": None, "id": "r1"}]
    pq = _parquet(tmp_path / "j.parquet", [{"prompt": "x", "response_a": "a", "response_b": "b"}])
    assert load_rows(JudgeCommandConfig(data={"input": str(pq)}), pointwise=False)[0]["response_b"] == "b"
    with pytest.raises(DataError, match=r"j2.jsonl:2: missing field\(s\) \['response_b'\]"):
        j2 = _jsonl(tmp_path / "j2.jsonl", [rows[0], {"prompt": "x", "response_a": "a"}])
        load_rows(JudgeCommandConfig(data={"input": str(j2)}), pointwise=False)


# ============================================================================ bad input, every loader

def _loaders():
    from pofe.loops.judge import JudgeCommandConfig, load_rows
    from pofe.data.calibration import load_calibration
    from pofe.data.preferences import load_preferences
    from pofe.data.prompts import load_prompts
    from pofe.data.sft import load_examples
    from pofe.evaluation.eval import load_responses
    from pofe.loops.label import read_pairs

    return {
        "prompts": lambda s: load_prompts(s), "preferences": lambda s: load_preferences(s),
        "calibration": lambda s: load_calibration([s]), "sft": lambda s: load_examples(s),
        "eval-responses": lambda s: load_responses(s), "label-pairs": lambda s: read_pairs(s),
        "judge": lambda s: load_rows(JudgeCommandConfig(data={"input": s}), pointwise=False),
    }


GOOD = {"prompt": "x", "chosen": "a", "rejected": "b", "response": "r", "response_a": "a", "response_b": "b",
        "label": "A", "completion": "c"}


@pytest.mark.parametrize("loader", ["prompts", "preferences", "calibration", "sft", "eval-responses", "label-pairs", "judge"])
def test_malformed_last_line_is_a_located_error_everywhere(tmp_path, loader):
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n" + '{"prompt": "torn', encoding="utf-8")
    with pytest.raises(DataError, match=r"in.jsonl:3: invalid JSON"):
        _loaders()[loader](str(f))


@pytest.mark.parametrize("loader", ["prompts", "preferences", "calibration", "sft", "judge"])
def test_scalar_rows_are_located_errors(tmp_path, loader):
    f = _write(tmp_path / "in.jsonl", json.dumps(GOOD) + "\n42\n")
    with pytest.raises(DataError, match=r"in.jsonl:2: expected a JSON object \(or a string\), got int"):
        _loaders()[loader](str(f))


def test_skip_bad_rows_counts_and_reports(tmp_path, caplog):
    from pofe.data.prompts import load_prompts

    f = _write(tmp_path / "in.jsonl", '{"prompt": "a"}\n{bad\n7\n{"nope": 1}\n{"prompt": "b"}\n{"prompt": "c')
    with caplog.at_level("WARNING"):
        got = load_prompts(f, skip_bad_rows=True)
    assert [p.text for p in got] == ["a", "b"]
    assert "skipped 4 bad row(s)" in caplog.text and "in.jsonl:2: invalid JSON" in caplog.text
    rows = read_located(f, skip_bad_rows=True)
    assert len(rows) == 3 and len(rows.bad) == 3  # the field-level bad row is the mapping's to count


def test_bom_one_line_file_is_read(tmp_path):
    f = tmp_path / "one.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "x", "response_a": "a", "response_b": "b"}).encode() + b"\n")
    assert read_rows(f) == [{"prompt": "x", "response_a": "a", "response_b": "b"}]
    c = tmp_path / "one.csv"
    c.write_bytes(b"\xef\xbb\xbfprompt\nhello\n")
    assert read_rows(c) == [{"prompt": "hello"}]


def test_errors_name_the_file_row_and_field(tmp_path):
    from pofe.data.preferences import load_preferences
    from pofe.data.prompts import load_prompts

    with pytest.raises(DataError, match=r"c.jsonl:1: 'prompt' message 1 must be \{role"):
        load_prompts(_jsonl(tmp_path / "c.jsonl", [{"prompt": [SYS, {"role": "user"}]}]))
    with pytest.raises(DataError, match=r"p.parquet row 0: missing field 'rejected'"):
        load_preferences(_parquet(tmp_path / "p.parquet", [{"prompt": "x", "chosen": "a"}]))
    with pytest.raises(DataError, match=r"s.csv:3: 2 columns expected"):
        read_rows(_write(tmp_path / "s.csv", "prompt,p\na,1\nb,2,extra\n"))
    with pytest.raises(DataError, match=r"x.parquet: not UTF-8|x.parquet: not a readable parquet"):
        read_rows(_write(tmp_path / "x.parquet", "not parquet"))
    with pytest.raises(DataError, match="file not found: .*missing.jsonl"):
        read_rows(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="xstest takes ':safe' or ':unsafe'"):
        read_rows("xstest:maybe")


def test_uncached_hub_id_fails_in_one_line_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match=r"nobody/nothing:train: .*HF_HUB_OFFLINE is set") as e:
        read_rows("nobody/nothing:train")
    assert "\n" not in str(e.value)


def test_uncached_hub_id_with_unreachable_hub_is_one_line_not_retries(monkeypatch):
    import pofe.data.io as dio

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(dio, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataError, match=r"nobody/nothing:cfg:test: .*not in the local cache and the Hub is unreachable"):
        read_rows("nobody/nothing:cfg:test")
    with pytest.raises(DataError, match="a Hub id is name\\[:config\\]:split"):
        read_rows("a/b:c:d:e")


def test_online_offline_trains_on_the_whole_conversation(tmp_path, tokenizer):
    """mode=offline tokenises a conversational pair's prompt from its messages (system message
    and earlier turns through the chat template), not from a flattened string."""
    from pofe.data.preferences import load_pairs
    from pofe.loops.online import tokenize_pair
    from pofe.models import apply_chat_template

    make, _ = _pair_formats()["conversational-explicit"]
    [q] = load_pairs(make(tmp_path))
    tp = tokenize_pair(tokenizer, q, tokenizer.eos_token_id, {}, "soft")
    want = tokenizer(apply_chat_template(tokenizer, CONV), add_special_tokens=False)["input_ids"]
    assert list(tp.prompt_ids) == want
    assert "Answer in one word." in tokenizer.decode(tp.prompt_ids)


@pytest.mark.parametrize("fmt", ["alpaca_eval-json", "parquet", "save_to_disk"])
def test_eval_reads_response_tables(tmp_path, fmt):
    """``pofe eval`` compares two response tables (alpaca_eval outputs among them) read by the
    data layer, matched on the prompt."""
    from pofe.evaluation.eval import EvalConfig, collect_responses

    a = [{"instruction": "Name a fruit.", "output": "Apple.", "generator": "m1"},
         {"instruction": "Say hi.", "output": "Hello.", "generator": "m1"}]
    b = [{"instruction": "Say hi.", "output": "Hi there, friend.", "generator": "m2"},
         {"instruction": "Name a fruit.", "output": "A ripe pear.", "generator": "m2"}]
    write = {"alpaca_eval-json": lambda p, rows: _write(p.with_suffix(".json"), json.dumps(rows)),
             "parquet": lambda p, rows: _parquet(p.with_suffix(".parquet"), rows),
             "save_to_disk": lambda p, rows: _saved(p, rows)}[fmt]
    fa, fb = write(tmp_path / "a", a), write(tmp_path / "b", b)
    prompts, (ra, rb) = collect_responses(EvalConfig(policy_a=str(fa), policy_b=str(fb)))
    assert prompts == ["Name a fruit.", "Say hi."]
    assert ra == ["Apple.", "Hello."] and rb == ["A ripe pear.", "Hi there, friend."]
