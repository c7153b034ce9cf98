"""``docs/CONTRIBUTING.md``'s touch-lists, followed to the letter.

For each of "Adding a judge backend", "Adding a DAP loss" and "Adding a command", the test
copies ``pofe/``, ``docs/`` and ``tests/`` into a temporary folder, makes the documented edits
there for a toy example (a backend that always answers ``Score: 3``, a squared-hinge loss, a
command ``pofe toy`` that counts to 3 on the driver), runs the copy's own tests of what it
touched (the layout and config-key checks included) and the real CLI from the copy in a
subprocess, and then compares the files it created and edited with the touch-list parsed from
the page: a step the page leaves out, or one it lists that the addition does not need, fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "CONTRIBUTING.md"
NAME, CAMEL = "toy", "Toy"  # what the page's <name> / <Name> stand for here
SECTIONS = ("Adding a judge backend", "Adding a DAP loss", "Adding a command")


# ----------------------------------------------------------------------------- the page

def touch_list(section: str) -> dict[str, str]:
    """path -> "+" (create) or "~" (edit), from the ```touch-list block of ``## <section>``."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    assert m, f"docs/CONTRIBUTING.md has no section '## {section}'"
    blocks = re.findall(r"^```touch-list\n(.*?)^```", m.group(1), re.DOTALL | re.MULTILINE)
    assert len(blocks) == 1, f"'## {section}': expected one ```touch-list block, found {len(blocks)}"
    out: dict[str, str] = {}
    for line in blocks[0].splitlines():
        if not line.strip():
            continue
        op, path, *note = line.split()
        assert op in ("+", "~") and note, f"'## {section}': bad touch-list line {line!r} (want '+ path note' or '~ path note')"
        path = path.replace("<name>", NAME).replace("<Name>", CAMEL)
        assert path not in out, f"'## {section}': {path} listed twice"
        out[path] = op
    return out


def test_every_touch_list_names_files_that_exist_or_are_new():
    for section in SECTIONS:
        for path, op in touch_list(section).items():
            # "~" edits a file the repository has; "+" creates one it has not
            assert (REPO / path).is_file() == (op == "~"), f"'## {section}': {op} {path}"


# ----------------------------------------------------------------------------- the copy

