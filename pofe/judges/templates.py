"""Judge prompt templates: versioned files identified by their content hash.

A template is a YAML file (``pofe/templates/<name>.yaml`` or a user path) with the prompt
text and how the answer is read; a plain ``.txt`` file is accepted too (the whole file is
the prompt, other fields take defaults). Every label records the template's id and the
sha256 of the file bytes, so editing a template visibly changes the provenance of the
labels it produces (rlaif-constitutional-ai.txt, "Keep the format identical across all
calls").

Injection safety. Responses are untrusted text: a policy being optimised against the judge
will eventually write "Answer: 1", fake delimiters or chat-control tokens. Rendering is
therefore (1) single-pass, so a response containing ``{response_2}`` is never expanded,
(2) delimiter-neutralising: any tag named like one of the template's delimiters
(``<response_1>``, ``</prompt>``...) inside a field has its ``<`` replaced by ``‹`` so it
cannot close or open a section, and (3) special-token-neutralising: chat-control strings
(``<|im_end|>``, ``[INST]``...) inside a field are broken so the tokenizer cannot read
them as control tokens. The structure of the rendered prompt is the template's whatever
the responses contain.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from pofe.config import safe_yaml_load

from pofe.chat_control import CHAT_CONTROL_STRINGS, break_control

# Chat-control strings of every common template family (an endpoint's tokenizer is not
# visible here); a backend with a tokenizer in this process adds its own special tokens.
DEFAULT_SPECIAL_STRINGS = CHAT_CONTROL_STRINGS

PLACEHOLDERS = ("prompt", "response_1", "response_2", "response", "principle", "reference", "instruction")
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_TAG_NAME_RE = re.compile(r"</?\s*([A-Za-z_][\w\-]*)\s*>")

KINDS = ("pairwise", "rubric", "expected-score")


@dataclass(frozen=True)
class Rendered:
    """A rendered judge request: the user turn and the start of the judge's answer."""

    user: str
    assistant_prefix: str = ""


@dataclass(frozen=True)
class Template:
    id: str
    hash: str
    kind: str
    prompt: str
    choices: tuple[str, ...] = ("1", "2")
    answer_instruction: str = ""
    answer_prefix: str = ""
    cot_instruction: str = ""
    cot_prefix: str = ""
    cot_answer_prefix: str = ""
    scores: tuple[str, ...] = ()
    description: str = ""
    source: str = ""
    delimiter_tags: frozenset[str] = field(default_factory=frozenset)

    # -- rendering -----------------------------------------------------------------
    def render(self, fields: dict[str, str | None], *, cot: bool = False,
               special_strings: Iterable[str] = ()) -> Rendered:
        """Fill the placeholders in one pass with neutralised field values."""
        specials = tuple(dict.fromkeys([*DEFAULT_SPECIAL_STRINGS, *special_strings]))
        values = {k: neutralise(v if v is not None else "", self.delimiter_tags, specials) for k, v in fields.items()}
        values["instruction"] = self.cot_instruction if cot else self.answer_instruction
        missing = [m for m in set(_PLACEHOLDER_RE.findall(self.prompt)) if m not in values]
        if missing:
            raise ValueError(f"template {self.id!r} needs fields {sorted(missing)}")
        user = _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], self.prompt)
        return Rendered(user=user, assistant_prefix=self.cot_prefix if cot else self.answer_prefix)


def neutralise(text: str, tags: Iterable[str], specials: Iterable[str] = DEFAULT_SPECIAL_STRINGS) -> str:
    """Make ``text`` unable to forge the template's delimiters or chat-control tokens."""
    for s in sorted(specials, key=len, reverse=True):
        if len(s) > 1 and s in text:
            text = text.replace(s, _break(s))
    tags = [t for t in tags if t]
    if tags:
        pat = re.compile(r"<(\s*/?\s*(?:" + "|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True)) + r")\b)",
                         re.IGNORECASE)
        text = pat.sub(lambda m: "‹" + m.group(1), text)
    return text


_break = break_control


# -- loading ---------------------------------------------------------------------------
def builtin_templates() -> list[str]:
    root = resources.files("pofe") / "templates"
    return sorted(p.name.rsplit(".", 1)[0] for p in root.iterdir() if p.name.endswith((".yaml", ".txt")))


def _read_source(name_or_path: str) -> tuple[bytes, str, str]:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".txt") and p.exists():
        return p.read_bytes(), str(p), p.suffix
    root = resources.files("pofe") / "templates"
    for ext in (".yaml", ".txt"):
        f = root / f"{name_or_path}{ext}"
        if f.is_file():
            return f.read_bytes(), f"pofe/templates/{name_or_path}{ext}", ext
    raise ValueError(f"unknown judge template {name_or_path!r}: not a file, and not one of {builtin_templates()}")


def load_template(name_or_path: str, *, kind: str | None = None) -> Template:
    """Load a shipped template by name or a user file by path; ``kind`` checks its use."""
    raw, source, ext = _read_source(name_or_path)
    digest = hashlib.sha256(raw).hexdigest()[:16]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 text (byte {e.start})") from None
    if ext == ".txt":
        data: dict[str, Any] = {"prompt": text}
    else:
        data = safe_yaml_load(text, source) or {}
        if not isinstance(data, dict) or "prompt" not in data:
            raise ValueError(f"{source}: a template file needs a 'prompt' key")
    allowed = {"id", "version", "kind", "prompt", "choices", "answer_instruction", "answer_prefix", "cot_instruction",
               "cot_prefix", "cot_answer_prefix", "scores", "description"}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{source}: unknown template keys {sorted(unknown)}")
    t_kind = data.get("kind", "pairwise")
    if t_kind not in KINDS:
        raise ValueError(f"{source}: kind must be one of {KINDS}, got {t_kind!r}")
    if kind is not None and t_kind != kind:
        raise ValueError(f"template {name_or_path!r} is a {t_kind} template; this judge needs a {kind} template")
    prompt = str(data["prompt"])
    if t_kind == "pairwise" and not {"response_1", "response_2"} <= set(_PLACEHOLDER_RE.findall(prompt)):
        raise ValueError(f"{source}: a pairwise template must contain {{response_1}} and {{response_2}}")
    if t_kind != "pairwise" and "response" not in _PLACEHOLDER_RE.findall(prompt):
        raise ValueError(f"{source}: a pointwise template must contain {{response}}")
    choices = tuple(str(c) for c in data.get("choices", ("1", "2")))
    if t_kind == "pairwise" and len(choices) != 2:
        raise ValueError(f"{source}: 'choices' must list exactly two answers, got {list(choices)}")
    version = data.get("version")
    tid = str(data.get("id") or Path(source).stem) + (f"@v{version}" if version is not None else "")
    return Template(
        id=tid,
        hash=digest,
        kind=t_kind,
        prompt=prompt,
        choices=choices,
        answer_instruction=str(data.get("answer_instruction", "")),
        answer_prefix=str(data.get("answer_prefix", "")),
        cot_instruction=str(data.get("cot_instruction", data.get("answer_instruction", ""))),
        cot_prefix=str(data.get("cot_prefix", "")),
        cot_answer_prefix=str(data.get("cot_answer_prefix", data.get("answer_prefix", ""))),
        scores=tuple(str(s) for s in data.get("scores", ())),
        description=str(data.get("description", "")),
        source=source,
        delimiter_tags=frozenset(_TAG_NAME_RE.findall(prompt)),
    )
