#!/usr/bin/env python
"""Re-run the reliability probes (every class of fault an outside tester found) against the ``pofe`` CLI (a script, not a test).

Every probe runs ``python -m pofe ...`` as a subprocess (one torch thread, ``HF_HUB_OFFLINE=1``,
a private ``$POFE_HOME``) on a tiny random model built into a temporary folder, with a fake
OpenAI-compatible judge (``tests/judges/fake_openai.py``) on 127.0.0.1 for the endpoint probes.
Classes: bad input, crash/resume, endpoint faults, concurrency, load.

For each probe the script records what it expected and what it observed: the exit status,
whether stderr holds a Python traceback, whether stderr's non-log lines are one line (and
name what they should), and whether inputs and outputs are intact. Each probe ends in one of

* ``fine``          -- it should succeed and did, with correct outputs;
* ``clear error``   -- it should fail and did, with one line and the expected exit status;
* ``traceback``     -- stderr held a traceback (without ``-v``);
* ``silent wrong``  -- exit 0 where an error was due, or wrong / missing outputs;
* ``data lost``     -- an input file was changed or deleted, or output rows went missing;
* ``other``         -- anything else that is not what was expected (wrong status, message
  not naming the key, a hang), counted as not ok.

Usage::

    python tests/faults/probe_suite.py --out probes.md [--jobs 2] [--only REGEX] [--keep]

Prints the markdown table (probe, class, expected, observed, ok) and the totals, and writes
them to ``--out``. Exit status 1 when any probe is not ok.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "judges"))

TRACEBACK = "Traceback (most recent call last)"
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d \w+ ")
CATEGORIES = ("fine", "clear error", "traceback", "silent wrong", "data lost", "other")


# ============================================================================ plumbing

@dataclass
class Outcome:
    category: str
    observed: str
    ok: bool


@dataclass
class Probe:
    name: str
    cls: str
    expected: str
    run: Callable[["Ctx"], Outcome]
    serial: bool = False  # runs alone (timing-sensitive: locks, concurrency)


@dataclass
class Ctx:
    root: Path
    tiny: Path
    env: dict[str, str]
    results: dict[str, Outcome] = field(default_factory=dict)

    def dir(self, name: str) -> Path:
        d = self.root / "p" / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        d.mkdir(parents=True, exist_ok=True)
        return d


IN_PROCESS = {"on": False}
"""Set by ``tests/faults/test_probe_suite.py``: a probe's command runs in this process (the CLI's
own top-level handler through typer's test runner, in the probe's environment and folder)
unless it needs a real process (a launcher prefix, an injected kill). The script runs every
command as a subprocess."""




class _CurrentStderr(logging.StreamHandler):
    """A log handler writing to whatever ``sys.stderr`` is when a record comes (the test
    runner swaps it for each invocation)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _in_process(args: tuple[str, ...], env: dict[str, str], cwd: Path, root: Path) -> subprocess.CompletedProcess:
    import traceback

    from typer.testing import CliRunner

    from pofe.cli.main import app

    saved_env, saved_cwd, saved_path = dict(os.environ), os.getcwd(), list(sys.path)
    extra_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra_path  # what PYTHONPATH gives a new interpreter (a judge.callable module)
    importlib.invalidate_caches()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # the log lines a process prints on its stderr (under pytest the root logger already has
    # handlers, so the CLI's basicConfig adds none): a handler on the runner's stderr of the moment
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.getLogger().addHandler(handler)
    try:
        res = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        logging.getLogger().removeHandler(handler)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        _as_if_the_process_ended(root)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        # an exception past the CLI's handler: what a subprocess would have printed
        stderr += "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, stderr)


def _as_if_the_process_ended(root: Path) -> None:
    """What a process's exit would undo: the run-folder locks it holds for life, the folders it
    guards, and the modules it imported from the probe's folders (a ``judge.callable`` module
    of the same name differs from probe to probe)."""
    from pofe import runs

    for fd in runs._HELD.values():
        os.close(fd)
    runs._HELD.clear()
    runs._ROOTS.clear()
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if f and str(root) in f:
            del sys.modules[name]


