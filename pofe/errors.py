"""The one base class of every error pofe reports to a user.

A :class:`PofeError` carries the process exit status the CLI ends with, so the one handler
in ``pofe.cli.main`` prints ``error: <first line of str(e)>`` and exits ``e.exit_code``
without knowing any subclass:

* ``2`` -- bad input: a config key, a data file, a run folder, a model name, a setup that is
  refused (a failed judge audit, several processes for a single-process command). Running
  it again unchanged fails again; the user has to change what they gave.
* ``1`` -- the environment or the run itself failed: an unreachable endpoint, a device that
  is not there, a full disk, a loss or weights that stopped being finite. The same input can
  succeed another time or elsewhere.

A leaf module: it imports nothing from pofe, so any module can raise these.
"""

from __future__ import annotations


class PofeError(Exception):
    """An error meant for the user: ``str(e)`` is one line naming the key, file or thing at
    fault; ``exit_code`` is 2 for bad input, 1 for an environment or run failure."""

    exit_code: int = 1


class ModelError(PofeError):
    """A model name that names nothing loadable (typo, missing folder, not on the hub, hub
    offline), or a model folder that cannot be trusted (a torn or missing file, weights that do not
    fit its config, a non-causal architecture, a chat template that fails or does not finish).
    ``str(e)`` is one line naming the file; the CLI exits 2 with it."""

    exit_code = 2


class DataError(PofeError, ValueError):
    """An input that cannot be read; ``str(e)`` is one line naming the file, the line or row,
    and the field. (A ``ValueError`` so callers that report bad input with exit 2 catch it.)"""

    exit_code = 2
