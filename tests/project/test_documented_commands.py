"""Every ``pofe`` command line in the README and docs/ resolves its config: the options, the
``--config`` example file and each ``--set KEY=VALUE`` are accepted (``--print-config``, so no
model loads). A renamed key or option breaks the documented command, and this test names the
file and line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pofe.cli.main import app

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GENERATED = {"config.md", "reliability-probes.md"}  # generated tables, not commands to run
# Commands without a config to print: their documented lines are run by their own tests.
NO_CONFIG = {"annotate", "report", "cache", "sim", "export", "chat", "reproduce", "--help", "--version"}


def _command_lines() -> list[tuple[str, list[str]]]:
    out = []
    for page in PAGES:
        if page.name in GENERATED:
            continue
        text = page.read_text(encoding="utf-8")
        lines = text.splitlines()
        i, fence = 0, False
        while i < len(lines):
            start = i
            line = lines[i].strip()
            if line.startswith("```"):  # only lines inside code blocks are commands
                fence = not fence
                i += 1
                continue
            if not fence:
                i += 1
                continue
            while line.endswith("\\") and i + 1 < len(lines):  # a continued shell line
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            m = re.match(r"^(?:torchrun .*?-m pofe\.cli\.main|pofe) (.*)$", line)
            if not m:
                continue
            try:
                argv = shlex.split(m.group(1), comments=True)
            except ValueError:
                continue
            if not argv or argv[0] in NO_CONFIG or "--resume" in argv or "--help" in argv:
                continue
            out.append((f"{page.relative_to(REPO)}:{start + 1}", argv))
    return out


LINES = _command_lines()


def test_the_docs_have_command_lines_to_check():
    assert len(LINES) >= 20, LINES  # the pattern above still finds the README's recipes


@pytest.mark.parametrize("where,argv", LINES, ids=[w for w, _ in LINES])
def test_documented_command_resolves_its_config(where, argv, monkeypatch):
    monkeypatch.chdir(REPO)  # example paths are relative to the repository root
    res = CliRunner().invoke(app, [*argv, "--print-config"])
    assert res.exit_code == 0, f"{where}: pofe {shlex.join(argv)} --print-config\n{res.output[-1500:]}"


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# the command of an example file, from its name's first word
EXAMPLE_COMMANDS = {"online": ["online"], "cai": ["cai", "revise"], "label": ["label"], "rl": ["rl"], "rm": ["rm"],
                    "self": ["self-reward"], "sft": ["sft"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_config_loads(path, monkeypatch):
    monkeypatch.chdir(REPO)
    cmd = EXAMPLE_COMMANDS[path.stem.split("-")[0]]
    res = CliRunner().invoke(app, [*cmd, "--config", str(path.relative_to(REPO)), "--print-config"])
    assert res.exit_code == 0, f"pofe {' '.join(cmd)} --config {path.name}: {res.output[-1500:]}"
