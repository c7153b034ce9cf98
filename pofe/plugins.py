"""Plugins: judge kinds, judge backends, losses and RL rewards from other installed packages.

A package adds one by declaring a Python entry point (``[project.entry-points."pofe.losses"]``
in its ``pyproject.toml``) in one of :data:`GROUPS`; the entry point's name is the name a
config uses (``loss.name``, ``judge.kind``, ...). Each lookup tries pofe's own name -> object
map first and reads the entry points only for a name that is not there, so ``pofe --help``
and every run that uses built-in names never imports a plugin. Once read, a group is cached
for the process.

Refused, never skipped: a plugin named like a built-in (the built-in would silently win, or
worse, the plugin would), two packages with the same name in one group, and a plugin whose
import fails (the error names the entry point and the package that declared it).

This module imports nothing heavy (the CLI validates configs with it before any model loads).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from pofe.config import ConfigError

GROUPS: dict[str, str] = {
    "pofe.judges": "judge kind",
    "pofe.judge_backends": "judge backend",
    "pofe.losses": "loss",
    "pofe.rm_losses": "reward-model loss",
    "pofe.rewards": "reward function",
}
"""Entry-point group -> what its plugins are (the words error messages use)."""


class PluginError(ConfigError, ValueError):
    """A plugin that cannot be used: not installed under that name, named like a built-in or
    like another package's plugin, failing to import, or not keeping its group's contract.
    ``str(e)`` is one line; exit 2 (a ValueError too, like every unknown-name error before)."""


class PluginCallError(PluginError):
    """A plugin that raised, exited or broke its contract while it ran (a judge's second batch,
    a loss): one line naming the plugin and its package; exit 1 (the run failed, its input was
    fine). What the run wrote before stays."""

    exit_code = 1


def _check_group(group: str) -> None:
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; one of {sorted(GROUPS)}")


def _origin(ep) -> str:
    dist = getattr(ep, "dist", None)
    package = f"{dist.name} {dist.version}" if dist is not None else "an unknown package"
    return f"entry point '{ep.name} = {ep.value}' in group {ep.group} of package {package}"


@functools.cache
def _entry_points(group: str) -> dict[str, Any]:
    """name -> EntryPoint of the group (metadata only: nothing is imported)."""
    from importlib.metadata import entry_points

    _check_group(group)
    out: dict[str, Any] = {}
    for ep in entry_points(group=group):
        if ep.name in out and out[ep.name].value != ep.value:
            raise PluginError(f"two {GROUPS[group]} plugins are named {ep.name!r}: {_origin(out[ep.name])} and "
                              f"{_origin(ep)}; uninstall one")
        out.setdefault(ep.name, ep)
    return out


def plugin_names(group: str) -> list[str]:
    """The names the group's installed plugins declare, sorted (nothing is imported)."""
    return sorted(_entry_points(group))


def package_of(group: str, name: str) -> str | None:
    """``"<distribution> <version>"`` of the package declaring plugin ``name`` (None: not a plugin)."""
    ep = _entry_points(group).get(name)
    dist = getattr(ep, "dist", None)
    return None if ep is None else f"{dist.name} {dist.version}" if dist is not None else "?"


def _failure(e: BaseException) -> str:
    """What a plugin did, in a few words: ``sys.exit(0)`` in a plugin is an exit, not a success
    of pofe's (it made ``pofe judge`` exit 0 with nothing written)."""
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    detail = " ".join(str(e).split())
    return f"{type(e).__name__}: {detail}" if detail else type(e).__name__


@functools.cache
def load_group(group: str) -> dict[str, object]:
    """name -> loaded object for every plugin of ``group`` (cached). A plugin that fails to
    import, or exits while importing, raises :class:`PluginError` naming its entry point and
    package."""
    out: dict[str, object] = {}
    for name, ep in _entry_points(group).items():
        try:
            out[name] = ep.load()
        except (Exception, SystemExit) as e:  # any failure of a plugin's import is reported as the plugin's
            raise PluginError(f"{GROUPS[group]} plugin {name!r} failed to import ({_origin(ep)}): {_failure(e)}") from e
    return out