def _files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (bytecode and caches left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and "__pycache__" not in rel.parts and ".pytest_cache" not in rel.parts:
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


class Tree:
    """A copy of the repository's sources, and the files changed in it since it was made."""

    def __init__(self, root: Path):
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
        for folder in ("pofe", "docs", "tests"):
            shutil.copytree(REPO / folder, root / folder, ignore=ignore, symlinks=True)
        shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")  # the pytest settings
        self.root = root
        # the baseline is the copy itself: other work in the checkout cannot change it under us
        self.before = _files(root)
        self.config_md = (root / "docs" / "config.md").read_text(encoding="utf-8")

    def create(self, rel: str, text: str) -> None:
        path = self.root / rel
        assert not path.exists(), f"{rel} already exists"
        path.write_text(text, encoding="utf-8")

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text(encoding="utf-8")
        assert text.count(old) == 1, (f"{rel}: the text this step of docs/CONTRIBUTING.md edits is not there once "
                                      f"({text.count(old)} times): {old!r}; update the page and this test")
        path.write_text(text.replace(old, new), encoding="utf-8")

    def touched(self) -> dict[str, str]:
        after = _files(self.root)
        out = {p: "+" for p in after.keys() - self.before.keys()}
        out |= {p: "~" for p in after.keys() & self.before.keys() if after[p] != self.before[p]}
        out |= {p: "-" for p in self.before.keys() - after.keys()}
        return out


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POFE_FAULT", "PYTHONPATH")}
    env.update({"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    return env


def _pofe(root: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    """The real CLI of the copy (``python -m pofe.cli.main``), in its own process."""
    env = _env(root)
    if fault:
        env["POFE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "pofe.cli.main", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


# docs/config.md is regenerated (the page's `python -m pofe.config_docs > docs/config.md`, whose
# __main__ prints render()) in the interpreter that then runs the copy's tests: one start-up of
# torch and every config class instead of two. Where the page says the file does not change, the
# copy's file is compared with render() instead, with object addresses masked: the judge union's
# type name shows its validators' reprs (`<function ... at 0x...>`), which differ per process.
_REGENERATE_AND_TEST = """
import re
import sys
from pathlib import Path
from pofe.config_docs import render
assert Path(sys.modules['pofe'].__file__).resolve().is_relative_to(Path.cwd().resolve()), 'pofe is not the copy'
page = Path('docs/config.md')
if sys.argv[1] == 'regenerate':
    page.write_text(render(), encoding='utf-8')
else:
    mask = lambda s: re.sub(r' at 0x[0-9a-f]+', ' at 0x?', s)
    assert mask(page.read_text(encoding='utf-8')) == mask(render()), 'docs/config.md differs from render()'
import pytest
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-x', '-m', 'slow or not slow', *sys.argv[2:]]))
"""


def _regenerate_and_test(root: Path, *tests: str, regenerate: bool = True) -> None:
    r = subprocess.run([sys.executable, "-c", _REGENERATE_AND_TEST, "regenerate" if regenerate else "check", *tests],
                       cwd=root, env=_env(root), capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"the copy's tests failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"


def _check_touched(tree: Tree, section: str) -> None:
    documented, done = touch_list(section), tree.touched()
    missing = {p: op for p, op in done.items() if documented.get(p) != op}
    extra = {p: op for p, op in documented.items() if done.get(p) != op}
    assert not missing and not extra, (
        f"docs/CONTRIBUTING.md '## {section}': files the addition changed but the touch-list does not list "
        f"(or lists with another op): {missing}; listed but not needed: {extra}")


def _config_md_rows(text: str, key: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"| `{key}` |")]


# ----------------------------------------------------------------------------- a judge backend

TOY_BACKEND = '''"""A toy judge backend: every generated continuation is ``Score: 3``; it reads no log-probabilities."""

from __future__ import annotations

from pofe.judges.base import BackendStats, GenOut, JudgeConfigError


class ToyBackend:
    """Answers every generation request with the same text (a rubric judge reads 3)."""

    kind = "toy"
    fingerprint = "toy:v1"
    cacheable = False
    special_strings: tuple[str, ...] = ()

    def __init__(self, text: str = "Score: 3"):
        self.text = text
        self.stats = BackendStats()

    @classmethod
    def from_config(cls, cfg, **runtime) -> "ToyBackend":
        return cls()  # it reads nothing from the judge config

    def validate_choices(self, choices) -> None:
        raise JudgeConfigError("judge.backend toy only generates text; it reads no choice tokens")

    def read_choices(self, requests, choices):
        raise JudgeConfigError("judge.backend toy only generates text; it reads no choice tokens")

    def generate(self, requests, *, n=1, temperature=0.0, top_p=1.0, max_new_tokens=128, seed=None):
        self.stats.add(calls=1, tokens=3 * n * len(requests))
        return [[GenOut(self.text, tokens=3) for _ in range(n)] for _ in requests]

    def close(self) -> None:
        pass
'''

TOY_BACKEND_TEST = '''"""The toy backend under the rubric judge: every sample reads 'Score: 3'."""

import pytest

from pofe.config import ConfigError
from pofe.judges import JudgeBackend, build_judge, parse_judge_config
from pofe.judges.backends import BACKENDS, ToyBackend


def test_the_rubric_judge_reads_3_from_every_sample():
    assert BACKENDS["toy"] == ToyBackend.from_config and isinstance(ToyBackend(), JudgeBackend)
    judge = build_judge(parse_judge_config({"kind": "rubric", "backend": "toy", "cache": {"enabled": False}}))
    scores = judge.score(["Colour?", "Size?"], ["Blue.", "Big."])
    assert [s.score for s in scores] == [3.0, 3.0] and [s.samples for s in scores] == [(3.0, 3.0, 3.0)] * 2


def test_settings_it_never_reads_are_refused():
    with pytest.raises(ConfigError, match="judge.batch_size"):
        parse_judge_config({"kind": "rubric", "backend": "toy", "batch_size": 4})
'''


@pytest.mark.slow  # a copy of the tree, its tests and one CLI run in subprocesses: ~20-40 s on a shared 2-core CPU
def test_adding_a_judge_backend(tmp_path):
    tree = Tree(tmp_path / "tree")
    tree.create("pofe/judges/backends/toy.py", TOY_BACKEND)
    init = "pofe/judges/backends/__init__.py"
    tree.edit(init, "(:mod:`.vllm`).\n", "(:mod:`.vllm`);\n* ``toy`` — always answers ``Score: 3`` (:mod:`.toy`).\n")
    tree.edit(init, "from pofe.judges.backends.vllm import VLLMBackend\n",
              "from pofe.judges.backends.toy import ToyBackend\nfrom pofe.judges.backends.vllm import VLLMBackend\n")
    tree.edit(init, '    "vllm": VLLMBackend.from_config,\n}', '    "vllm": VLLMBackend.from_config,\n    "toy": ToyBackend.from_config,\n}')
    config = "pofe/judges/config.py"
    # its spec row: no settings section, it loads no model in this process (the in-process keys are refused)
    tree.edit(config, '    "vllm": BackendSpec(settings="vllm", in_process=("max_length",), shares_weights=True),\n}',
              '    "vllm": BackendSpec(settings="vllm", in_process=("max_length",), shares_weights=True),\n'
              '    "toy": BackendSpec(in_process=()),\n}')
    tree.edit(config, "Where the judge model runs: transformers, llamacpp, openai, vllm, or",
              "Where the judge model runs: transformers, llamacpp, openai, vllm, toy (always 'Score: 3'), or")
    tree.edit("tests/judges/test_judge_config.py", 'assert set(BACKENDS) == {"transformers", "llamacpp", "openai", "vllm"}',
              'assert set(BACKENDS) == {"transformers", "llamacpp", "openai", "vllm", "toy"}')
    tree.create("tests/judges/test_toy_backend.py", TOY_BACKEND_TEST)

    _regenerate_and_test(tree.root, "tests/judges/test_toy_backend.py",
                         "tests/judges/test_judge_config.py::test_every_backend_implements_the_protocol",
                         "tests/plugins/test_plugins.py::test_builtin_backend_names_match_the_backends_map",
                         "tests/project/test_layout.py", regenerate=False)

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": "Colour?", "response_a": a, "response_b": b}) + "\n"
                             for a, b in [("Blue.", "Red."), ("Green.", "Grey.")]))
    r = _pofe(tree.root, "judge", str(pairs), "--judge", "rubric", "--json", "--set", "judge.backend=toy",
              "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=rubric")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "runs" / "rubric" / "verdicts.jsonl").read_text().splitlines()]
    # rubric: 3 sampled justifications per response, each parsed as 3, averaged
    assert [x["score"] for x in rows] == [3.0, 3.0] and all(x["samples"] == [3.0, 3.0, 3.0] for x in rows)
    assert {x["extra"]["backend"] for x in rows} == {"toy"}

    _check_touched(tree, "Adding a judge backend")


# ----------------------------------------------------------------------------- a DAP loss

TOY_LOSS = '''def toy(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.5,
    p: float | torch.Tensor = 1.0,
) -> LossOutput:
    """A squared hinge ``(1 - beta*h)^2`` (a toy); soft p weights the mirrored square ``(1 + beta*h)^2`` by 1 - p."""
    h, p_t, cr, rr = _prepare(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, p)
    z = beta * h
    losses = p_t * (1.0 - z) ** 2 + (1.0 - p_t) * (1.0 + z) ** 2
    return LossOutput(losses, cr, rr, cr - rr)


'''

TOY_LOSS_TEST = '''

def test_toy_squared_hinge_by_hand():
    from pofe.losses import default_beta, get_loss

    toy = get_loss("toy")
    assert default_beta("toy") == 0.5
    out = toy(PC, PR, RC, RR, beta=0.5)  # h = 1: (1 - 0.5)^2 = 0.25
    assert out.losses.item() == pytest.approx(0.25) and out.margins.item() == pytest.approx(0.5)
    soft = toy(PC, PR, RC, RR, beta=0.5, p=0.75)  # 0.75 * 0.5^2 + 0.25 * 1.5^2 = 0.1875 + 0.5625
    assert soft.losses.item() == pytest.approx(0.75)
'''


@pytest.mark.slow  # a copy of the tree, its tests and a `pofe online` run in subprocesses: ~30-50 s
def test_adding_a_dap_loss(tmp_path, tiny_model_dir):
    tree = Tree(tmp_path / "tree")
    losses = "pofe/losses.py"
    tree.edit(losses, 'LOSSES: dict[str, PreferenceLoss] = {"dpo": dpo, "ipo": ipo, "slic": slic}',
              TOY_LOSS + 'LOSSES: dict[str, PreferenceLoss] = {"dpo": dpo, "ipo": ipo, "slic": slic, "toy": toy}')
    online = "pofe/loops/online/__init__.py"
    tree.edit(online, "slic (Eq. 3), or a loss", "slic (Eq. 3), toy (a squared hinge), or a loss")
    tree.edit(online, "SLiC 0.002.", "SLiC 0.002; toy 0.5.")
    tests = "tests/core/test_losses.py"
    tree.edit(tests, 'assert {n: default_beta(n) for n in LOSSES} == {"dpo": 0.1, "ipo": 1.0, "slic": 0.002}',
              'assert {n: default_beta(n) for n in LOSSES} == {"dpo": 0.1, "ipo": 1.0, "slic": 0.002, "toy": 0.5}')
    (tree.root / tests).write_text((tree.root / tests).read_text(encoding="utf-8") + TOY_LOSS_TEST, encoding="utf-8")

    _regenerate_and_test(tree.root, "tests/core/test_losses.py",
                         "tests/project/test_config_keys.py::test_docs_config_md_is_generated_from_the_classes_and_current",
                         "tests/project/test_layout.py")
    new_md = (tree.root / "docs" / "config.md").read_text(encoding="utf-8")
    assert not any("toy" in r for r in _config_md_rows(tree.config_md, "loss.name"))
    assert any("toy" in r for r in _config_md_rows(new_md, "loss.name"))

    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": f"What is {i} plus {i}?", "chosen": f"It is {2 * i}.",
                                         "rejected": "No idea at all."}) + "\n" for i in range(4)))
    r = _pofe(tree.root, "online", "--json", *[a for s in (
        "mode=offline", f"data.preferences={prefs}", f"model.name={tiny_model_dir}", "judge.kind=length", "loss.name=toy",
        "train.steps=2", "train.batch_size=2", "optim.lr=1e-2", "optim.warmup_steps=0", "eval.enabled=false",
        "log.progress=false", "log.tensorboard=false", f"run.output_dir={tmp_path / 'runs'}", "run.name=on")
        for a in ("--set", s)])
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["loss"] == "toy" and summary["beta"] == 0.5  # loss.beta null: the toy function's own beta
    rows = [json.loads(x) for x in (tmp_path / "runs" / "on" / "metrics.jsonl").read_text().splitlines()]
    # step 1: policy = reference, h = 0, every pair's (1 - 0)^2 = 1. The reference is a separate copy of
    # the weights, and on an AMX Xeon the fp32 forward of a deep copy gave summed log-probs of ~-65 that
    # differ by 3.8e-6 (1 ulp; the same model with and without grad agreed exactly), so "equal" is up
    # to that rounding.
    assert rows[0]["loss"] == pytest.approx(1.0, abs=1e-4) and rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-4)
    # step 2: the mean of (1 - m_i)^2 over the batch is at least (1 - mean m)^2 (Jensen), and it trained
    m = rows[1]["rewards/margins"]
    assert m != pytest.approx(0.0, abs=1e-6) and rows[1]["loss"] >= (1.0 - m) ** 2 - 1e-6

    _check_touched(tree, "Adding a DAP loss")


