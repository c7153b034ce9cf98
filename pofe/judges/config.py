"""Typed judge configs: one class per judge ``kind``, joined in a discriminated union.

Why a union and not one flat class: each kind takes only its own settings, so
``judge.kind: lenght`` or ``judge.prefer`` on an ``llm`` judge are errors naming the key
*when the command's config is parsed*, before any model loads or a run folder exists
(a flat 30-field class accepted both and failed 19 s later, or never).

This module imports no torch and no HTTP client (the CLI validates configs with it first).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (AfterValidator, BaseModel, Discriminator, Field, Tag, TypeAdapter, ValidationInfo,
                      ValidationError, WrapValidator, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from pofe.config import MAX_BATCH_SIZE, MAX_NEW_TOKENS, ConfigError, PofeConfig, Seed
from pofe.generation.base import VLLMSettings
from pofe.judges.base import Capability
from pofe.judges.usage import BudgetConfig, PriceConfig
from pofe.labels import calibration_map
from pofe.plugins import PluginError, is_plugin, lookup, name_validator, package_of, plugin_names

# The embedded model's name; kept equal to pofe.models.DEFAULT_MODEL (tested), not imported
# from there because pofe.models imports torch and this module must not.
DEFAULT_JUDGE_MODEL = "smollm2-135m-instruct"

Dtype = Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "auto"]
"""Weights dtype of an in-process judge model."""

COT_DEFAULT_CLAMP = (0.4, 0.6)
"""Bai et al. 2022 (rlaif-constitutional-ai, Stage 2) clamp chain-of-thought labels to
[0.4, 0.6] *whenever* CoT is used: reasoning pushes probabilities to 0/1, and overconfident
labels inflate reward-model margins."""

P, PW, SW, LP = Capability.POINTWISE, Capability.PAIRWISE, Capability.SHARES_WEIGHTS, Capability.NEEDS_LOGPROBS


# ======================================================================================
# Sections
# ======================================================================================
class CacheConfig(PofeConfig):
    """Judge cache (SQLite)."""

    enabled: bool = True
    """Store and reuse judge reads. A live model passed in at run time (its weights may be
    training) is cached only under a caller-given tag that changes with the weights."""
    path: str | None = None
    """SQLite file; default ``$POFE_HOME/judge-cache.sqlite`` (shared by runs)."""


class EndpointConfig(PofeConfig):
    """An OpenAI-compatible HTTP endpoint (kind ``openai``, or ``backend: openai``)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Base URL up to and including ``/v1``."""
    model: str = ""
    """Model name sent with each request (empty: the server's default)."""
    api: Literal["completions", "chat"] = "completions"
    """``completions`` sends the rendered prompt (with ``tokenizer``'s chat template when set); ``chat`` sends messages."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself is never in a config)."""
    tokenizer: str | None = None
    """completions API: tokenizer whose chat template renders the prompt (None: plain text)."""
    chat_prefill: bool = False
    """chat API: send the answer prefix as a partial assistant message (llama.cpp and vLLM accept this)."""
    concurrency: int = Field(4, ge=1)
    """Requests in flight at once."""
    timeout_s: float = Field(60.0, gt=0)
    """Per-request timeout."""
    max_retries: int = Field(3, ge=0)
    """Retries after the first attempt on connection errors, timeouts, 429, 5xx and unreadable 200 bodies."""
    backoff_s: float = Field(0.5, ge=0)
    """Base of the exponential backoff (full jitter: uniform(0, min(max_backoff_s, backoff_s * 2^attempt)))."""
    max_backoff_s: float = Field(20.0, ge=0)
    """Cap of one wait, also of a server's ``Retry-After`` (a huge or far-future value waits this long, no more)."""
    top_logprobs: int = Field(20, ge=1)
    """How many alternatives to request for the answer position (OpenAI caps chat at 20, legacy completions at 5)."""
    rate_limit: float | None = Field(None, gt=0)
    """Maximum requests per second (None: unlimited)."""
    identify: bool = True
    """Ask ``GET /v1/models`` once which model (id, revision/fingerprint if reported) serves
    the URL; that identity is part of every cache key, so a changed model never serves old
    labels. False: the configured name only (then never share a cache across model swaps)."""
    extra_body: dict[str, Any] = {}
    """Extra JSON fields merged into every request body."""

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, v: str) -> str:
        from pofe.judges.base import base_url_problem

        problem = base_url_problem(v)
        if problem and ("credentials" in problem or "query string" in problem):
            # Not a ValueError: pydantic's message would quote the value, and with it the key.
            raise ConfigError(f"bad value for 'judge.endpoint.base_url': {problem}")
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            # Most likely the key itself was pasted here: refuse it without repeating it.
            raise ConfigError("bad value for 'judge.endpoint.api_key_env': must be the NAME of an environment variable "
                              "holding the key (letters, digits, '_'), never the key itself")
        return v


