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


@pytest.mark.slow
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


# ----------------------------------------------------------------------------- ranges and finiteness

@pytest.mark.parametrize("text", ["lr=.nan", "lr=.inf", "lr=-.inf", "lr=nan", "lr=inf"])
def test_nan_and_inf_floats_are_refused_naming_the_key(text):
    """A NaN passes every ``<= 0`` guard (all comparisons are False), so it must never parse."""
    with pytest.raises(ConfigError, match=r"'lr'"):
        load_config(Outer, None, [text])


def test_nan_in_yaml_names_key_and_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("judge:\n  template: x\nlr: .nan\n")
    with pytest.raises(ConfigError) as e:
        load_config(Outer, f)
    assert "'lr'" in str(e.value) and str(f) in str(e.value)


def test_typed_range_helpers():
    from pofe.config import NonNegativeInt, PositiveFloat, PositiveInt, Probability

    class C(PofeConfig):
        n: PositiveInt = 1
        k: NonNegativeInt = 0
        beta: PositiveFloat = 0.1
        p: Probability = 0.5

    assert load_config(C, None, ["n=3", "k=0", "beta=2", "p=1"]).p == 1
    for bad, key in [("n=0", "n"), ("k=-1", "k"), ("beta=0", "beta"), ("beta=-0.1", "beta"), ("p=1.01", "p"),
                     ("p=-0.01", "p")]:
        with pytest.raises(ConfigError, match=rf"'{key}'.*greater|'{key}'.*less"):
            load_config(C, None, [bad])


@pytest.mark.parametrize("override,key", [
    ("optim.lr=0", "optim.lr"), ("optim.lr=-1e-5", "optim.lr"), ("optim.warmup_steps=-1", "optim.warmup_steps"),
    ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio"), ("optim.grad_clip=0", "optim.grad_clip"),
    ("optim.weight_decay=-0.1", "optim.weight_decay"), ("model.lora.r=0", "model.lora.r"),
    ("model.lora.alpha=0", "model.lora.alpha"), ("model.lora.dropout=1", "model.lora.dropout"),
    ("model.device=gpu", "model.device"), ("run.name=../..", "run.name"), ("run.name=a/b", "run.name"),
    ("run.name=..", "run.name"),
])
def test_shared_sections_validate_ranges_naming_the_key(override, key):
    from pofe.runs import RunConfig
    from pofe.runtime import ModelConfig, OptimConfig

    class Cfg(PofeConfig):
        model: ModelConfig = ModelConfig()
        optim: OptimConfig = OptimConfig()
        run: RunConfig = RunConfig()

    with pytest.raises(ConfigError) as e:
        load_config(Cfg, None, [override])
    assert f"'{key}'" in str(e.value) and f"--set {override}" in str(e.value)


def test_betas_and_adapter_conflict_are_refused():
    from pofe.runtime import ModelConfig, OptimConfig

    with pytest.raises(ConfigError, match="betas"):
        load_config(OptimConfig, None, ["betas=[0.9, 1.0]"])
    with pytest.raises(ConfigError, match="model.adapter"):
        load_config(ModelConfig, None, ["adapter=/x/adapter", "lora.enabled=true"])


def test_print_config_shows_field_docstrings_and_loads_back(tmp_path):
    from pofe.runtime import ModelConfig, OptimConfig

    class Cfg(PofeConfig):
        model: ModelConfig = ModelConfig()
        optim: OptimConfig = OptimConfig(lr=1e-4)
        """The optimiser."""

    cfg = load_config(Cfg, None, ["model.lora.r=4"])
    text = dump_config(cfg, comments=True)
    assert "# Peak learning rate (> 0)." in text and "# The optimiser." in text
    assert "  # auto = CUDA when present, then MPS, else CPU.\n  device: auto\n" in text
    f = tmp_path / "printed.yaml"
    f.write_text(text)
    assert load_config(Cfg, f) == cfg


def test_cli_print_config_has_comments():
    res = runner.invoke(app, ["chat", "hi", "--print-config"])
    assert res.exit_code == 0, res.output
    assert "\n# " in "\n" + res.output or "\n  # " in res.output


def test_a_section_check_is_one_short_line_without_the_section_dumped():
    """A check over a whole section (a model validator) fails with its own message, without
    pydantic's "Value error, " prefix and without every value of the section after it."""
    from pofe.generation.base import SamplingConfig

    class Cfg(PofeConfig):
        sampling: SamplingConfig = SamplingConfig()

    with pytest.raises(ConfigError) as e:
        load_config(Cfg, None, ["sampling.sync_check.enabled=true"])
    msg = str(e.value)
    assert msg == ("--set sampling.sync_check.enabled=true: bad value for 'sampling': sync_check is only used with "
                   "engines vllm and vllm-server (hf samples from the trained tensors themselves)")
