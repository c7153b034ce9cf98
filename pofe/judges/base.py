"""The judge and backend protocols every pipeline consumes AI feedback through.

A *pairwise* judge answers "is A better than B?" for a batch of (prompt, A, B) and returns
:class:`~pofe.records.Judgment` verdicts (both orders, debiased p, consistency, parse
status, provenance). A *pointwise* judge returns :class:`~pofe.records.Score` verdicts.
Judges never invent a value: an unreadable output gives ``p=None`` / ``score=None`` with
``parse_ok=False``, and callers count and report it.

Judges *declare* what they can do (:class:`Capability`) so that loops ask "can this judge
score one response?" instead of keeping their own sets of kind names; a call site that
needs a capability the judge lacks raises :class:`JudgeCapabilityError` (one line), never
an ``AttributeError`` deep inside a loop.

This module imports neither torch nor an HTTP client: configs and the CLI use it before
any model loads.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, Sequence, runtime_checkable

from pofe.records import Judgment, Score
from pofe.errors import PofeError


# ======================================================================================
# Errors
# ======================================================================================
class JudgeError(PofeError):
    """Base of every judge error; ``str(e)`` is one line naming what and where."""

    exit_code = 1


class JudgeConfigError(JudgeError, ValueError):
    """A judge that cannot be built as configured (a template without the slot it needs,
    choices that are not single tokens, a missing checkpoint). Bad input: exit 2."""

    exit_code = 2


class JudgeCapabilityError(JudgeError, ValueError):
    """The judge cannot do what the call site needs (e.g. a pairwise-only judge asked for a
    pointwise score). Bad input: exit 2."""

    exit_code = 2


class EndpointError(JudgeError, RuntimeError):
    """The judge endpoint could not be reached, refused the request, or kept answering
    unreadably (after bounded retries). Environment problem: exit 1."""

    exit_code = 1


def base_url_problem(url: Any) -> str | None:
    """What is wrong with an endpoint ``base_url`` (None: nothing). An http(s) URL with a
    host; credentials (userinfo, a query string) are refused without repeating the URL, which
    would put the key into the very error that refuses it."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url.strip():
        return "must be an http:// or https:// URL such as http://127.0.0.1:8000/v1, got an empty value"
    if any(c.isspace() for c in url):
        return "must not contain spaces"
    try:
        parts = urlsplit(url)
        parts.port  # raises on a port outside 0..65535 or not a number
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        if not parts.scheme or "//" not in url:
            return "has no scheme; write it as http://HOST:PORT/v1"
        return f"scheme must be http or https, got {parts.scheme!r}"
    if "@" in parts.netloc:
        return ("must not hold credentials (user:key@host): put the key in an environment variable and "
                "name it in judge.endpoint.api_key_env")
    if parts.query or parts.fragment:
        return ("must not have a query string or fragment (a key there would be stored in config.yaml and every "
                "verdict): put the key in an environment variable and name it in judge.endpoint.api_key_env")
    if not parts.hostname:
        return "has no host; write it as http://HOST:PORT/v1"
    return None


_LOGPROB_TOLERANCE = 1e-4
"""A log-probability can come out a little above 0 from float rounding of log(1) (float32
log-softmax); beyond this it is a probability above 1, not a rounding."""


def invalid_logprob(v: float) -> bool:
    """NaN, +inf or a log-probability above 0 (beyond float tolerance): a broken number, never a read."""
    return math.isnan(v) or v > _LOGPROB_TOLERANCE


def logprob_error(values) -> str | None:
    """Why a read with these log-probabilities is unreadable (None: every value is valid)."""
    bad = [v for v in values if invalid_logprob(v)]
    if not bad:
        return None
    return "non-finite logprob" if not math.isfinite(bad[0]) else f"positive logprob {bad[0]!r} (a probability above 1)"


# ======================================================================================
# Capabilities
# ======================================================================================
class Capability(str, Enum):
    """What a judge can do. Declared by each judge class (``capabilities``) and by each
    judge config kind (so a loop can decide before anything is built or loaded)."""

    PAIRWISE = "pairwise"
    """``judge(prompts, a, b) -> list[Judgment]``."""
    POINTWISE = "pointwise"
    """``score(prompts, responses) -> list[Score]``."""
    SHARES_WEIGHTS = "shares-weights"
    """Can run on a model object the caller already loaded (``build_judge(cfg, model=, tokenizer=)``)."""
    NEEDS_LOGPROBS = "needs-logprobs"
    """Reads next-token log-probabilities (an endpoint without them gives text-fallback or unreadable reads)."""


def capabilities_of(obj: Any) -> frozenset[Capability]:
    """The capabilities a judge (or judge config) declares. An object that declares none (a
    user's own judge passed to ``run(judge=...)``) is read by the protocol it implements:
    a ``judge`` method makes it pairwise, a ``score`` method pointwise."""
    caps = getattr(obj, "capabilities", None)
    if caps is not None:
        return frozenset(caps)
    inferred = set()
    if callable(getattr(obj, "judge", None)):
        inferred.add(Capability.PAIRWISE)
    if callable(getattr(obj, "score", None)):
        inferred.add(Capability.POINTWISE)
    return frozenset(inferred)


