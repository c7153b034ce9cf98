"""Machine-readable and quiet (issue 40): ``--json`` puts the JSON alone on stdout for every
command that takes it (``pofe <cmd> --json | jq`` works; DeepSpeed's "Setting accelerator to CPU"
was the first stdout line of a real process), ``--quiet`` / ``--log-level``, and ``--help`` in
plain words: no reStructuredText, no ``<bool>`` / ``<list[str]>``, the judge kinds by name and a
``--set`` example each command accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pofe.cli.helptext import SET_EXAMPLES
from pofe.cli.main import app, present_commands
from tests._cli import pofe

WIDE = {"COLUMNS": "250", "TERMINAL_WIDTH": "250"}  # one help line per option


def run_json(*args: str) -> dict:
    """``pofe *args --json`` in-process: exit 0 and stdout is one JSON document, nothing else."""
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output[-3000:]
    return json.loads(r.stdout)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


# ----------------------------------------------------------------------------- --help

def _command_paths() -> list[str]:
    return [n.replace("_", "-") for n in present_commands()] + ["cai revise", "cai refusal", "cache stats",
                                                                "cache prune", "cache clear", "cache export"]


@pytest.mark.parametrize("path", ["", *_command_paths()])
def test_help_is_plain_words(path):
    r = CliRunner().invoke(app, [*path.split(), "--help"], env=WIDE)
    assert r.exit_code == 0, r.output
    for markup in ("``", ":mod:", ":class:", ":func:", ":data:", "<bool>", "<list[", "<str>", "<int>", "JUDGES"):
        assert markup not in r.stdout, (path, markup)
    if path in SET_EXAMPLES:
        assert f"e.g. --set {SET_EXAMPLES[path]} (repeatable" in r.stdout


@pytest.mark.parametrize("path", ["audit", "eval", "judge"])
def test_judge_option_lists_the_kinds(path):
    r = CliRunner().invoke(app, [path, "--help"], env=WIDE)
    line = next(ln for ln in r.stdout.splitlines() if "--judge " in ln)
    assert ("Judge kind (judge.kind): llm, vllm, llamacpp, openai, rubric, expected-score, length, keyword, "
            "reference-overlap, callable, reward-model, jury, or an installed plugin's.") in line


def test_flags_show_no_type_and_values_their_name():
    lines = CliRunner().invoke(app, ["export", "--help"], env=WIDE).stdout.splitlines()
    cells = {m.group(1): m.group(2) for m in (re.match(r"│ (--[a-z-]+)\s+(?:-\w\s+)?(\S*)", ln) for ln in lines) if m}
    assert (cells["--json"], cells["--print-config"]) == ("Print", "Print")  # no value column: the help starts
    assert (cells["--set"], cells["--config"], cells["--include"]) == ("TEXT", "PATH", "trained|all")


@pytest.mark.parametrize("path", SET_EXAMPLES)
def test_each_set_example_is_a_key_of_its_command(path):
    given = {"chat": ["hi"], "annotate": ["pairs.jsonl", "-a", "me", "-o", "out.jsonl"]}.get(path, [])
    key, value = SET_EXAMPLES[path].split("=")
    r = CliRunner().invoke(app, [*path.split(), *given, "--set", SET_EXAMPLES[path], "--print-config"])
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load(r.stdout)
    for part in key.split("."):
        cfg = cfg[part]
    assert str(cfg) == str(yaml.safe_load(value))


def test_log_level_must_be_a_level():
    r = CliRunner().invoke(app, ["--log-level", "loud", "sim"])
    assert r.exit_code == 2
    # rich folds the error box to the terminal's width (80 columns in CI): compare the words
    words = " ".join(r.output.replace("│", " ").split())
    assert "'loud' is not one of debug, info, warning, error" in words


# ----------------------------------------------------------------------------- --json, in-process

@pytest.mark.slow  # a command's libraries start processes (ldconfig -p)
def test_json_alone_on_stdout_small_commands(tmp_path, tiny_model_dir):
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"q{i}", "response_a": "short", "response_b": "much longer"}
                                              for i in range(2)])
    s = run_json("judge", str(pairs), "--judge", "length", *_sets(f"run.output_dir={tmp_path}", "run.name=j"))
    assert s["command"] == "judge"
    assert run_json("export", str(tmp_path / "j"), "-o", str(tmp_path / "e.jsonl"))["pairs"] == 2
    cal = _jsonl(tmp_path / "cal.jsonl", [{"prompt": f"q{i}", "response_a": "a" * (i + 1), "response_b": "bb",
                                           "label": "AB"[i % 2]} for i in range(4)])
    r = CliRunner().invoke(app, ["audit", str(cal), "--judge", "length", "--set", "contrasts=false", "--json"])
    assert r.exit_code in (0, 1) and json.loads(r.stdout)["calibration"]["n_items"] == 4  # 1: a failed check
    a = _jsonl(tmp_path / "a.jsonl", [{"prompt": f"q{i}", "response": "x" * 9} for i in range(3)])
    b = _jsonl(tmp_path / "b.jsonl", [{"prompt": f"q{i}", "response": "x" * 3} for i in range(3)])
    assert run_json("eval", str(a), str(b), "--judge", "length", *_sets("n_boot=10", "refusal=false"))["n"] == 3
    assert "judge_human_agreement" in run_json("sim", "--seed", "0")
    assert run_json("chat", "Hello", "--model", str(tiny_model_dir), *_sets("sampling.max_new_tokens=2"))
    home = tmp_path / "cache.sqlite"
    from pofe.judges.cache import JudgeCache

    JudgeCache(home).close()
    assert run_json("cache", "stats", "--path", str(home))["entries"] == 0
    assert run_json("cache", "prune", "--path", str(home), "--max-size", "1M")["deleted"] == 0
    assert run_json("cache", "export", "--path", str(home), "-o", str(tmp_path / "c.jsonl"))["entries"] == 0
    assert run_json("cache", "clear", "--path", str(home), "--yes")["deleted"] == 0


@pytest.mark.slow
def test_json_alone_on_stdout_training_commands(tmp_path, tiny_model_dir):
    common = (f"model.name={tiny_model_dir}", f"run.output_dir={tmp_path}", "log.progress=false")
    prompts = _jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "yes", "no", "ok")])
    online = run_json("online", *_sets(*common, "judge.kind=length", "train.steps=1", "train.batch_size=2",
                                       "sampling.max_new_tokens=4", "optim.warmup_steps=0", "eval.num_prompts=2",
                                       "eval.sampling.max_new_tokens=4", "log.tensorboard=false", "run.name=online"))
    assert online["command"] == "online" and online["steps"] == 1
    assert run_json("report", online["run_dir"])["run_dir"] == online["run_dir"]
    ift = _jsonl(tmp_path / "ift.jsonl", [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(2)])
    assert run_json("sft", "--ift", str(ift), *_sets(*common, "train.steps=1", "train.batch_size=2",
                                                     "train.grad_accum=1", "run.name=sft"))["command"] == "sft"
    prefs = _jsonl(tmp_path / "prefs.jsonl", [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad", "p": 0.8}
                                              for i in range(4)])
    assert run_json("rm", "--train", str(prefs), *_sets(*common, "train.batch_size=2", "train.steps=1",
                                                        "data.eval_fraction=0", "run.name=rm"))["command"] == "rm"
    assert run_json("rl", "--prompts", str(prompts), *_sets(
        *common, "train.steps=1", "train.batch_size=2", "train.group_size=2", "eval.num_prompts=0",
        "sampling.max_new_tokens=3", "reward.kind=programmatic", "run.name=rl"))["command"] == "rl"
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"q{i}", "response_a": "short", "response_b": "much longer"}
                                              for i in range(2)])
    assert run_json("label", *_sets(*common, f"data.pairs={pairs}", "judge.kind=length", "train.batch_size=2",
                                    "run.name=label"))["command"] == "label"
    words = (tmp_path / "words.txt")
    words.write_text("Say hi.\nSay yes.\n")
    assert run_json("cai", "revise", *_sets(
        *common, f"data.prompts={words}", "data.max_prompts=2", "sampling.max_new_tokens=3",
        "critique_sampling.max_new_tokens=3", "refusal.enabled=false", "train.batch_size=2", "run.name=cai"))[
        "command"] == "cai-revise"
    assert "harmful_refusal_rate" in run_json("cai", "refusal", *_sets(
        f"model.name={tiny_model_dir}", f"data.benign={words}", f"data.harmful={words}", "sampling.max_new_tokens=3"))
    sr = tmp_path / "sr.yaml"
    sr.write_text(yaml.safe_dump({
        "model": {"name": str(tiny_model_dir)}, "iterations": 1,
        "judge": {"kind": "expected-score", "template": "expected-score", "batch_size": 8},
        "data": {"prompts": str(words), "per_iteration": 2},
        "candidates": {"n": 2, "chunk": 4, "sampling": {"max_new_tokens": 3, "temperature": 1.0}},
        "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 2, "grad_accum": 1, "steps": 1},
        "selection": {"enabled": False}, "eval": {"num_prompts": 1, "rm_metrics": False, "sampling": {"max_new_tokens": 3}},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path), "name": "sr"}}))
    assert run_json("self-reward", "--config", str(sr))["run_dir"] == str(tmp_path / "sr")


@pytest.mark.slow
def test_json_stdout_of_a_real_process_and_quiet(tmp_path, tiny_model_dir):
    """A real process: DeepSpeed (imported under accelerate when installed) logs to a handler it
    bound to stdout; --quiet leaves warnings only and no progress bars on stderr."""
    r = pofe("--quiet", "online", "--json", *_sets(
        f"model.name={tiny_model_dir}", "judge.kind=length", "train.steps=1", "train.batch_size=2",
        "sampling.max_new_tokens=4", "optim.warmup_steps=0", f"run.output_dir={tmp_path}", "eval.num_prompts=2",
        "eval.sampling.max_new_tokens=4", "log.tensorboard=false"), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)  # the whole of stdout
    assert s["command"] == "online" and s["steps"] == 1
    assert "Setting accelerator" not in r.stdout
    assert not re.search(r"\d+%\|", r.stderr), r.stderr[-2000:]  # no progress bar
    assert not re.search(r"^\d\d:\d\d:\d\d INFO ", r.stderr, re.M), r.stderr[-2000:]
