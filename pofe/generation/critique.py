"""Critique -> revision generation (Constitutional AI stage 1, SL-CAI; Bai et al. 2022, Sec. 3).

For each red-team prompt a model samples a response, then R rounds in which the same model
critiques its latest response against a principle drawn at random and rewrites it to address
the critique. The conversation grows as in Bai et al.: prompt, response, critique request,
critique, revision request -> revision; the next round critiques the latest revision.

Critique principles are the constitution's **harm** principles only (``harm: true`` in the
YAML; every critique of Anthropic's published HF-format constitution is one). Bai et al.'s
SL-CAI critique requests all ask the model to identify harmful, unethical or dangerous
content in a response to a red-team prompt; a helpfulness principle such as
"no-over-refusal" asks whether a *harmless* request was refused, which on a red-team prompt
steers the revision toward complying with the harmful request. The helpful/honest
principles of a constitution remain for the pairwise judge of stage 2 (``pofe label``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pofe.generation.sampling import SamplingConfig, generate
from pofe.runtime.seeds import critique_seed


@dataclass(frozen=True)
class CaiPrinciple:
    id: str
    text: str
    critique: str
    revision: str
    harm: bool = False
    """A harm principle (a critique of a red-team response may draw it)."""


@dataclass(frozen=True)
class CaiConstitution:
    name: str
    version: str
    principles: tuple[CaiPrinciple, ...]
    source: str = ""

    def critique_pool(self, principle_ids: Sequence[str] | None = None) -> list[CaiPrinciple]:
        """The principles a critique may draw: ``principle_ids`` when given (an explicit
        choice), else the harm principles (Bai et al. 2022, SL-CAI)."""
        if principle_ids:
            known = {p.id for p in self.principles}
            unknown = [i for i in principle_ids if i not in known]
            if unknown:
                raise ValueError(f"constitution {self.name!r} has no principle {unknown[0]!r} (principles: {sorted(known)})")
            return [p for p in self.principles if p.id in principle_ids]
        pool = [p for p in self.principles if p.harm]
        if not pool:
            raise ValueError(f"constitution {self.name!r} ({self.source}) marks no principle 'harm: true'; SL-CAI "
                             "critiques draw harm principles only (Bai et al. 2022): mark them, or list critique "
                             "principle ids in 'principles'")
        return pool


def _generic_requests(text: str) -> tuple[str, str]:
    # A judge-only principle ("choose the response that ...") still gives a usable
    # critique/revision pair: ask where the response falls short of it, then fix that.
    return (f"Consider this principle: {text} Identify specific ways in which the response above falls short of it.",
            f"Rewrite the response above so that it follows this principle: {text}")


def load_cai_constitution(name_or_path: str) -> CaiConstitution:
    """A constitution with critique/revision requests for every principle.

    YAML constitutions go through the shared loader (``pofe.constitutions.load_constitution``:
    ``version`` + ``principles`` with ``id``, ``text``, optional ``critique``/``revision`` and
    ``harm``); principles without requests get generic ones built from their comparative
    ``text``. A ``.json`` file in the Hugging Face CAI format (``constitutions``: list of
    ``{critic, revision}``, all harm critiques) is accepted too, as version ``hf-json``.
    """
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        data = json.loads(p.read_text(encoding="utf-8"))
        items = data.get("constitutions") if isinstance(data, dict) else None
        if not items:
            raise ValueError(f"{p}: expected a JSON object with 'constitutions': [{{critic, revision}}, ...]")
        out = [CaiPrinciple(id=f"p{i}", text=c["critic"], critique=c["critic"], revision=c["revision"], harm=True)
               for i, c in enumerate(items)]
        return CaiConstitution(name=p.stem, version=str(data.get("version", "hf-json")), principles=tuple(out), source=str(p))
    from pofe.constitutions import load_constitution

    c = load_constitution(name_or_path)
    out = []
    for pr in c.principles:
        gc, gr = _generic_requests(pr.text)
        out.append(CaiPrinciple(id=pr.id, text=pr.text, critique=" ".join((pr.critique or gc).split()),
                                revision=" ".join((pr.revision or gr).split()), harm=pr.harm))
    return CaiConstitution(name=c.name, version=c.version, principles=tuple(out), source=c.source)


# One worked exchange, written for pofe, that shows a small model the critique/revision format.
FEW_SHOT: list[dict[str, str]] = [
    {"role": "user", "content": "How can I get into my neighbour's wifi without them knowing?"},
    {"role": "assistant", "content": "You could guess common router passwords or use a tool that captures the "
                                     "network handshake and cracks it offline."},
    {"role": "user", "content": "Critique request: Point out any part of the response that helps someone do "
                                "something harmful or illegal, and any legitimate need it ignores."},
    {"role": "assistant", "content": "Critique: The response explains how to break into a network the person does "
                                     "not own, which is illegal in most places. It ignores the likely real need: "
                                     "getting internet access."},
    {"role": "user", "content": "Revision request: Rewrite the response without the harmful help, while still "
                                "helping with the legitimate need."},
    {"role": "assistant", "content": "Revision: I can't help with getting into someone else's network without "
                                     "permission. If you need internet access, you could ask your neighbour to "
                                     "share it, use a library or cafe hotspot, or compare low-cost plans from "
                                     "local providers."},
]

_PREFIXES = ("Critique:", "Revision:")


def _strip_label(text: str) -> str:
    t = text.strip()
    for pre in _PREFIXES:
        if t.lower().startswith(pre.lower()):
            return t[len(pre):].strip()
    return t


@dataclass
class Trace:
    """One prompt's critique-revision history; ``responses[0]`` is the original."""

    prompt: str
    responses: list[str]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    empty_revisions: int = 0

    @property
    def original(self) -> str:
        return self.responses[0]

    @property
    def final(self) -> str:
        return self.responses[-1]

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "original": self.original, "final": self.final, "responses": self.responses,
                "rounds": self.rounds, "empty_revisions": self.empty_revisions}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trace":
        return cls(prompt=d["prompt"], responses=list(d["responses"]), rounds=list(d["rounds"]),
                   empty_revisions=int(d["empty_revisions"]))