def has_capability(obj: Any, cap: Capability) -> bool:
    return cap in capabilities_of(obj)


def require_capability(obj: Any, cap: Capability, *, where: str) -> None:
    """Raise :class:`JudgeCapabilityError` unless ``obj`` declares ``cap``. ``where`` names
    the setting or step that needs it (e.g. ``judge`` of ``pofe self-reward``)."""
    if not has_capability(obj, cap):
        name = getattr(obj, "kind", None) or getattr(obj, "id", type(obj).__name__)
        have = ", ".join(sorted(c.value for c in capabilities_of(obj))) or "none"
        raise JudgeCapabilityError(f"{where}: judge {name!r} is not {cap.value} (it is: {have})")


# ======================================================================================
# Judge protocols
# ======================================================================================
@runtime_checkable
class PairwiseJudge(Protocol):
    """Compare two responses to the same prompt."""

    id: str
    capabilities: frozenset[Capability]

    def judge(
        self,
        prompts: Sequence[str],
        responses_a: Sequence[str],
        responses_b: Sequence[str],
        *,
        references: Sequence[str | None] | None = None,
    ) -> list[Judgment]: ...


@runtime_checkable
class PointwiseJudge(Protocol):
    """Score one response to a prompt."""

    id: str
    capabilities: frozenset[Capability]

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        *,
        references: Sequence[str | None] | None = None,
    ) -> list[Score]: ...


class PointwiseAsPairwise:
    """A pairwise view of a pointwise judge: A beats B when its score is higher (ties 0.5).
    Both "orders" are the same two scores, so the verdict is consistent by construction
    (a pointwise scorer has no position to be biased by)."""

    capabilities = frozenset({Capability.PAIRWISE})

    def __init__(self, inner):
        self.inner = inner
        # The inner judge's id: it is the same judge (an audit of it gates training with it).
        self.id = getattr(inner, "id", "pointwise")

    def judge(self, prompts, responses_a, responses_b, *, references=None) -> list[Judgment]:
        check_batch(prompts, responses_a, responses_b)
        n = len(prompts)
        scores = self.inner.score(list(prompts) * 2, list(responses_a) + list(responses_b))  # one batch for A and B
        out = []
        for sa, sb in zip(scores[:n], scores[n:]):
            if not (_finite(sa.score) and _finite(sb.score)):  # a NaN is no score: never a 0.5 tie
                p = None
            else:
                p = 1.0 if sa.score > sb.score else 0.0 if sa.score < sb.score else 0.5
            out.append(Judgment(p=p, p_ab=p, p_ba=p, consistent=None if p is None else True, parse_ok=p is not None,
                                judge_id=self.id, extra={"score_a": sa.score, "score_b": sb.score}))
        return out


def _finite(x) -> bool:
    """A finite number (False for None, NaN, +-inf and anything that is not a number)."""
    if x is None or isinstance(x, (str, bytes)) or not hasattr(x, "__float__"):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def as_pairwise(judge):
    """The judge itself when it compares pairs, else a :class:`PointwiseAsPairwise` view."""
    if has_capability(judge, Capability.PAIRWISE):
        return judge
    if has_capability(judge, Capability.POINTWISE):
        return PointwiseAsPairwise(judge)
    raise JudgeCapabilityError(f"judge {getattr(judge, 'id', judge)!r} declares neither pairwise nor pointwise")


def check_batch(prompts, a, b=None) -> None:
    if len(prompts) != len(a) or (b is not None and len(b) != len(a)):
        raise ValueError(
            f"judge batch mismatch: {len(prompts)} prompts, {len(a)} responses A"
            + (f", {len(b)} responses B" if b is not None else "")
        )


# ======================================================================================
# Backend protocol: where a judge's reads come from
# ======================================================================================
@dataclass
class ChoiceRead:
    """One next-token read. ``logprobs`` maps each choice to its absolute log-prob (-inf when
    the choice is absent from what the backend returned); ``None`` is the *unreadable*
    marker (nothing could be read: malformed answer, no choice token, non-finite numbers),
    with the reason in ``error``."""

    logprobs: dict[str, float] | None
    raw: str = ""
    tokens: int = 0  # tokens in + out of this read (pofe.judges.usage)
    hard_label: bool = False  # text fallback: read from generated text, not log-probs
    truncated: bool = False  # some choice missing from a top-k list
    error: str | None = None
    tokens_out: int = 0  # of ``tokens``, the generated ones (an endpoint's answer token(s))
    metered: bool = True  # False: the server reported no usage, ``tokens`` is unknown (0)


@dataclass
class GenOut:
    """One sampled text; ``text`` is None when the backend's answer could not be read."""

    text: str | None
    tokens: int = 0  # prompt + generated tokens of this sample (pofe.judges.usage)
    error: str | None = None
    tokens_out: int = 0  # of ``tokens``, the generated ones
    metered: bool = True  # False: the server reported no usage, ``tokens`` is unknown (0)


