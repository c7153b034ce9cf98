"""Self-Instruct prompt generation (Self-Rewarding LMs Sec. 3.4, "Self-Instruction creation,
Step 1"; Wang et al. 2023).

A model is few-shot prompted with 8 tasks -- 6 from the seed prompts, 2 from prompts generated
in *earlier iterations* (filled from the seeds while there are fewer than 2; never from this
iteration's own outputs, so a round cannot feed on itself) -- in the Self-Instruct template
for non-classification tasks, and continues the list. Decoding T = 0.6, top-p 0.9. The
prompt is a raw completion prompt (:func:`completion_fn`), not wrapped in the chat template.

Every candidate goes through the Self-Instruct filters, in this order, and the first one that
rejects it is counted (nothing is dropped silently):

``empty``       nothing left after extraction;
``preamble``    a chat model's lead-in instead of a task ("Sure, here are the tasks:",
                "Here are some more instructions:");
``too_short`` / ``too_long``  word-count bounds (Self-Instruct: more than 3 and at most 150 words);
``format``      starts with punctuation or a non-ASCII character (Self-Instruct's heuristic);
``blocklist``   contains a blocklisted keyword (tasks a text model cannot do: images, files, ...);
``duplicate``   identical (case/space-insensitive) to a prompt already in the pool;
``rouge``       ROUGE-L F1 >= 0.7 with any prompt in the pool (seeds, earlier generations,
                prompts kept in this round and any held-out prompts passed in).

Extraction is robust to the failure the paper reports for M2/M3 (App. A.5): the model "first
generate[s] several instructions, then insert[s] a separator, and then begin[s] responding to
those instructions". Everything after a separator line or an answer marker is discarded, and
each further ``Task N:`` before it is a separate candidate.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pydantic import Field

from pofe.config import PofeConfig
from pofe.generation.sampling import SamplingConfig, generate

# Self-Instruct's keyword filter (yizhongw/self-instruct, bootstrap_instructions.py): tasks
# that need a modality a language model lacks.
SELF_INSTRUCT_BLOCKLIST = [
    "image", "images", "graph", "graphs", "picture", "pictures", "file", "files", "map", "maps",
    "draw", "plot", "go to", "video", "audio", "music", "flowchart", "diagram",
]

HEADER = "Come up with a series of tasks:"


class SelfInstructConfig(PofeConfig):
    """How new prompts are generated and filtered each iteration."""

    num_prompts: int = Field(64, ge=1)
    """Prompts to keep per iteration (generation stops once reached)."""
    max_generations: int | None = Field(None, ge=1)
    """Cap on few-shot generate calls; default 4 x num_prompts (a model that only produces
    rejects must not loop forever)."""
    num_examples: int = Field(8, ge=1)
    """Demonstrations per few-shot prompt (paper: 8)."""
    num_machine_examples: int = Field(2, ge=0)
    """Of those, how many come from previously generated prompts (paper: 2; the rest from seeds)."""
    model: str | None = None
    """Prompt generator: null = the current model M_t; or a name / path of a fixed model
    (the paper uses Llama 2-Chat 70B "for time efficiency")."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.6, top_p=0.9, max_new_tokens=96, batch_size=8)
    """Paper: T 0.6, top-p 0.9."""
    rouge_threshold: float = Field(0.7, ge=0.0, le=1.0)
    """Reject when ROUGE-L F1 with any existing prompt is >= this (Self-Instruct: 0.7)."""
    min_words: int = Field(4, ge=0)
    """Keep prompts with at least this many words (Self-Instruct: more than 3)."""
    max_words: int = Field(150, ge=1)
    """Keep prompts with at most this many words (Self-Instruct: 150)."""
    blocklist: list[str] = list(SELF_INSTRUCT_BLOCKLIST)
    """Reject tasks with these words (Self-Instruct's keyword filter: images, files, ...)."""


# ----------------------------------------------------------------------------- prompt

def build_fewshot_prompt(examples: Sequence[str]) -> str:
    """The Self-Instruct template for non-classification tasks, ending with the next task's
    number so the model writes exactly one new task after it."""
    lines = [HEADER, ""]
    for i, ex in enumerate(examples, 1):
        lines.append(f"Task {i}: {_one_line(ex)}")
    lines.append(f"Task {len(examples) + 1}:")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    # A multi-line demonstration would teach the model that a blank line is part of a task,
    # which would defeat the blank-line cut in extraction.
    return re.sub(r"\s*\n\s*", " ", text.strip())


def sample_examples(seeds: Sequence[str], machine: Sequence[str], cfg: SelfInstructConfig, rng: random.Random) -> list[str]:
    """``num_examples`` demonstrations: ``num_machine_examples`` generated ones (from
    ``machine``, the earlier iterations' pool, when that many exist) and the rest from the
    seeds, shuffled so the generated ones are not always last."""
    k_machine = min(cfg.num_machine_examples, len(machine))
    k_seed = min(cfg.num_examples - k_machine, len(seeds))
    out = rng.sample(list(seeds), k_seed) + rng.sample(list(machine), k_machine)
    rng.shuffle(out)
    return out


