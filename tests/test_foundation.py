"""Models, records, run folders, generation."""

import json

import pytest

from pofe.generation import SamplingConfig, generate
from pofe.models import DEFAULT_MODEL, apply_chat_template, embedded_gguf_path, load_model
from pofe.records import PreferencePair
from pofe.runs import JsonlWriter, RunConfig, new_run_dir, read_jsonl, write_config


def test_embedded_gguf_is_shipped():
    p = embedded_gguf_path(DEFAULT_MODEL)
    assert p.suffix == ".gguf" and p.stat().st_size > 50_000_000


def test_unknown_embedded_name():
    with pytest.raises(ValueError, match="not an embedded model"):
        embedded_gguf_path("gpt-7")


def test_load_local_dir_and_chat_template(tiny_model_dir):
    model, tok = load_model(str(tiny_model_dir))
    assert model.config.num_hidden_layers == 2
    assert tok.pad_token is not None
    text = apply_chat_template(tok, "hi")
    assert "hi" in text and text != "hi"  # SmolLM2's template wraps the message


def test_missing_local_model_is_clear(tmp_path):
    with pytest.raises(Exception) as e:
        load_model(str(tmp_path / "nope"))
    assert "nope" in str(e.value)


def test_generate_keeps_ids_and_is_seeded(tiny_model, tokenizer):
    s = SamplingConfig(max_new_tokens=5, temperature=1.0)
    a = generate(tiny_model, tokenizer, ["one", "two three"], n=2, sampling=s, seed=3)
    b = generate(tiny_model, tokenizer, ["one", "two three"], n=2, sampling=s, seed=3)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert len(a) == 2 and all(len(g) == 2 for g in a)
    c = a[1][0]
    assert c.prompt == "two three" and 1 <= c.num_tokens <= 5 and c.prompt_token_ids
    assert tokenizer.decode(c.prompt_token_ids).count("two three") == 1


def test_preference_pair_validates_and_roundtrips():
    p = PreferencePair("x", "a", "b", p=0.7, provenance={"judge": "length"})
    assert PreferencePair.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError):
        PreferencePair("x", "a", "b", p=1.2)


def test_run_dirs_never_collide(tmp_path):
    cfg = RunConfig(output_dir=str(tmp_path), name="r")
    d1 = new_run_dir(cfg, "online")
    write_config(d1, cfg)
    d2 = new_run_dir(cfg, "online")
    assert d1 != d2 and d2.name == "r-2"
    assert (d1 / "config.yaml").read_text().startswith("output_dir")


def test_jsonl_writer_and_torn_last_line(tmp_path):
    f = tmp_path / "m.jsonl"
    with JsonlWriter(f) as w:
        w.write({"step": 1, "loss": float("nan")})
        w.write({"step": 2})
    with open(f, "a") as fh:
        fh.write('{"step": 3, "lo')  # a crash mid-write
    rows = read_jsonl(f)
    assert rows == [{"step": 1, "loss": None}, {"step": 2}]


def test_greedy_with_several_samples_repeats_the_greedy_answer(tiny_model, tokenizer):
    s = SamplingConfig(max_new_tokens=4, temperature=0.0)
    out = generate(tiny_model, tokenizer, ["a", "b c"], n=3, sampling=s)
    for g in out:
        assert len(g) == 3 and len({c.token_ids for c in g}) == 1