# ----------------------------------------------------------------------------- a command

TOY_LOOP = '''"""``pofe toy``: counts to ``train.steps`` on the driver, one metrics row per step -- the smallest
command a recipe makes. The running total is the recipe's checkpoint state, so ``--resume`` of a
killed run continues the count from its checkpoint; everything around the loop is the driver's
(:mod:`pofe.recipe`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from pofe.config import PofeConfig
from pofe.recipe import CheckpointConfig, Recipe, RunContext, drive
from pofe.runs import RunConfig
from pofe.runtime.tracking import LogConfig


class ToyTrainConfig(PofeConfig):
    """The loop's length."""

    steps: int = Field(3, ge=1)
    """Steps to count."""


class ToyConfig(PofeConfig):
    """``pofe toy``."""

    train: ToyTrainConfig = ToyTrainConfig()
    """How far to count."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoints for ``--resume``."""
    log: LogConfig = LogConfig()
    """metrics.jsonl, optional TensorBoard / W&B / MLflow, progress bar."""
    seed: int = 0
    """Seeds the driver's generators (nothing here is random)."""
    run: RunConfig = RunConfig()
    """Where the run folder goes."""


class ToyRecipe(Recipe):
    """Step t adds t to the total: 1, 3, 6, ..."""

    command = "toy"
    show = (("total", "total", "{}"),)

    def setup(self, run: RunContext) -> None:
        self.total_steps = self.cfg.train.steps
        run.restore_checkpoint()
        self.total = int(run.state.get("total", 0))  # a resume's total (0 for a new run)

    def step(self, step: int) -> dict[str, Any]:
        self.total += step
        return {"count": step, "total": self.total}

    def checkpoint_state(self) -> dict[str, Any]:
        return {"total": self.total}

    def summary(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {"total": self.total}


def run(cfg: ToyConfig, *, resume: str | Path | None = None) -> dict[str, Any]:
    """Count to ``cfg.train.steps``; returns the summary (also in the run folder)."""
    return drive(ToyRecipe(cfg), resume=resume)
'''

