"""A run folder is data from anyone: ``--resume`` never runs code named in its config.yaml
unless the command line says so, run files are never opened through symbolic links,
``run.json`` pins the config and inputs a run started from, files follow the umask, a
bad-input error leaves no run folder, and ``run.name`` is the text that was typed."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _cli import error_lines, invoke, pofe
from pofe.runs import RunConfig, RunError

pytestmark = pytest.mark.faults


def _pairs(path: Path, n: int = 4) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Q{i}?", "response_a": "short", "response_b": "a longer answer " * (i + 1)})
                            + "\n" for i in range(n)))
    return path


def _label(tmp_path: Path, *extra: str, name: str = "r", pairs: Path | None = None):
    pairs = pairs or _pairs(tmp_path / "pairs.jsonl")
    args = ["label", "--pairs", str(pairs), "--set", "judge.kind=length", "--set", f"run.output_dir={tmp_path / 'runs'}",
            "--set", f"run.name={name}", "--set", "log.progress=false", "--set", "log.tensorboard=false", *extra]
    return invoke(*args)


def _plant(run_dir: Path, cls, data: dict) -> Path:
    """A received run folder: a valid config.yaml (and nothing else, like a folder of an older pofe)."""
    from pofe.config import dump_config

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(cls.model_validate(data)))
    return run_dir


def _one_line(res, *needles: str) -> str:
    lines = error_lines(res)
    assert len(lines) == 1, res.stdout[-1000:] + res.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- code from the folder

def test_resume_never_runs_a_callable_judge_named_by_the_folder(tmp_path, tiny_model_dir):
    """A received folder whose config says ``judge: {kind: callable, callable: shutil:rmtree}``
    deleted the directory its prompts named on ``--resume`` (exit 0). Refused with exit 2 naming
    the key and --trust-run-config; the directory is still there."""
    from pofe.loops.online import OnlineConfig

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{victim}\n{victim}\n")
    run_dir = _plant(tmp_path / "runs" / "r", OnlineConfig, {
        "model": {"name": str(tiny_model_dir)}, "judge": {"kind": "callable", "callable": "shutil:rmtree"},
        "data": {"prompts": str(prompts)}, "train": {"steps": 1, "batch_size": 2}, "sampling": {"max_new_tokens": 2},
        "eval": {"enabled": False}, "log": {"progress": False, "tensorboard": False},
        "run": {"output_dir": str(tmp_path / "runs"), "name": "r"}})
    res = invoke("online", "--resume", str(run_dir))
    assert res.returncode == 2, res.stderr[-2000:]
    _one_line(res, "judge.callable", "shutil:rmtree", "--trust-run-config")
    assert (victim / "precious.txt").read_text() == "keep me"
    assert not (run_dir / "ledger.jsonl").exists()


_EVIL = '''
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the model folder's Python ran")
from transformers import LlamaConfig
class EvilConfig(LlamaConfig):
    model_type = "llama"
'''


@pytest.mark.slow
def test_resume_never_turns_on_trust_remote_code_from_the_folder(tmp_path, tiny_model_dir):
    """``model.trust_remote_code: true`` in a received folder's config ran the model folder's
    Python on resume. Refused (exit 2 naming model.trust_remote_code); nothing of it ran."""
    import shutil

    from pofe.loops.label import LabelConfig

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "evil.py").write_text(_EVIL)
    run_dir = _plant(tmp_path / "runs" / "r", LabelConfig, {
        "model": {"name": str(model), "trust_remote_code": True},
        "data": {"prompts": str(_pairs(tmp_path / "p.txt")), "max_prompts": 2}, "judge": {"kind": "length"},
        "sampling": {"max_new_tokens": 2},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path / "runs"), "name": "r"}})
    res = pofe("label", "--resume", str(run_dir), timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    _one_line(res, "model.trust_remote_code", "--trust-run-config")
    assert not (model / "RAN").exists()


def test_resume_refuses_an_endpoint_url_from_the_folder_unless_confirmed(tmp_path):
    """An endpoint URL in a received folder receives every prompt and the API key: refused; the
    same URL repeated with ``--set`` (or ``--trust-run-config``) is the command line's choice
    and goes ahead (here to a closed port: exit 1 naming the endpoint); a different URL is
    refused as a change of the run's config."""
    from pofe.loops.label import LabelConfig

    url = "http://127.0.0.1:9/v1"  # discard port: nothing listens
    run_dir = _plant(tmp_path / "runs" / "r", LabelConfig, {
        "data": {"pairs": str(_pairs(tmp_path / "pairs.jsonl"))},
        "judge": {"kind": "openai", "endpoint": {"base_url": url, "max_retries": 0, "identify": False}},
        "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(tmp_path / "runs"), "name": "r"}})
    res = invoke("label", "--resume", str(run_dir))
    assert res.returncode == 2
    _one_line(res, "judge.endpoint.base_url", url, "--trust-run-config", f"--set judge.endpoint.base_url={url}")
    res = invoke("label", "--resume", str(run_dir), "--set", "judge.endpoint.base_url=http://other:1/v1")
    assert res.returncode == 2
    _one_line(res, "judge.endpoint.base_url", "differs")
    for extra in (["--set", f"judge.endpoint.base_url={url}"], ["--trust-run-config"]):
        res = invoke("label", "--resume", str(run_dir), *extra)
        assert res.returncode == 1, res.stderr[-2000:]
        assert "--trust-run-config" not in res.stderr and "127.0.0.1:9" in _one_line(res)


def test_untrusted_settings_finds_every_code_running_key():
    """Nested judges (rl reward and monitor, online eval judge), backends and models: every
    callable, every trust_remote_code: true, and only the endpoint URLs that are used."""
    from pofe.loops.online import OnlineConfig
    from pofe.loops.rl import RLConfig
    from pofe.runs import untrusted_settings

    cfg = RLConfig.model_validate({
        "model": {"trust_remote_code": True},
        "reward": {"kind": "judge", "judge": {"kind": "callable", "callable": "mymod.sub:score"}},
        "monitor": {"kind": "judge", "judge": {"kind": "expected-score", "backend": "openai",
                                               "endpoint": {"base_url": "http://judge:8000/v1"}}}})
    assert untrusted_settings(cfg) == [
        ("model.trust_remote_code", True), ("reward.judge.callable", "mymod.sub:score"),
        ("monitor.judge.endpoint.base_url", "http://judge:8000/v1")]
    online = OnlineConfig.model_validate({
        "judge": {"kind": "openai", "endpoint": {"base_url": "http://a:1/v1"}},
        "eval": {"judge": {"kind": "reward-model", "reward_model": "some/rm", "trust_remote_code": True}}})
    assert untrusted_settings(online) == [("judge.endpoint.base_url", "http://a:1/v1"),
                                          ("eval.judge.trust_remote_code", True)]
    # a pointwise judge on the transformers backend never talks to its endpoint section
    quiet = {"monitor": {"kind": "judge", "judge": {"kind": "expected-score", "backend": "transformers",
                                                    "endpoint": {"base_url": "http://x:1/v1"}}}}
    assert untrusted_settings(quiet) == []


# ----------------------------------------------------------------------------- links in the folder

def _planted_online(tmp_path: Path) -> Path:
    from pofe.loops.online import OnlineConfig

    return _plant(tmp_path / "runs" / "r", OnlineConfig, {"judge": {"kind": "length"}})


def test_planted_lock_link_never_truncates_its_target(tmp_path):
    from pofe.runs import open_run

    run_dir = _planted_online(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (run_dir / ".lock").symlink_to(victim)
    with pytest.raises(RunError, match=r"\.lock: is a symbolic link"):
        open_run(RunConfig(), "online", resume=run_dir)
    assert victim.read_text() == "precious\n"


def test_planted_ledger_and_metrics_links_never_touch_their_targets(tmp_path):
    """Resume trims ledger.jsonl / metrics.jsonl and appends to them: through a planted link
    that truncated and appended to another file."""
    from pofe.recipe import rewind, rewind_metrics, rewind_output
    from pofe.runs import JsonlWriter, open_run, release_run

    run_dir = _planted_online(tmp_path)
    victim = tmp_path / "victim.jsonl"
    victim.write_text('{"step": 5}\n{"step": 6}\n')
    for name in ("ledger.jsonl", "metrics.jsonl"):
        (run_dir / name).symlink_to(victim)
    open_run(RunConfig(), "online", resume=run_dir)
    try:
        with pytest.raises(RunError, match="ledger.jsonl: is a symbolic link"):
            rewind(run_dir, 0, {"ledger.jsonl": 0}, ("ledger.jsonl",))
        with pytest.raises(RunError, match="ledger.jsonl: is a symbolic link"):
            JsonlWriter(run_dir / "ledger.jsonl")
        with pytest.raises(RunError, match="metrics.jsonl: is a symbolic link"):
            rewind_metrics(run_dir / "metrics.jsonl", 0)
        with pytest.raises(RunError, match="metrics.jsonl: is a symbolic link"):
            rewind_output(run_dir / "metrics.jsonl", 0)
        (run_dir / "ledger.jsonl").unlink()
        (run_dir / "eval").symlink_to(tmp_path, target_is_directory=True)  # a folder link out of the run
        with pytest.raises(RunError, match="outside the run folder"):
            JsonlWriter(run_dir / "eval" / "step-1.jsonl")
    finally:
        release_run(run_dir)
    assert victim.read_text() == '{"step": 5}\n{"step": 6}\n'
    assert not (tmp_path / "step-1.jsonl").exists()


def test_planted_checkpoint_links_never_write_or_prune_outside(tmp_path):
    import torch

    from pofe.runs import open_run, release_run
    from pofe.runtime import CheckpointError, latest_checkpoint, prune_checkpoints, save_checkpoint

    run_dir = _planted_online(tmp_path)
    outside = tmp_path / "outside"
    (outside / "step-1").mkdir(parents=True)
    (outside / "step-1" / "trainer_state.json").write_text("{}")
    (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
    open_run(RunConfig(), "online", resume=run_dir)
    try:
        model = torch.nn.Linear(2, 2)
        with pytest.raises(RunError, match="outside the run folder"):
            save_checkpoint(run_dir / "checkpoints" / "step-2", model=model, step=2)
        with pytest.raises(CheckpointError, match="checkpoints: is a symbolic link"):
            prune_checkpoints(run_dir, 1)
        with pytest.raises(CheckpointError, match="checkpoints: is a symbolic link"):
            latest_checkpoint(run_dir)
        (run_dir / "checkpoints").unlink()
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "step-1").symlink_to(outside / "step-1", target_is_directory=True)
        with pytest.raises(CheckpointError, match="step-1: is a symbolic link"):
            latest_checkpoint(run_dir)
    finally:
        release_run(run_dir)
    assert sorted(p.name for p in outside.iterdir()) == ["step-1"]
    assert (outside / "step-1" / "trainer_state.json").read_text() == "{}"


def _report_folder(tmp_path: Path) -> Path:
    run_dir = _planted_online(tmp_path)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.7 - s / 10, "mean_len": 10 + s})
                                                   + "\n" for s in range(1, 5)))
    return run_dir


