"""What ``pofe report`` reads from a run folder (:class:`RunData`) and which command wrote it.

The command is the one ``run.json`` records (:func:`recorded_command`); only a folder from an
older pofe, without ``run.json``, has it guessed from the files each loop writes
(:func:`detect_kind`). Every reader is tolerant: a missing or unreadable file means missing
data (and so a missing plot), never an error.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pofe.errors import PofeError

log = logging.getLogger(__name__)


@dataclass
class RunData:
    run_dir: Path
    config_text: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    ledger_p: list[float] = field(default_factory=list)
    iterations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)  # pofe label: labels.jsonl
    revisions: list[dict[str, Any]] = field(default_factory=list)  # pofe cai revise: revisions.jsonl
    eval_rows: list[dict[str, Any]] = field(default_factory=list)  # pofe online: the last eval/step-N.jsonl
    eval_step: int | None = None
    audit: dict[str, Any] | None = None  # pofe audit: audit.json
    candidates: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)  # self-reward iter_t/data/candidates.jsonl
    kind: str = "unknown"


@dataclass
class Plot:
    name: str
    title: str
    caption: str
    png: bytes


# A run folder given to ``pofe report`` may come from anyone: a file larger than this is refused
# rather than read whole into memory (the longest real metrics.jsonl is a few hundred MB).
MAX_FILE_BYTES = 512 << 20


class ReceivedFileError(PofeError):
    """A file of the folder given to ``pofe report`` that is not a regular file (a FIFO that
    would block the reader, a device) or is over :data:`MAX_FILE_BYTES` (bad input: exit 2)."""

    exit_code = 2


def _check_file(path: Path) -> None:
    """Refuse, before anything opens it, a file of a received folder that is not a regular file
    or is too large to read (``lstat``: a FIFO is never opened, so nothing blocks)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return  # the run-file readers refuse links themselves, with their own line
    if not stat.S_ISREG(st.st_mode):
        raise ReceivedFileError(f"{path}: not a regular file (a FIFO or device in a received run folder is never read)")
    if st.st_size > MAX_FILE_BYTES:
        raise ReceivedFileError(f"{path}: {st.st_size} bytes, over the report's limit of {MAX_FILE_BYTES} bytes "
                                f"per file")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from pofe.runs import read_jsonl

    try:
        _check_file(path)
        return [r for r in read_jsonl(path) if isinstance(r, dict)]
    except (OSError, ValueError) as e:
        log.warning("report: cannot read %s (%s); skipping it", path, e)
        return []


def _read_json(path: Path) -> Any:
    from pofe.runs import read_run_text

    try:
        _check_file(path)
        return json.loads(read_run_text(path))
    except (OSError, ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply
        log.warning("report: %s is not valid JSON; skipping it", path)
        return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def recorded_command(run_dir: Path) -> str | None:
    """The command ``run.json`` says wrote the folder (pofe.runs.write_manifest), or None when the
    folder has no readable ``run.json`` (an older pofe)."""
    from pofe.runs import read_run_text

    try:
        _check_file(Path(run_dir) / "run.json")
        command = json.loads(read_run_text(Path(run_dir) / "run.json")).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) and command else None


def detect_kind(run: RunData) -> str:
    """Which command wrote the folder: the one ``run.json`` names; for a folder from an older pofe
    (no ``run.json``), guessed from the files it writes (each loop's own set)."""
    d = run.run_dir
    if run.audit is not None:
        return "audit"
    recorded = recorded_command(d)
    if recorded is not None:
        return recorded
    if (d / "revisions.jsonl").exists():
        return "cai-revise"
    if (d / "labels.jsonl").exists():
        return "label"
    if run.iterations:
        return "self-reward"
    sm = run.summary or {}
    if "train_pairs" in sm or (d / "final" / "pofe_reward_model.json").exists():
        return "rm"
    if "algo" in sm or any("objective/kl_k3" in r for r in run.metrics):
        return "rl"
    if run.metrics or run.ledger_p:
        return "online"
    return "unknown"


class RunFolderNotFound(PofeError, FileNotFoundError):
    """The folder given to ``pofe report`` does not exist (bad input: exit 2). Also a
    ``FileNotFoundError`` for callers of :func:`write_report` that catch that."""

    exit_code = 2


def load_run(run_dir: str | Path) -> RunData:
    d = Path(run_dir)
    if d.suffix == ".json" and d.exists() and not d.is_dir():  # an audit report given directly
        run = RunData(d.parent)
        run.audit = _read_json(d)
        run.kind = "audit"
        return run
    if not d.is_dir():
        raise RunFolderNotFound(f"run folder not found: {d}")
    from pofe.runs import guard_run_dir, read_run_text

    guard_run_dir(d)  # its files are read never through links (a planted one would leak a file into the report)
    run = RunData(d)
    if (d / "config.yaml").exists():
        import yaml

        from pofe.config import safe_yaml_load

        _check_file(d / "config.yaml")
        try:
            run.config_text = read_run_text(d / "config.yaml")
        except UnicodeDecodeError:
            log.warning("report: %s is not UTF-8 text; skipping it", d / "config.yaml")
        try:
            run.config = safe_yaml_load(run.config_text or "", str(d / "config.yaml")) or {}  # bounded, strict
        except yaml.YAMLError:
            run.config = {}
        if not isinstance(run.config, dict):
            run.config = {}
    if (d / "summary.json").exists():
        run.summary = _read_json(d / "summary.json")
    if (d / "metrics.jsonl").exists():
        run.metrics = sorted(_read_jsonl(d / "metrics.jsonl"), key=lambda r: _num(r.get("step")) or 0.0)
    if (d / "ledger.jsonl").exists():
        for r in _read_jsonl(d / "ledger.jsonl"):
            # Annotation rows carry p; other kinds (e.g. per-pair losses) do not.
            p = _num(r.get("p"))
            if p is not None and r.get("kind", "annotation") == "annotation":
                run.ledger_p.append(p)
    if (d / "labels.jsonl").exists():
        run.labels = _read_jsonl(d / "labels.jsonl")
        run.ledger_p += [p for p in (_num(r.get("p")) for r in run.labels) if p is not None]
    if (d / "revisions.jsonl").exists():
        run.revisions = _read_jsonl(d / "revisions.jsonl")
    evals = [(int(m.group(1)), p) for p in (d / "eval").glob("step-*.jsonl")
             if (m := re.fullmatch(r"step-(\d+)\.jsonl", p.name))] if (d / "eval").is_dir() else []
    if evals:
        run.eval_step, path = max(evals)
        run.eval_rows = _read_jsonl(path)
    for name in ("audit.json", "report.json"):
        if (d / name).exists():
            rep = _read_json(d / name)
            if isinstance(rep, dict) and "checks" in rep and "metrics" in rep:
                run.audit = rep
                break
    iters = [p for p in d.glob("iter_*") if p.is_dir() and re.fullmatch(r"iter_\d+", p.name)]
    for it in sorted(iters, key=lambda p: int(p.name.split("_")[1])):
        f = it / "metrics.json"
        if f.exists():
            m = _read_json(f)
            if m is not None:
                run.iterations.append((it.name, m))
        if (it / "data" / "candidates.jsonl").exists():
            run.candidates.append((it.name, _read_jsonl(it / "data" / "candidates.jsonl")))
    run.kind = detect_kind(run)
    return run