def plugin_label(group: str, name: str) -> str:
    """``judge kind plugin 'x' (package pofe-x 0.1)``: how a message names a plugin."""
    return f"{GROUPS[group]} plugin {name!r} (package {package_of(group, name) or '?'})"


def call_error(group: str, name: str, what: str, e: BaseException | None = None) -> PluginCallError:
    """The one line for plugin ``name`` failing in ``what`` (raising or exiting: ``e``; else ``what``
    says how it broke its contract)."""
    return PluginCallError(f"{plugin_label(group, name)} failed {what}" + (f": {_failure(e)}" if e is not None else ""))


def contained(group: str, name: str, fn: Callable) -> Callable:
    """``fn`` (a plugin's function), with what it raises or an exit turned into one line naming
    the plugin and its package (:class:`PluginCallError`). ``functools.wraps``: its attributes
    and signature stay readable (a loss's ``default_beta``)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PluginError:
            raise
        except (Exception, SystemExit) as e:
            raise call_error(group, name, "when called", e) from e

    return call


def clear_cache() -> None:
    """Forget what was read (tests that install or remove a plugin in the running process)."""
    _entry_points.cache_clear()
    load_group.cache_clear()


def _check_collisions(group: str, builtin: Iterable[str]) -> None:
    eps = _entry_points(group)
    for name in sorted(set(eps) & set(builtin)):
        raise PluginError(f"{GROUPS[group]} plugin {name!r} ({_origin(eps[name])}) has the name of pofe's built-in "
                          f"{GROUPS[group]} {name!r}; a plugin cannot replace a built-in: rename it")


def known_names(group: str, builtin: Iterable[str]) -> list[str]:
    """Built-in names, then the plugins' (what an unknown-name error lists)."""
    builtin = list(builtin)
    _check_collisions(group, builtin)
    return sorted(builtin) + plugin_names(group)


def unknown_message(group: str, name: Any, builtin: Iterable[str]) -> str:
    return f"unknown {GROUPS[group]} {name!r}; choose one of {known_names(group, builtin)}"


def is_plugin(group: str, name: Any, builtin: Iterable[str]) -> bool:
    """``name`` is not built in and an installed plugin declares it (nothing is imported)."""
    builtin = list(builtin)
    if not isinstance(name, str) or name in builtin:
        return False
    _check_collisions(group, builtin)
    return name in _entry_points(group)


def lookup(group: str, name: str, builtin: dict[str, Any]) -> Any:
    """``builtin[name]``, else the plugin of that name (imported now); an unknown name raises
    :class:`PluginError` listing every known name."""
    if name in builtin:
        return builtin[name]
    if not is_plugin(group, name, builtin):
        raise PluginError(unknown_message(group, name, builtin))
    return load_group(group)[name]


def name_validator(group: str, builtin: Callable[[], Iterable[str]] | Iterable[str],
                   check: Callable[[str, Any], None] | None = None) -> Callable[[Any], Any]:
    """A pydantic after-validator for a config field naming a member of ``group``: built-in
    names pass untouched; a plugin name is loaded (so a broken plugin fails when the config is
    parsed, before any model loads) and given to ``check(name, obj)``, which raises
    :class:`PluginError` when the object breaks the group's contract; anything else is an
    error naming the key and listing every known name. ``builtin`` may be a function, for maps
    defined after the field."""

    def validate(v: Any) -> Any:
        from pydantic_core import PydanticCustomError

        names = list(builtin() if callable(builtin) else builtin)
        if v in names:
            return v
        try:
            if not is_plugin(group, v, names):
                raise PluginError(unknown_message(group, v, names))
            obj = load_group(group)[v]
            if check is not None:
                check(v, obj)
        except PluginError as e:
            # a custom error type, not ValueError: the message is the whole error, without "Value error, "
            raise PydanticCustomError("unknown_name", "{message}", {"message": str(e)}) from None
        return v

    return validate
