"""Data and config input is never silently misread, and no reachable input is a traceback or
an "internal error": a null / boolean / 400-digit ``p``, a row with two pair shapes, a torn
quoted CSV row, an over-long CSV field, deeply nested JSON, ``true`` for a numeric setting,
duplicated YAML keys, alias bombs and ``!!python`` tags in configs, judge templates and
constitutions are each one located error (file, line, key) with exit status 2."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from _cli import error_lines, invoke
from pofe.cli.main import describe_error
from pofe.config import ConfigError, load_config, parse_override
from pofe.constitutions import load_constitution
from pofe.data.eft import load_ranked
from pofe.data.io import read_rows
from pofe.errors import DataError
from pofe.data.preferences import load_preferences
from pofe.judges.templates import load_template
from pofe.loops.online import OnlineConfig

pytestmark = pytest.mark.faults

GOOD = {"prompt": "Q?", "chosen": "a", "rejected": "bb"}
BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]) + "\n"


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _error(res, code: int = 2) -> str:
    lines = error_lines(res)
    assert res.returncode == code, (res.stdout + res.stderr)[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], lines
    return lines[0]


# ----------------------------------------------------------------------------- preference p

@pytest.mark.parametrize("raw", ["null", "true", "false"])
def test_null_or_bool_p_is_an_error_naming_file_line_and_field(tmp_path, raw):
    f = _jsonl(tmp_path / "prefs.jsonl", [GOOD, '{"prompt": "Q?", "chosen": "a", "rejected": "bb", "p": %s}' % raw])
    with pytest.raises(DataError) as e:
        load_preferences(f)
    assert f"{f}:2" in str(e.value) and "'p'" in str(e.value) and raw in str(e.value)


def test_null_p_is_a_counted_skip_under_skip_bad_rows(tmp_path):
    f = _jsonl(tmp_path / "prefs.jsonl", [GOOD, {**GOOD, "p": None}, {**GOOD, "p": True}, {**GOOD, "p": 0.25}])
    data = load_preferences(f, skip_bad_rows=True)
    assert [q.p for q in data.pairs] == [1.0, 0.25]
    assert data.skipped == {"bad-row": 2}


def test_bool_p_in_a_response_a_row_is_an_error(tmp_path):
    f = _jsonl(tmp_path / "v.jsonl", [{"prompt": "Q?", "response_a": "a", "response_b": "bb", "p": True}])
    with pytest.raises(DataError, match=r"v\.jsonl:1: 'p' must be a number, got true"):
        load_preferences(f)


@pytest.mark.parametrize("digits", [400, 5000])
def test_huge_integer_p_is_a_clear_error_on_the_cli(tmp_path, digits):
    f = _jsonl(tmp_path / "prefs.jsonl", ['{"prompt": "Q?", "chosen": "a", "rejected": "bb", "p": 1%s}' % ("0" * digits)])
    line = _error(invoke("export", str(f), "--format", "trl", "-o", str(tmp_path / "out.jsonl")))
    assert "prefs.jsonl:1" in line
    assert not (tmp_path / "out.jsonl").exists()


def test_ranks_must_be_numbers(tmp_path):
    f = _jsonl(tmp_path / "ranked.jsonl", [{"prompt": "Q?", "responses": ["a", "b"], "ranks": [True, 0]}])
    with pytest.raises(DataError, match=r"ranked\.jsonl:1: 'ranks' must be a number, got true"):
        load_ranked(f)


# ----------------------------------------------------------------------------- ambiguous rows

@pytest.mark.parametrize("extra, named", [
    ({"response_a": "x", "response_b": "y", "p": 0.9}, "'chosen/rejected' and 'response_a/response_b'"),
    ({"output_1": "x", "output_2": "y", "label": 1}, "'chosen/rejected' and 'output_1/output_2'"),
])
def test_a_row_with_two_pair_shapes_is_an_error_naming_the_row(tmp_path, extra, named):
    f = _jsonl(tmp_path / "prefs.jsonl", [GOOD, {**GOOD, **extra}])
    with pytest.raises(DataError) as e:
        load_preferences(f)
    assert str(e.value).startswith(f"{f}:2: ") and named in str(e.value)


def test_a_row_with_both_p_and_label_is_an_error(tmp_path):
    f = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Q?", "response_a": "a", "response_b": "bb", "p": 0.9, "label": "B"}])
    with pytest.raises(DataError, match=r"pairs\.jsonl:1: the row has both 'p'.* and 'label'"):
        load_preferences(f)


# ----------------------------------------------------------------------------- CSV

def test_torn_quoted_last_csv_row_is_an_error_naming_the_line(tmp_path):
    f = tmp_path / "prefs.csv"
    f.write_text('prompt,chosen,rejected\nQ1,a,bb\nQ2,a,"torn reply that never ends\nmore text\n', encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_rows(f)
    assert str(e.value).startswith(f"{f}:3: malformed CSV row") and "quoted field" in str(e.value)


def test_csv_field_over_the_limit_is_a_clear_error(tmp_path, monkeypatch):
    import pofe.data.io as dio

    monkeypatch.setattr(dio, "CSV_FIELD_LIMIT", 1024 * 1024)  # the real limit, scaled down
    f = tmp_path / "big.csv"
    f.write_text("prompt,chosen,rejected\nQ,a,b\nQ," + "x" * (1024 * 1024 + 10) + ",b\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"big\.csv:3: malformed CSV row \(a field is over the 1 MiB limit"):
        read_rows(f)


def test_csv_field_limit_is_restored_after_reading(tmp_path):
    import csv

    before = csv.field_size_limit()
    f = tmp_path / "p.csv"
    f.write_text("text\nhello\n", encoding="utf-8")
    assert read_rows(f) == [{"text": "hello"}]
    assert csv.field_size_limit() == before


# ----------------------------------------------------------------------------- JSON

@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_deeply_nested_json_is_a_located_error(tmp_path, suffix):
    deep = "[" * 200_000 + "]" * 200_000
    f = tmp_path / f"rows{suffix}"
    f.write_text(('{"text": "ok"}\n{"text": %s}\n' % deep) if suffix == ".jsonl" else "[%s]" % deep, encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_rows(f)
    assert str(e.value).startswith(f"{f}:2: " if suffix == ".jsonl" else f"{f}: ") and "nested too deeply" in str(e.value)


def test_deeply_nested_json_on_the_cli_is_one_line(tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text('{"prompt": "Q?", "response_a": "a", "response_b": %s}\n' % ("[" * 200_000 + "]" * 200_000))
    line = _error(invoke("judge", str(f), "--judge", "length", "--set", f"run.output_dir={tmp_path / 'runs'}"))
    assert "pairs.jsonl:1" in line and "nested too deeply" in line


# ----------------------------------------------------------------------------- config values

@pytest.mark.parametrize("kv, key", [("train.steps=true", "train.steps"), ("optim.lr=false", "optim.lr"),
                                     ("loss.beta=true", "loss.beta"), ("labels.min_margin=true", "labels.min_margin")])
def test_bool_for_a_numeric_setting_is_an_error_naming_the_key(kv, key):
    with pytest.raises(ConfigError) as e:
        load_config(OnlineConfig, overrides=[kv])
    assert f"bad value for '{key}'" in str(e.value) and "not a boolean" in str(e.value)


def test_bool_inside_a_numeric_list_setting_is_an_error():
    with pytest.raises(ConfigError, match=r"'judge.cot.clamp'.*not a boolean"):
        load_config(OnlineConfig, overrides=["judge.kind=llm", "judge.cot.clamp=[true, 0.9]"])


def test_bool_settings_and_numbers_still_load(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  steps: 3\neval:\n  enabled: false\noptim:\n  lr: 0.001\n", encoding="utf-8")
    c = load_config(OnlineConfig, cfg)
    assert (c.train.steps, c.eval.enabled, c.optim.lr) == (3, False, 0.001)


def test_bool_for_steps_in_a_config_file_on_the_cli(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  steps: true\n", encoding="utf-8")
    # a model that does not exist: had the setting been taken, the run fails there, never trains
    line = _error(invoke("online", "--config", str(cfg), "--set", f"run.output_dir={tmp_path / 'runs'}",
                         "--set", f"model.name={tmp_path / 'no-model'}"))
    assert "c.yaml" in line and "train.steps" in line
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- YAML

def test_duplicated_key_in_a_config_file_names_file_line_and_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  steps: 5\n  batch_size: 2\n  steps: 7\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(OnlineConfig, cfg)
    assert str(e.value) == f"{cfg}:4: invalid YAML (duplicated key 'steps' (first at line 2))"


def test_duplicated_key_on_the_cli_is_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 1\nseed: 2\n", encoding="utf-8")
    line = _error(invoke("online", "--config", str(cfg), "--set", f"run.output_dir={tmp_path / 'runs'}",
                         "--set", f"model.name={tmp_path / 'no-model'}"))
    assert "c.yaml:2" in line and "'seed'" in line


def test_duplicated_key_in_a_set_value_is_an_error():
    with pytest.raises(ConfigError, match=r"duplicated key 'a'"):
        parse_override("judge.extra={a: 1, a: 2}")
    assert parse_override("judge.prompt=[1, 2") == (["judge", "prompt"], "[1, 2")  # not YAML: the text


def test_alias_bomb_config_is_refused_quickly(tmp_path):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB, encoding="utf-8")
    assert len(BOMB) < 700
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb\.yaml:\d+: invalid YAML \(.*alias"):
        load_config(OnlineConfig, cfg)
    assert time.perf_counter() - t0 < 10


def test_recursive_alias_is_refused(tmp_path):
    cfg = tmp_path / "rec.yaml"
    cfg.write_text("a: &a [*a]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"rec\.yaml:1: invalid YAML \(a recursive alias"):
        load_config(OnlineConfig, cfg)


def _template(tmp_path: Path, body: str) -> Path:
    f = tmp_path / "t.yaml"
    f.write_text(body, encoding="utf-8")
    return f


PAIRWISE = 'prompt: "{prompt} {response_1} {response_2}"\n'


@pytest.mark.parametrize("body, needle", [
    (PAIRWISE + 'prompt: "{response_1} {response_2}"\n', "t.yaml:2: invalid YAML (duplicated key 'prompt'"),
    ("prompt: [unclosed\n", "t.yaml:2: invalid YAML"),
    ("prompt: !!python/object/apply:os.system ['true']\n", "t.yaml:1: invalid YAML (could not determine a constructor"),
    (BOMB + PAIRWISE, "alias"),
])
def test_bad_template_yaml_is_exit_2_naming_the_file(tmp_path, body, needle):
    with pytest.raises(Exception) as e:
        load_template(str(_template(tmp_path, body)))
    code, msg = describe_error(e.value)
    assert code == 2 and needle in msg and "internal error" not in msg


@pytest.mark.parametrize("body, needle", [
    ("version: 1\nprinciples:\n  - {id: a, text: t}\nversion: 2\n", "c.yaml:4: invalid YAML (duplicated key 'version'"),
    ("version: 1\nprinciples: !!python/name:os.system\n", "c.yaml:2: invalid YAML (could not determine a constructor"),
    ("version: 1\nprinciples: [\n", "c.yaml:3: invalid YAML"),
])
def test_bad_constitution_yaml_is_exit_2_naming_the_file(tmp_path, body, needle):
    f = tmp_path / "c.yaml"
    f.write_text(body, encoding="utf-8")
    with pytest.raises(Exception) as e:
        load_constitution(str(f))
    code, msg = describe_error(e.value)
    assert code == 2 and needle in msg and "internal error" not in msg


def test_shipped_templates_and_constitutions_still_load():
    from pofe.constitutions import available_constitutions
    from pofe.judges.templates import builtin_templates

    assert len([load_template(n) for n in builtin_templates()]) == len(builtin_templates()) == 9
    assert sorted(load_constitution(n).source for n in available_constitutions()) == [
        "pofe/constitutions/default.yaml", "pofe/constitutions/hhh.yaml"]
