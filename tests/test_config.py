"""Typed configs: unknown keys, wrong types and missing files are errors naming key and file."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app
from pofe.config import ConfigError, PofeConfig, dump_config, load_config, parse_override


class Inner(PofeConfig):
    template: str = "helpful"
    batch: int = 4


class Outer(PofeConfig):
    lr: float = 1e-6
    judge: Inner = Inner()


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.001\njudge:\n  batch: 8\n")
    cfg = load_config(Outer, f, ["judge.template=helpful-short"])
    assert cfg.lr == 0.001 and cfg.judge.batch == 8 and cfg.judge.template == "helpful-short"


def test_unknown_key_names_dotted_path_and_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("judge:\n  tempalte: x\n")
    with pytest.raises(ConfigError) as e:
        load_config(Outer, f)
    assert "judge.tempalte" in str(e.value) and str(f) in str(e.value)
    assert "\n" not in str(e.value)


def test_wrong_type_names_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("judge:\n  batch: many\n")
    with pytest.raises(ConfigError, match=r"judge\.batch"):
        load_config(Outer, f)


def test_bad_override_names_the_set_flag():
    with pytest.raises(ConfigError, match=r"--set judge.batch=x: bad value for 'judge.batch'"):
        load_config(Outer, None, ["judge.batch=x"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("judge.batch")


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Outer, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1,\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(Outer, bad)


def test_dump_roundtrip(tmp_path):
    cfg = load_config(Outer, None, ["lr=0.5"])
    f = tmp_path / "out.yaml"
    f.write_text(dump_config(cfg))
    assert load_config(Outer, f) == cfg


runner = CliRunner()


def test_cli_exit_2_unknown_key(tmp_path):
    f = tmp_path / "chat.yaml"
    f.write_text("sampling:\n  max_new_tokenz: 3\n")
    res = runner.invoke(app, ["chat", "hi", "--config", str(f)])
    assert res.exit_code == 2
    assert "sampling.max_new_tokenz" in res.output and str(f) in res.output


def test_cli_print_config():
    res = runner.invoke(app, ["chat", "hi", "--set", "sampling.max_new_tokens=7", "--print-config"])
    assert res.exit_code == 0, res.output
    assert "max_new_tokens: 7" in res.output


def test_real_entry_point_exit_status(tmp_path):
    """The installed console entry point (not just the test runner) exits 2 with one line."""
    f = tmp_path / "c.yaml"
    f.write_text("nonsense_key: 1\n")
    r = subprocess.run([sys.executable, "-m", "pofe", "chat", "hi", "--config", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "nonsense_key" in err[0] and str(f) in err[0]


class Opt(PofeConfig):
    lr: float = 5e-7
    warmup_steps: int = 150


class WithCustomDefault(PofeConfig):
    optim: Opt = Opt(lr=1e-5, warmup_steps=0)


def test_partial_override_keeps_customised_section_defaults(tmp_path):
    cfg = load_config(WithCustomDefault, None, ["optim.lr=0.001"])
    assert cfg.optim.lr == 0.001 and cfg.optim.warmup_steps == 0  # not the class default 150
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 0.002\n")
    assert load_config(WithCustomDefault, f).optim.warmup_steps == 0