# ----------------------------------------------------------------------------- extraction

# "Task 10:" (our template), "Instruction 3." or a bare "2." / "2)" list item at a line start
# (Self-Instruct's original numbering; small chat models answer few-shot prompts with lists).
_TASK_MARK = re.compile(
    r"(?im)^[ \t]*(?:[#*>]+[ \t]*)?(?:(?:task|instruction)[ \t]*(\d+)[ \t]*[:.)\-]|(\d+)[ \t]*[.)][ \t]+)")
# A separator line (---, ***, ===, ###, ___ alone) or the start of an answer.
_STOP = re.compile(
    r"(?im)^[ \t]*(?:[-*=#_~]{3,}[ \t]*$|(?:answer|response|output|solution|assistant|reply|example output)"
    r"[ \t]*(?:to[ \t]+task[ \t]*\d+[ \t]*)?:)"
)
_PREFIX = re.compile(r"(?i)^\s*(?:(?:task[ \t]*\d*|instruction|new task|prompt)[ \t]*\d*[ \t]*[:.)\-]|\d+[ \t]*[.)](?=[ \t]))\s*")


def extract_instructions(text: str) -> list[str]:
    """Pull the new task(s) out of a few-shot continuation.

    The continuation normally starts right after ``Task 9:`` (or repeats it). Further
    ``Task N:`` markers start further tasks. Extraction stops at the first separator line or
    answer marker (the model has started answering its own tasks), and each task is cut at
    its first blank line (a Self-Instruct task is one paragraph; what follows is an answer).
    """
    stop = _STOP.search(text)
    if stop:
        text = text[: stop.start()]
    marks = list(_TASK_MARK.finditer(text))
    chunks = []
    start = 0
    for m in marks:
        chunks.append(text[start : m.start()])
        start = m.end()
    chunks.append(text[start:])
    out = []
    for c in chunks:
        c = _PREFIX.sub("", c.strip(), count=1)
        c = re.split(r"\n[ \t]*\n", c, maxsplit=1)[0]
        c = _one_line(c).strip().strip('"').strip()
        if c:
            out.append(c)
    return out


# ----------------------------------------------------------------------------- filters

class RougeFilter:
    """ROUGE-L F1 against a growing pool, via the ``rouge-score`` package.

    Pool entries are tokenised once (the package's own tokenizer) and compared with its LCS
    routine, as Self-Instruct does, instead of re-tokenising the pool on every check.
    """

    def __init__(self, pool: Sequence[str] = ()):
        from rouge_score import rouge_scorer

        self._scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
        self._lcs = getattr(rouge_scorer, "_score_lcs", None)
        self._texts: list[str] = []
        self._tokens: list[list[str]] = []
        for p in pool:
            self.add(p)

    def __len__(self) -> int:
        return len(self._texts)

    def add(self, text: str) -> None:
        self._texts.append(text)
        self._tokens.append(self._scorer._tokenizer.tokenize(text))

    def max_similarity(self, text: str) -> tuple[float, str | None]:
        """Highest ROUGE-L F1 with any pool entry, and that entry."""
        toks = self._scorer._tokenizer.tokenize(text)
        best, arg = 0.0, None
        for t, ref in zip(self._tokens, self._texts):
            if self._lcs is not None:
                f = self._lcs(t, toks).fmeasure
            else:  # pragma: no cover - older/newer rouge-score without the private helper
                f = self._scorer.score(ref, text)["rougeL"].fmeasure
            if f > best:
                best, arg = f, ref
        return best, arg


# A chat model answering the few-shot list instead of continuing it opens with a lead-in.
_PREAMBLE_OPENER = re.compile(
    r"(?i)^\W*(?:sure|certainly|of course|absolutely|okay|ok|alright|great|happy to help|no problem|"
    r"i(?:'d| would| will|'ll) (?:be happy|gladly)|here(?:'s| is| are)|below (?:is|are))\b")
_LEAD_IN = re.compile(r"(?i)\b(?:tasks?|instructions?|prompts?|list|examples?|ideas?)\b[^.?!]*:\s*$")


def is_preamble(text: str) -> bool:
    """A lead-in rather than a task: a conversational opener ("Sure, ...", "Here are ...") or a
    line announcing a list of tasks and ending with a colon. A task that ends with a colon
    because its input follows ("Translate the sentence below:") is not one."""
    t = text.strip()
    return bool(_PREAMBLE_OPENER.match(t) or _LEAD_IN.search(t))


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


