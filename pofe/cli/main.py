"""``pofe`` command line. Commands register themselves from ``pofe/cli/<name>.py``; a
command whose module is missing is not listed (``pofe --help`` lists only commands that exist).

Two things live here for every command:

* **Lazy commands.** A command's module is imported only when that command runs (or its own
  ``--help`` is asked for); ``pofe --help`` lists commands from their module docstrings without
  importing them, so ``pofe --help`` / ``pofe --version`` start without torch or transformers.
* **One line per error.** Every exception that reaches the top becomes one line on stderr and
  an exit status -- 2 for bad input (config, data, run folder, model name), 1 for the
  environment or an endpoint (disk full, read-only file system, unreachable judge) and for
  internal errors -- with ``-v`` printing the traceback first (a user's mistake deserves
  a sentence, not a traceback). A :class:`pofe.errors.PofeError` carries its own status, so a
  command raises a typed error where the problem is found and never catches to exit.
"""

from __future__ import annotations

import ast
import errno
import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import typer
from typer import _click as click  # typer >= 0.20 vendors click; its groups and errors are these classes
from typer.core import TyperCommand, TyperGroup

from pofe import __version__
from pofe.cli.helptext import install as plain_value_names
from pofe.errors import PofeError

plain_value_names()  # --help: TEXT / PATH / the choices, nothing for a flag (not <bool>, <list[str]>)

# Order = order in --help.
COMMAND_MODULES = [
    "online", "self_reward", "sft", "judge", "label", "rm", "rl", "cai", "cache", "annotate", "audit", "eval", "report",
    "sim", "chat", "export", "reproduce",
]

_state = {"verbose": False}

# Commands that run data-parallel under torchrun / accelerate launch (a subcommand as "group
# sub"). Every other command refuses WORLD_SIZE > 1 with one line instead of running N
# independent copies (two run folders from a 2-process ``pofe sft``). A command joins this set
# once its loop shards data (and all-reduces gradients where it trains), with a test.
DATA_PARALLEL_COMMANDS = {"online", "sft", "rm", "rl", "self-reward", "label", "cai revise", "judge", "eval", "audit"}


def _leave_group_if_worker() -> None:
    """A torchrun process whose command is done ends its process group (``leave_process_group``)."""
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        from pofe.runtime.parallel import leave_process_group

        leave_process_group()


def present_commands() -> list[str]:
    """Module names of the commands that exist (found without importing them)."""
    return [n for n in COMMAND_MODULES if importlib.util.find_spec(f"pofe.cli.{n}") is not None]


def _short_help(module: str) -> str:
    """The first sentence-paragraph of a command module's docstring, without the leading
    ``pofe name``: prefix; read with ``ast`` so the module is not imported."""
    spec = importlib.util.find_spec(f"pofe.cli.{module}")
    try:
        doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, TypeError):
        return ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    if first.startswith("``pofe") and "``:" in first:
        first = first.split("``:", 1)[1].strip()
    from pofe.cli.helptext import plain

    first = plain(first)
    return first[:1].upper() + first[1:]


# ----------------------------------------------------------------------------- errors

_OS_BAD_INPUT = {errno.ENOENT: "no such file or directory", errno.EISDIR: "is a directory",
                 errno.ENOTDIR: "not a directory", errno.EEXIST: "already exists"}
_OS_ENVIRONMENT = {errno.ENOSPC: "no space left on device (disk full)", errno.EROFS: "read-only file system",
                   errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                   errno.EDQUOT: "disk quota exceeded"}


