"""Shared CLI plumbing: config resolution with exit status 2 on bad input, --print-config,
--json output. Each command lives in ``pofe/cli/<command>.py`` and exposes ``register(app)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer

from pofe.config import ConfigError, PofeConfig, dump_config, load_config

T = TypeVar("T", bound=PofeConfig)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file.")
SetOpt = typer.Option(None, "--set", "-s", help="Override a key: --set judge.template=helpful-short (repeatable).")
PrintConfigOpt = typer.Option(False, "--print-config", help="Print the resolved config and exit.")
JsonOpt = typer.Option(False, "--json", help="Print a JSON summary on stdout at the end.")


def fail(message: str, code: int = 2) -> None:
    """One-line error on stderr, then exit (status 2 for bad input)."""
    from pofe.secrets import redact  # the message can quote a value that is a key

    typer.echo(f"error: {redact(message)}", err=True)
    raise typer.Exit(code)


def resolve_config(cls: type[T], config: Optional[Path], sets: Optional[list[str]], extra: dict[str, Any] | None = None,
                   print_config: bool = False, resume: Optional[Path] = None) -> T:
    """Load the command's config or exit 2 naming the bad key and the file.

    With ``resume`` (a run folder), the run's own saved ``config.yaml`` is the truth: a
    resumed run must continue the run that was started, never a default one (a resume that
    rebuilt the config from defaults once overwrote the run's config and mixed two judges'
    labels in one file). ``--config`` and ``--set`` are refused with a resume.
    """
    if resume is not None:
        saved = Path(resume) / "config.yaml"
        if not saved.is_file():
            fail(f"--resume {resume}: no config.yaml there (not a pofe run folder)")
        given = [k for k, v in (extra or {}).items() if v is not None]
        if config is not None or sets or given:
            what = "--config" if config is not None else ("--set " + sets[0]) if sets else f"option {given[0]}"
            fail(f"--resume {resume}: {what} is refused; a resumed run keeps its saved config.yaml "
                 f"(start a new run to change settings)")
        config, sets, extra = saved, [], {}
    try:
        cfg = load_config(cls, config, sets or [], {k: v for k, v in (extra or {}).items() if v is not None})
    except ConfigError as e:
        fail(str(e))
    if print_config:
        typer.echo(dump_config(cfg, comments=True), nl=False)
        raise typer.Exit(0)
    return cfg


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
