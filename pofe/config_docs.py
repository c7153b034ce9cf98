"""``docs/config.md``: every command's config keys, generated from the config classes (the
field docstrings are the documentation), so the page cannot drift from the code.

    python -m pofe.config_docs > docs/config.md

``tests/project/test_config_keys.py`` checks that the committed page equals :func:`render` and that the
shared sections carry the same keys and classes in every command.
"""

from __future__ import annotations

import importlib
import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# command -> "module:ConfigClass" (the class its CLI validates the YAML and --set against)
COMMANDS: dict[str, str] = {
    "online": "pofe.loops.online:OnlineConfig",
    "sft": "pofe.loops.sft:SFTConfig",
    "rm": "pofe.loops.rm:RMConfig",
    "rl": "pofe.loops.rl:RLConfig",
    "self-reward": "pofe.loops.self_reward:SelfRewardConfig",
    "label": "pofe.loops.label:LabelConfig",
    "cai revise": "pofe.loops.cai_revise:CaiReviseConfig",
    "cai refusal": "pofe.loops.cai_refusal:RefusalEvalConfig",
    "judge": "pofe.loops.judge:JudgeCommandConfig",
    "audit": "pofe.evaluation.audit.config:AuditConfig",
    "eval": "pofe.evaluation.eval:EvalConfig",
    "annotate": "pofe.annotate.server:AnnotateConfig",
    "sim": "pofe.evaluation.sim:SimConfig",
    "chat": "pofe.loops.chat:ChatConfig",
    "export": "pofe.loops.export:ExportConfig",
}

TRAINING_COMMANDS = ("online", "sft", "rm", "rl", "self-reward", "label", "cai revise")
"""The commands that run on the one driver (:mod:`pofe.recipe`)."""


def config_class(command: str) -> type[BaseModel]:
    module, _, name = COMMANDS[command].partition(":")
    return getattr(importlib.import_module(module), name)


def _section(annotation: Any) -> type[BaseModel] | None:
    """The config class of a nested section (``X`` or ``X | None``), or None for a plain value
    or a union of several classes (the judge kinds, documented by kind elsewhere)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(models) == 1 and isinstance(models[0], type) and issubclass(models[0], BaseModel):
            return models[0]
    return None


def _members(annotation: Any) -> list[Any]:
    """Every type inside ``annotation`` (Optional, Union and Annotated unwrapped)."""
    args = typing.get_args(annotation)
    return [annotation] if not args else [m for a in args for m in _members(a)]


def _type_name(annotation: Any) -> str:
    from pofe.judges.config import _JudgeKind

    # The judge union is a discriminated union of the kinds' configs whose repr carries validator
    # function addresses (different on every run): name it by what a user writes instead.
    members = _members(annotation)
    if any(isinstance(m, type) and issubclass(m, _JudgeKind) for m in members):
        kind = "judge (a section with `kind`: one of the judge kinds)"
        return f"{kind} or null" if type(None) in members else kind
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    for noise in ("pofe.judges.config.", "pofe.generation.sampling.", "Annotated[", "pathlib."):
        text = text.replace(noise, "")
    return text


def _default(field) -> str:
    if field.default is PydanticUndefined:
        return "(required)" if field.default_factory is None else json.dumps(field.default_factory(), default=str)
    d = field.default
    if isinstance(d, BaseModel):
        return "(section)"
    return json.dumps(d, default=str)


def keys(cls: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every key of ``cls``, sections expanded in place."""
    rows = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}{name}"
        doc = " ".join((field.description or "").split())
        sub = _section(field.annotation)
        if sub is not None:
            rows.append((key, sub.__name__, "(section)", doc))
            rows += keys(sub, prefix=f"{key}.")
        else:
            rows.append((key, _type_name(field.annotation), _default(field), doc))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    out = ["# Config keys of every command", "",
           "Generated from the config classes by `python -m pofe.config_docs > docs/config.md`; a test keeps it",
           "current. Every key can be set in the YAML given to `--config` or with `--set KEY=VALUE`; an unknown,",
           "mistyped or inapplicable key is an error naming it, raised before any model loads.", "",
           "Shared sections carry the same keys in every command: `model`, `data` (the inputs: `data.prompts`,",
           "`data.max_prompts`, ...), `eval`, `train` (`steps`, `batch_size`, `grad_accum`, `precision`), `optim`,",
           "`checkpoint` (`every`, `keep_last`), `labels` (`drop_inconsistent`, `min_margin`, `calibration`),",
           "`log`, `run`, `seed`.", ""]
    for command in COMMANDS:
        cls = config_class(command)
        out += [f"## pofe {command}", "", f"`{COMMANDS[command]}`", "", "| key | type | default | description |",
                "|---|---|---|---|"]
        out += [f"| `{k}` | {_cell(t)} | {_cell(d)} | {_cell(doc)} |" for k, t, d, doc in keys(cls)]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