def pofe(ctx: Ctx, *args: str, timeout: float = 240, prefix: tuple[str, ...] = (), cwd: Path | None = None,
         **extra: str) -> subprocess.CompletedProcess:
    env = {**ctx.env, **extra}
    if IN_PROCESS["on"] and not prefix and "POFE_FAULT" not in extra:
        return _in_process(args, env, cwd or ctx.root, ctx.root)
    try:
        return subprocess.run([*prefix, sys.executable, "-m", "pofe", *map(str, args)], cwd=cwd or ctx.root, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
                                           ((e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")) + "\n[probe: timed out]")


def error_lines(res: subprocess.CompletedProcess) -> list[str]:
    """Non-empty stderr lines that are not log lines (``HH:MM:SS LEVEL name: ...``), progress
    bars or library warnings."""
    out = []
    for ln in res.stderr.splitlines():
        if not ln.strip() or LOG_LINE.match(ln) or re.search(r"\d+%\|", ln) or "it/s]" in ln:
            continue
        if re.search(r"(Warning|warn)\b.*:", ln) and not ln.startswith("error:"):
            continue
        out.append(ln)
    return out


def digest(paths) -> dict[str, str | None]:
    out = {}
    for p in paths:
        p = Path(p)
        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return out


def short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 3] + "..."


def judge_result(res: subprocess.CompletedProcess, *, code: int, needles=(), check=None, inputs_before=None,
                 inputs_after=None) -> Outcome:
    """Classify one command's result against what was expected."""
    lines = error_lines(res)
    tb = TRACEBACK in res.stderr
    obs = f"exit {res.returncode}"
    if lines:
        obs += f"; {len(lines)} line{'s' if len(lines) > 1 else ''}: {short(lines[0], 90)}"
    if inputs_before is not None and inputs_before != inputs_after:
        changed = [k for k in inputs_before if inputs_before[k] != inputs_after.get(k)]
        return Outcome("data lost", obs + f"; input changed/deleted: {', '.join(Path(c).name for c in changed)}", False)
    if tb:
        return Outcome("traceback", obs + "; traceback", False)
    if res.returncode == 124:
        return Outcome("other", obs + "; hung (timed out)", False)
    if code == 0:
        if res.returncode != 0:
            return Outcome("other" if lines and len(lines) == 1 else "other", obs + "; expected success", False)
        if check is not None:
            bad = check()
            if bad:
                return Outcome("silent wrong", obs + f"; {bad}", False)
        return Outcome("fine", obs, True)
    if res.returncode == 0:
        bad = check() if check is not None else None
        return Outcome("silent wrong", obs + "; exit 0 where an error was due" + (f" ({bad})" if bad else ""), False)
    if len(lines) != 1:
        return Outcome("other", obs + f"; {len(lines)} non-log stderr lines", False)
    missing = [n for n in needles if n.lower() not in lines[0].lower()]
    if res.returncode != code or missing or not lines[0].startswith("error: "):
        why = f"expected exit {code}" if res.returncode != code else f"line does not name {missing}"
        return Outcome("other", obs + f"; {why}", False)
    bad = check() if check is not None else None
    if bad:
        return Outcome("silent wrong", obs + f"; {bad}", False)
    return Outcome("clear error", obs, True)


def cli(name: str, cls: str, expected: str, args: Callable[[Ctx, Path], list], *, code: int, needles=(),
        check: Callable[[Ctx, Path], str | None] | None = None, inputs: Callable[[Ctx, Path], list] | None = None,
        setup: Callable[[Ctx, Path], None] | None = None, timeout: float = 240, env: dict[str, str] | None = None,
        prefix: Callable[[Ctx, Path], tuple] | None = None, serial: bool = False) -> Probe:
    """A probe that is one ``pofe`` command: ``args(ctx, d)`` (``d`` = the probe's own folder)."""

    def run(ctx: Ctx) -> Outcome:
        d = ctx.dir(name)
        if setup is not None:
            setup(ctx, d)
        watched = inputs(ctx, d) if inputs is not None else []
        before = digest(watched)
        res = pofe(ctx, *args(ctx, d), timeout=timeout, prefix=prefix(ctx, d) if prefix else (), **(env or {}))
        after = digest(watched)
        return judge_result(res, code=code, needles=needles, check=(lambda: check(ctx, d)) if check else None,
                            inputs_before=before if watched else None, inputs_after=after if watched else None)

    return Probe(name, cls, expected, run, serial)


def sets(*kv: str) -> list[str]:
    return [a for s in kv for a in ("--set", s)]


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


# ============================================================================ fixtures

def build_fixtures(root: Path) -> Ctx:
    import torch

    torch.set_num_threads(1)
    from pofe.models import load_tokenizer, pofe_home, tiny_causal_lm

    real_models = pofe_home() / "models"
    home = root / "home"
    home.mkdir(parents=True)
    if real_models.is_dir():
        (home / "models").symlink_to(real_models, target_is_directory=True)
    tok = load_tokenizer()
    tiny = root / "tiny"
    tiny_causal_lm(tok).save_pretrained(tiny)
    tok.save_pretrained(tiny)
    env = {k: v for k, v in os.environ.items() if k not in ("POFE_FAULT", "WORLD_SIZE", "RANK")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", POFE_HOME=str(home), PYTHONPATH=str(REPO))
    data = root / "data"
    data.mkdir()
    (data / "prompts.txt").write_text("".join(f"Question {i}: what is {i} plus {i}?\n" for i in range(8)))
    jsonl(data / "pairs.jsonl", [{"prompt": f"Question {i}?", "response_a": "short" + "!" * i,
                                  "response_b": "a much longer answer " * (1 + i % 3)} for i in range(6)])
    jsonl(data / "prefs.jsonl", [{"prompt": f"Question {i}?", "chosen": f"Answer {i}.",
                                  "rejected": f"A long wrong answer number {i} " * 2, "p": 0.8} for i in range(8)])
    jsonl(data / "ift.jsonl", [{"prompt": f"Question {i}?", "response": f"Answer number {i}."} for i in range(8)])
    return Ctx(root=root, tiny=tiny, env=env)


D = lambda ctx, name: ctx.root / "data" / name  # noqa: E731


# ---------------------------------------------------------------------------- command lines

def online_args(ctx: Ctx, d: Path, *extra: str, name: str = "r") -> list[str]:
    return sets(f"model.name={ctx.tiny}", "judge.kind=length", "train.steps=2", "train.batch_size=2",
                "sampling.max_new_tokens=4", "eval.enabled=false", "log.progress=false", "log.tensorboard=false",
                f"run.output_dir={d / 'runs'}", f"run.name={name}", *extra)


def sft_args(ctx: Ctx, d: Path, *extra: str, ift: Path | None = None) -> list[str]:
    # settings as --set (not --steps / --name): a later --set in a probe then overrides them
    return ["sft", "--ift", str(ift or D(ctx, "ift.jsonl")),
            *sets(f"model.name={ctx.tiny}", f"run.output_dir={d / 'runs'}", "train.steps=2", "train.batch_size=2", "train.grad_accum=1", "log.progress=false", "log.tensorboard=false", *extra)]


def rl_args(ctx: Ctx, d: Path, *extra: str, name: str = "r", steps: int = 2) -> list[str]:
    return ["rl", "--prompts", str(D(ctx, "prompts.txt")),
            *sets(f"model.name={ctx.tiny}", f"run.output_dir={d / 'runs'}", f"train.steps={steps}", f"run.name={name}", "train.batch_size=2", "train.group_size=2", "eval.num_prompts=2", "eval.samples=1",
                  "sampling.max_new_tokens=4", "optim.lr=1e-2", "log.progress=false", "log.tensorboard=false", *extra)]


def rm_args(ctx: Ctx, d: Path, *extra: str, train: Path | None = None) -> list[str]:
    return ["rm", "--train", str(train or D(ctx, "prefs.jsonl")),
            *sets(f"model.name={ctx.tiny}", f"run.output_dir={d / 'runs'}", "train.steps=2", "run.name=r", "train.batch_size=2", "max_length=64", "log.progress=false", "log.tensorboard=false", *extra)]


def judge_args(ctx: Ctx, d: Path, *extra: str, inp: Path | None = None, kind: str = "length") -> list[str]:
    return ["judge", str(inp or D(ctx, "pairs.jsonl")), "--judge", kind, *sets(f"run.output_dir={d / 'runs'}", *extra)]


def label_pairs_args(ctx: Ctx, d: Path, *extra: str, pairs: Path | None = None, name: str = "r") -> list[str]:
    return ["label", "--pairs", str(pairs or D(ctx, "pairs.jsonl")),
            *sets(f"run.output_dir={d / 'runs'}", f"run.name={name}", "judge.kind=length", "log.progress=false", "log.tensorboard=false", *extra)]


def label_sample_args(ctx: Ctx, d: Path, *extra: str, name: str = "r") -> list[str]:
    return ["label", "--prompts", str(D(ctx, "prompts.txt")),
            *sets(f"model.name={ctx.tiny}", f"run.output_dir={d / 'runs'}", f"run.name={name}", "data.max_prompts=6", f"judge.model={ctx.tiny}", f"judge.cache.path={d / 'cache.sqlite'}", "train.batch_size=2",
                  "sampling.max_new_tokens=5", "log.progress=false", "log.tensorboard=false", *extra)]


def eval_args(ctx: Ctx, d: Path, *extra: str, prompts: Path | None = None) -> list[str]:
    return ["eval", str(ctx.tiny), str(ctx.tiny), "--prompts", str(prompts or D(ctx, "prompts.txt")), "--judge", "length",
            *sets("data.max_prompts=4", "sampling.max_new_tokens=4", "n_boot=20", "refusal=false", *extra)]


def sr_config(ctx: Ctx, d: Path, name: str = "r", **over) -> Path:
    import yaml

    cfg = {"model": {"name": str(ctx.tiny)}, "iterations": 2, "judge": {"kind": "length"},
           "data": {"prompts": str(D(ctx, "prompts.txt")), "per_iteration": 4},
           "candidates": {"n": 2, "chunk": 2, "sampling": {"max_new_tokens": 6, "temperature": 1.0}},
           "dpo": {"optim": {"lr": 1e-2, "warmup_steps": 0}, "batch_size": 1, "grad_accum": 1, "steps": 2},
           "selection": {"num_checkpoints": 2, "num_prompts": 2},
           "eval": {"num_prompts": 2, "sampling": {"max_new_tokens": 6}},
           "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(d / "runs"), "name": name}}
    cfg.update(over)
    path = d / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# ============================================================================ probe classes

COMMAND_LINES: dict[str, Callable[[Ctx, Path], list[str]]] = {
    "online": lambda c, d: ["online", *online_args(c, d)],
    "sft": lambda c, d: sft_args(c, d),
    "rl": lambda c, d: rl_args(c, d),
    "rm": lambda c, d: rm_args(c, d),
    "judge": lambda c, d: judge_args(c, d),
    "label": lambda c, d: label_pairs_args(c, d),
    "self-reward": lambda c, d: ["self-reward", "--config", str(sr_config(c, d))],
    "eval": lambda c, d: eval_args(c, d),
    "audit": lambda c, d: ["audit", str(D(c, "prefs.jsonl")), "--judge", "length"],
    "cai": lambda c, d: ["cai", "revise", *sets(f"model.name={c.tiny}", f"run.output_dir={d / 'runs'}")],
}

# (command, key=value, the key the one-line error must name)
HYPER = [
    ("online", "loss.beta=-0.1", "loss.beta"), ("online", "loss.beta=0", "loss.beta"),
    ("online", "train.batch_size=0", "train.batch_size"), ("online", "train.batch_size=-2", "train.batch_size"),
    ("online", "train.samples_per_prompt=1", "samples_per_prompt"), ("online", "train.grad_accum=0", "grad_accum"),
    ("online", "train.steps=0", "train.steps"), ("online", "train.steps=-1", "train.steps"),
    ("online", "sampling.temperature=nan", "temperature"), ("online", "optim.lr=nan", "optim.lr"),
    ("online", "optim.lr=-1e-3", "optim.lr"), ("online", "judge.temperature=nan", "temperature"),
    ("online", "labels.min_margin=0.7", "min_margin"), ("online", "sampling.top_p=1.5", "top_p"),
    ("online", "checkpoint.every=-1", "checkpoint.every"), ("online", "sampling.max_new_tokens=0", "max_new_tokens"),
    ("sft", "train.steps=0", "train.steps"), ("sft", "train.batch_size=0", "batch_size"),
    ("sft", "train.grad_accum=0", "grad_accum"), ("sft", "optim.lr=nan", "optim.lr"),
    ("sft", "train.epochs=0", "epochs"), ("sft", "data.max_length=0", "max_length"),
    ("rl", "beta=-0.1", "beta"), ("rl", "beta=0", "beta"), ("rl", "train.group_size=1", "group_size"),
    ("rl", "train.steps=0", "train.steps"), ("rl", "sampling.temperature=nan", "temperature"),
    ("rl", "sampling.temperature=0", "temperature"), ("rl", "reward.scale=inf", "reward.scale"),
    ("rm", "train.batch_size=0", "batch_size"), ("rm", "train.steps=0", "train.steps"),
    ("rm", "optim.lr=inf", "optim.lr"), ("rm", "data.eval_fraction=1.5", "eval_fraction"),
    ("judge", "batch_size=0", "batch_size"), ("judge", "batch_size=-5", "batch_size"),
    ("judge", "data.limit=-1", "data.limit"), ("judge", "judge.batch_size=0", "batch_size"),
    ("label", "train.batch_size=0", "train.batch_size"), ("label", "data.max_prompts=0", "data.max_prompts"),
    ("label", "labels.min_margin=0.9", "labels.min_margin"), ("label", "sampling.temperature=nan", "temperature"),
    ("self-reward", "iterations=0", "iterations"), ("self-reward", "dpo.beta=-1", "dpo.beta"),
    ("self-reward", "candidates.n=1", "candidates.n"), ("self-reward", "dpo.grad_accum=0", "grad_accum"),
    ("eval", "n_boot=-1", "n_boot"), ("eval", "data.max_prompts=-3", "data.max_prompts"),
    ("audit", "batch_size=0", "batch_size"), ("audit", "data.limit=-1", "data.limit"), ("audit", "seeds=0", "seeds"),
    ("audit", "thresholds.min_agreement=1.5", "min_agreement"), ("audit", "contrast_limit=-1", "contrast_limit"),
    ("cai", "rounds=0", "rounds"), ("cai", "train.batch_size=0", "train.batch_size"), ("cai", "data.helpful_ratio=1.0", "data.helpful_ratio"),
]


def with_set(cmd: str, kv: str) -> Callable[[Ctx, Path], list[str]]:
    base = COMMAND_LINES[cmd]
    return lambda c, d: [*base(c, d), "--set", kv]


def probes_bad_config() -> list[Probe]:
    out: list[Probe] = []
    for cmd in ("online", "sft", "rl", "rm", "judge", "label", "self-reward", "eval"):
        def malformed(c, d, cmd=cmd):
            bad = d / "bad.yaml"
            bad.write_text("train:\n  steps: [1, 2\n  batch_size: 2\n")
            return [cmd, "--config", str(bad)]

        out.append(cli(f"{cmd}: malformed YAML", "bad input", "exit 2, one line naming the file and line", malformed,
                       code=2, needles=("bad.yaml",)))
        out.append(cli(f"{cmd}: unknown key", "bad input", "exit 2, one line naming the key",
                       with_set(cmd, "nosuch.key=1"), code=2, needles=("nosuch",)))

        def python_tag(c, d, cmd=cmd):
            bad = d / "evil.yaml"
            bad.write_text(f"seed: !!python/object/apply:os.system ['touch {d / 'PWNED'}']\n")
            return [cmd, "--config", str(bad)]

        out.append(cli(f"{cmd}: !!python tag in YAML", "bad input", "exit 2, one line; the tag is never executed",
                       python_tag, code=2, needles=("evil.yaml",),
                       check=lambda c, d: "the !!python payload ran" if (d / "PWNED").exists() else None))
    # settings that only make sense together: refused when parsed, before any run folder or model
    for name, args_fn, key in (
            ("rl: reward.kind=reward-model without reward.model", with_set("rl", "reward.kind=reward-model"), "reward.model"),
            ("rl: reward.kind=judge without reward.judge", with_set("rl", "reward.kind=judge"), "reward.judge"),
            ("self-reward: a pairwise-only judge (llm)", with_set("self-reward", "judge.kind=llm"), "pointwise"),
            ("online: mode=offline without data.preferences", with_set("online", "mode=offline"), "data.preferences")):
        out.append(cli(name, "bad input", f"exit 2 naming {key}; no run folder left", args_fn, code=2, needles=(key,),
                       check=lambda c, d: "a run folder was created" if any((d / "runs").glob("*/config.yaml")) else None))
    out.append(cli("judge: no input file", "bad input", "exit 2, one line", lambda c, d: ["judge", "--judge", "length"], code=2))
    out.append(cli("rm: no --train", "bad input", "exit 2 naming data.train",
                   lambda c, d: ["rm", *sets(f"model.name={c.tiny}", f"run.output_dir={d / 'runs'}")], code=2,
                   needles=("data.train",)))
    out.append(cli("cache prune: garbage --max-size", "bad input", "exit 2 naming --max-size",
                   lambda c, d: ["cache", "prune", "--max-size", "lots", "--path", str(d / "c.sqlite")], code=2,
                   needles=("max-size",)))
    out.append(cli("cache stats: cache file is not SQLite", "bad input", "exit 1, one line naming the file",
                   lambda c, d: ["cache", "stats", "--path", str(d / "c.sqlite")], code=1, needles=("c.sqlite",),
                   setup=lambda c, d: (d / "c.sqlite").write_text("not a database")))
    out.append(cli("report: not a run folder", "bad input", "exit 2, one line; no empty report", lambda c, d: ["report", str(d)],
                   code=2, check=lambda c, d: "an empty report was written" if (d / "report").exists() else None))
    out.append(cli("online: mistyped value (train.steps=abc)", "bad input", "exit 2, one line naming train.steps",
                   with_set("online", "train.steps=abc"), code=2, needles=("train.steps",)))
    out.append(cli("online: --config is a directory", "bad input", "exit 2, one line",
                   lambda c, d: ["online", "--config", str(d)], code=2))
    out.append(cli("online: --config missing", "bad input", "exit 2, one line naming the file",
                   lambda c, d: ["online", "--config", str(d / "nope.yaml")], code=2, needles=("nope.yaml",)))
    out.append(cli("online: irrelevant key for the mode (sampling.vllm.nosuch)", "bad input", "exit 2 naming the key",
                   with_set("online", "sampling.vllm.nosuch=1"), code=2, needles=("nosuch",)))
    for cmd, kv, key in HYPER:
        out.append(cli(f"{cmd}: {kv}", "bad input", f"exit 2, one line naming {key}", with_set(cmd, kv), code=2,
                       needles=(key.split(".")[-1],)))
    return out


def _bad_files(d: Path) -> dict[str, Path]:
    good = {"prompt": "Q?", "response_a": "a", "response_b": "bb", "chosen": "a", "rejected": "bb", "response": "ok"}
    f = {}
    f["malformed last line"] = d / "badlast.jsonl"
    f["malformed last line"].write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + '{"prompt": "Q?", "resp')
    f["malformed middle line"] = d / "badmid.jsonl"
    f["malformed middle line"].write_text(json.dumps(good) + "\n{not json}\n" + json.dumps(good) + "\n")
    f["empty file"] = d / "empty.jsonl"
    f["empty file"].write_text("")
    f["scalar JSON rows"] = d / "scalars.jsonl"
    f["scalar JSON rows"].write_text("1\n2\n\"x\"\n")
    f["missing field"] = d / "nofield.jsonl"
    f["missing field"].write_text(json.dumps({"foo": "bar"}) + "\n")
    return f


def probes_bad_files() -> list[Probe]:
    out: list[Probe] = []
    lines = {  # how each command takes an input file
        "judge": lambda c, d, p: judge_args(c, d, inp=p),
        "label": lambda c, d, p: label_pairs_args(c, d, pairs=p),
        "eval": lambda c, d, p: eval_args(c, d, prompts=p),
        "rm": lambda c, d, p: rm_args(c, d, train=p),
        "sft": lambda c, d, p: sft_args(c, d, ift=p),
        "export": lambda c, d, p: ["export", str(p), "-o", str(d / "out.jsonl")],
    }
    for cmd, mk in lines.items():
        for what, needle in (("malformed last line", "badlast.jsonl"), ("malformed middle line", "badmid.jsonl"),
                             ("empty file", "empty.jsonl"), ("scalar JSON rows", "scalars.jsonl"),
                             ("missing field", "nofield.jsonl")):
            if cmd == "eval" and what == "missing field":
                continue  # a prompt file's rows are prompts; see "scalar JSON rows"

            def args(c, d, mk=mk, needle=needle):
                return mk(c, d, d / needle)

            out.append(cli(f"{cmd}: input with {what}", "bad input", "exit 2, one line naming the file (and line)", args,
                           code=2, needles=(needle,), setup=lambda c, d: _bad_files(d),
                           inputs=lambda c, d, needle=needle: [d / needle]))
        out.append(cli(f"{cmd}: input file missing", "bad input", "exit 2, one line naming the file",
                       lambda c, d, mk=mk: mk(c, d, d / "missing.jsonl"), code=2, needles=("missing.jsonl",)))
        out.append(cli(f"{cmd}: input is a directory", "bad input", "exit 2, one line",
                       lambda c, d, mk=mk: mk(c, d, d), code=2))

    # UTF-8 BOM: the file is read, not "0 rows, exit 0"
    def bom_pairs(c, d):
        p = d / "bom.jsonl"
        p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "Q?", "response_a": "a", "response_b": "bbbb"}).encode() + b"\n")
        return p

    out.append(cli("judge: one-line file with a UTF-8 BOM", "bad input", "exit 0, 1 verdict",
                   lambda c, d: judge_args(c, d, "run.name=r", inp=bom_pairs(c, d)), code=0,
                   check=lambda c, d: None if len(read_rows(d / "runs" / "r" / "verdicts.jsonl")) == 1 else "not 1 verdict"))
    out.append(cli("label: --pairs file with a UTF-8 BOM", "bad input", "exit 0, 1 label",
                   lambda c, d: label_pairs_args(c, d, pairs=bom_pairs(c, d)), code=0,
                   check=lambda c, d: None if len(read_rows(d / "runs" / "r" / "labels.jsonl")) == 1 else "not 1 label"))

    def bom_ift(c, d):
        p = d / "bom_ift.jsonl"
        p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"prompt": f"Q{i}?", "response": "ok"}) + "\n"
                                                 for i in range(4)).encode())
        return sft_args(c, d, ift=p)

    out.append(cli("sft: IFT file with a UTF-8 BOM", "bad input", "exit 0, trained", bom_ift, code=0))

    def bom_prefs(c, d):
        p = d / "bom_prefs.jsonl"
        p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"prompt": f"Q{i}?", "chosen": "a", "rejected": "bb"}) + "\n"
                                                 for i in range(4)).encode())
        return rm_args(c, d, train=p)

    out.append(cli("rm: preference file with a UTF-8 BOM", "bad input", "exit 0, trained", bom_prefs, code=0))

    def bom_prompts(c, d):
        p = d / "bom.txt"
        p.write_bytes(b"\xef\xbb\xbfWhat is one plus one?\nName a colour.\n")
        return eval_args(c, d, prompts=p)

    out.append(cli("eval: prompt file with a UTF-8 BOM", "bad input", "exit 0", bom_prompts, code=0))
    out.append(cli("judge: --skip-bad-rows on a malformed middle line", "bad input", "exit 0, 2 verdicts, 1 skip counted",
                   lambda c, d: [*judge_args(c, d, "run.name=r", inp=_bad_files(d)["malformed middle line"]),
                                 "--skip-bad-rows"], code=0,
                   check=lambda c, d: None if len(read_rows(d / "runs" / "r" / "verdicts.jsonl")) == 2 else "not 2 verdicts"))
    return out