@dataclass
class InstructionFilter:
    """The Self-Instruct filters over one pool; ``check`` returns the rejecting filter's name
    (or None = keep) and ``add`` grows the pool."""

    cfg: SelfInstructConfig
    pool: Sequence[str] = ()
    rouge: RougeFilter = field(init=False)
    _seen: set[str] = field(init=False)
    _block: list[re.Pattern] = field(init=False)

    def __post_init__(self) -> None:
        self.rouge = RougeFilter(self.pool)
        self._seen = {_norm(p) for p in self.pool}
        self._block = [re.compile(rf"(?i)\b{re.escape(w)}\b") for w in self.cfg.blocklist]

    def check(self, text: str) -> str | None:
        words = text.split()
        if not words:
            return "empty"
        if is_preamble(text):
            return "preamble"
        if len(words) < self.cfg.min_words:
            return "too_short"
        if len(words) > self.cfg.max_words:
            return "too_long"
        if not text[0].isascii() or not (text[0].isalnum() or text[0] in "\"'("):
            return "format"
        if any(b.search(text) for b in self._block):
            return "blocklist"
        if _norm(text) in self._seen:
            return "duplicate"
        if self.rouge.max_similarity(text)[0] >= self.cfg.rouge_threshold:
            return "rouge"
        return None

    def add(self, text: str) -> None:
        self.rouge.add(text)
        self._seen.add(_norm(text))


# ----------------------------------------------------------------------------- loop

REJECT_REASONS = ("empty", "preamble", "too_short", "too_long", "format", "blocklist", "duplicate", "rouge")


def generate_prompts(
    generate_fn: Callable[[list[str], SamplingConfig, int], list[str]],
    seeds: Sequence[str],
    cfg: SelfInstructConfig,
    *,
    machine: Sequence[str] = (),
    avoid: Sequence[str] = (),
    seed: int = 0,
) -> tuple[list[str], dict[str, Any]]:
    """Generate up to ``cfg.num_prompts`` new prompts.

    ``generate_fn(few_shot_prompts, sampling, seed) -> continuations`` (one per prompt).
    ``machine``: prompts generated in earlier iterations: the only source of "generated"
    demonstrations (this call's own outputs are not shown back to the model) and part of the
    ROUGE pool.
    ``avoid``: other prompts new ones must not be near-duplicates of (held-out sets).
    Returns the kept prompts and counts: ``generations`` (generate calls' outputs),
    ``candidates`` (extracted), ``kept``, ``no_task`` (outputs with nothing extractable),
    ``rejected`` per filter, ``surplus`` (extracted after the target was reached), so that
    candidates = kept + sum(rejected) + surplus.
    """
    if not seeds:
        raise ValueError("self-instruct needs at least one seed prompt")
    rng = random.Random(seed)
    filt = InstructionFilter(cfg, list(seeds) + list(machine) + list(avoid))
    machine_pool = list(machine)  # fixed for this call: demonstrations come from earlier iterations only
    kept: list[str] = []
    stats: dict[str, Any] = {"generations": 0, "candidates": 0, "kept": 0, "no_task": 0, "surplus": 0,
                             "rejected": {r: 0 for r in REJECT_REASONS}}
    cap = cfg.max_generations if cfg.max_generations is not None else 4 * cfg.num_prompts
    round_ = 0
    while len(kept) < cfg.num_prompts and stats["generations"] < cap:
        bs = min(cfg.sampling.batch_size, cap - stats["generations"])
        fewshot = [build_fewshot_prompt(sample_examples(seeds, machine_pool, cfg, rng)) for _ in range(bs)]
        outs = generate_fn(fewshot, cfg.sampling, seed + round_)
        round_ += 1
        stats["generations"] += len(outs)
        for text in outs:
            cands = extract_instructions(text)
            if not cands:
                stats["no_task"] += 1
            for c in cands:
                stats["candidates"] += 1
                if len(kept) >= cfg.num_prompts:
                    stats["surplus"] += 1  # extracted after the target was reached; not checked
                    continue
                reason = filt.check(c)
                if reason is None:
                    kept.append(c)
                    filt.add(c)
                else:
                    stats["rejected"][reason] += 1
    stats["kept"] = len(kept)
    return kept, stats


def completion_fn(model, tokenizer) -> Callable[[list[str], SamplingConfig, int], list[str]]:
    """The ``generate_fn`` of :func:`generate_prompts` for a local model: each few-shot prompt
    is a *raw completion* prompt. Wrapped in the chat template, an instruction-tuned model
    answers the list ("Sure, here are the tasks:") instead of continuing it (3 of 3 kept
    prompts were such preambles with SmolLM2-Instruct)."""
    def fn(fewshot: list[str], sampling: SamplingConfig, seed: int) -> list[str]:
        return [g[0].text for g in generate(model, tokenizer, fewshot, n=1, sampling=sampling, seed=seed,
                                            chat_template=False)]
    return fn