def test_report_never_writes_or_reads_through_planted_links(tmp_path):
    """``pofe report`` wrote its PNGs through links planted in RUN_DIR/report, and a
    ``config.yaml`` link put another file's text into report.html."""
    run_dir = _report_folder(tmp_path)
    res = invoke("report", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    pngs = json.loads(res.stdout)["pngs"]
    assert pngs
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for planted in (Path(pngs[0]), run_dir / "report" / "report.html"):
        planted.unlink()
        planted.symlink_to(victim)
        res = invoke("report", str(run_dir))
        assert res.returncode == 2
        _one_line(res, planted.name, "symbolic link")
        assert victim.read_text() == "precious"
        planted.unlink()
    import shutil

    shutil.rmtree(run_dir / "report")
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "report").symlink_to(outside, target_is_directory=True)
    res = invoke("report", str(run_dir))
    assert res.returncode == 2 and list(outside.iterdir()) == []
    (run_dir / "report").unlink()
    secret = tmp_path / "secret.yaml"
    secret.write_text("api_key: sk-do-not-leak\n")
    (run_dir / "config.yaml").unlink()
    (run_dir / "config.yaml").symlink_to(secret)
    res = invoke("report", str(run_dir))
    assert res.returncode == 2
    _one_line(res, "config.yaml", "symbolic link")
    assert not any("sk-do-not-leak" in p.read_text(errors="replace") for p in run_dir.rglob("*.html"))