class LlamaCppConfig(PofeConfig):
    """A local llama.cpp server (kind ``llamacpp``, or ``backend: llamacpp``)."""

    gguf: str | None = None
    """GGUF file; default: the embedded model's GGUF (``judge.model`` must then be an embedded name)."""
    n_ctx: int = Field(4096, ge=1)
    """Context per parallel slot."""
    n_parallel: int = Field(2, ge=1)
    """Parallel slots (= concurrent requests)."""
    n_threads: int | None = Field(None, ge=1)
    """CPU threads (default: half the cores, at most 8)."""
    tokenizer: str | None = None
    """With ``gguf`` set: tokenizer (name/dir) whose chat template renders prompts (None: plain text).
    Without it the embedded model's own tokenizer is used."""
    top_logprobs: int = Field(20, ge=1)
    timeout_s: float = Field(120.0, gt=0)


class CotConfig(PofeConfig):
    """Chain-of-thought labels (Bai et al. 2022): reason first, then read the choice token."""

    enabled: bool = False
    max_new_tokens: int = Field(128, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(0.0, ge=0)
    clamp: list[float] | None = None
    """Clamp p to [lo, hi]. Default (None) with CoT on: [0.4, 0.6], as CAI does whenever CoT is
    used; set another [lo, hi] to override, or [0, 1] to turn clamping off explicitly."""

    @field_validator("clamp")
    @classmethod
    def _check_clamp(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (len(v) != 2 or not 0.0 <= v[0] <= v[1] <= 1.0):
            raise ValueError(f"must be [lo, hi] with 0 <= lo <= hi <= 1, got {v}")
        return v

    def effective_clamp(self) -> tuple[float, float] | None:
        """The clamp the judge applies: none without CoT, the CAI default unless overridden."""
        if not self.enabled:
            return None
        return tuple(self.clamp) if self.clamp is not None else COT_DEFAULT_CLAMP


class RubricConfig(PofeConfig):
    """Additive 5-point rubric (Self-Rewarding LMs): k samples, parse 'Score: N', average."""

    samples: int = Field(3, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.9, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1, le=MAX_NEW_TOKENS)
    score_range: list[float] = [0, 5]
    """[lo, hi]: a parsed "Score: N" outside it is not a reading."""

    @field_validator("score_range")
    @classmethod
    def _check_range(cls, v: list[float]) -> list[float]:
        if len(v) != 2 or not v[0] < v[1]:
            raise ValueError(f"must be [lo, hi] with lo < hi, got {v}")
        return v


# ======================================================================================
# Kinds
# ======================================================================================
class _JudgeKind(PofeConfig):
    """Base of every judge kind: ``capabilities`` says what the built judge can do."""

    kind: str
    """Which judge (each kind narrows this to its own name; declared here so it comes first in dumped configs)."""

    def identity(self) -> dict[str, Any]:
        """Everything in this config that can change a label, as a flat-ish JSON dict: what an
        audit report records and ``--require-audit`` compares key by key (kind, model and
        revision, endpoint URL/model/API, template and its content hash, constitution and its
        version, choices, both orders, CoT and the clamp actually applied, temperatures,
        scores, ...). Settings that change only speed or plumbing (cache, batch size,
        device, retries, concurrency, API-key variable) are left out."""
        d = _identity_fields(self.model_dump(mode="json"))
        cot = getattr(self, "cot", None)
        if cot is not None:
            d["cot_clamp_applied"] = list(cot.effective_clamp()) if cot.effective_clamp() else None
        template = getattr(self, "template", None)
        if template:
            try:
                from pofe.judges.templates import load_template

                d["template_hash"] = load_template(template).hash
            except (OSError, ValueError, KeyError):
                d["template_hash"] = None  # unreadable here: the build fails later with the reason
        constitution = getattr(self, "constitution", None)
        if constitution:
            try:
                from pofe.constitutions import load_constitution

                d["constitution_version"] = load_constitution(constitution).version
            except (OSError, ValueError, KeyError):
                d["constitution_version"] = None
        return d

    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    @model_validator(mode="after")
    def _refuse_inapplicable(self):
        """A setting the chosen kind/backend/mode never reads is an error naming the key, when
        the config is parsed: ``endpoint.base_url`` on a transformers rubric judge or
        ``cot.clamp`` with CoT off would otherwise be accepted and silently do nothing."""
        for key, why in self._inapplicable():
            # ConfigError, not ValueError: pydantic would append the whole judge section as "got ...".
            raise ConfigError(f"bad value for 'judge.{key}': it does not apply here ({why}); remove it")
        return self

    def _inapplicable(self) -> list[tuple[str, str]]:
        """(key, why) for each explicitly set setting that this configuration ignores."""
        return []


class _MeteredKind(_JudgeKind):
    """A built-in kind: its judging is counted (``pofe.judges.usage``), priced and budgeted. A
    plugin kind is not (its judge is the plugin's own object)."""

    price: PriceConfig | None = None
    """What the judge's tokens cost, per million in and out (any currency): gives ``cost`` in metrics and
    summaries (``pofe.judges.usage``). A jury's cost is its members' (each member's own price)."""
    budget: BudgetConfig | None = None
    """The most one run may spend on judging (``tokens`` in + out and/or ``cost``): the run stops cleanly after
    the step that goes past it; ``--resume RUN --set judge.budget.tokens=N`` continues with a larger one."""

    def _inapplicable(self) -> list[tuple[str, str]]:
        out = super()._inapplicable()
        if self.budget is not None and self.budget.cost is not None and not self._priced():
            out.append(("budget.cost", "a cost budget needs judge.price to turn tokens into cost"))
        return out

    def _priced(self) -> bool:
        return self.price is not None


def _is_set(model: BaseModel, name: str) -> bool:
    """The user set ``name`` to something other than its default. Only explicit keys count
    (``model_fields_set``), and a key holding its default does not: commands merge the class
    defaults into what they validate, so defaults arrive as "set" keys too."""
    if name not in model.model_fields_set:
        return False
    default = type(model).model_fields[name].get_default(call_default_factory=True)
    value = getattr(model, name)
    if isinstance(value, BaseModel) and isinstance(default, BaseModel):
        return value.model_dump() != default.model_dump()
    return value != default


def _set_keys(model: BaseModel, names, prefix: str = "") -> list[str]:
    return [prefix + n for n in names if _is_set(model, n)]


_IN_PROCESS_KEYS = ("revision", "trust_remote_code", "dtype", "device", "batch_size", "max_length")


def _endpoint_inapplicable(e: "EndpointConfig", reads_logprobs: bool = True) -> list[tuple[str, str]]:
    out = []
    if e.api == "chat" and _is_set(e, "tokenizer"):
        out.append(("endpoint.tokenizer", "the tokenizer renders prompts for endpoint.api=completions; this is chat"))
    if e.api == "completions" and _is_set(e, "chat_prefill"):
        out.append(("endpoint.chat_prefill", "prefilling is for endpoint.api=chat; this is completions"))
    if not reads_logprobs and _is_set(e, "top_logprobs"):
        out.append(("endpoint.top_logprobs", "this judge reads generated text, not log-probabilities"))
    return out


def _llamacpp_inapplicable(lc: "LlamaCppConfig", owner: BaseModel, reads_logprobs: bool = True) -> list[tuple[str, str]]:
    out = []
    if not lc.gguf and _is_set(lc, "tokenizer"):
        out.append(("llamacpp.tokenizer", "it is read only with llamacpp.gguf; the embedded model uses its own tokenizer"))
    if lc.gguf and _is_set(owner, "model"):
        out.append(("model", "llamacpp.gguf is set, so the GGUF file is served, not judge.model"))
    if not reads_logprobs and _is_set(lc, "top_logprobs"):
        out.append(("llamacpp.top_logprobs", "this judge reads generated text, not log-probabilities"))
    return out


class _InProcessSettings(_MeteredKind):
    """A judge model run in this process (transformers)."""

    model: str = DEFAULT_JUDGE_MODEL
    """Judge model: embedded name, Hugging Face id or local directory."""
    revision: str | None = None
    """Model revision (part of the cache key)."""
    trust_remote_code: bool = False
    dtype: Dtype = "float32"
    device: str | None = None
    batch_size: int = Field(8, ge=1, le=MAX_BATCH_SIZE)
    """Sequences per forward pass."""
    max_length: int | None = Field(4096, ge=1)
    """Maximum judge prompt tokens (longer prompts keep their end)."""


class _LLMSettings(_MeteredKind):
    """Settings of every LLM judge, whatever runs the model."""

    template: str = "helpful"
    """Template shipped with pofe (helpful, helpful-short, helpful-very-short, summarize, harmless, constitution,
    rubric, expected-score) or a path to a template file."""
    max_response_chars: int | None = Field(6000, ge=1)
    """Cut each response to this many characters before rendering (marked with ' [...]')."""
    seed: Seed = 0
    """Seeds principle sampling and sampled decoding."""
    cache: CacheConfig = CacheConfig()


class _PairwiseLLMSettings(_LLMSettings):
    choices: list[str] | None = None
    """Answer tokens to read (default: the template's, e.g. ['1', '2'] or ['A', 'B'])."""
    both_orders: bool = True
    """Score (A, B) and (B, A) and average (OAIF Appendix E). False halves the cost and keeps position bias."""
    require_both_orders: bool = True
    """With both orders on: p is None unless both orders were read (a single order keeps its position bias)."""
    cot: CotConfig = CotConfig()
    constitution: str | None = None
    """Constitution name (pofe/constitutions/<name>.yaml) or path; used with the 'constitution' template."""
    principles_per_comparison: int = Field(1, ge=0)
    """Principles sampled per comparison; > 1 averages an ensemble (0 = all)."""

    def _inapplicable(self) -> list[tuple[str, str]]:
        out = super()._inapplicable()
        if not self.cot.enabled:
            out += [(k, "chain-of-thought is off; set judge.cot.enabled=true to use it")
                    for k in _set_keys(self.cot, ("max_new_tokens", "temperature", "clamp"), "cot.")]
        if not self.both_orders and _is_set(self, "require_both_orders"):
            out.append(("require_both_orders", "judge.both_orders is false: there is one order"))
        if _is_set(self, "principles_per_comparison") and not self.constitution and not self._template_has_principle():
            out.append(("principles_per_comparison", "no constitution is used (set judge.constitution or the "
                                                     "'constitution' template)"))
        return out

    def _template_has_principle(self) -> bool:
        try:
            from pofe.judges.templates import load_template

            return "{principle}" in load_template(self.template).prompt
        except (OSError, ValueError, KeyError):
            return True  # unreadable here: the build reports the template; do not guess


class LLMJudgeConfig(_PairwiseLLMSettings, _InProcessSettings):
    """``llm``: in-process transformers pairwise judge (token probabilities, both orders in one
    batch). Can share an already loaded model (``build_judge(cfg, model=, tokenizer=)``)."""

    kind: Literal["llm"] = "llm"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({PW, SW, LP})


class LlamaCppJudgeConfig(_PairwiseLLMSettings):
    """``llamacpp``: an xllamacpp server on 127.0.0.1 serving a GGUF (default: the embedded
    model's), read through the OpenAI-compatible backend."""

    kind: Literal["llamacpp"] = "llamacpp"
    model: str = DEFAULT_JUDGE_MODEL
    """Embedded model whose bundled GGUF is served (ignored when ``llamacpp.gguf`` is set)."""
    llamacpp: LlamaCppConfig = LlamaCppConfig()
    capabilities: ClassVar[frozenset[Capability]] = frozenset({PW, LP})

    def _inapplicable(self) -> list[tuple[str, str]]:
        return super()._inapplicable() + _llamacpp_inapplicable(self.llamacpp, self)


class OpenAIJudgeConfig(_PairwiseLLMSettings):
    """``openai``: any OpenAI-compatible endpoint (completions or chat, with logprobs)."""

    kind: Literal["openai"] = "openai"
    endpoint: EndpointConfig = EndpointConfig()
    capabilities: ClassVar[frozenset[Capability]] = frozenset({PW, LP})

    def _inapplicable(self) -> list[tuple[str, str]]:
        return super()._inapplicable() + _endpoint_inapplicable(self.endpoint)


class VLLMJudgeConfig(_PairwiseLLMSettings):
    """``vllm``: pairwise judge on an in-process vLLM engine (both orders in one batch; a
    choice outside the top-k list is read exactly through prompt log-probs, never as 0)."""

    kind: Literal["vllm"] = "vllm"
    model: str = DEFAULT_JUDGE_MODEL
    """Judge model: embedded name, Hugging Face id or local directory."""
    max_length: int | None = Field(4096, ge=1)
    """Maximum judge prompt tokens (longer prompts keep their end)."""
    vllm: VLLMSettings = VLLMSettings()
    """The engine (shared with a vLLM policy of the same model)."""
    # shares-weights: given the live policy, it reads through the policy's own engine and syncs
    capabilities: ClassVar[frozenset[Capability]] = frozenset({PW, SW, LP})


@dataclass(frozen=True)
class BackendSpec:
    """What validating a judge config needs to know of a built-in backend, without importing it
    (the backends import torch or an HTTP client): one row per key of
    ``pofe.judges.backends.BACKENDS`` (tests/plugins/test_plugins.py checks the two agree). A plugin
    backend has no row: it reads the config itself, and every built-in section is refused for it."""

    settings: str | None = None
    """Its own section of the judge config (``endpoint``, ``llamacpp``, ``vllm``); the others are refused."""
    in_process: tuple[str, ...] = _IN_PROCESS_KEYS
    """Which of the in-process model keys it reads (all for a model loaded here; the rest are refused)."""
    shares_weights: bool = False
    """It can read a live policy's weights (the shares-weights capability: self-rewarding)."""
    served_model: bool = False
    """The model is named by the server (``judge.model`` is refused: set ``endpoint.model``)."""


BACKEND_SPECS: dict[str, BackendSpec] = {
    "transformers": BackendSpec(shares_weights=True),
    "llamacpp": BackendSpec(settings="llamacpp", in_process=()),
    "openai": BackendSpec(settings="endpoint", in_process=(), served_model=True),
    "vllm": BackendSpec(settings="vllm", in_process=("max_length",), shares_weights=True),
}
BUILTIN_BACKENDS = tuple(BACKEND_SPECS)


def _check_backend_plugin(name: str, obj: Any) -> None:
    if not callable(obj):
        raise PluginError(f"judge backend plugin {name!r} is a {type(obj).__name__}, not a class or function "
                          f"(judge_config, **runtime) -> backend")


BackendName = Annotated[str, AfterValidator(name_validator("pofe.judge_backends", BUILTIN_BACKENDS, _check_backend_plugin))]
"""A judge backend: built in, or a ``pofe.judge_backends`` plugin (:mod:`pofe.plugins`)."""


class _PointwiseLLMSettings(_LLMSettings, _InProcessSettings):
    backend: BackendName = "transformers"
    """Where the judge model runs: transformers, llamacpp, openai, vllm, or a backend an installed plugin package adds."""
    vllm: VLLMSettings = VLLMSettings()
    """backend vllm: the in-process engine."""
    endpoint: EndpointConfig = EndpointConfig()
    """backend openai: the endpoint."""
    llamacpp: LlamaCppConfig = LlamaCppConfig()
    """backend llamacpp: the server."""

    reads_logprobs: ClassVar[bool] = True

    def _inapplicable(self) -> list[tuple[str, str]]:
        out = super()._inapplicable()
        b = self.backend
        spec = BACKEND_SPECS.get(b)  # None: a plugin's, which reads the config itself
        why = f"judge.backend is {b}"
        out += [(k, why) for k in sorted({s.settings for s in BACKEND_SPECS.values() if s.settings})
                if (spec is None or spec.settings != k) and _is_set(self, k)]
        if spec is not None:
            out += [(k, why + ": the model is not loaded by transformers in this process")
                    for k in _set_keys(self, tuple(k for k in _IN_PROCESS_KEYS if k not in spec.in_process))]
        if spec is not None and spec.served_model and _is_set(self, "model"):
            out.append(("model", f"{why}: the served model is judge.endpoint.model"))
        if spec is not None and spec.settings == "endpoint":
            out += _endpoint_inapplicable(self.endpoint, self.reads_logprobs)
        if spec is not None and spec.settings == "llamacpp":
            out += _llamacpp_inapplicable(self.llamacpp, self, self.reads_logprobs)
        return out

    @property
    def capabilities(self) -> frozenset[Capability]:  # type: ignore[override]
        base = set(type(self).base_capabilities)
        spec = BACKEND_SPECS.get(self.backend)
        if spec is not None and spec.shares_weights:
            base.add(SW)
        return frozenset(base)


class RubricJudgeConfig(_PointwiseLLMSettings):
    """``rubric``: additive 5-point rubric (Self-Rewarding LMs): sampled justifications ending
    in 'Score: N', averaged."""

    kind: Literal["rubric"] = "rubric"
    template: str = "rubric"
    rubric: RubricConfig = RubricConfig()
    base_capabilities: ClassVar[frozenset[Capability]] = frozenset({P})
    reads_logprobs: ClassVar[bool] = False


class ExpectedScoreJudgeConfig(_PointwiseLLMSettings):
    """``expected-score``: E[score] under the judge's distribution over score tokens (direct
    RLAIF, Lee et al. 2023), normalised to [0, 1]."""

    kind: Literal["expected-score"] = "expected-score"
    template: str = "expected-score"
    scores: list[str] | None = None
    """Score strings (default: the template's, 1..10)."""
    base_capabilities: ClassVar[frozenset[Capability]] = frozenset({P, LP})


class _ValueSettings(_MeteredKind):
    temperature: float = Field(0.0, ge=0)
    """0 = hard 1/0/0.5 labels, > 0 = sigmoid((v_A - v_B) / temperature)."""
    capabilities: ClassVar[frozenset[Capability]] = frozenset({PW, P})


class LengthJudgeConfig(_ValueSettings):
    """``length``: prefers the shorter (or longer) response; an oracle with a known preference."""

    kind: Literal["length"] = "length"
    prefer: Literal["shorter", "longer"] = "shorter"
    unit: Literal["chars", "words"] = "chars"
    """How length is counted."""


class KeywordJudgeConfig(_ValueSettings):
    """``keyword``: rewards (include) or penalises (exclude) the presence of words."""

    kind: Literal["keyword"] = "keyword"
    keywords: list[str] = Field(min_length=1)
    keyword_mode: Literal["include", "exclude"] = "include"


class ReferenceOverlapJudgeConfig(_ValueSettings):
    """``reference-overlap``: ROUGE-L F1 against the item's reference answer."""

    kind: Literal["reference-overlap"] = "reference-overlap"


class CallableJudgeConfig(_ValueSettings):
    """``callable``: ``module:function`` with ``value(prompt, response, reference) -> float | None``."""

    kind: Literal["callable"] = "callable"
    callable: str
    """'module:function' (the only import-string judge kind)."""

    @field_validator("callable")
    @classmethod
    def _check_spec(cls, v: str) -> str:
        mod, sep, fn = v.partition(":")
        if not (mod and sep and fn):
            raise ValueError(f"expected 'module:function', got {v!r}")
        return v


class RewardModelJudgeConfig(_MeteredKind):
    """``reward-model``: a sequence-classification checkpoint with one output;
    P(A > B) = sigmoid(r_A - r_B) (OAIF Sec. 4.3's RM baseline)."""

    kind: Literal["reward-model"] = "reward-model"
    reward_model: str
    """The checkpoint (local directory or hub id)."""
    trust_remote_code: bool = False
    dtype: Dtype = "float32"
    device: str | None = None
    """auto|cpu|cuda|mps; None = auto (CUDA when present, then MPS, else CPU)."""
    batch_size: int = Field(8, ge=1, le=MAX_BATCH_SIZE)
    max_length: int | None = Field(4096, ge=1)
    # Not shares-weights: it takes a loaded *classifier*, never the policy's causal LM.
    capabilities: ClassVar[frozenset[Capability]] = frozenset({PW, P})


_NOT_IDENTITY = {"price", "budget", "cache", "batch_size", "device", "concurrency", "timeout_s", "max_retries", "backoff_s",
                 "max_backoff_s", "rate_limit", "api_key_env", "n_parallel", "n_threads", "identify"}


def _identity_fields(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _identity_fields(v) for k, v in d.items() if k not in _NOT_IDENTITY}
    return d


# ----------------------------------------------------------------------------- plugin kinds
def _check_judge_plugin(name: str, obj: Any) -> None:
    """A ``pofe.judges`` plugin is a pydantic model class (its settings, the ``options``) with a
    ``build(self, **runtime)`` method returning the judge and a ``capabilities`` class attribute."""
    if not (isinstance(obj, type) and issubclass(obj, BaseModel) and callable(getattr(obj, "build", None))):
        raise PluginError(f"judge kind plugin {name!r} must be a pydantic model class (its options) with a "
                          f"build(self, **runtime) method, got {obj!r}")
    try:
        caps = frozenset(Capability(c) for c in getattr(obj, "capabilities", ()))
    except (TypeError, ValueError):
        caps = frozenset()
    if not caps & {Capability.PAIRWISE, Capability.POINTWISE}:
        raise PluginError(f"judge kind plugin {name!r} must declare capabilities, a set with 'pairwise' and/or "
                          f"'pointwise' (of {[c.value for c in Capability]}), got {getattr(obj, 'capabilities', None)!r}")


def judge_plugin(kind: str) -> type[BaseModel]:
    """The options class of the plugin judge kind ``kind`` (imported now; PluginError if none or broken)."""
    obj = lookup("pofe.judges", kind, {})
    _check_judge_plugin(kind, obj)
    return obj


class PluginJudgeConfig(_JudgeKind):
    """A judge kind that an installed plugin package adds (entry-point group ``pofe.judges``,
    :mod:`pofe.plugins`): ``kind`` is its entry point's name, ``options`` its own settings,
    validated by its own pydantic model when the config is parsed."""

    kind: str
    options: Any = Field(default_factory=dict, validate_default=True)
    """The plugin's settings (its documentation lists them); a bad one is an error naming ``judge.options.<key>``."""

    @field_validator("kind")
    @classmethod
    def _installed(cls, v: str) -> str:
        if v in KINDS:
            raise PydanticCustomError("unknown_name", "{message}", {"message": f"{v!r} is a built-in kind, not a plugin's"})
        try:
            judge_plugin(v)
        except PluginError as e:
            raise PydanticCustomError("unknown_name", "{message}", {"message": str(e)}) from None
        return v

    @field_validator("options", mode="before")
    @classmethod
    def _plugin_options(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is None:
            return v  # the kind itself was refused: that is the error
        options_cls = judge_plugin(kind)
        return v if isinstance(v, options_cls) else options_cls.model_validate({} if v is None else v)

    @property
    def capabilities(self) -> frozenset[Capability]:  # type: ignore[override]
        return frozenset(Capability(c) for c in type(self.options).capabilities)

    def identity(self) -> dict[str, Any]:
        # the package and its version: an audit of another version of the plugin's judge is another judge's
        return {**super().identity(), "plugin": package_of("pofe.judges", self.kind)}


JUDGE_CONFIGS: dict[str, type[_JudgeKind]] = {
    "llm": LLMJudgeConfig,
    "vllm": VLLMJudgeConfig,
    "llamacpp": LlamaCppJudgeConfig,
    "openai": OpenAIJudgeConfig,
    "rubric": RubricJudgeConfig,
    "expected-score": ExpectedScoreJudgeConfig,
    "length": LengthJudgeConfig,
    "keyword": KeywordJudgeConfig,
    "reference-overlap": ReferenceOverlapJudgeConfig,
    "callable": CallableJudgeConfig,
    "reward-model": RewardModelJudgeConfig,
}
"""kind -> config class of the built-in kinds that judge by themselves (the plain mapping; the
builders are in ``pofe.judges.registry``): what a ``jury`` is made of. A plugin kind's config
is a :class:`PluginJudgeConfig`; :data:`KINDS` adds the jury."""

_PLUGIN_TAG = "<plugin>"  # not a possible kind name of an entry point


def _judge_tag(v: Any) -> str | None:
    """The union member of a judge section: its kind, or the plugin member."""
    if isinstance(v, PluginJudgeConfig):
        return _PLUGIN_TAG
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return kind if kind is None or isinstance(kind, str) else str(kind)


def _route_kind(v: Any, handler) -> Any:
    """A kind that is not built in: an installed plugin's (its config class is the plugin's,
    not a union member, so it is validated here), else an error listing every kind."""
    kind = v.get("kind") if isinstance(v, dict) else None
    if kind is None or (isinstance(kind, str) and kind in KINDS):
        return handler(v)
    try:
        if is_plugin("pofe.judges", kind, KINDS):
            return PluginJudgeConfig.model_validate(v)
        # the kinds of one judge (built in, then plugins'), then the jury, which is made of them
        combined = [k for k in KINDS if k not in JUDGE_CONFIGS]
        known = ", ".join(repr(k) for k in [*JUDGE_CONFIGS, *plugin_names("pofe.judges"), *combined])
    except PluginError as e:  # a plugin named like a built-in kind, or two plugins of one name
        raise PydanticCustomError("unknown_name", "{message}", {"message": str(e)}) from None
    raise PydanticCustomError("union_tag_invalid", "unknown kind '{tag}'; choose one of {expected_tags}",
                              {"tag": str(kind), "expected_tags": known, "discriminator": "'kind'"})


def _kind_union(configs: dict[str, type[_JudgeKind]]):
    """A judge section choosing one of ``configs`` (or a plugin's kind) by ``kind``."""
    return Annotated[
        Union[tuple(Annotated[c, Tag(k)] for k, c in [*configs.items(), (_PLUGIN_TAG, PluginJudgeConfig)])],  # type: ignore[valid-type]
        Discriminator(_judge_tag),
        WrapValidator(_route_kind),
    ]


# ----------------------------------------------------------------------------- juries
JURY_P_CLIP = 1e-3
"""A member's p is clipped to [0.001, 0.999] before its log-odds are taken (|logit| <= 6.9): a
programmatic judge's hard 0/1 is a strong vote but a finite one, never an infinite veto."""


def _report_agreement(cmap: dict[str, Any]) -> float | None:
    a = cmap.get("agreement")
    return float(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else None


_MemberConfig = _kind_union(JUDGE_CONFIGS)
"""A jury member's section: any kind but the jury (plugins' included)."""


class JuryJudgeConfig(_MeteredKind):
    """``jury``: several pairwise judges, one verdict. Each member reads the pair itself (both
    orders, if it does), its p goes through its own calibration map when one is given, and the
    jury's p is the weighted mean of the members' log-odds,
    sigma(sum_i w_i logit(p_i) / sum_i w_i) (a logarithmic opinion pool; p_i clipped to
    [0.001, 0.999]). A member whose verdict is unreadable is left out of that pair's pool and
    counted; with none readable the jury's verdict is unreadable."""

    kind: Literal["jury"] = "jury"
    members: list[_MemberConfig] = Field(min_length=2)  # type: ignore[valid-type]
    """The member judges: two or more judge sections of any pairwise kind (``length``, ``llm``, ``openai``,
    ``reward-model``, ...; not a pointwise-only kind, and not a jury: a jury of juries is one jury whose
    weights are the products)."""
    calibration: list[str | None] | None = None
    """Per member (same order, null for none): an audit report (``pofe audit`` output) of that member, whose
    calibration map is applied to its p before pooling; checked when the config is parsed."""
    weights: Union[Literal["equal", "agreement"], list[float]] = "equal"
    """``equal``; ``agreement`` (each member's agreement with humans in its ``calibration`` report, minus the
    0.5 of chance: a judge at chance carries no information); or one positive number per member. Only
    ratios matter."""

    @field_validator("members", mode="before")
    @classmethod
    def _flat_pairwise_members(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v  # pydantic reports the type
        out = []
        for i, m in enumerate(v):
            if _judge_tag(m) == "jury":
                raise ConfigError(f"bad value for 'judge.members.{i}.kind': a jury cannot be a member of a jury "
                                  "(list its members here; pooled log-odds of pooled log-odds are one pool whose "
                                  "weights are the products)")
            try:
                m = parse_judge_config(m)
            except ConfigError as e:  # a member's own refusal: name the key under its place in the jury
                raise ConfigError(str(e).replace("'judge.", f"'judge.members.{i}.", 1)) from None
            except ValidationError:
                out.append(m)  # validated again below, where pydantic names the key
                continue
            if PW not in m.capabilities:
                raise ConfigError(f"bad value for 'judge.members.{i}.kind': {m.kind} is not a pairwise judge "
                                  "(a pointwise score has no log-odds of A over B to pool)")
            if getattr(m, "budget", None) is not None:  # only the jury's own budget is read
                raise ConfigError(f"bad value for 'judge.members.{i}.budget': a budget is the whole jury's; set "
                                  "judge.budget instead")
            out.append(m)
        return out

    def _priced(self) -> bool:
        return any(getattr(m, "price", None) is not None for m in self.members)

    def _inapplicable(self) -> list[tuple[str, str]]:
        out = super()._inapplicable()
        if self.price is not None:
            out.append(("price", "a jury's cost is its members': set judge.members.N.price on each"))
        return out

    @field_validator("weights", mode="before")
    @classmethod
    def _check_weights(cls, v: Any) -> Any:
        if v in ("equal", "agreement"):
            return v
        ok = isinstance(v, list) and all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                                         and w > 0 for w in v)
        if not ok:
            raise ConfigError(f"bad value for 'judge.weights': 'equal', 'agreement' or a list of positive numbers, "
                              f"one per member, got {v!r}")
        return v

    @field_validator("calibration")
    @classmethod
    def _readable_maps(cls, v: list[str | None] | None) -> list[str | None] | None:
        for i, path in enumerate(v or []):
            if path is not None:
                try:
                    calibration_map(path)
                except (OSError, ValueError) as e:
                    raise ConfigError(f"bad value for 'judge.calibration.{i}': {e}") from None
        return v

    @model_validator(mode="after")
    def _per_member(self):
        n = len(self.members)
        if self.calibration is not None and len(self.calibration) != n:
            raise ConfigError(f"bad value for 'judge.calibration': {len(self.calibration)} entries for {n} members "
                              "(one per member, null for none)")
        if isinstance(self.weights, list) and len(self.weights) != n:
            raise ConfigError(f"bad value for 'judge.weights': {len(self.weights)} weights for {n} members")
        if self.weights == "agreement":
            self.member_weights()  # refuses a member without a usable agreement, naming its key
        return self

    def calibration_maps(self) -> list[dict[str, Any] | None]:
        """Each member's calibration map (None: its p is pooled as it is)."""
        return [None if c is None else calibration_map(c) for c in (self.calibration or [None] * len(self.members))]

    def member_weights(self) -> list[float]:
        """The members' weights, normalised to sum to 1 (the pool depends on ratios only)."""
        n = len(self.members)
        if self.weights == "equal":
            raw = [1.0] * n
        elif self.weights == "agreement":
            raw = []
            for i, cmap in enumerate(self.calibration_maps()):
                if cmap is None:
                    raise ConfigError(f"bad value for 'judge.weights': 'agreement' reads each member's agreement from "
                                      f"its audit report, and 'judge.calibration.{i}' is not set")
                a = _report_agreement(cmap)
                if a is None or a <= 0.5:
                    why = "records no metrics.agreement" if a is None else f"says agreement {a:.3f}, no better than chance"
                    raise ConfigError(f"bad value for 'judge.calibration.{i}': {cmap.get('source')} {why}, so member "
                                      f"{i} would get no weight (drop it, or give judge.weights as numbers)")
                raw.append(a - 0.5)
        else:
            raw = [float(w) for w in self.weights]
        total = sum(raw)
        return [w / total for w in raw]

    @property
    def capabilities(self) -> frozenset[Capability]:  # type: ignore[override]
        # pairwise only: the members load their own models (none shares weights through the jury)
        return frozenset({PW} | ({LP} if any(LP in m.capabilities for m in self.members) else set()))

    def identity(self) -> dict[str, Any]:
        # the members' own identities, the weights applied and each calibration map (not where its file lies)
        return {"kind": self.kind, "members": [m.identity() for m in self.members], "weights": self.member_weights(),
                "calibration": [None if c is None else {k: v for k, v in c.items() if k != "source"}
                                for c in self.calibration_maps()]}


KINDS: dict[str, type[_JudgeKind]] = {**JUDGE_CONFIGS, "jury": JuryJudgeConfig}
"""kind -> config class of every built-in kind (the single judges and the jury)."""

AnyJudgeConfig = Union[tuple(KINDS.values()) + (PluginJudgeConfig,)]  # type: ignore[valid-type]

JudgeConfig = _kind_union(KINDS)
"""The type of a command's ``judge:`` section: one of the kinds, chosen by ``kind``; a kind
that is not built in is an installed plugin's (:class:`PluginJudgeConfig`) or an error
naming ``<section>.kind`` and listing every kind, plugins' included."""

_ADAPTER: TypeAdapter | None = None


def parse_judge_config(data: dict[str, Any] | _JudgeKind) -> _JudgeKind:
    """A judge config from a dict (``{"kind": "length", "prefer": "longer"}``); raises
    pydantic's ValidationError naming the key."""
    global _ADAPTER
    if isinstance(data, _JudgeKind):
        return data
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(JudgeConfig)
    return _ADAPTER.validate_python(data)

