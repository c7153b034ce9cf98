"""CLI smoke tests: --help lists only working commands, --version, chat on a tiny local model."""

import json
from pathlib import Path

import pytest
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


@pytest.mark.slow
def test_chat_on_tiny_local_model(tiny_model_dir):
    res = runner.invoke(app, ["chat", "Hello", "--model", str(tiny_model_dir), "--set", "sampling.max_new_tokens=4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["responses"][0]["prompt"] == "Hello"
    assert out["responses"][0]["tokens"] <= 4


def _fresh_modules(*argv: str) -> set[str]:
    """Modules imported by ``pofe <argv>`` in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys\nsys.argv = ['pofe', *sys.argv[1:]]\nimport pofe.cli.main as m\n"
            "try:\n    m.main()\nexcept SystemExit:\n    pass\nprint('\\n'.join(sorted(sys.modules)), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    return set(r.stderr.split())


@pytest.mark.slow
def test_version_and_help_start_without_torch_or_transformers():
    """``pofe --version`` / ``--help`` import neither torch nor transformers (counted modules,
    not seconds: 1680 modules incl. torch, scipy, transformers' deps on main)."""
    for argv in (["--version"], ["--help"]):
        mods = _fresh_modules(*argv)
        assert "pofe.cli.main" in mods
        heavy = {m for m in mods if m.split(".")[0] in ("torch", "transformers", "scipy", "numpy", "peft", "accelerate")}
        assert heavy == set(), (argv, sorted(heavy)[:5])
        assert len(mods) < 500, (argv, len(mods))


@pytest.mark.slow
def test_multi_process_launch_of_a_single_process_command_exits_2_without_run_folders(tmp_path, tiny_model_dir):
    """A 2-process ``torchrun`` of ``pofe cai refusal`` (one process answering every prompt:
    it neither shards its prompts nor gathers) would answer everything twice: the processes exit
    2 with one line, before any model loads, and nothing is written."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "pofe", "cai", "refusal", "--model", str(tiny_model_dir), "--set", "data.max_prompts=1"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode != 0
    refusals = [ln for ln in r.stderr.splitlines() if ln.startswith("error: pofe cai refusal does not run data-parallel")]
    # torchrun stops the other process once one fails, so it may not get to print its line
    assert 1 <= len(refusals) <= 2 and "WORLD_SIZE=2" in refusals[0], r.stderr[-3000:]
    assert "exitcode: 2" in r.stderr and not [ln for ln in r.stderr.splitlines()
                                             if ln.startswith("error:") and ln not in refusals]
    assert list(tmp_path.iterdir()) == []


def test_world_size_refusal_in_process(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = runner.invoke(app, ["chat", "hi"])
    assert res.exit_code == 2 and "pofe chat does not run data-parallel" in res.stderr


def test_the_cli_data_parallel_set_is_the_recipes_own_flag():
    """The CLI refuses WORLD_SIZE > 1 before parsing a config for every command outside
    DATA_PARALLEL_COMMANDS; the driver decides from ``Recipe.data_parallel``. The two agree.
    ``eval`` and ``audit`` run outside the driver: their run functions take their processes
    from ``launched`` (tests/invariants/test_data_parallel_labelling.py runs both on 2)."""
    import importlib
    import inspect

    from pofe.cli.main import DATA_PARALLEL_COMMANDS
    from pofe.recipe import Recipe

    cli_path = {"cai-revise": "cai revise"}  # a recipe's command name -> the words that run it
    flagged = set()
    for module in ("online", "sft", "rm", "rl", "self_reward", "label", "cai_revise", "judge"):
        mod = importlib.import_module(f"pofe.loops.{module}")
        recipes = [c for _, c in inspect.getmembers(mod, inspect.isclass)
                   if issubclass(c, Recipe) and c is not Recipe and c.__module__ == mod.__name__]
        assert recipes, module
        flagged |= {cli_path.get(c.command, c.command) for c in recipes if c.data_parallel}
    outside = {"eval": "pofe/evaluation/eval.py", "audit": "pofe/evaluation/audit/run.py"}
    for name, path in outside.items():
        assert "launched(" in (Path(__file__).parents[2] / path).read_text(), path
    assert flagged | set(outside) == DATA_PARALLEL_COMMANDS
    assert {"online", "sft", "rm", "rl", "self-reward", "label", "cai revise", "judge"} <= flagged


@pytest.mark.parametrize("argv", [["label"], ["judge"], ["eval"], ["audit"], ["cai", "revise"], ["sft"],
                                  ["self-reward"]])
def test_world_size_2_lets_the_data_parallel_commands_through(monkeypatch, argv):
    """Under WORLD_SIZE=2 a data-parallel command reaches its config (printed here, nothing runs)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = runner.invoke(app, [*argv, "--print-config"])
    assert res.exit_code == 0 and "does not run data-parallel" not in res.stderr, res.stderr
    assert "run:" in res.stdout or "judge:" in res.stdout


@pytest.mark.parametrize("argv, name", [(["cai", "refusal"], "cai refusal"), (["chat", "hi"], "chat")])
def test_world_size_2_refuses_the_other_commands_by_their_words(monkeypatch, argv, name):
    """A group's subcommand is judged by its own words: ``cai revise`` runs data-parallel,
    ``cai refusal`` (one process answering every prompt) is refused and named."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = runner.invoke(app, [*argv, "--print-config"])
    assert res.exit_code == 2 and f"error: pofe {name} does not run data-parallel" in res.stderr, res.stderr


def test_the_driver_refuses_world_size_2_for_a_single_process_recipe(tmp_path, monkeypatch, tiny_model_dir):
    """A library caller under torchrun gets the same refusal from the driver, before any folder."""
    from pofe.config import load_config
    from pofe.loops.sft import SFTConfig
    from pofe.recipe import Recipe, drive
    from pofe.runtime.guards import MultiProcessRefused

    class Solo(Recipe):  # a recipe that neither shards its data nor all-reduces
        command = "solo"

    ift = tmp_path / "ift.jsonl"
    ift.write_text('{"prompt": "q?", "response": "a."}\n')
    cfg = load_config(SFTConfig, None, [f"model.name={tiny_model_dir}", f"data.ift=[{ift}]",
                                        f"run.output_dir={tmp_path / 'runs'}", "train.steps=1"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(MultiProcessRefused, match="pofe solo does not run data-parallel"):
        drive(Solo(cfg))
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_unknown_command_suggests_and_exits_2():
    res = runner.invoke(app, ["onlne"])
    assert res.exit_code == 2 and "Did you mean 'online'" in res.output
