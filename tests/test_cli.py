"""CLI smoke tests: --help lists only working commands, --version, chat on a tiny local model."""

import json

import typer
from typer.testing import CliRunner

from pofe import __version__
from pofe.cli.main import COMMAND_MODULES, app

runner = CliRunner()


def test_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and __version__ in res.output


def _registered_names():
    import importlib.util

    return {n.replace("_", "-") for n in COMMAND_MODULES if importlib.util.find_spec(f"pofe.cli.{n}") is not None}


def test_help_lists_registered_commands_only():
    """A command is listed exactly when its module exists (pofe --help lists only commands
    that exist), and each listed module really registers that command."""
    present = _registered_names()
    assert {"online", "sft", "chat", "cai"} <= present
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for name in present:
        assert name in res.output
    group = typer.main.get_command(app)
    for name in present:
        cmd = group.get_command(None, name)
        assert cmd is not None and cmd.name == name


def test_every_command_has_help():
    names = _registered_names()
    assert "chat" in names
    for name in names:
        res = runner.invoke(app, [name.replace("_", "-"), "--help"])
        assert res.exit_code == 0, (name, res.output)


def test_chat_on_tiny_local_model(tiny_model_dir):
    res = runner.invoke(app, ["chat", "Hello", "--model", str(tiny_model_dir), "--set", "sampling.max_new_tokens=4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["responses"][0]["prompt"] == "Hello"
    assert out["responses"][0]["tokens"] <= 4
