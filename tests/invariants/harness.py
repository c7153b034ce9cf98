"""The invariant harness: run a ``pofe`` training command as a real process, optionally
SIGKILLed at a fault point, and compare what two runs wrote.

``pofe`` runs the way a user runs it (``python -m pofe <cmd> --config C.yaml``, through
``tests/_cli.py``), with one CPU thread (so two runs do the same arithmetic in the same order:
the basis of the bit-identical claims) and no hub. A kill uses the loops' own fault points
(``POFE_FAULT=<point>``: ``pofe.runtime.fault_point`` sends SIGKILL to the process at that
line, no cleanup).
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from _cli import pofe, torchrun

REPO = Path(__file__).resolve().parents[2]


class Result(NamedTuple):
    rc: int
    stdout: str
    stderr: str
    run_dir: Path


def run_pofe(argv: list[str] | tuple[str, ...], *, config: dict | None = None, resume: Path | None = None,
             fault: str | None = None, timeout: float = 300, processes: int = 1,
             env: dict[str, str] | None = None) -> Result:
    """``python -m pofe *argv`` with ``config`` (written next to its run folder and
    passed as ``--config``) or ``--resume RUN_DIR``; ``fault``: the ``POFE_FAULT`` point at
    which the process SIGKILLs itself; ``processes`` > 1: under ``torchrun --standalone`` (CPU,
    gloo); ``env``: more environment variables (a launcher's sharding variables). Returns (rc,
    stdout, stderr, run_dir); rc is -9 for a killed run (non-zero under torchrun)."""
    if (config is None) == (resume is None):
        raise ValueError("run_pofe: give config or resume")
    args = list(argv)
    if config is not None:
        run_dir = Path(config["run"]["output_dir"]) / config["run"]["name"]
        path = run_dir.parent / f"{run_dir.name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        args += ["--config", str(path)]
    else:
        run_dir = Path(resume)
        args += ["--resume", str(run_dir)]
    extra = dict(env or {}, **({} if fault is None else {"POFE_FAULT": fault}))
    p = pofe(*args, timeout=timeout, **extra) if processes == 1 else torchrun(*args, nproc=processes, timeout=timeout, **extra)
    return Result(p.returncode, p.stdout, p.stderr, run_dir)


def _content_key(value: Any) -> Any:
    """``value`` with every path to an existing file or model folder replaced by its content's
    digest, so that two tests' configs over equal data files in their own folders compare equal."""
    import hashlib

    if isinstance(value, dict):
        return {k: _content_key(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_content_key(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        path = Path(value)
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path] if path.is_file() else []
        if files:
            h = hashlib.sha256()
            for f in files:
                h.update(f.relative_to(path).as_posix().encode() if path.is_dir() else b"")
                h.update(f.read_bytes())
            return "sha256:" + h.hexdigest()
    return value


def shared_run(argv: list[str] | tuple[str, ...], *, config: dict, processes: int = 1, env: dict[str, str] | None = None,
               timeout: float = 300) -> Result:
    """A run of ``config`` that several tests read (the same command, data, model, settings, process
    count and launcher variables ``env``: the one-process sft at batch 4 of the data-parallel, FSDP2
    and ZeRO equalities; the two-process runs the accelerate configs are compared with), run once per
    test session and shared read-only; the first test to ask runs it (a file lock across pytest
    workers). A failed run is not kept: the next test runs it again and sees the failure itself."""
    import hashlib
    import os
    import tempfile

    from filelock import FileLock

    key = hashlib.sha256(json.dumps([list(argv), processes, env or {},
                                     _content_key({k: v for k, v in config.items() if k != "run"})],
                                    sort_keys=True).encode()).hexdigest()[:20]
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    root = Path(tempfile.gettempdir()) / f"pofe-shared-runs-{session}" / key
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if (root / "ok").exists():  # the first asker's run, under the name it gave
            return Result(0, "", "", root / (root / "ok").read_text())
        name = config["run"]["name"]
        res = run_pofe(argv, config={**config, "run": {**config["run"], "output_dir": str(root)}}, timeout=timeout,
                       processes=processes, env=env)
        if res.rc == 0:
            (root / "ok").write_text(name)
        return res


# ----------------------------------------------------------------------------- reading a run

def _drop(row: Any, drop: tuple[str, ...], prefix: str = "") -> Any:
    """``row`` without the fields named in ``drop`` (dotted paths; ``*`` patterns allowed; the
    items of a list keep their list's path)."""
    if isinstance(row, list):
        return [_drop(v, drop, prefix) for v in row]
    if not isinstance(row, dict):
        return row
    out = {}
    for k, v in row.items():
        name = prefix + k
        if any(fnmatch.fnmatchcase(name, d) or fnmatch.fnmatchcase(k, d) for d in drop):
            continue
        out[k] = _drop(v, drop, name + ".")
    return out


def rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict]:
    """JSON Lines rows of ``path`` with the ``drop`` fields removed (a torn line is an error)."""
    return [_drop(json.loads(line), drop) for line in Path(path).read_text().splitlines() if line.strip()]


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


# ----------------------------------------------------------------------------- comparisons

def first_difference(a: list, b: list) -> str:
    """Where two lists of rows part, for a failure message."""
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)} rows"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(set(x) | set(y)) if isinstance(x, dict) and isinstance(y, dict) else []
            diff = {k: (x.get(k), y.get(k)) for k in keys if x.get(k) != y.get(k)}
            return f"row {i}: {diff or (x, y)}"
    return "equal"