def probes_outputs() -> list[Probe]:
    out: list[Probe] = []

    def copy_in(d, name="pairs.jsonl"):
        p = d / name
        if not p.exists():
            shutil.copy(D_ctx[0].root / "data" / name, p)
        return p

    out.append(cli("judge: -o on the input file", "bad input", "exit 2; the input is untouched",
                   lambda c, d: [*judge_args(c, d, inp=copy_in(d)), "-o", str(copy_in(d))], code=2,
                   needles=("input",), inputs=lambda c, d: [copy_in(d)]))
    out.append(cli("judge: -o on the input via another path", "bad input", "exit 2; the input is untouched",
                   lambda c, d: [*judge_args(c, d, inp=copy_in(d)), "-o", str(d / "." / "x" / ".." / "pairs.jsonl")],
                   code=2, inputs=lambda c, d: [copy_in(d)], setup=lambda c, d: (d / "x").mkdir(exist_ok=True)))

    def eval_o_input(c, d):
        p = d / "prompts.txt"
        return [*eval_args(c, d, prompts=p), "-o", str(p)]

    out.append(cli("eval: -o on the prompts file", "bad input", "exit 2; the input is untouched", eval_o_input, code=2,
                   inputs=lambda c, d: [d / "prompts.txt"], setup=lambda c, d: shutil.copy(D(c, "prompts.txt"), d / "prompts.txt")))
    out.append(cli("export: -o on the input file", "bad input", "exit 2; the input is untouched",
                   lambda c, d: ["export", str(copy_in(d, "prefs.jsonl")), "-o", str(copy_in(d, "prefs.jsonl"))], code=2,
                   inputs=lambda c, d: [copy_in(d, "prefs.jsonl")]))
    out.append(cli("judge: -o on a directory", "bad input", "exit 2, one line", lambda c, d: [*judge_args(c, d), "-o", str(d)],
                   code=2))
    out.append(cli("eval: -o on a directory", "bad input", "exit 2, one line", lambda c, d: [*eval_args(c, d), "-o", str(d)],
                   code=2))
    out.append(cli("judge: -o under a regular file", "bad input", "exit 2, one line",
                   lambda c, d: [*judge_args(c, d), "-o", str(d / "afile" / "v.jsonl")], code=2,
                   setup=lambda c, d: (d / "afile").write_text("x")))
    out.append(cli("online: run.output_dir is a regular file", "bad input", "exit 2 or 1, one line",
                   lambda c, d: ["online", *online_args(c, d, f"run.output_dir={d / 'afile'}")], code=2,
                   setup=lambda c, d: (d / "afile").write_text("x")))
    ro = lambda c, d: ("unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro,size=64k tmpfs {d / 'ro'} && exec \"$@\"", "sh")  # noqa: E731
    full = lambda c, d: ("unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs {d / 'ro'} && exec \"$@\"", "sh")  # noqa: E731
    mk_ro = lambda c, d: (d / "ro").mkdir(exist_ok=True)  # noqa: E731
    out.append(cli("online: read-only file system for run.output_dir", "bad input", "exit 1, one line: read-only",
                   lambda c, d: ["online", *online_args(c, d, f"run.output_dir={d / 'ro' / 'runs'}")], code=1,
                   needles=("read-only",), prefix=ro, setup=mk_ro))
    out.append(cli("judge: -o on a read-only file system", "bad input", "exit 1, one line: read-only",
                   lambda c, d: [*judge_args(c, d), "-o", str(d / "ro" / "v.jsonl")], code=1, needles=("read-only",),
                   prefix=ro, setup=mk_ro))
    out.append(cli("sft: read-only file system for the run folder", "bad input", "exit 1, one line: read-only",
                   lambda c, d: sft_args(c, d, f"run.output_dir={d / 'ro' / 'runs'}"), code=1, needles=("read-only",),
                   prefix=ro, setup=mk_ro))
    out.append(cli("online: disk full while checkpointing (256 KiB tmpfs)", "bad input",
                   "exit 1, one line: no space left", lambda c, d: ["online", *online_args(c, d, f"run.output_dir={d / 'ro' / 'runs'}")],
                   code=1, needles=("no space",), prefix=full, setup=mk_ro))
    out.append(cli("rl: disk full (256 KiB tmpfs)", "bad input", "exit 1, one line: no space left",
                   lambda c, d: rl_args(c, d, f"run.output_dir={d / 'ro' / 'runs'}"), code=1, needles=("no space",),
                   prefix=full, setup=mk_ro))
    for cmd in ("online", "rl", "label", "sft"):
        base = {"online": lambda c, d: ["online", *online_args(c, d, "run.name=../..")],
                "rl": lambda c, d: rl_args(c, d, "run.name=../.."),
                "label": lambda c, d: label_pairs_args(c, d, "run.name=../.."),
                "sft": lambda c, d: sft_args(c, d, "run.name=../..")}[cmd]
        out.append(cli(f"{cmd}: run.name=../..", "bad input", "exit 2 naming run.name; nothing written outside", base,
                       code=2, needles=("run.name",),
                       check=lambda c, d: "wrote config.yaml outside" if (d.parent / "config.yaml").exists() else None))
    out.append(cli("rl: --name ../..", "bad input", "exit 2 naming run.name; nothing written outside",
                   lambda c, d: [*rl_args(c, d), "--name", "../.."], code=2, needles=("run.name",),
                   check=lambda c, d: "wrote config.yaml outside" if (d.parent / "config.yaml").exists() else None))
    # typo'd model and dataset names: fast, one line, never a hub retry loop
    out.append(cli("online: typo'd model name", "bad input", "exit 2 in < 60 s naming the model",
                   lambda c, d: ["online", *online_args(c, d, "model.name=smollm2-135m-instrutc")], code=2,
                   needles=("smollm2-135m-instrutc",), timeout=60))
    out.append(cli("sft: typo'd local model path", "bad input", "exit 2 in < 60 s naming the path",
                   lambda c, d: sft_args(c, d, f"model.name={d / 'tiny-typo'}"), code=2, needles=("tiny-typo",), timeout=60))
    out.append(cli("judge: typo'd judge model", "bad input", "exit 2 in < 60 s naming the model",
                   lambda c, d: judge_args(c, d, "judge.model=smol-typo", kind="llm"), code=2, needles=("smol-typo",),
                   timeout=60))
    out.append(cli("rl: typo'd dataset name", "bad input", "exit 2 naming the source",
                   lambda c, d: ["rl", "--prompts", "hh-rlhf:helpfull", *rl_args(c, d)[3:]], code=2,
                   needles=("helpfull",), timeout=60))
    out.append(cli("label: typo'd dataset name", "bad input", "exit 2 naming the source",
                   lambda c, d: ["label", "--prompts", "advbnch", "--model", str(c.tiny), "--output-dir", str(d / "runs")],
                   code=2, needles=("advbnch",), timeout=60))
    out.append(cli("rm: typo'd dataset name", "bad input", "exit 2 naming the source",
                   lambda c, d: rm_args(c, d, train=Path("hh-rlhf:helpfull")), code=2, needles=("helpfull",), timeout=60))
    def typo_command(ctx: Ctx) -> Outcome:
        res = pofe(ctx, "onlin")
        ok = res.returncode == 2 and "Did you mean 'online'" in res.stderr and TRACEBACK not in res.stderr
        return Outcome("clear error" if ok else "other", f"exit {res.returncode}; click usage error: "
                       f"{short([ln for ln in res.stderr.splitlines() if 'Did you mean' in ln] or res.stderr[-200:])}", ok)

    out.append(Probe("pofe: typo'd command", "bad input", "exit 2, click's usage error with a suggestion", typo_command))
    out.append(cli("sft: WORLD_SIZE=2 (not data-parallel)", "bad input", "exit 2, one line",
                   lambda c, d: sft_args(c, d), code=2, needles=("WORLD_SIZE",), env={"WORLD_SIZE": "2"}))
    return out


