"""``pofe cai revise``: stage 1 of Constitutional AI (SL-CAI), critique -> revision.

rlaif-constitutional-ai, "Stage 1: critique and revision": for each red-team prompt sample
a response, then R rounds (R = 1..4) in which the same model critiques its latest response
against a principle drawn at random from the constitution and rewrites it to address the
critique. The final revisions paired with their prompts are SFT data, mixed with
helpfulness data "so the model does not drift toward refusal"; ``pofe sft`` trains on
``sft.jsonl``. The (final revision > original) pairs are written too, as a preference set
(the alignment-handbook CAI recipe trains DPO on exactly these).

Every intermediate text is kept (``revisions.jsonl``), and refusals are counted on the
red-team prompts and on a benign set run through the same critique-revise process
(``summary.json: refusal``): a constitution that only teaches refusal shows up as the
benign rate climbing with the harmful one (seed, "Over-refusal or over-compliance").

Readable top to bottom: setup -> loop -> save. The logic lives in :func:`critique_revise`,
:func:`mix_sft` and :func:`preference_pairs`, which the tests call directly.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from pofe.config import PofeConfig
from pofe.generation import SamplingConfig, generate
from pofe.models import DEFAULT_MODEL
from pofe.records import PreferencePair
from pofe.runs import (
    JsonlWriter,
    RunConfig,
    atomic_write_text,
    new_run_dir,
    write_config,
)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- config

class RefusalTrackConfig(PofeConfig):
    """Refusal tracking of a CAI run (over-refusal next to refusal on harmful prompts)."""

    enabled: bool = True
    benign: str | None = "xstest:safe"
    """Benign prompts run through the same critique-revise process (null: skip)."""
    n_benign: int = 16
    """How many benign prompts (each costs 1 + 2R generations)."""


# Subclasses rather than default instances, so that a partial override such as
# ``--set sampling.top_p=0.9`` keeps these defaults instead of falling back to the base class's.
class CaiSamplingConfig(SamplingConfig):
    """Initial responses and revisions."""

    max_new_tokens: int = 96
    temperature: float = 0.7


class CritiqueSamplingConfig(SamplingConfig):
    max_new_tokens: int = 64
    temperature: float = 0.7


class CaiReviseConfig(PofeConfig):
    """``pofe cai revise`` (SL-CAI)."""

    model: str = DEFAULT_MODEL
    """The helpful model to critique and revise with (it also writes the first response)."""
    trust_remote_code: bool = False
    prompts: str = "advbench"
    """Red-team prompts: a file or advbench, xstest:unsafe, hh-rlhf:harmless (see pofe.data.io)."""
    max_prompts: int | None = 32
    constitution: str = "hhh"
    """Shipped constitution name (pofe/constitutions/<name>.yaml) or a path (YAML, or the HF JSON critic/revision format)."""
    principles: list[str] | None = None
    """Restrict sampling to these principle ids (default: all)."""
    rounds: int = Field(1, ge=1, le=4)
    """Critique -> revision rounds per prompt, each with a freshly sampled principle (seed: R = 1 to 4)."""
    few_shot: bool = True
    """Prepend one worked critique/revision exchange (small models follow the format far better with it)."""
    sampling: CaiSamplingConfig = CaiSamplingConfig()
    """Initial responses and revisions."""
    critique_sampling: CritiqueSamplingConfig = CritiqueSamplingConfig()
    helpful_data: str | None = None
    """Helpfulness SFT examples to mix in: a prompt/response jsonl or hh-rlhf:helpful (null: none)."""
    helpful_ratio: float = Field(0.5, ge=0.0, lt=1.0)
    """Share of the final SFT set that is helpfulness data (0.5 = one helpful example per revision)."""
    refusal: RefusalTrackConfig = RefusalTrackConfig()
    seed: int = 0
    run: RunConfig = RunConfig()


# ----------------------------------------------------------------------------- constitution

@dataclass(frozen=True)
class CaiPrinciple:
    id: str
    text: str
    critique: str
    revision: str


@dataclass(frozen=True)
class CaiConstitution:
    name: str
    version: str
    principles: tuple[CaiPrinciple, ...]
    source: str = ""


def _generic_requests(text: str) -> tuple[str, str]:
    # A judge-only principle ("choose the response that ...") still gives a usable
    # critique/revision pair: ask where the response falls short of it, then fix that.
    return (f"Consider this principle: {text} Identify specific ways in which the response above falls short of it.",
            f"Rewrite the response above so that it follows this principle: {text}")


def load_cai_constitution(name_or_path: str) -> CaiConstitution:
    """A constitution with critique/revision requests for every principle.

    YAML constitutions go through the shared loader (``pofe.constitutions.load_constitution``:
    ``version`` + ``principles`` with ``id``, ``text``, optional ``critique``/``revision``);
    principles without requests get generic ones built from their comparative ``text``.
    A ``.json`` file in the Hugging Face CAI format (``constitutions``: list of
    ``{critic, revision}``) is accepted too, as version ``hf-json``.
    """
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        data = json.loads(p.read_text(encoding="utf-8"))
        items = data.get("constitutions") if isinstance(data, dict) else None
        if not items:
            raise ValueError(f"{p}: expected a JSON object with 'constitutions': [{{critic, revision}}, ...]")
        out = [CaiPrinciple(id=f"p{i}", text=c["critic"], critique=c["critic"], revision=c["revision"])
               for i, c in enumerate(items)]
        return CaiConstitution(name=p.stem, version=str(data.get("version", "hf-json")), principles=tuple(out), source=str(p))
    from pofe.constitutions import load_constitution

    c = load_constitution(name_or_path)
    out = []
    for pr in c.principles:
        gc, gr = _generic_requests(pr.text)
        out.append(CaiPrinciple(id=pr.id, text=pr.text, critique=" ".join((pr.critique or gc).split()),
                                revision=" ".join((pr.revision or gr).split())))
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


# ----------------------------------------------------------------------------- core logic

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
        return {"prompt": self.prompt, "original": self.original, "final": self.final, "rounds": self.rounds,
                "empty_revisions": self.empty_revisions}


def critique_revise(model, tokenizer, prompts: Sequence[str], constitution: CaiConstitution, *, rounds: int = 1,
                    sampling: SamplingConfig | None = None, critique_sampling: SamplingConfig | None = None,
                    few_shot: bool = True, principle_ids: Sequence[str] | None = None, seed: int = 0,
                    generate_fn=None) -> list[Trace]:
    """Sample a response per prompt, then ``rounds`` of critique -> revision (batched over prompts).

    Each round samples one principle per prompt (seed: "a principle drawn at random"). The
    conversation grows as in Bai et al.: prompt, response, critique request, critique,
    revision request -> revision; the next round critiques the latest revision. A blank
    revision keeps the previous text (nothing is invented) and is counted.
    ``generate_fn(message_lists, sampling, seed) -> list[str]`` replaces the model (tests).
    """
    sampling = sampling or SamplingConfig(max_new_tokens=96, temperature=0.7)
    critique_sampling = critique_sampling or SamplingConfig(max_new_tokens=64, temperature=0.7)
    pool = [p for p in constitution.principles if not principle_ids or p.id in principle_ids]
    if not pool:
        raise ValueError(f"no principles left after filtering by {list(principle_ids or [])}")
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
        critiques = [_strip_label(c) for c in gen(convs, critique_sampling, seed + 1000 * (r + 1))]
        convs = [conv + [{"role": "assistant", "content": f"Critique: {crit}"},
                         {"role": "user", "content": f"Revision request: {c.revision}"}]
                 for conv, crit, c in zip(convs, critiques, chosen)]
        revisions = [_strip_label(v) for v in gen(convs, sampling, seed + 1000 * (r + 1) + 500)]
        for t, c, crit, rev in zip(traces, chosen, critiques, revisions):
            empty = not rev.strip()
            t.empty_revisions += int(empty)
            t.rounds.append({"round": r + 1, "principle_id": c.id, "critique_request": c.critique, "critique": crit,
                             "revision_request": c.revision, "revision": rev, "kept_previous": empty})
            t.responses.append(t.final if empty else rev)
    return traces


def mix_sft(cai_rows: list[dict[str, Any]], helpful_rows: list[dict[str, Any]], ratio: float, *, seed: int = 0) -> list[dict[str, Any]]:
    """CAI rows plus helpfulness rows so that helpful / total = ``ratio`` (as close as the
    available helpful rows allow), shuffled with ``seed``.

    n_helpful = round(n_cai * ratio / (1 - ratio)); e.g. 30 revisions at ratio 0.25 -> 10.
    """
    if not 0 <= ratio < 1:
        raise ValueError(f"helpful ratio must be in [0, 1), got {ratio}")
    want = round(len(cai_rows) * ratio / (1 - ratio)) if ratio > 0 else 0
    rng = random.Random(seed)
    helpful = list(helpful_rows)
    rng.shuffle(helpful)
    rows = list(cai_rows) + helpful[:want]
    rng.shuffle(rows)
    return rows


def preference_pairs(traces: Sequence[Trace], constitution: CaiConstitution) -> list[PreferencePair]:
    """(final revision > original) pairs, p = 1; identical texts carry no preference and are skipped."""
    out = []
    for t in traces:
        if t.final.strip() and t.final.strip() != t.original.strip():
            out.append(PreferencePair(prompt=t.prompt, chosen=t.final, rejected=t.original, p=1.0, provenance={
                "source": "cai-revise", "constitution": constitution.name, "constitution_version": constitution.version,
                "principle_ids": [r["principle_id"] for r in t.rounds], "rounds": len(t.rounds)}))
    return out


def refusal_summary(harmful: Sequence[Trace], benign: Sequence[Trace]) -> dict[str, Any]:
    """Refusal rates of the original responses and the final revisions, harmful and benign."""
    from pofe.evaluation.refusal import refusal_report

    def rep(which: str) -> dict[str, Any]:
        pick = (lambda t: t.original) if which == "original" else (lambda t: t.final)
        r = refusal_report(([t.prompt for t in benign], [pick(t) for t in benign]) if benign else None,
                           ([t.prompt for t in harmful], [pick(t) for t in harmful]) if harmful else None)
        return {k: r[k] for k in ("over_refusal_rate", "harmful_refusal_rate", "gap")}

    return {"original": rep("original"), "revised": rep("final"), "detector": "patterns"}


# ----------------------------------------------------------------------------- the command

def run(cfg: CaiReviseConfig, *, model=None, tokenizer=None, generate_fn=None) -> dict[str, Any]:
    """Setup -> critique/revise loop -> save. Returns the summary (also in ``summary.json``)."""
    from pofe.data.prompts import load_prompt_texts as load_prompts
    from pofe.data.sft import load_examples
    from pofe.training import seed_everything

    # --- setup
    seed_everything(cfg.seed)
    run_dir = new_run_dir(cfg.run, "cai-revise")
    write_config(run_dir, cfg)
    constitution = load_cai_constitution(cfg.constitution)
    prompts = load_prompts(cfg.prompts, limit=cfg.max_prompts)
    if not prompts:
        raise ValueError(f"no prompts in {cfg.prompts!r}")
    benign: list[str] = []
    if cfg.refusal.enabled and cfg.refusal.benign:
        try:
            benign = load_prompts(cfg.refusal.benign, limit=cfg.refusal.n_benign)
        except FileNotFoundError as e:
            log.warning("refusal tracking: benign prompts unavailable (%s)", e)
    if model is None and generate_fn is None:
        from pofe.models import load_model

        model, tokenizer = load_model(cfg.model, trust_remote_code=cfg.trust_remote_code)
    log.info("cai revise: %d red-team + %d benign prompts, %d round(s), constitution %s (%s)",
             len(prompts), len(benign), cfg.rounds, constitution.name, constitution.version)

    # --- loop (batched inside critique_revise)
    t0 = time.perf_counter()
    kw = dict(rounds=cfg.rounds, sampling=cfg.sampling, critique_sampling=cfg.critique_sampling, few_shot=cfg.few_shot,
              principle_ids=cfg.principles, generate_fn=generate_fn)
    traces = critique_revise(model, tokenizer, prompts, constitution, seed=cfg.seed, **kw)
    benign_traces = critique_revise(model, tokenizer, benign, constitution, seed=cfg.seed + 1, **kw) if benign else []
    seconds = time.perf_counter() - t0

    # --- save
    with JsonlWriter(run_dir / "revisions.jsonl") as w:
        for t in traces:
            w.write({**t.to_dict(), "set": "red-team", "constitution_version": constitution.version})
        for t in benign_traces:
            w.write({**t.to_dict(), "set": "benign", "constitution_version": constitution.version})
    cai_rows = [{"prompt": t.prompt, "response": t.final, "source": "cai-revision",
                 "constitution_version": constitution.version} for t in traces if t.final.strip()]
    helpful_rows = []
    if cfg.helpful_data and cfg.helpful_ratio > 0:
        want = round(len(cai_rows) * cfg.helpful_ratio / (1 - cfg.helpful_ratio))
        helpful_rows = [{"prompt": e.prompt if isinstance(e.prompt, str) else list(e.prompt), "response": e.response,
                         "source": "helpful"} for e in load_examples(cfg.helpful_data, limit=max(4 * want, want))]
    sft = mix_sft(cai_rows, helpful_rows, cfg.helpful_ratio if helpful_rows else 0.0, seed=cfg.seed)
    with JsonlWriter(run_dir / "sft.jsonl") as w:
        for r in sft:
            w.write(r)
    pairs = preference_pairs(traces, constitution)
    with JsonlWriter(run_dir / "preferences.jsonl") as w:
        for p in pairs:
            w.write(p.to_dict())
    principle_counts: dict[str, int] = {}
    for t in traces:
        for r in t.rounds:
            principle_counts[r["principle_id"]] = principle_counts.get(r["principle_id"], 0) + 1
    summary = {
        "run_dir": str(run_dir),
        "constitution": constitution.name,
        "constitution_version": constitution.version,
        "prompts": len(traces),
        "rounds": cfg.rounds,
        "sft_examples": len(sft),
        "sft_cai": sum(r["source"] == "cai-revision" for r in sft),
        "sft_helpful": sum(r["source"] == "helpful" for r in sft),
        "preference_pairs": len(pairs),
        "unchanged": sum(t.final.strip() == t.original.strip() for t in traces),
        "empty_revisions": sum(t.empty_revisions for t in traces),
        "principle_counts": principle_counts,
        "mean_chars": {"original": _mean([len(t.original) for t in traces]), "revised": _mean([len(t.final) for t in traces])},
        "refusal": refusal_summary(traces, benign_traces) if cfg.refusal.enabled else None,
        "seconds": round(seconds, 2),
        "files": {"sft": str(run_dir / "sft.jsonl"), "preferences": str(run_dir / "preferences.jsonl"),
                  "revisions": str(run_dir / "revisions.jsonl")},
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