def assert_same_rows(got: list, want: list, what: str) -> None:
    assert got == want, f"{what}: {first_difference(got, want)}"


def is_slice(part: list, whole: list) -> bool:
    """Whether ``part`` is a contiguous run of ``whole`` (the empty list is one)."""
    n = len(part)
    return any(whole[i:i + n] == part for i in range(len(whole) - n + 1))


def assert_steps_once_in_order(rows_: list[dict], steps: tuple[int, ...] | list[int], what: str) -> None:
    got = [r.get("step") for r in rows_]
    assert got == list(steps), f"{what}: steps {got}, want {list(steps)} (each once, in order)"


def same_weights(a: Path, b: Path) -> tuple[bool, float]:
    """(bit-identical, max |a - b|) of two safetensors files."""
    import torch

    x, y = weights(a), weights(b)
    if x.keys() != y.keys():
        return False, float("inf")
    ident = all(torch.equal(x[k], y[k]) for k in x)
    diff = max(float((x[k].double() - y[k].double()).abs().max()) for k in x)
    return ident, diff


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def one_run_folder(work: Path, name: str) -> None:
    """Rank 0 alone owns the run folder: ``work`` holds the folder ``name`` once and no second
    folder (``name-2``, ...) from another process."""
    folders = [p.name for p in work.iterdir() if p.is_dir() and (p / "run.json").exists()]
    assert folders.count(name) == 1 and not [f for f in folders if f.startswith(name + "-")], folders


def final_weights(run_dir: Path) -> Path:
    """``final/model.safetensors`` of a run (self-reward's final/ may be a link to iter_T/model)."""
    return Path(run_dir) / "final" / "model.safetensors"


def one_and_two_processes(cmd, tmp_path: Path, model_dir, over: dict) -> tuple[Any, Any]:
    """The same config run as one process ("one") and as two ("two"), side by side; both must
    succeed and the second must record 2 processes."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        f1 = pool.submit(run_pofe, cmd.argv, config=cmd.config(tmp_path, model_dir, "one", over))
        f2 = pool.submit(run_pofe, cmd.argv, config=cmd.config(tmp_path, model_dir, "two", over), processes=2)
        one, two = f1.result(), f2.result()
    for r in (one, two):
        assert r.rc == 0, r.stderr[-3000:]
    assert summary(two.run_dir)["processes"] == 2
    return one, two


VLLM = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True}
"""The in-process engine of the sharded weight-push tests: fp32, so a push is checked to fp32 rounding."""
