"""Typed configs: one pydantic model per command, loaded from YAML, overridable from the CLI.

Why pydantic with ``extra="forbid"``: a mistyped key (``judge.tempalte``) must be an
error that names the key, never silently dropped (TRL's ``fail_with_unknown_args=False``
is the counter-example in shared/docs/style-anchors.md).

Errors surface as :class:`ConfigError` with a one-line message naming the dotted key and
the file; the CLI turns it into exit status 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Iterable, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

T = TypeVar("T", bound="PofeConfig")


class ConfigError(Exception):
    """A bad config: unknown key, wrong type, missing file. ``str(e)`` is one line."""


class PofeConfig(BaseModel):
    """Base for every config section: unknown keys are errors, assignments re-validated, and
    NaN / inf floats are refused everywhere (``allow_inf_nan=False``): a NaN temperature once
    passed a ``<= 0`` guard, because every comparison with NaN is False."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(),
                              allow_inf_nan=False, use_attribute_docstrings=True)


# Typed fields for ranges every command needs; ``Field`` constraints make pydantic's error name
# the key (``bad value for 'loss.beta': Input should be greater than 0``), at parse time,
# before any model loads.
PositiveInt = Annotated[int, Field(ge=1)]
"""An integer >= 1 (counts, steps, batch sizes, chunk sizes)."""
NonNegativeInt = Annotated[int, Field(ge=0)]
"""An integer >= 0 (limits, warm-up steps, ``every``-style periods where 0 = off)."""
PositiveFloat = Annotated[float, Field(gt=0)]
"""A finite float > 0 (learning rates, beta, KL coefficients)."""
NonNegativeFloat = Annotated[float, Field(ge=0)]
"""A finite float >= 0 (temperatures, weight decay, dropout-like rates without an upper bound)."""
Probability = Annotated[float, Field(ge=0, le=1)]
"""A probability in [0, 1]."""


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML (so ``3``, ``true``, ``[1, 2]`` work)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. --set judge.template=helpful-short")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _set_path(data: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    cur = data
    for i, part in enumerate(path[:-1]):
        nxt = cur.get(part)
        if nxt is None:
            nxt = {}
            cur[part] = nxt
        elif not isinstance(nxt, dict):
            raise ConfigError(f"{origin}: {'.'.join(path[: i + 1])} is not a section, cannot set {'.'.join(path)}")
        cur = nxt
    cur[path[-1]] = value


def _format_error(e: ValidationError, source: str) -> str:
    err = e.errors()[0]
    key = ".".join(str(x) for x in err["loc"]) or "<root>"
    if err["type"] == "extra_forbidden":
        msg = f"unknown key '{key}'"
    elif err["type"] == "missing":
        msg = f"missing required key '{key}'"
    else:
        msg = f"bad value for '{key}': {err['msg']} (got {err.get('input')!r})"
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{source}: {msg}{more}"


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    extra: dict[str, Any] | None = None,
) -> T:
    """Build ``cls`` from an optional YAML file, then ``--set`` overrides, then ``extra``.

    Raises:
        ConfigError: naming the dotted key and the file (or ``--set``) it came from.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data = _read_yaml(Path(path))
        source = str(path)
    overrides = list(overrides)
    for text in overrides:
        keypath, value = parse_override(text)
        _set_path(data, keypath, value, f"--set {text}")
    for k, v in (extra or {}).items():
        _set_path(data, k.split("."), v, f"option {k}")
    data = _merge(_defaults(cls), data)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        # Name where the bad key came from: a --set override if it touched that key.
        bad = ".".join(str(x) for x in e.errors()[0]["loc"])
        origin = source
        for text in overrides:
            if text.split("=", 1)[0].strip() == bad or bad.startswith(text.split("=", 1)[0].strip() + "."):
                origin = f"--set {text}"
        raise ConfigError(_format_error(e, origin)) from None


def _defaults(cls: type[PofeConfig]) -> dict[str, Any]:
    """The class's defaults as a nested dict, or {} when it has required fields.

    Why: a section whose default is a customised instance (``optim: OptimConfig =
    OptimConfig(lr=1e-5, warmup_steps=0)``) must keep those values when a YAML file or
    ``--set optim.lr=...`` changes one key of it; validating the partial dict alone would
    rebuild the section from the class defaults and silently drop them.
    """
    try:
        return cls().model_dump(mode="python", round_trip=True)
    except ValidationError:
        return {}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def dump_config(cfg: BaseModel, *, comments: bool = False) -> str:
    """The resolved config as YAML (what run folders store). With ``comments`` (what
    ``--print-config`` prints) each key is preceded by its field docstring as a ``#`` comment,
    so the printed config documents itself; the YAML loads back to the same config either way."""
    if not comments:
        return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    return "".join(_commented(cfg, 0))


def _commented(cfg: BaseModel, indent: int) -> Iterable[str]:
    pad = " " * indent
    data = cfg.model_dump(mode="json")
    for name, info in type(cfg).model_fields.items():
        for line in (info.description or "").strip().splitlines():
            yield f"{pad}# {line.strip()}".rstrip() + "\n"
        value = getattr(cfg, name)
        if isinstance(value, BaseModel) and type(value).model_fields:
            yield f"{pad}{name}:\n"
            yield from _commented(value, indent + 2)
        else:
            text = yaml.safe_dump({name: data[name]}, sort_keys=False)
            yield "".join(f"{pad}{line}\n" for line in text.splitlines())
