"""One key per concept across every command's config, the shared sections as the same classes,
one option name per concept on the command line, and ``docs/config.md`` generated from the classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pofe.config_docs import COMMANDS, TRAINING_COMMANDS, config_class, keys, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"

# section key -> the one class every command uses for it (a subclass where a command needs more fields)
SHARED = {
    "checkpoint": ("pofe.recipe", "CheckpointConfig"),
    "labels": ("pofe.labels", "LabelPolicy"),
    "log": ("pofe.runtime.tracking", "LogConfig"),
    "run": ("pofe.runs", "RunConfig"),
    "optim": ("pofe.runtime", "OptimConfig"),
    "model": ("pofe.runtime", "DeviceConfig"),
}
# Top-level spellings of a concept whose key lives in a shared section (the left side is refused
# at the top level of every command; the right side is where it is).
MOVED = {"prompts": "data.prompts", "max_prompts": "data.max_prompts", "pairs": "data.pairs",
         "eval_prompts": "eval.num_prompts", "eval_samples": "eval.samples", "evaluation": "eval",
         "filter": "labels", "calibration": "labels.calibration", "batch_size": "train.batch_size",
         "helpful_data": "data.helpful", "eval_every": "eval.every", "steps": "train.steps"}
# Inside a section, the spellings of one concept that must not come back.
SYNONYMS = {"eval_every": "eval.every", "resumed_from_step": "resumed_from"}


def _cls(mod: str, name: str):
    import importlib

    return getattr(importlib.import_module(mod), name)


def test_docs_config_md_is_generated_from_the_classes_and_current():
    assert DOC.exists(), "docs/config.md is missing: python -m pofe.config_docs > docs/config.md"
    assert DOC.read_text(encoding="utf-8") == render(), \
        "docs/config.md is out of date: python -m pofe.config_docs > docs/config.md"


def test_the_docs_list_every_key_of_every_command():
    text = render()
    for command in COMMANDS:
        assert f"## pofe {command}\n" in text
        for key, *_ in keys(config_class(command)):
            assert f"| `{key}` |" in text


@pytest.mark.parametrize("command", list(COMMANDS))
def test_shared_sections_are_the_same_class_in_every_command(command):
    fields = config_class(command).model_fields
    for key, (mod, name) in SHARED.items():
        if key in fields:
            want = _cls(mod, name)
            got = fields[key].annotation
            got = next((a for a in getattr(got, "__args__", (got,)) if a is not type(None)), got)
            assert isinstance(got, type) and issubclass(got, want), f"pofe {command}: {key} is {got}, not {want.__name__}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_one_key_per_concept(command):
    cls = config_class(command)
    top = set(cls.model_fields)
    # batch_size / steps are the driver's loop shape (train.*) in the training commands; a command that
    # does not train names its rows per judge call ``batch_size`` at the top level
    rule = MOVED if command in TRAINING_COMMANDS else {k: v for k, v in MOVED.items() if k not in ("batch_size", "steps")}
    moved = {k: rule[k] for k in top & set(rule)}
    assert not moved, f"pofe {command}: top-level keys that live in a shared section everywhere else: {moved}"
    nested = {k.rsplit(".", 1)[-1]: k for k, *_ in keys(cls)}
    syn = {nested[k]: SYNONYMS[k] for k in nested.keys() & set(SYNONYMS)}
    assert not syn, f"pofe {command}: {syn}"


def test_training_commands_share_the_driver_sections():
    for command in TRAINING_COMMANDS:
        fields = config_class(command).model_fields
        missing = {"model", "checkpoint", "log", "run", "seed"} - set(fields)
        assert not missing, f"pofe {command} lacks {missing}"
        if "data" in fields:
            data = fields["data"].annotation
            assert not ({"prompt", "prompt_source", "source"} & set(data.model_fields)), command


def _options():
    """(command path, option names) of every command on the real CLI."""
    import typer
    from typer import _click as click  # typer vendors click

    from pofe.cli.main import app

    group = typer.main.get_command(app)
    ctx = click.Context(group)
    out = []

    def walk(cmd, path):
        if hasattr(cmd, "list_commands"):  # a group (typer's TyperGroup on its vendored click)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), (*path, name))
        else:
            out.append((" ".join(path), {o for p in cmd.params for o in getattr(p, "opts", [])}))

    walk(group, ())
    return out


def test_one_option_name_per_concept_on_the_command_line():
    opts = _options()
    assert len(opts) >= 15
    for path, names in opts:
        assert "--out" not in names, f"pofe {path}: --out (every command names its output --output / -o)"
        assert "--kind" not in names, f"pofe {path}: --kind (the judge kind is --judge in every command)"
    judge_kind = {path for path, names in opts if "--judge" in names}
    assert {"judge", "audit", "eval", "online"} <= judge_kind