def test_resume_refuses_a_config_yaml_link(tmp_path, tiny_model_dir):
    from pofe.loops.online import OnlineConfig

    run_dir = _plant(tmp_path / "runs" / "r", OnlineConfig, {
        "model": {"name": str(tiny_model_dir)}, "judge": {"kind": "length"}, "train": {"steps": 1, "batch_size": 2},
        "sampling": {"max_new_tokens": 2}, "eval": {"enabled": False}, "log": {"progress": False, "tensorboard": False}})
    other = tmp_path / "other.yaml"
    other.write_text((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").unlink()
    (run_dir / "config.yaml").symlink_to(other)
    res = invoke("online", "--resume", str(run_dir))
    assert res.returncode == 2
    _one_line(res, "config.yaml: is a symbolic link")


# ----------------------------------------------------------------------------- run.json

@pytest.mark.slow
def test_run_json_pins_config_and_inputs_and_resume_refuses_changes(tmp_path):
    """An edited config mixed two judges in one ledger, a grown data file gave different
    weights, both silently. run.json records pofe's version, the command and sha256 of
    config.yaml and every input file; a resume after a change is refused naming the file."""
    import hashlib

    from pofe import __version__

    pairs = _pairs(tmp_path / "pairs.jsonl")
    res = _label(tmp_path, pairs=pairs)
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = tmp_path / "runs" / "r"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["pofe_version"] == __version__ and manifest["command"] == "label"
    assert manifest["config_sha256"] == hashlib.sha256((run_dir / "config.yaml").read_bytes()).hexdigest()
    assert manifest["inputs"] == [{"key": "data.pairs", "path": str(pairs), "sha256": hashlib.sha256(pairs.read_bytes()).hexdigest(),
                                   "bytes": pairs.stat().st_size}]
    assert invoke("label", "--resume", str(run_dir)).returncode == 0  # unchanged: resumes

    original = pairs.read_text()
    pairs.write_text(original + json.dumps({"prompt": "new?", "response_a": "a", "response_b": "bb"}) + "\n")
    res = invoke("label", "--resume", str(run_dir))
    assert res.returncode == 2
    _one_line(res, "input data.pairs", str(pairs), "changed")
    pairs.write_text(original)

    config = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(config.replace("prefer: shorter", "prefer: longer"))
    res = invoke("label", "--resume", str(run_dir))
    assert res.returncode == 2
    _one_line(res, "config.yaml changed")
    (run_dir / "config.yaml").write_text(config)

    (run_dir / "run.json").unlink()  # a folder of an older pofe: resumed, with a warning
    from pofe.runs import release_run

    release_run(run_dir)  # held by this test process since its in-process resumes
    res = pofe("label", "--resume", str(run_dir), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "cannot be verified" in res.stderr


# ----------------------------------------------------------------------------- umask, leftovers, names

_UMASK_SCRIPT = r"""
import os, sys, torch
from pathlib import Path
from pofe.runs import RunConfig, new_run_dir, write_config, atomic_write_text, JsonlWriter
from pofe.runtime import save_checkpoint
d = new_run_dir(RunConfig(output_dir=sys.argv[1], name="r"), "x")
write_config(d, RunConfig())
atomic_write_text(d / "summary.json", "{}")
with JsonlWriter(d / "metrics.jsonl") as w:
    w.write({"step": 1})
save_checkpoint(d / "checkpoints" / "step-1", model=torch.nn.Linear(2, 2), step=1)
"""


@pytest.mark.slow
def test_files_follow_the_umask(tmp_path):
    """Run files were forced to 0644 (and checkpoint folders to 0700) whatever the umask."""
    from _cli import env

    res = subprocess.run(["sh", "-c", 'umask 027 && exec "$0" "$@"', sys.executable, "-c", _UMASK_SCRIPT, str(tmp_path)],
                         env=env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    d = tmp_path / "r"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in
             (d / "config.yaml", d / "run.json", d / ".lock", d / "summary.json", d / "metrics.jsonl",
              d / "checkpoints" / "step-1", d / "checkpoints" / "step-1" / "trainer_state.json")}
    assert modes == {"config.yaml": 0o640, "run.json": 0o640, ".lock": 0o640, "summary.json": 0o640,
                     "metrics.jsonl": 0o640, "step-1": 0o750, "trainer_state.json": 0o640}


def test_bad_input_error_leaves_no_run_folder(tmp_path):
    """A judge that cannot be built (bad callable) was found after the run folder existed, and
    the folder stayed behind with only its config."""
    res = _label(tmp_path, "--set", "judge.kind=callable", "--set", "judge.callable=no_such_module_xyz:score")
    assert res.returncode == 2
    _one_line(res, "no_such_module_xyz")
    assert not (tmp_path / "runs" / "r").exists()
    res = invoke("judge", str(_pairs(tmp_path / "pairs.jsonl")), "--judge", "callable",
                 "--set", "judge.callable=no_such_module_xyz:score", "--set", f"run.output_dir={tmp_path / 'jruns'}")
    assert res.returncode == 2
    assert not (tmp_path / "jruns").exists() or list((tmp_path / "jruns").iterdir()) == []


@pytest.mark.parametrize("typed", ["123", "2024-12-01", "007", "1.50"])
def test_run_name_is_the_text_typed(tmp_path, typed):
    res = invoke("label", "--set", f"run.name={typed}", "--set", "judge.kind=length", "--print-config")
    assert res.returncode == 0, res.stderr[-1000:]
    assert yaml.safe_load(res.stdout)["run"]["name"] == typed


@pytest.mark.parametrize("typed, name", [("null", None), ("'2024-12-01'", "2024-12-01"), ('"007"', "007")])
def test_run_name_null_and_quoted_keep_their_yaml_meaning(typed, name):
    res = invoke("label", "--set", f"run.name={typed}", "--set", "judge.kind=length", "--print-config")
    assert res.returncode == 0, res.stderr[-1000:]
    assert yaml.safe_load(res.stdout)["run"]["name"] == name


def test_run_name_from_yaml_date_or_int(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("judge: {kind: length}\nrun: {name: 2024-12-01}\n")
    res = invoke("label", "--config", str(cfg), "--print-config")
    assert res.returncode == 0, res.stderr[-1000:]
    assert yaml.safe_load(res.stdout)["run"]["name"] == "2024-12-01"
    assert RunConfig.model_validate({"name": 123}).name == "123"


@pytest.mark.parametrize("bad", ["a\nb", "tab\there", "esc\x1b[31m", "bell\x07"])
def test_run_name_with_control_characters_is_refused(tmp_path, bad):
    res = invoke("label", "--set", f"run.name={bad}", "--set", "judge.kind=length",
                 "--set", f"run.output_dir={tmp_path / 'runs'}", "--print-config")
    assert res.returncode == 2
    _one_line(res, "run.name", "control characters")
    assert not (tmp_path / "runs").exists()


def test_self_reward_model_copy_never_goes_through_a_planted_link(tmp_path):
    """The selected model is copied to ``iter_t/model``: a planted link there got the copy."""
    from pofe.evaluation.self_reward import SelectionSettings, select_checkpoint
    from pofe.runs import guard_run_dir

    run_dir = tmp_path / "runs" / "r"
    (run_dir / "iter_1").mkdir(parents=True)
    final = tmp_path / "final"
    final.mkdir()
    (final / "model.safetensors").write_text("weights")
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "iter_1" / "model").symlink_to(outside, target_is_directory=True)
    guard_run_dir(run_dir)
    with pytest.raises(RunError, match="model: is a symbolic link"):
        select_checkpoint(run_dir / "iter_1", final, SelectionSettings(enabled=False), load=None, respond=None,
                          judge=None, prompts=[], previous=[])
    assert list(outside.iterdir()) == []
