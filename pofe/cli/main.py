"""``pofe`` command line. Commands register themselves from ``pofe/cli/<name>.py``; a
command whose module is missing or fails to import is not listed (``pofe --help`` lists
only commands that work)."""

from __future__ import annotations

import importlib
import logging
import os
from typing import Optional

import typer

from pofe import __version__

# Order = order in --help.
COMMAND_MODULES = [
    "online", "self_reward", "sft", "judge", "label", "rm", "rl", "cai", "annotate", "audit", "eval", "report", "sim", "chat",
    "export",
]

app = typer.Typer(
    name="pofe",
    help="Preference optimisation from AI feedback: online DPO/IPO/SLiC (OAIF), self-rewarding LMs, RLAIF/CAI, judge audits.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pofe {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="Show the version."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    # Nothing is ever fetched from a model hub at run time unless the user opts in.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    for noisy in ("httpx", "urllib3", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"pofe.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"pofe.cli.{name}":
                continue
            raise
        mod.register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