def _one_line(text: str, limit: int = 600) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _raised_in_pofe(e: BaseException) -> bool:
    """True when the innermost frame of ``e``'s traceback is pofe's own code (a deliberate
    ``raise ValueError("...")`` with a message for the user, not a library's internal error)."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    pkg = str(Path(__file__).resolve().parents[1])
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(pkg)


def describe_error(e: BaseException) -> tuple[int, str]:
    """(exit status, one-line message) for an exception that reached the top of a command."""
    if isinstance(e, PofeError):  # every error pofe raises for the user carries its own status
        return e.exit_code, _one_line(e)
    if isinstance(e, RuntimeError) and "torch.distributed" in sys.modules:
        from pofe.runtime.parallel import as_collective_timeout

        stalled = as_collective_timeout(e)  # a peer stopped answering: one line naming the ranks, not gloo's text
        if stalled is not None:
            return stalled.exit_code, str(stalled)
    if isinstance(e, KeyboardInterrupt):
        return 130, "interrupted (what was already written is kept; --resume RUN_DIR continues a training run)"
    if isinstance(e, OSError) and e.errno is not None:
        where = e.filename if e.filename is not None else ""
        where = f": {where}" if where else ""
        if e.errno in _OS_BAD_INPUT:
            return 2, f"{_OS_BAD_INPUT[e.errno]}{where}"
        if e.errno in _OS_ENVIRONMENT:
            return 1, f"{_OS_ENVIRONMENT[e.errno]}{where}"
        return 1, f"{e.strerror or type(e).__name__}{where}"
    text = str(e)
    for needle, what in (("No space left on device", "no space left on device (disk full)"),
                         ("Read-only file system", "read-only file system")):
        if needle in text:  # e.g. safetensors' SafetensorError carries the OS error only in its text
            return 1, f"{what}: {_one_line(text)}"
    if isinstance(e, RuntimeError) and "probability tensor contains either" in text:
        # torch.multinomial on NaN/inf probabilities: the policy's weights diverged
        return 1, ("the model's next-token probabilities are not finite while sampling: its weights diverged "
                   "(lower optim.lr; resume from an earlier checkpoint)")
    if type(e).__name__ == "OutOfMemoryError" or isinstance(e, MemoryError):
        return 1, f"out of memory: {_one_line(e) or type(e).__name__} (smaller batch_size / max_new_tokens, or LoRA)"
    if isinstance(e, (ValueError, NotImplementedError)) and _raised_in_pofe(e):
        return 2, _one_line(e)
    if isinstance(e, RuntimeError) and _raised_in_pofe(e):
        return 1, _one_line(e)
    return 1, f"internal error: {type(e).__name__}: {_one_line(e)} (run with -v for the traceback)"


# ----------------------------------------------------------------------------- the group

class LazyGroup(TyperGroup):
    """The root group: commands imported on first use, errors turned into one line."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n.replace("_", "-") for n in present_commands()]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = cmd_name.replace("-", "_")
        if module not in present_commands():
            return None
        if self._listing:  # pofe --help: a stand-in carrying the short help, nothing imported
            return TyperCommand(cmd_name, short_help=_short_help(module), help=_short_help(module))
        if cmd_name not in self.commands:
            self.commands[cmd_name] = _load_command(module, cmd_name)
        return self.commands[cmd_name]

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            name, cmd, rest = super().resolve_command(ctx, args)
        except click.exceptions.UsageError as e:
            from difflib import get_close_matches

            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if matches and "Did you mean" not in e.message:
                e.message = f"{e.message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise
        if name is not None and name not in DATA_PARALLEL_COMMANDS and os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
            from pofe.runtime.guards import require_single_process

            # a group's subcommand by its path: "cai revise" runs, "cai refusal" is refused
            group = isinstance(cmd, TyperGroup) and rest and not rest[0].startswith("-")
            sub = f"{name} {rest[0]}" if group else name
            if sub not in DATA_PARALLEL_COMMANDS:
                require_single_process(sub)  # raises MultiProcessRefused -> exit 2, one line
        return name, cmd, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            _leave_group_if_worker()  # a finished torchrun process
            return result
        except (typer.Exit, typer.Abort, click.exceptions.ClickException, SystemExit) as e:
            # a command that reports its status by exiting (audit: 0 passed, 1 failed) is done too
            if isinstance(e, typer.Exit) and e.exit_code == 0:
                _leave_group_if_worker()
            raise
        except BaseException as e:  # noqa: BLE001 - the one place every error becomes one line
            code, message = describe_error(e)
            if code == 2:  # bad input: a fresh run folder with nothing computed in it is removed
                from pofe.cli.common import discard_unused_runs

                discard_unused_runs()
            from pofe.secrets import redact  # a message can quote a key a server or a library echoed

            if _state["verbose"]:
                sys.stderr.write(redact("".join(traceback.format_exception(e))))
            line = f"error: {redact(message)}"
            if _first_to_report(line):
                typer.echo(line, err=True)
            raise typer.Exit(code) from None