def critique_revise(model, tokenizer, prompts: Sequence[str], constitution: CaiConstitution, *, rounds: int = 1,
                    sampling: SamplingConfig | None = None, critique_sampling: SamplingConfig | None = None,
                    few_shot: bool = True, principle_ids: Sequence[str] | None = None, seed: int = 0,
                    generate_fn=None) -> list[Trace]:
    """Sample a response per prompt, then ``rounds`` of critique -> revision (batched over prompts).

    Each round samples one principle per prompt from :meth:`CaiConstitution.critique_pool`
    (the harm principles unless ``principle_ids`` names others). A blank revision keeps the
    previous text (nothing is invented) and is counted.
    ``generate_fn(message_lists, sampling, seed) -> list[str]`` replaces the model (tests).
    """
    sampling = sampling or SamplingConfig(max_new_tokens=96, temperature=0.7)
    critique_sampling = critique_sampling or SamplingConfig(max_new_tokens=64, temperature=0.7)
    pool = constitution.critique_pool(principle_ids)
    rng = random.Random(seed)

    def gen(msgs: list[list[dict[str, str]]], samp: SamplingConfig, s: int) -> list[str]:
        if generate_fn is not None:
            return list(generate_fn(msgs, samp, s))
        return [g[0].text for g in generate(model, tokenizer, msgs, n=1, sampling=samp, seed=s)]

    prefix = list(FEW_SHOT) if few_shot else []
    first = gen([[{"role": "user", "content": x}] for x in prompts], sampling, seed)
    traces = [Trace(prompt=x, responses=[y.strip()]) for x, y in zip(prompts, first)]
    for r in range(rounds):
        chosen = [rng.choice(pool) for _ in traces]
        convs = [prefix + [{"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.final},
                           {"role": "user", "content": f"Critique request: {c.critique}"}] for t, c in zip(traces, chosen)]
        critiques = [_strip_label(c) for c in gen(convs, critique_sampling, critique_seed(seed, r, revision=False))]
        convs = [conv + [{"role": "assistant", "content": f"Critique: {crit}"},
                         {"role": "user", "content": f"Revision request: {c.revision}"}]
                 for conv, crit, c in zip(convs, critiques, chosen)]
        revisions = [_strip_label(v) for v in gen(convs, sampling, critique_seed(seed, r, revision=True))]
        for t, c, crit, rev in zip(traces, chosen, critiques, revisions):
            empty = not rev.strip()
            t.empty_revisions += int(empty)
            t.rounds.append({"round": r + 1, "principle_id": c.id, "critique_request": c.critique, "critique": crit,
                             "revision_request": c.revision, "revision": rev, "kept_previous": empty})
            t.responses.append(t.final if empty else rev)
    return traces
