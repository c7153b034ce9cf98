"""What a command writes besides its own output: the log level (``-v``, ``--log-level``,
``--quiet``), progress bars, and libraries that write to stdout.

Set up by the root callback, before a command imports torch or transformers (both read
their progress-bar switches when they load). stdout is a command's own: its text, or its JSON
alone under ``--json`` (:func:`pofe.cli.common.json_only_stdout`).
"""

from __future__ import annotations

import logging
import os

LEVELS = ("debug", "info", "warning", "error")

# Libraries whose INFO lines are chatter to a pofe user (request lines, load notes).
NOISY = ("httpx", "urllib3", "transformers", "accelerate")

# Libraries that log through a handler of their own bound to stdout, not through the root logger.
STDOUT_LOGGERS = ("DeepSpeed",)


class _ToRootLogger(logging.Filter):
    """A library logger's records through the root logger's handlers (stderr, pofe's format and
    level) instead of its own stdout handler. DeepSpeed, installed beside vLLM and imported under
    accelerate, logs "Setting accelerator to CPU" to stdout at import: the first line of
    ``pofe online --json``'s output, before the JSON."""

    def filter(self, record: logging.LogRecord) -> bool:
        root = logging.getLogger()
        if record.levelno >= root.getEffectiveLevel():
            root.handle(record)
        return False  # never its own handler's


def configure(*, verbose: bool = False, quiet: bool = False, level: str | None = None) -> None:
    """The root logger's level and format; quiet: warnings and errors only, no progress bars."""
    chosen = "debug" if verbose else level or ("warning" if quiet else "info")
    logging.basicConfig(level=getattr(logging, chosen.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger().setLevel(getattr(logging, chosen.upper()))  # basicConfig keeps an earlier level
    for name in NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    for name in STDOUT_LOGGERS:
        lib = logging.getLogger(name)
        if not any(isinstance(f, _ToRootLogger) for f in lib.filters):
            lib.addFilter(_ToRootLogger())
    if quiet:
        # read when tqdm bars are made and when huggingface_hub loads (transformers' "Loading
        # weights" / "Writing model shards" bars, pofe's step bar)
        os.environ["TQDM_DISABLE"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
