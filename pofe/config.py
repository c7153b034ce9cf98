"""Typed configs: one pydantic model per command, loaded from YAML, overridable from the CLI.

Why pydantic with ``extra="forbid"``: a mistyped key (``judge.tempalte``) must be an
error that names the key, never silently dropped (TRL's ``fail_with_unknown_args=False``
is the counter-example in shared/docs/style-anchors.md).

Errors surface as :class:`ConfigError` with a one-line message naming the dotted key and
the file; the CLI turns it into exit status 2.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Iterable, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from pofe.errors import PofeError

T = TypeVar("T", bound="PofeConfig")


class ConfigError(PofeError):
    """A bad config: unknown key, wrong type, missing file. ``str(e)`` is one line."""

    exit_code = 2


class YAMLInputError(ConfigError, yaml.YAMLError):
    """A YAML text that cannot be loaded (malformed, a duplicated key, a ``!!python`` tag, an
    alias bomb); ``str(e)`` is one line naming the file and line. Also a ``yaml.YAMLError``, so
    code that already catches YAML errors keeps doing so. ``refused`` is True when the text
    parsed but is refused (not a mere syntax error)."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


# Bounds for every YAML text pofe loads (configs, judge templates, constitutions): aliases make
# a few hundred bytes expand to billions of nodes once walked (a "billion laughs" document),
# which exhausts memory long before any key is validated. Real configs use no aliases at all.
YAML_MAX_BYTES = 8 * 1024 * 1024
YAML_MAX_ALIASES = 100
YAML_MAX_NODES = 100_000


