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
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def resolve_config(cls: type[T], config: Optional[Path], sets: Optional[list[str]], extra: dict[str, Any] | None = None,
                   print_config: bool = False) -> T:
    """Load the command's config or exit 2 naming the bad key and the file."""
    try:
        cfg = load_config(cls, config, sets or [], {k: v for k, v in (extra or {}).items() if v is not None})
    except ConfigError as e:
        fail(str(e))
    if print_config:
        typer.echo(dump_config(cfg), nl=False)
        raise typer.Exit(0)
    return cfg


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()