D_ctx: list[Ctx] = []  # set in main(): probes_outputs' helpers need the data folder


# ---------------------------------------------------------------------------- crash / resume

def _weights(path: Path):
    from safetensors.torch import load_file

    return load_file(str(path))


def _same_weights(a: Path, b: Path) -> bool:
    import torch

    x, y = _weights(a), _weights(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


TIMING = re.compile(r"^(time_|seconds$)|_time$|per_s$|latency")  # measured durations differ between runs


def _rows(path: Path, drop=("cached",)) -> list[dict]:
    """A JSONL file's rows without timings and where-it-came-from (a re-done read is a cache hit,
    which spends no judge tokens, so the ``judge/*`` meter of a resumed run differs too)."""
    from pofe.runs import read_jsonl

    rows = [{k: v for k, v in r.items() if k not in drop and not TIMING.search(k) and not k.startswith("judge/")}
            for r in read_jsonl(path)] \
        if path.exists() else []
    for r in rows:
        if isinstance(r.get("extra"), dict):
            r["extra"] = {k: v for k, v in r["extra"].items() if k not in ("cache_hits", "cache_misses")}
    return rows


def crash_probe(name: str, point: str, start: Callable[[Ctx, Path, str], list[str]], compare: list[str],
                final: str | None = "final/model.safetensors", steps_file: str = "metrics.jsonl",
                steps: list[int] | None = None) -> Probe:
    """Reference run; the same run SIGKILLed at ``POFE_FAULT=point``; ``--resume RUN_DIR`` alone;
    then the final weights bit-identical and the named JSONL files row-for-row equal."""

    def run(ctx: Ctx) -> Outcome:
        d = ctx.dir(name)
        ref = pofe(ctx, *start(ctx, d, "ref"))
        if ref.returncode != 0:
            return judge_result(ref, code=0)
        crashed = pofe(ctx, *start(ctx, d, "crash"), POFE_FAULT=point)
        if crashed.returncode != -signal.SIGKILL:
            return Outcome("other", f"fault point {point} not reached (exit {crashed.returncode})", False)
        run_dir = d / "runs" / "crash"
        cmd = start(ctx, d, "crash")[0]
        saved = (run_dir / "config.yaml").read_text()
        res = pofe(ctx, cmd, "--resume", run_dir)
        o = judge_result(res, code=0)
        if not o.ok:
            return o
        problems = []
        if (run_dir / "config.yaml").read_text() != saved:
            problems.append("config.yaml rewritten")
        if final and not _same_weights(d / "runs" / "ref" / final, run_dir / final):
            problems.append("final weights differ")
        lost = None
        for f in compare:
            a, b = _rows(run_dir / f), _rows(d / "runs" / "ref" / f)
            if a != b:
                (lost := f) if len(a) < len(b) else problems.append(f"{f}: {len(a)} rows vs {len(b)}, not equal")
        got = [r.get("step") for r in _rows(run_dir / steps_file)]
        if steps is not None and got != steps:
            problems.append(f"{steps_file} steps {got}")
        if lost:
            return Outcome("data lost", f"killed at {point}, resumed: {lost} lost rows", False)
        if problems:
            return Outcome("silent wrong", f"killed at {point}, resumed exit 0 but {'; '.join(problems)}", False)
        return Outcome("fine", f"killed at {point} (exit -9); resume exit 0; weights equal; "
                               f"{', '.join(compare)} equal", True)

    return Probe(name, "crash/resume", "exit -9, then --resume exit 0: same weights, rows once each in order", run)


def probes_crash() -> list[Probe]:
    out = []
    online = lambda c, d, n: ["online", *online_args(c, d, "train.steps=4", "checkpoint.every=2", "optim.lr=1e-3",  # noqa: E731
                                                      "loss.labels=soft", "judge.temperature=20", name=n)]
    for pt in ("2:after_checkpoint", "3:after_judge"):
        out.append(crash_probe(f"online: SIGKILL at {pt}", pt, online, ["ledger.jsonl", "metrics.jsonl"], steps=[1, 2, 3, 4]))

    def sft(c, d, n):
        import yaml

        cfg = {"model": {"name": str(c.tiny)}, "data": {"ift": [str(D(c, "ift.jsonl"))]}, "optim": {"lr": 1e-3},
               "train": {"steps": 4, "batch_size": 2, "grad_accum": 1}, "checkpoint": {"every": 2},
               "log": {"progress": False, "tensorboard": False}, "run": {"output_dir": str(d / "runs"), "name": n}}
        (d / f"{n}.yaml").write_text(yaml.safe_dump(cfg))
        return ["sft", "--config", str(d / f"{n}.yaml")]

    for pt in ("2:after_checkpoint", "3:after_step"):
        out.append(crash_probe(f"sft: SIGKILL at {pt}", pt, sft, ["metrics.jsonl"], steps=[1, 2, 3, 4]))
    rl = lambda c, d, n: rl_args(c, d, "checkpoint.every=2", name=n, steps=4)  # noqa: E731
    for pt in ("1:after_step", "4:after_checkpoint"):
        out.append(crash_probe(f"rl: SIGKILL at {pt}", pt, rl, ["metrics.jsonl"], steps=[1, 2, 3, 4]))
    label = lambda c, d, n: label_sample_args(c, d, f"judge.cache.path={d / (n + '.sqlite')}", name=n)  # noqa: E731
    for pt in ("2:after_batch", "3:row_1"):
        out.append(crash_probe(f"label: SIGKILL at {pt}", pt, label, ["labels.jsonl", "preferences.jsonl", "metrics.jsonl"],
                               final=None, steps=[1, 2, 3]))
    sr = lambda c, d, n: ["self-reward", "--config", str(sr_config(c, d, n))]  # noqa: E731
    for pt in ("sr1:after_iteration", "1:after_checkpoint", "sr2:after_selection"):
        out.append(crash_probe(f"self-reward: SIGKILL at {pt}", pt, sr,
                               ["metrics.jsonl", "iter_2/data/candidates.jsonl", "iter_2/data/aift.jsonl",
                                "iter_2/eval_responses.jsonl"], steps=[1, 2]))

    def torn_final(command: str, first_run, keep: int):
        """Run, cut final/model.safetensors to 1/keep of its bytes, resume: final/ must be whole again."""
        def probe(ctx: Ctx) -> Outcome:
            d = ctx.dir(f"torn final {command}")
            r = first_run(ctx, d)
            if r.returncode != 0:
                return judge_result(r, code=0)
            f = d / "runs" / "r" / "final" / "model.safetensors"
            data = f.read_bytes()
            f.write_bytes(data[: len(data) // keep])
            res = pofe(ctx, command, "--resume", d / "runs" / "r")
            from pofe.runtime import final_complete

            return judge_result(res, code=0, check=lambda: None if final_complete(f.parent) and f.stat().st_size == len(data)
                                else "final/ still torn after exit 0")
        return probe

    out.append(Probe("online: torn final/ then --resume", "crash/resume", "exit 0 and final/ rewritten whole",
                     torn_final("online", lambda ctx, d: pofe(ctx, "online", *online_args(ctx, d, "checkpoint.every=2")), 2)))
    out.append(Probe("rl: torn final/ then --resume", "crash/resume", "exit 0 and final/ rewritten whole",
                     torn_final("rl", lambda ctx, d: pofe(ctx, *rl_args(ctx, d, "checkpoint.every=2")), 3)))

    def planted(ctx: Ctx) -> Outcome:
        import pickle

        d = ctx.dir("planted pickle")
        r = pofe(ctx, "online", *online_args(ctx, d, "checkpoint.every=1"))
        if r.returncode != 0:
            return judge_result(r, code=0)
        ck = sorted((d / "runs" / "r" / "checkpoints").glob("step-*"))[-1]

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {d / 'PWNED'}",))

        (ck / "trainer_state.pt").write_bytes(pickle.dumps(Evil()))
        for x in ("trainer_state.json", "trainer_state.safetensors"):
            (ck / x).unlink(missing_ok=True)
        res = pofe(ctx, "online", "--resume", d / "runs" / "r")

        def check():
            if (d / "PWNED").exists():
                return "the planted pickle ran"
            # the checkpoint no longer matches its manifest: passed over for the one before, saying so
            if "resuming from step-" not in res.stderr or ck.name not in res.stderr:
                return f"no warning line naming {ck.name} and the checkpoint resumed from"
            return None

        return judge_result(res, code=0, check=check)

    out.append(Probe("online: planted pickle in a checkpoint, --resume", "crash/resume",
                     "exit 0 from the checkpoint before, one warning naming the damaged one; the pickle never runs",
                     planted))
    for cmd in ("online", "sft", "rl", "label", "self-reward", "rm"):
        out.append(cli(f"{cmd}: --resume of a typo'd run folder", "crash/resume", "exit 2 naming the folder",
                       lambda c, d, cmd=cmd: [cmd, "--resume", str(d / "runs" / "nope")], code=2, needles=("nope",)))

    def resume_with_set(ctx: Ctx) -> Outcome:
        d = ctx.dir("resume with set")
        r = pofe(ctx, "online", *online_args(ctx, d))
        if r.returncode != 0:
            return judge_result(r, code=0)
        cfg = (d / "runs" / "r" / "config.yaml").read_text()
        res = pofe(ctx, "online", "--resume", d / "runs" / "r", "--set", "train.steps=9")
        return judge_result(res, code=2, needles=("refused",),
                            check=lambda: "config.yaml changed" if (d / "runs" / "r" / "config.yaml").read_text() != cfg else None)

    def nan_loss(ctx: Ctx) -> Outcome:
        d = ctx.dir("nan loss")
        res = pofe(ctx, "online", *online_args(ctx, d, "optim.lr=1e30", "optim.warmup_steps=0",
                                               "train.steps=6", "checkpoint.every=1", "checkpoint.keep_last=0"))

        def finite_checkpoints():
            import torch

            bad = [c.name for c in sorted((d / "runs" / "r" / "checkpoints").glob("step-*"))
                   if not all(torch.isfinite(t).all() for t in _weights(c / "model.safetensors").values())]
            return f"non-finite checkpoint(s) saved: {bad}" if bad else None

        return judge_result(res, code=1, needles=("non-finite", "step"), check=finite_checkpoints)

    out.append(Probe("online: update diverges to NaN weights (lr 1e30)", "crash/resume",
                     "exit 1 naming the step; every checkpoint on disk finite", nan_loss))

    def diverged_sampling(ctx: Ctx) -> Outcome:
        d = ctx.dir("diverged sampling")
        res = pofe(ctx, "online", *online_args(ctx, d, "optim.lr=1e30", "optim.warmup_steps=0", "train.steps=6"))
        return judge_result(res, code=1, needles=("not finite",))

    out.append(Probe("online: diverged weights, no checkpoint (lr 1e30)", "crash/resume",
                     "exit 1, one line saying the probabilities are not finite", diverged_sampling))

    def verbose(ctx: Ctx) -> Outcome:
        d = ctx.dir("verbose traceback")
        res = pofe(ctx, "-v", "online", *online_args(ctx, d, "model.name=smollm2-135m-instrutc"))
        ok = res.returncode == 2 and TRACEBACK in res.stderr and res.stderr.rstrip().splitlines()[-1].startswith("error: ")
        return Outcome("clear error" if ok else "other", f"exit {res.returncode}; traceback shown: {TRACEBACK in res.stderr}", ok)

    out.append(Probe("pofe -v: a bad model name", "bad input", "exit 2; with -v the traceback, then the one line", verbose))
    out.append(Probe("online: --resume with --set", "crash/resume", "exit 2, refused; config.yaml unchanged", resume_with_set))

    def sft_resume_no_config(ctx: Ctx) -> Outcome:
        d = ctx.dir("sft resume keeps config")
        r = pofe(ctx, *sft_args(ctx, d, "run.name=r"))
        if r.returncode != 0:
            return judge_result(r, code=0)
        cfg = (d / "runs" / "r" / "config.yaml").read_text()
        res = pofe(ctx, "sft", "--resume", d / "runs" / "r")
        return judge_result(res, code=0, check=lambda: "config.yaml overwritten"
                            if (d / "runs" / "r" / "config.yaml").read_text() != cfg else None)

    out.append(Probe("sft: --resume without --config (defect 1)", "crash/resume", "exit 0; config.yaml unchanged",
                     sft_resume_no_config))
    return out


# ---------------------------------------------------------------------------- endpoint faults

class Server:
    """The shared fake OpenAI-compatible server, started in this process for one probe."""

    def __init__(self, default=None):
        from fake_openai import FakeServer, chat_shape

        self.s = FakeServer(default=default or (200, chat_shape({"1": -0.4, "2": -1.3})))

    def __enter__(self):
        return self.s

    def __exit__(self, *a):
        self.s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openai_judge_args(ctx: Ctx, d: Path, url: str, *extra: str, name: str = "r", cache: bool = True) -> list[str]:
    return judge_args(ctx, d, f"judge.endpoint.base_url={url}", "judge.endpoint.max_retries=2",
                      "judge.endpoint.backoff_s=0.01", "judge.endpoint.max_backoff_s=0.05", "judge.endpoint.timeout_s=3",
                      f"judge.cache.path={d / 'cache.sqlite'}", f"judge.cache.enabled={str(cache).lower()}",
                      f"run.name={name}", *extra, kind="openai")


def endpoint_probe(name: str, expected: str, script: Callable, *, code: int, needles=(), check=None,
                   extra=(), url_override: Callable[[], str] | None = None) -> Probe:
    """``script(server)`` sets the fault mode; ``check(rows, server)`` inspects the verdicts."""
    from fake_openai import chat_shape

    def run(ctx: Ctx) -> Outcome:
        d = ctx.dir(name)
        with Server((200, chat_shape({"1": -0.4, "2": -1.3}))) as s:
            script(s)
            url = url_override() if url_override else s.url
            res = pofe(ctx, *openai_judge_args(ctx, d, url, *extra), timeout=120)
            vfile = d / "runs" / "r" / "verdicts.jsonl"

            def chk():
                rows = read_rows(vfile) if vfile.exists() else []
                return check(rows, s) if check else None

            return judge_result(res, code=code, needles=needles, check=chk)

    return Probe(name, "endpoint", expected, run)


def probes_endpoint() -> list[Probe]:
    from fake_openai import chat_shape, legacy_shape

    good = chat_shape({"1": -0.4, "2": -1.3})
    nan_body = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "1"}, "logprobs": {"content": [{"token": "1", "logprob": NaN, "top_logprobs": [{"token": "1", "logprob": NaN}, {"token": "2", "logprob": NaN}]}]}}]}'

    def all_parsed(rows, s):
        if len(rows) != 6:
            return f"{len(rows)} verdicts of 6"
        if any(r.get("p") is None for r in rows):
            return "a verdict is missing"
        return None

    def none_invented(rows, s):
        if len(rows) != 6:
            return f"{len(rows)} verdicts of 6"
        bad = [r.get("p") for r in rows if r.get("p") is not None and not r.get("text_fallback")
               and not (r.get("extra") or {}).get("hard_label_orders")]
        return f"invented labels {bad[:3]}" if bad else None

    out = [
        endpoint_probe("openai judge: connection refused", "exit 1, one line naming the endpoint, bounded retries",
                       lambda s: None, code=1, needles=("127.0.0.1",), url_override=lambda: f"http://127.0.0.1:{free_port()}/v1"),
        endpoint_probe("openai judge: persistent 503", "exit 1, one line: HTTP 503",
                       lambda s: (setattr(s, "default", (503, {"error": "overloaded"})), setattr(s, "models_status", 503)),
                       code=1, needles=("503",)),
        endpoint_probe("openai judge: 500 on reads", "exit 1, one line: HTTP 500",
                       lambda s: setattr(s, "default", (500, "boom")), code=1, needles=("500",)),
        endpoint_probe("openai judge: 503 twice then OK", "exit 0, every row labelled",
                       lambda s: s.script.extend([(503, {"error": "x"})] * 2), code=0, check=all_parsed),
        endpoint_probe("openai judge: 429 with Retry-After 1e12 then OK", "exit 0 (wait capped), every row labelled",
                       lambda s: (s.script.append((429, {"error": "slow down"})), s.reply_headers.update({"Retry-After": "1e12"})),
                       code=0, check=all_parsed),
        endpoint_probe("openai judge: 429 with Retry-After 99999999999999999999 then OK", "exit 0, no OverflowError",
                       lambda s: (s.script.append((429, {"error": "slow down"})),
                                  s.reply_headers.update({"Retry-After": "9" * 20})), code=0, check=all_parsed),
        endpoint_probe("openai judge: 429 with an HTTP-date Retry-After then OK", "exit 0, every row labelled",
                       lambda s: (s.script.append((429, {"error": "slow down"})), s.reply_headers.update(
                           {"Retry-After": format_datetime(datetime.now(timezone.utc) + timedelta(seconds=1), usegmt=True)})),
                       code=0, check=all_parsed),
        endpoint_probe("openai judge: 429 with a garbage Retry-After then OK", "exit 0",
                       lambda s: (s.script.append((429, {"error": "x"})), s.reply_headers.update({"Retry-After": "soon"})),
                       code=0, check=all_parsed),
        endpoint_probe("openai judge: persistent 429", "exit 1, one line: HTTP 429",
                       lambda s: (setattr(s, "default", (429, {"error": "x"})), s.reply_headers.update({"Retry-After": "0"})),
                       code=1, needles=("429",)),
        endpoint_probe("openai judge: server hangs", "exit 1 after the timeout, one line",
                       lambda s: setattr(s, "delay", 10.0), code=1, needles=("timeout",),
                       extra=("judge.endpoint.timeout_s=0.5",)),
        endpoint_probe("openai judge: garbage bodies", "exit 1 or counted unreadable; never an invented label",
                       lambda s: setattr(s, "default", (200, "<html>not json")), code=1),
        endpoint_probe("openai judge: no logprobs", "exit 0; text-fallback flagged or unreadable, never a soft label",
                       lambda s: setattr(s, "default", (200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                                                                  "content": "1"}}]})),
                       code=0, check=none_invented),
        endpoint_probe("openai judge: missing choices", "exit 1: every read of the batch unreadable; no label invented",
                       lambda s: setattr(s, "default", (200, {"id": "x", "object": "chat.completion"})), code=1,
                       needles=("unreadabl",),
                       check=lambda rows, s: f"labels invented: {[r.get('p') for r in rows]}"
                       if any(r.get("p") is not None for r in rows) else None),
        endpoint_probe("openai judge: NaN logprobs", "exit 0; p null for every row, counted",
                       lambda s: setattr(s, "default", (200, nan_body)), code=0,
                       check=lambda rows, s: None if len(rows) == 6 and all(r.get("p") is None for r in rows)
                       else f"labels from NaN: {[r.get('p') for r in rows]}"),
        endpoint_probe("openai judge: legacy completions shape", "exit 0, every row labelled",
                       lambda s: setattr(s, "default", (200, legacy_shape({"1": -0.4, "2": -1.3}))), code=0,
                       check=all_parsed),
        endpoint_probe("openai judge: model list unavailable (404)", "exit 0; labelled, not cached",
                       lambda s: setattr(s, "models_status", 404), code=0, check=all_parsed),
    ]

    def changed_model(ctx: Ctx) -> Outcome:
        d = ctx.dir("changed model")
        with Server((200, good)) as s:
            r1 = pofe(ctx, *openai_judge_args(ctx, d, s.url, name="a"))
            if r1.returncode != 0:
                return judge_result(r1, code=0)
            n1 = len([r for r in s.requests if r["path"].endswith("completions")])
            s.model_id = "another-model"
            s.default = (200, chat_shape({"1": -3.0, "2": -0.1}))
            r2 = pofe(ctx, *openai_judge_args(ctx, d, s.url, name="b"))
            n2 = len([r for r in s.requests if r["path"].endswith("completions")]) - n1
            rows = read_rows(d / "runs" / "b" / "verdicts.jsonl") if (d / "runs" / "b" / "verdicts.jsonl").exists() else []
            # the new model prefers the second-shown answer: p_ab (the AB order's P(A)) drops
            return judge_result(r2, code=0, check=lambda: None if n2 == n1 and rows and all(r["p_ab"] < 0.5 for r in rows)
                                else f"{n2} requests after the model changed (first run {n1}); stale labels")

    out.append(Probe("openai judge: model behind the URL changed (defect 2)", "endpoint",
                     "exit 0; every read redone, no stale label", changed_model))

    def label_endpoint_down(ctx: Ctx) -> Outcome:
        d = ctx.dir("label endpoint down")
        res = pofe(ctx, *label_pairs_args(ctx, d, "judge.kind=openai", f"judge.endpoint.base_url=http://127.0.0.1:{free_port()}/v1",
                                          "judge.endpoint.max_retries=1", "judge.endpoint.backoff_s=0.01"))
        return judge_result(res, code=1, needles=("127.0.0.1",))

    out.append(Probe("label: openai judge refused", "endpoint", "exit 1, one line", label_endpoint_down))

    def label_with_endpoint(ctx: Ctx) -> Outcome:
        d = ctx.dir("label endpoint ok")
        with Server((200, good)) as s:
            res = pofe(ctx, *label_pairs_args(ctx, d, "judge.kind=openai", f"judge.endpoint.base_url={s.url}",
                                              f"judge.cache.path={d / 'c.sqlite'}"))
        f = d / "runs" / "r" / "labels.jsonl"
        return judge_result(res, code=0, check=lambda: None if f.exists() and len(read_rows(f)) == 6 else "not 6 labels")

    out.append(Probe("label: openai judge OK", "endpoint", "exit 0, 6 labels", label_with_endpoint))

    def audit_gate(same: bool) -> Callable[[Ctx], Outcome]:
        def run(ctx: Ctx) -> Outcome:
            from pofe.evaluation.audit import judge_identity
            from pofe.judges.config import OpenAIJudgeConfig

            d = ctx.dir(f"audit gate {same}")
            with Server((200, good)) as s:
                audited = OpenAIJudgeConfig(endpoint={"base_url": s.url if same else "http://judge-a:8000/v1"})
                report = d / "audit.json"
                report.write_text(json.dumps({"judge": "openai", "judge_identity": judge_identity(audited), "passed": True,
                                              "checks": {}, "calibration": {"sha256": "abc"}}))
                res = pofe(ctx, *label_pairs_args(ctx, d, "judge.kind=openai", f"judge.endpoint.base_url={s.url}",
                                                  f"judge.cache.path={d / 'c.sqlite'}"), "--require-audit", report)
                posts = [r for r in s.requests if r["path"].endswith("completions")]
            if same:
                return judge_result(res, code=0)
            return judge_result(res, code=2, needles=("different judge",),
                                check=lambda: f"{len(posts)} judge requests made before the gate" if posts else None)
        return run

    out.append(Probe("label --require-audit: audit of another endpoint (defect 10)", "endpoint",
                     "exit 2 naming the different judge; no request made", audit_gate(False)))
    out.append(Probe("label --require-audit: audit of this judge", "endpoint", "exit 0 (the gate passes)", audit_gate(True)))
    return out