class _BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicated mapping keys (YAML says keys are unique;
    PyYAML silently keeps the last one) and documents that alias-expand beyond the bounds."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > YAML_MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.MarkedYAMLError(problem=f"more than {YAML_MAX_ALIASES} aliases (refused: an alias bomb?)",
                                           problem_mark=mark)
        return super().compose_node(parent, index)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # "<<: *base" then explicit keys: overriding merged keys is the point
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if first is not None:
                    raise yaml.MarkedYAMLError(problem=f"duplicated key {key!r} (first at line {first})",
                                               problem_mark=key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph that expands (aliases followed) to more than YAML_MAX_NODES nodes,
    or that refers to itself; counted once per distinct node, so the cost is the document's."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise yaml.MarkedYAMLError(problem="a recursive alias (a node that contains itself)",
                                       problem_mark=node.start_mark)
        active.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(size(x) for x in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        if n > YAML_MAX_NODES:
            raise yaml.MarkedYAMLError(problem=f"expands to more than {YAML_MAX_NODES} nodes through aliases "
                                               "(refused: an alias bomb?)", problem_mark=node.start_mark)
        sizes[key] = n
        return n

    size(root)


def safe_yaml_load(text: str | bytes, where: str) -> Any:
    """Load one YAML document like ``yaml.safe_load``, bounded (size, aliases, expansion) and
    strict (a duplicated key is an error). Every YAML text pofe reads goes through here.

    Raises:
        YAMLInputError: one line ``<where>[:line]: invalid YAML (<problem>)``.
    """
    if len(text) > YAML_MAX_BYTES:
        raise YAMLInputError(f"{where}: YAML text of {len(text)} bytes is over the {YAML_MAX_BYTES}-byte limit",
                             refused=True)
    loader = _BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise YAMLInputError(f"{where}: invalid YAML (nested too deeply)", refused=True) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        refused = not isinstance(e, (yaml.scanner.ScannerError, yaml.parser.ParserError))
        raise YAMLInputError(f"{where}{line}: invalid YAML ({' '.join(str(problem).split())})", refused=refused) from None
    finally:
        loader.dispose()


_NUMBER_TYPES = (int, float)


def _members(ann: Any) -> list[Any]:
    """The types a field annotation admits at its top level (Annotated, Optional and unions
    unwrapped)."""
    origin = typing.get_origin(ann)
    if origin is Annotated:
        return _members(typing.get_args(ann)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [m for a in typing.get_args(ann) for m in _members(a)]
    return [ann]


def _bool_for_number(ann: Any, value: Any) -> bool:
    """True when ``value`` is (or holds, in a list / tuple / dict field) a bool where the field
    takes a number and not a bool."""
    members = _members(ann)
    if any(m is Any or m is bool for m in members):
        return False
    if isinstance(value, bool):
        return any(m in _NUMBER_TYPES for m in members)
    if isinstance(value, (list, tuple, dict)):
        for m in members:
            origin, args = typing.get_origin(m), typing.get_args(m)
            if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
                elems = [a for a in args if a is not Ellipsis]
                if any(_bool_for_number(typing.Union[tuple(elems)] if len(elems) > 1 else elems[0], v)
                       for v in value):
                    return True
            if origin is dict and isinstance(value, dict) and len(args) == 2:
                if any(_bool_for_number(args[1], v) for v in value.values()):
                    return True
    return False


class PofeConfig(BaseModel):
    """Base for every config section: unknown keys are errors, assignments re-validated, and
    NaN / inf floats are refused everywhere (``allow_inf_nan=False``): a NaN temperature once
    passed a ``<= 0`` guard, because every comparison with NaN is False. A YAML ``true`` for a
    number is refused too: pydantic's lax mode reads it as 1 (``train.steps: true`` ran one
    step)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(),
                              allow_inf_nan=False, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_number(cls, data: Any) -> Any:
        # A model-level check, not a ``field_validator("*")``: pydantic allows no before-
        # validator on the ``kind`` fields that tag the judge unions. _format_error names the key.
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if field is not None and _bool_for_number(field.annotation, value):
                    raise PydanticCustomError("bool_for_number", "Input should be a number, not a boolean",
                                              {"field": name, "value": value})
        return data


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

# Upper bounds on sizes, refused when parsed: ``train.batch_size=2^63`` walked 2^63 batch positions
# (a hang with growing memory) and ``sampling.max_new_tokens=10^12`` generated past the model's
# context until killed. No step holds a million rows, and no model reads a million-token answer
# (pofe.generation also checks max_new_tokens against the loaded model's own context).
MAX_BATCH_SIZE = 1_000_000
MAX_NEW_TOKENS = 1_000_000
MAX_SEED = 2**63 - 1
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
"""Rows, prompts or sequences per batch: 1 to 1,000,000."""
NewTokens = Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)]
"""Tokens to generate: 1 to 1,000,000 (and at most the model's context, checked when it loads)."""
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
"""A seed: 0 to 2^63 - 1 (torch, numpy and Python all take it; ``seed=2^64`` was an internal error)."""


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    data = safe_yaml_load(text, str(path)) or {}
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
        value = safe_yaml_load(raw, f"--set {text}") if raw.strip() != "" else ""
    except YAMLInputError as e:
        if e.refused:  # a duplicated key, an alias bomb, a tag: never passed on as a string
            raise
        value = raw  # not YAML at all (``--set judge.prompt=a: b {``): the text itself
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


def _error_key(err: dict[str, Any], data: Any) -> str:
    """The dotted key of a validation error as the user wrote it: a tagged union (``judge:``,
    chosen by ``kind``) puts the tag in pydantic's loc (``judge.length.model``); drop it, and
    name ``<section>.kind`` when the tag itself is bad or missing."""
    parts, node = [], data
    for x in err["loc"]:
        if isinstance(node, dict) and x not in node and node.get("kind") == x:
            continue  # the union tag, not a key
        parts.append(str(x))
        if isinstance(node, list):  # a list of sections (a jury's members): follow the index
            node = node[x] if isinstance(x, int) and 0 <= x < len(node) else None
        else:
            node = node.get(x) if isinstance(node, dict) else None
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        parts.append("kind")
    if err["type"] == "bool_for_number":  # raised for the section: the key is in ctx
        parts.append(str(err["ctx"]["field"]))
    return ".".join(parts) or "<root>"


def _format_error(e: ValidationError, source: str, data: Any = None) -> str:
    err = dict(e.errors()[0])
    err["msg"] = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
    key = _error_key(err, data)
    if err["type"] == "union_tag_invalid":
        msg = f"bad value for '{key}': unknown kind {err['ctx']['tag']!r}; choose one of {err['ctx']['expected_tags']}"
    elif err["type"] == "union_tag_not_found":
        msg = f"missing required key '{key}'"
    elif err["type"] == "extra_forbidden":
        msg = f"unknown key '{key}'"
    elif err["type"] == "missing":
        msg = f"missing required key '{key}'"
    elif err["type"] == "bool_for_number":
        msg = f"bad value for '{key}': {err['msg']} (got {err['ctx']['value']!r})"
    elif isinstance(err.get("input"), (dict, list)):  # a whole section's check: its message names the keys,
        msg = f"bad value for '{key}': {err['msg']}"    # and the section's every value would bury it
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
        bad = _error_key(e.errors()[0], data)
        origin = source
        for text in overrides:
            k = text.split("=", 1)[0].strip()
            if k == bad or bad.startswith(k + ".") or k.startswith(bad + "."):
                origin = f"--set {text}"
        for k in extra or {}:
            if k == bad or bad.startswith(k + ".") or k.startswith(bad + "."):
                origin = f"option {k}"
        raise ConfigError(_format_error(e, origin, data)) from None


def config_from_dict(cls: type[T], values: Mapping[str, Any], source: str = "config") -> T:
    """Build ``cls`` from a mapping -- the Python API's config (``pofe.run("sft", {...})``):
    nested sections and dotted keys (``{"train.steps": 2}``, as ``--set`` writes them), over the
    class defaults as :func:`load_config` merges a YAML file.

    Raises:
        ConfigError: ``<source>: unknown key 'train.stpes'``, as for a file.
    """
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: expected a mapping of keys, got {type(values).__name__}")
    for key in values:
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{source}: keys are dotted names such as 'train.steps', got {key!r}")
    data: dict[str, Any] = {}
    # whole sections first, then dotted keys into them: {"judge.prefer": ..., "judge": {...}} keeps both
    for key, value in sorted(values.items(), key=lambda kv: "." in kv[0]):
        # a copy: the merge below must not write the defaults into the caller's own dicts
        _set_path(data, key.split("."), copy.deepcopy(value), f"{source} key {key!r}")
    data = _merge(_defaults(cls), data)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_error(e, source, data)) from None


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
        # A section whose ``kind`` changes (judge: llm -> length) starts from the new kind's
        # own defaults: the old kind's settings are not keys of the new one.
        if isinstance(v, dict) and isinstance(out.get(k), dict) and v.get("kind", out[k].get("kind")) == out[k].get("kind"):
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