def _first_to_report(line: str) -> bool:
    """Whether this process prints ``line``: always, except under a launcher (torchrun, accelerate
    launch: ``TORCHELASTIC_RUN_ID`` set, ``WORLD_SIZE`` > 1), where the processes that fail with
    the same line print it once per machine (the first to claim it in a folder of this launch;
    a line of one process alone is always printed). The launcher is also handed the line as
    the failure's cause (``TORCHELASTIC_ERROR_FILE``), so its closing ChildFailedError summary
    shows pofe's line in place of "To enable traceback see ...": its own traceback follows, and
    the ``error:`` line above it is the cause."""
    import hashlib
    import json
    import tempfile
    import time

    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id or int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return True
    report = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if report:
        try:  # the schema torch.distributed.elastic's ErrorHandler writes
            Path(report).write_text(json.dumps({"message": {"message": line, "extraInfo": {
                "py_callstack": line, "timestamp": str(int(time.time()))}}}))
        except OSError:
            pass
    if report:  # torchrun's folder of this launch attempt (<log dir>/attempt_N/<rank>/error.json): shared by
        folder = Path(report).parent.parent / "pofe-errors"  # its local processes, new for each launch
    else:  # the run id alone can repeat across launches ("none"): the launcher's PID and port with it
        key = f"{run_id}:{os.getppid()}:{os.environ.get('MASTER_PORT', '')}"
        safe = hashlib.sha256(key.encode()).hexdigest()[:16]
        folder = Path(tempfile.gettempdir()) / f"pofe-errors-{os.getuid() if hasattr(os, 'getuid') else 0}-{safe}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(folder / hashlib.sha256(line.encode()).hexdigest(), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    except FileExistsError:
        return False
    except OSError:  # no writable temp folder: every process prints, as before
        return True
    return True


def _load_command(module: str, cmd_name: str) -> click.Command:
    mod = importlib.import_module(f"pofe.cli.{module}")
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    mod.register(sub)
    group = typer.main.get_group(sub)
    if cmd_name not in group.commands:
        raise RuntimeError(f"pofe/cli/{module}.py registers {sorted(group.commands)}, not {cmd_name!r}")
    from pofe.cli.helptext import tidy

    return tidy(group.commands[cmd_name], cmd_name)


app = typer.Typer(
    name="pofe",
    cls=LazyGroup,
    help="Preference optimisation from AI feedback: online DPO/IPO/SLiC (OAIF), self-rewarding LMs, RLAIF/CAI, judge audits.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pofe {__version__}")
        raise typer.Exit(0)


def _log_level(value: Optional[str]) -> Optional[str]:
    from pofe.cli.logs import LEVELS

    if value is not None and value.lower() not in LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LEVELS)}")
    return None if value is None else value.lower()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="Show the version."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging, and the traceback of an error."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors on stderr; no progress bars."),
    log_level: Optional[str] = typer.Option(None, "--log-level", metavar="debug|info|warning|error",
                                            callback=_log_level, help="Log level on stderr (default info)."),
) -> None:
    _state["verbose"] = verbose
    from pofe.cli.logs import configure

    configure(verbose=verbose, quiet=quiet, level=log_level)
    # Nothing is ever fetched from a model hub at run time unless the user opts in.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from pofe.secrets import install_log_redaction

    install_log_redaction()


def main() -> None:
    from pofe.preload import command_of, restart_with_tcmalloc

    restart_with_tcmalloc(command_of(sys.argv[1:]), sys.argv[1:])  # a model command on tcmalloc, when installed
    app()


if __name__ == "__main__":
    main()