TOY_CLI = '''"""``pofe toy``: count to N on the driver, one metrics row per step (the example command of docs/CONTRIBUTING.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, JsonOpt, PrintConfigOpt, SetOpt, TrustRunConfigOpt, emit_json, resolve_config


def register(app: typer.Typer) -> None:
    @app.command(help="Count to N, one metrics row per step (the smallest recipe on the driver).")
    def toy(
        config: Optional[Path] = ConfigOpt,
        steps: Optional[int] = typer.Option(None, "--steps", help="Steps to count (train.steps)."),
        output_dir: Optional[str] = typer.Option(None, "--output-dir", help="Parent folder of run folders (run.output_dir)."),
        name: Optional[str] = typer.Option(None, "--name", help="Run folder name (run.name)."),
        resume: Optional[Path] = typer.Option(None, "--resume", help="Continue RUN_DIR from its latest checkpoint."),
        set_: Optional[list[str]] = SetOpt,
        trust_run_config: bool = TrustRunConfigOpt,
        print_config: bool = PrintConfigOpt,
        json_out: bool = JsonOpt,
    ) -> None:
        from pofe.loops.toy import ToyConfig, run

        extra = {"train.steps": steps, "run.output_dir": output_dir, "run.name": name}
        cfg = resolve_config(ToyConfig, config, set_, extra, print_config, resume=resume, trust_run_config=trust_run_config)
        summary = run(cfg, resume=resume)
        if json_out:
            emit_json(summary)
        else:
            typer.echo(f"toy: counted to {summary['steps']}, total {summary['total']} ({summary['run_dir']})")
'''