@dataclass
class BackendStats:
    calls: int = 0  # forward batches / generate calls / HTTP requests (incl. retries)
    tokens: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, calls: int = 0, tokens: int = 0, seconds: float = 0.0) -> None:
        with self.lock:
            self.calls += calls
            self.tokens += tokens
            self.seconds += seconds


@runtime_checkable
class JudgeBackend(Protocol):
    """What an LLM judge needs from a model runtime (transformers, llama.cpp, an
    OpenAI-compatible endpoint, vLLM in-process). Judge logic — orders, principles,
    caching, parsing, clamping — lives in the judges, so every backend gets the same
    semantics; a backend only renders and reads.

    Requests are :class:`~pofe.judges.templates.Rendered` prompts (a user message plus the
    start of the judge's answer, ``assistant_prefix``); the backend applies its chat
    template (or sends messages) and continues after the prefix.
    """

    kind: str
    """Registry name of the backend (``transformers``, ``llamacpp``, ``openai``, ``vllm``)."""
    stats: BackendStats

    @property
    def fingerprint(self) -> str:
        """Identity of the model that answers: part of every judge-cache key. It must change
        whenever the weights behind a name change (weights identity, server-reported model
        id and revision); a backend that cannot tell must set ``cacheable = False``."""
        ...

    @property
    def cacheable(self) -> bool:
        """False when the fingerprint cannot be trusted to change with the weights (a live,
        training model object without a caller-given tag)."""
        ...

    @property
    def special_strings(self) -> tuple[str, ...]:
        """Special tokens of the judge's tokenizer: neutralised in judged texts (injection)."""
        ...

    def validate_choices(self, choices: Sequence[str]) -> None:
        """Raise :class:`JudgeConfigError` when the choice strings cannot be read (e.g. not a
        single token)."""
        ...

    def read_choices(self, requests: Sequence[Any], choices: Sequence[str]) -> list[ChoiceRead]:
        """For each rendered request, the absolute next-token log-probability of each choice
        string (tokenizer variants such as ``"1"``/``" 1"`` summed). One
        :class:`ChoiceRead` per request, in order; an unreadable read has ``logprobs=None``.
        Non-finite numbers are never returned as values (NaN/inf -> unreadable)."""
        ...

    def generate(self, requests: Sequence[Any], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, seed: int | None = None) -> list[list[GenOut]]:
        """``n`` sampled continuations per request (chain-of-thought rationales, rubric
        justifications); ``GenOut.text is None`` marks an unreadable sample."""
        ...

    def close(self) -> None: ...


def choice_variants(choice: str) -> tuple[str, ...]:
    """The spellings of one answer that count as that answer: as written and with a
    leading space (BPE vocabularies often have both)."""
    return tuple(dict.fromkeys([choice, " " + choice]))


class SingleTokenChoices:
    """``variant_ids`` / ``validate_choices`` for a backend that holds its judge's tokenizer
    (in-process transformers and vLLM): a choice is read from one next-token distribution, so
    only its single-token spellings count. Needs ``self.tokenizer``, ``self.model_name`` and a
    ``self._variant_ids`` dict."""

    def variant_ids(self, choice: str) -> list[int]:
        """Token ids of the single-token spellings of ``choice`` (multi-token spellings
        cannot be read from one next-token distribution and are skipped)."""
        if choice not in self._variant_ids:
            ids = []
            for v in choice_variants(choice):
                enc = self.tokenizer.encode(v, add_special_tokens=False)
                if len(enc) == 1:
                    ids.append(enc[0])
            self._variant_ids[choice] = sorted(set(ids))
        return self._variant_ids[choice]

    def validate_choices(self, choices: Sequence[str]) -> None:
        for c in choices:
            if not self.variant_ids(c):
                raise JudgeConfigError(f"judge choice {c!r} is not a single token (with or without a leading space) for "
                                       f"{self.model_name}; pick choices the tokenizer encodes as one token, e.g. '1'/'2' "
                                       f"or 'A'/'B'")
        sets = [set(self.variant_ids(c)) for c in choices]
        if len(set().union(*sets)) != sum(len(s) for s in sets):
            raise JudgeConfigError(f"judge choices {list(choices)} share a token for {self.model_name}")


# ----------------------------------------------------------------------------- in-process reads
def render_chat(tokenizer, req) -> str:
    """A rendered judge request as the model's chat prompt, ending in the assistant prefix
    (the in-process backends, transformers and vLLM, read the same text)."""
    from pofe.models import apply_chat_template

    return apply_chat_template(tokenizer, req.user) + req.assistant_prefix


def encode_keep_end(tokenizer, texts: Sequence[str], max_length: int | None) -> list[list[int]]:
    """Token ids of each text, cut to its last ``max_length`` tokens: the end holds the
    instruction and the answer slot; the start of a long prompt is the least informative
    part to lose."""
    out = []
    for t in texts:
        ids = tokenizer(t, add_special_tokens=False)["input_ids"]
        out.append(ids[-max_length:] if max_length and len(ids) > max_length else ids)
    return out
