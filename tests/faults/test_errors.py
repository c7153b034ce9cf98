"""Every error a user can reach is one line on stderr and an exit status (2 bad input, 1
environment), with ``-v`` for the traceback; a full or read-only disk is reported, not a
traceback."""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

import pytest
from typer.testing import CliRunner

from _cli import error_lines, invoke, pofe
from pofe.cli.main import app

pytestmark = pytest.mark.faults


def _online(tiny_model_dir, out, *sets):
    base = [f"model.name={tiny_model_dir}", "judge.kind=length", "train.steps=2", "train.batch_size=2",
            "sampling.max_new_tokens=4", "eval.enabled=false", "log.progress=false", "log.tensorboard=false",
            f"run.output_dir={out}", *sets]
    return [a for s in base for a in ("--set", s)]


def _one_line(res, code, *needles):
    lines = error_lines(res)
    assert res.returncode == code, res.stderr[-2000:]
    assert len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith("error: ") and "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@lru_cache(maxsize=1)
def _can_mount_tmpfs() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare not found"
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"cannot mount a tmpfs in a user namespace here ({r.stderr.strip()[:120]})"


def _on_tmpfs(mount, opts):
    """A command prefix running pofe in a private mount namespace with a small tmpfs at ``mount``."""
    why = _can_mount_tmpfs()
    if why:
        pytest.skip(f"disk-full / read-only probes need a private tmpfs: {why}")
    mount.mkdir(parents=True, exist_ok=True)
    return ("unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o {opts} tmpfs {mount} && exec \"$@\"", "sh")


@pytest.mark.slow
def test_disk_full_is_one_line_exit_1(tmp_path, tiny_model_dir):
    """A 256 KiB tmpfs holds config and metrics but not the checkpoint: exit 1 naming the
    full disk, no traceback."""
    mnt = tmp_path / "small"
    res = pofe("online", *_online(tiny_model_dir, mnt / "runs", "run.name=r"), prefix=_on_tmpfs(mnt, "size=256k"))
    _one_line(res, 1, "no space left on device")


@pytest.mark.slow
def test_read_only_output_is_one_line_exit_1(tmp_path, tiny_model_dir):
    mnt = tmp_path / "ro"
    res = pofe("online", *_online(tiny_model_dir, mnt / "runs"), prefix=_on_tmpfs(mnt, "ro,size=64k"))
    _one_line(res, 1, "read-only file system", str(mnt / "runs"))


def test_config_that_is_a_directory_exit_2(tmp_path):
    res = invoke("online", "--config", str(tmp_path))
    _one_line(res, 2, "is a directory", str(tmp_path))


def test_typo_model_name_is_one_line_exit_2(tmp_path):
    res = invoke("online", "--set", "model.name=HuggingFaceTB/SmolLM2-135M-Instrukt", "--set", "judge.kind=length",
                 "--set", f"run.output_dir={tmp_path}", "--set", "log.progress=false")
    _one_line(res, 2, "SmolLM2-135M-Instrukt", "HF_HUB_OFFLINE")


def test_bad_setting_raised_by_a_loop_is_one_line_exit_2(tmp_path, tiny_model_dir):
    """On main this ValueError ended in a traceback."""
    res = invoke("online", *_online(tiny_model_dir, tmp_path, "sampling.temperature=0"))
    _one_line(res, 2, "sampling.temperature")


def test_resume_of_a_missing_run_is_one_line_exit_2(tmp_path):
    res = invoke("online", "--resume", str(tmp_path / "typo"))
    _one_line(res, 2, str(tmp_path / "typo"))


def test_internal_error_is_one_line_exit_1_and_v_shows_the_traceback(monkeypatch):
    import pofe.loops.online as online

    def broken(*a, **k):
        raise KeyError("boom")

    monkeypatch.setattr(online, "run", broken)
    runner = CliRunner()
    res = runner.invoke(app, ["online", "--set", "judge.kind=length"])
    assert res.exit_code == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == ["error: internal error: KeyError: 'boom' (run with -v for the traceback)"]
    res = runner.invoke(app, ["-v", "online", "--set", "judge.kind=length"])
    assert res.exit_code == 1 and "Traceback (most recent call last)" in res.stderr and "KeyError: 'boom'" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith("error: internal error: KeyError")


@pytest.mark.parametrize("exc,code,text", [
    (OSError(28, "No space left on device", "/x/ckpt"), 1, "no space left on device (disk full): /x/ckpt"),
    (OSError(30, "Read-only file system", "/ro"), 1, "read-only file system: /ro"),
    (PermissionError(13, "Permission denied", "/p"), 1, "permission denied: /p"),
    (IsADirectoryError(21, "Is a directory", "/d"), 2, "is a directory: /d"),
    (FileNotFoundError(2, "No such file or directory", "/f"), 2, "no such file or directory: /f"),
    (MemoryError(), 1, "out of memory"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_describe_error_maps_environment_and_input_errors(exc, code, text):
    from pofe.cli.main import describe_error

    got_code, msg = describe_error(exc)
    assert got_code == code and msg.startswith(text)


def test_pofe_error_types_map_by_class():
    from pofe.cli.main import describe_error
    from pofe.config import ConfigError
    from pofe.models import DeviceUnavailable, ModelError
    from pofe.runs import RunError
    from pofe.runtime import CheckpointError, MultiProcessRefused, NonFiniteLoss

    for exc, code in [(ConfigError("a\nb"), 2), (RunError("r"), 2), (ModelError("m"), 2), (CheckpointError("c"), 2),
                      (MultiProcessRefused("w"), 2), (NonFiniteLoss("n"), 1), (DeviceUnavailable("d"), 1)]:
        got, msg = describe_error(exc)
        assert got == code and "\n" not in msg
    assert describe_error(ValueError("numpy says no")) == (1, "internal error: ValueError: numpy says no (run with -v for the traceback)")