# ---------------------------------------------------------------------------- concurrency

def probes_concurrency() -> list[Probe]:
    out = []

    def same_name(ctx: Ctx) -> Outcome:
        d = ctx.dir("two runs one name")
        env = {**ctx.env}
        procs = [subprocess.Popen([sys.executable, "-m", "pofe", "online", *online_args(ctx, d, name="same")], cwd=ctx.root,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [p.communicate(timeout=300) for p in procs]
        codes = [p.returncode for p in procs]
        dirs = sorted(x.name for x in (d / "runs").iterdir() if x.is_dir())
        tb = any(TRACEBACK in e for _, e in results)
        obs = f"exits {codes}; folders {dirs}"
        if tb:
            return Outcome("traceback", obs, False)
        if codes != [0, 0, 0] or dirs != ["same", "same-2", "same-3"]:
            return Outcome("silent wrong", obs, False)
        bad = [x for x in dirs if [r.get("step") for r in _rows(d / "runs" / x / "metrics.jsonl")] != [1, 2]]
        return Outcome("silent wrong", obs + f"; {bad} metrics not [1, 2]", False) if bad else Outcome("fine", obs, True)

    out.append(Probe("online: three runs started together with one run.name", "concurrency",
                     "three folders (same, same-2, same-3), each exit 0 with its own 2 metrics rows", same_name, serial=True))

    def resume_live(ctx: Ctx) -> Outcome:
        d = ctx.dir("resume of a live run")
        p = subprocess.Popen([sys.executable, "-m", "pofe", "online", *online_args(ctx, d, "train.steps=400", name="live")],
                             cwd=ctx.root, env=ctx.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        metrics = d / "runs" / "live" / "metrics.jsonl"
        t0 = time.time()
        while p.poll() is None and not (metrics.exists() and metrics.read_text().strip()) and time.time() - t0 < 120:
            time.sleep(0.2)
        if p.poll() is not None:
            return Outcome("other", f"the live run ended early (exit {p.returncode}): {short(p.stderr.read())}", False)
        before = len(metrics.read_text().splitlines())
        res = pofe(ctx, "online", "--resume", d / "runs" / "live", timeout=120)
        p.send_signal(signal.SIGKILL)
        p.wait()
        o = judge_result(res, code=2, needles=("PID",))
        steps = [r.get("step") for r in _rows(metrics)]
        if steps != sorted(set(steps)):
            return Outcome("silent wrong", o.observed + f"; duplicated metrics rows {steps[:8]}", False)
        return Outcome(o.category, o.observed + f" (live run had {before} rows)", o.ok)

    out.append(Probe("online: --resume of a still-running run", "concurrency", "exit 2 naming the PID; no duplicate rows",
                     resume_live, serial=True))

    def cache_writers(ctx: Ctx) -> Outcome:
        from fake_openai import chat_shape

        d = ctx.dir("concurrent cache writers")
        rows = [{"prompt": f"Q{i}?", "response_a": f"a{i}", "response_b": f"b{i}"} for i in range(300)]
        with Server((200, chat_shape({"1": -0.4, "2": -1.3}))) as s:
            procs = []
            for k in range(3):
                inp = jsonl(d / f"in{k}.jsonl", rows[k * 100:(k + 1) * 100] + rows[:50])  # overlapping keys too
                args = judge_args(ctx, d, f"judge.endpoint.base_url={s.url}", f"judge.cache.path={d / 'shared.sqlite'}",
                                  f"run.name=w{k}", "judge.endpoint.concurrency=4", inp=inp, kind="openai")
                procs.append(subprocess.Popen([sys.executable, "-m", "pofe", *args], cwd=ctx.root, env=ctx.env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=300) for p in procs]
        codes = [p.returncode for p in procs]
        con = sqlite3.connect(d / "shared.sqlite")
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
        n = sum(con.execute(f"select count(*) from {t}").fetchone()[0] for t in tables)
        con.close()
        counts = [len(read_rows(d / "runs" / f"w{k}" / "verdicts.jsonl")) for k in range(3)]
        obs = f"exits {codes}; integrity {integrity}; {n} cache rows; verdicts {counts}"
        if any(TRACEBACK in e for _, e in outs):
            return Outcome("traceback", obs, False)
        ok = codes == [0, 0, 0] and integrity == "ok" and counts == [150, 150, 150] and n >= 600
        return Outcome("fine" if ok else "silent wrong", obs, ok)

    out.append(Probe("openai judge: three processes writing one cache", "concurrency",
                     "all exit 0; integrity ok; 600 distinct reads cached; 150 verdicts each", cache_writers, serial=True))
    return out


# ---------------------------------------------------------------------------- load

def probes_load() -> list[Probe]:
    def big(d: Path) -> Path:
        return jsonl(d / "big.jsonl", [{"prompt": f"Question {i}?", "response_a": "x" * (i % 7 + 1),
                                        "response_b": "y" * (i % 5 + 1)} for i in range(2000)])

    def judge_2000(c, d):
        return judge_args(c, d, "run.name=r", inp=big(d))

    def judge_check(c, d):
        rows = read_rows(d / "runs" / "r" / "verdicts.jsonl")
        if len(rows) != 2000:
            return f"{len(rows)} verdicts"
        if [r["prompt"] for r in rows] != [f"Question {i}?" for i in range(2000)]:
            return "rows out of order or changed"
        return None

    def label_check(c, d):
        rows = read_rows(d / "runs" / "r" / "labels.jsonl")
        ident = sum(1 for i in range(2000) if "x" * (i % 7 + 1) == "y" * (i % 5 + 1))
        return None if len(rows) == 2000 - ident else f"{len(rows)} labels"

    def judge_chunks(c, d):
        return judge_args(c, d, "run.name=r", "batch_size=7", inp=big(d))

    return [
        cli("judge: 2000 pairs in", "load", "exit 0, 2000 verdicts in input order; input untouched",
            lambda c, d: judge_args(c, d, "run.name=r", inp=d / "big.jsonl"), code=0, check=judge_check,
            setup=lambda c, d: big(d), inputs=lambda c, d: [d / "big.jsonl"]),
        cli("judge: 2000 pairs, batch_size 7", "load", "exit 0, 2000 verdicts in input order", judge_chunks, code=0,
            check=judge_check),
        cli("judge: 2000 pairs, --limit 1500", "load", "exit 0, exactly 1500 verdicts",
            lambda c, d: [*judge_2000(c, d), "--limit", "1500"], code=0,
            check=lambda c, d: None if len(read_rows(d / "runs" / "r" / "verdicts.jsonl")) == 1500 else "not 1500"),
        cli("label: 2000 pairs in", "load", "exit 0, 2000 labels", lambda c, d: label_pairs_args(c, d, "train.batch_size=64",
                                                                                               "data.max_prompts=5000", pairs=big(d)),
            code=0, check=label_check),
        cli("export: 2000 pairs in", "load", "exit 0, 2000 rows out",
            lambda c, d: ["export", str(jsonl(d / "p.jsonl", [{"prompt": f"Q{i}", "chosen": "a", "rejected": "b"}
                                                                for i in range(2000)])), "-o", str(d / "out.jsonl")],
            code=0, check=lambda c, d: None if len(read_rows(d / "out.jsonl")) == 2000 else "not 2000 rows"),
    ]


# ============================================================================ main

def round2_probes() -> list[Probe]:
    """The round-2 classes (untrusted run folders, text round trips, network deadlines, secrets,
    invented values, output guards, the annotate log, resume boundaries): one module per class
    under ``tests/faults/probe_suite_r2/``, each with ``probes(P)`` taking this module for its plumbing."""
    import importlib.util

    out: list[Probe] = []
    for path in sorted((Path(__file__).resolve().parent / "probe_suite_r2").glob("[a-z]*.py")):
        spec = importlib.util.spec_from_file_location(f"probes_r2_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out.extend(mod.probes(sys.modules[__name__]))
    return out


def all_probes() -> list[Probe]:
    return [*probes_bad_config(), *probes_bad_files(), *probes_outputs(), *probes_crash(), *probes_endpoint(),
            *probes_concurrency(), *probes_load(), *round2_probes()]


def run_one(p: Probe, ctx: Ctx) -> Outcome:
    t0 = time.time()
    try:
        o = p.run(ctx)
    except Exception as e:  # noqa: BLE001 - a probe's own failure is reported, never hidden
        o = Outcome("other", f"probe failed: {type(e).__name__}: {short(e)}", False)
    o.observed += f" [{time.time() - t0:.0f} s]"
    return o


def table(probes: list[Probe], results: dict[str, Outcome]) -> str:
    lines = ["| # | probe | class | expected | observed | category | ok |", "|---|---|---|---|---|---|---|"]
    for i, p in enumerate(probes, 1):
        o = results[p.name]
        lines.append(f"| {i} | {short(p.name, 80)} | {p.cls} | {short(p.expected, 80)} | {short(o.observed, 160)} | "
                     f"{o.category} | {'yes' if o.ok else '**NO**'} |")
    totals = {c: sum(results[p.name].category == c for p in probes) for c in CATEGORIES}
    ok = sum(results[p.name].ok for p in probes)
    head = (f"**{len(probes)} probes: {ok} ok, {len(probes) - ok} not ok.** "
            + ", ".join(f"{c}: {n}" for c, n in totals.items()))
    return head + "\n\n" + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="Markdown file for the table and totals.")
    ap.add_argument("--jobs", type=int, default=2, help="Probes run in parallel (serial ones run alone).")
    ap.add_argument("--only", default=None, help="Regex: run only the probes whose name matches.")
    ap.add_argument("--keep", action="store_true", help="Keep the temporary folder (its path is printed).")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="pofe-probes-"))
    t0 = time.time()
    try:
        ctx = build_fixtures(root)
        D_ctx.append(ctx)
        probes = all_probes()
        names = [p.name for p in probes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SystemExit(f"duplicate probe names: {sorted(dup)}")
        if args.only:
            probes = [p for p in probes if re.search(args.only, p.name)]
        results: dict[str, Outcome] = {}
        lock = threading.Lock()

        def go(p: Probe):
            o = run_one(p, ctx)
            with lock:
                results[p.name] = o
                print(f"[{len(results)}/{len(probes)}] {'ok ' if o.ok else 'BAD'} {p.name}: {o.category}; {o.observed}",
                      flush=True)

        with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(go, [p for p in probes if not p.serial]))
        for p in probes:
            if p.serial:
                go(p)
        text = (f"# pofe probe re-run (issues 14 and 21)\n\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"{time.time() - t0:.0f} s wall, {args.jobs} jobs, commit {_commit()}\n\n" + table(probes, results))
        Path(args.out).write_text(text)
        print(text)
        return 0 if all(results[p.name].ok for p in probes) else 1
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