TOY_TEST = '''"""``pofe toy``: 1 + 2 + 3 = 6, one row per step, the driver's summary."""

import json

from typer.testing import CliRunner

from pofe.cli.main import app


def test_toy_counts_to_three(tmp_path):
    r = CliRunner().invoke(app, ["toy", "--output-dir", str(tmp_path), "--name", "t", "--json",
                                 "--set", "log.progress=false", "--set", "log.tensorboard=false"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["count"], x["total"]) for x in rows] == [(1, 1, 1), (2, 2, 3), (3, 3, 6)]
    s = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert (s["command"], s["steps"], s["steps_run"], s["total"], s["final_model"]) == ("toy", 3, 3, 6, None)
'''

DRIVER_KEYS = {"command", "run_dir", "final_model", "steps", "steps_run", "resumed_from", "seconds"}


@pytest.mark.slow  # a copy of the tree, its tests and three CLI runs in subprocesses: ~30-50 s
def test_adding_a_command(tmp_path):
    tree = Tree(tmp_path / "tree")
    tree.create("pofe/loops/toy.py", TOY_LOOP)
    tree.create("pofe/cli/toy.py", TOY_CLI)
    tree.edit("pofe/cli/main.py", '"reproduce",\n]', '"reproduce", "toy",\n]')
    tree.edit("pofe/config_docs.py", '    "export": "pofe.loops.export:ExportConfig",\n}',
              '    "export": "pofe.loops.export:ExportConfig",\n    "toy": "pofe.loops.toy:ToyConfig",\n}')
    tree.edit("tests/project/test_layout.py", '"cai revise": "cai_revise"}', '"cai revise": "cai_revise", "toy": "toy"}')
    tree.create("tests/loops/test_toy.py", TOY_TEST)

    _regenerate_and_test(tree.root, "tests/loops/test_toy.py", "tests/project/test_layout.py", "tests/project/test_config_keys.py",
                         "tests/cli/test_cli.py::test_help_lists_registered_commands_only",
                         "tests/cli/test_cli.py::test_every_command_has_help")
    new_md = (tree.root / "docs" / "config.md").read_text(encoding="utf-8")
    assert "## pofe toy\n" in new_md and "## pofe toy\n" not in tree.config_md

    runs = tmp_path / "runs"
    sets = ["--set", "checkpoint.every=1", "--set", "log.progress=false", "--set", "log.tensorboard=false"]
    r = _pofe(tree.root, "toy", "--output-dir", str(runs), "--name", "whole", "--json", *sets)
    assert r.returncode == 0, r.stderr[-3000:]
    whole = [json.loads(x) for x in (runs / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert whole == [{"step": 1, "count": 1, "total": 1}, {"step": 2, "count": 2, "total": 3},
                     {"step": 3, "count": 3, "total": 6}]
    s = json.loads((runs / "whole" / "summary.json").read_text())
    assert DRIVER_KEYS <= set(s) and s == json.loads(r.stdout[r.stdout.index("{"):])
    assert (s["command"], s["steps"], s["steps_run"], s["resumed_from"], s["final_model"], s["total"]) == \
        ("toy", 3, 3, None, None, 6)

    # killed after step 2's row, before its checkpoint: --resume starts from step-1's total (1), not 0
    r = _pofe(tree.root, "toy", "--output-dir", str(runs), "--name", "killed", *sets, fault="2:after_step")
    assert r.returncode == -9, r.stderr[-3000:]
    assert len((runs / "killed" / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (runs / "killed" / "summary.json").exists()
    r = _pofe(tree.root, "toy", "--resume", str(runs / "killed"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [json.loads(x) for x in (runs / "killed" / "metrics.jsonl").read_text().splitlines()] == whole
    s = json.loads((runs / "killed" / "summary.json").read_text())
    assert (s["steps"], s["steps_run"], s["resumed_from"], s["total"]) == (3, 2, 1, 6)

    _check_touched(tree, "Adding a command")
