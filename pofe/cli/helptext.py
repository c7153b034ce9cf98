"""``--help`` in plain words: no reStructuredText from the docstrings it is read from
(````pofe cai revise````, ``:mod:`...```), value names instead of Python types (``<bool>`` on
a flag, ``<list[str]>`` on a repeatable option), the judge kinds by name, and a ``--set``
example each command accepts.

:func:`tidy` rewrites a loaded command (and a group's subcommands) before click formats it;
:func:`install` makes the type column say ``TEXT`` / ``INTEGER`` / ``PATH`` / the choices, and
nothing for a flag, which takes no value.
"""

from __future__ import annotations

import re
from typing import Any

# ``x`` -> x; :mod:`x` / :func:`~a.b` -> x / b
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")

SET_EXAMPLES = {
    "online": "train.steps=50",
    "self-reward": "iterations=2",
    "sft": "optim.lr=0.00001",
    "judge": "judge.template=helpful-short",
    "label": "judge.template=helpful-short",
    "rm": "train.steps=100",
    "rl": "algo=grpo",
    "cai revise": "rounds=2",
    "cai refusal": "data.max_prompts=20",
    "annotate": "port=8765",
    "audit": "thresholds.min_agreement=0.7",
    "eval": "judge.template=helpful-short",
    "sim": "seed=1",
    "chat": "sampling.max_new_tokens=64",
    "export": "format=alpaca_eval",
}
"""One ``--set KEY=VALUE`` per command (``tests/cli`` checks each key is one its config has)."""


def plain(text: str | None) -> str | None:
    """``text`` without reStructuredText roles and literals."""
    if not text:
        return text
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return _LITERAL.sub(r"\1", text)


def judge_kinds_help() -> str:
    """The ``--judge`` option's help: every built-in kind by name."""
    from pofe.judges.config import KINDS  # config classes only: no torch

    return f"Judge kind (judge.kind): {', '.join(KINDS)}, or an installed plugin's."


def tidy(cmd: Any, path: str) -> Any:
    """``cmd``'s help, its options' help and its subcommands' in plain words; its ``--set``
    example one that ``path`` (``online``, ``cai revise``) accepts."""
    cmd.help, cmd.short_help = plain(cmd.help), plain(cmd.short_help)
    for p in getattr(cmd, "params", []):
        if getattr(p, "help", None):
            p.help = plain(p.help)
        if "--set" in getattr(p, "opts", ()) and path in SET_EXAMPLES:
            p.help = f"Override a config key, e.g. --set {SET_EXAMPLES[path]} (repeatable; --print-config lists them)."
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        tidy(sub, f"{path} {name}")
    return cmd


_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "int range": "INTEGER", "float range": "NUMBER"}


def _value_name(self, ctx) -> str | None:
    if getattr(self, "metavar", None) is not None and not getattr(self, "_is_argument", False):
        return self.metavar
    if getattr(self, "is_flag", False):
        return None  # a flag takes no value
    label = self.display_type(ctx)
    label = label[1:-1] if label.startswith("<") and label.endswith(">") else label
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]  # a repeatable option or a variadic argument: one value's name
    return label if "|" in label else _WORDS.get(label, label.upper())


def install() -> None:
    """Plain value names in every command's type column (typer >= 0.20 shows Python types)."""
    from typer import core

    for cls in (getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)):
        if cls is not None and hasattr(cls, "display_type_rich") and cls.display_type_rich is not _value_name:
            cls.display_type_rich = _value_name
    if hasattr(core, "TyperArgument"):
        core.TyperArgument._is_argument = True  # its metavar is its name, already in the name column
