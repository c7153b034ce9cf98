"""Judge configs and the plain name -> builder mapping (no substring matching, no import strings
except the explicit ``callable`` kind).

Kinds:

* ``llm`` — in-process transformers pairwise judge (token probabilities, both orders in
  one batch). Runtime ``model=``/``tokenizer=`` share an already loaded model.
* ``llamacpp`` — starts an xllamacpp server on 127.0.0.1 serving a GGUF (default: the
  embedded model's) and reads it through the OpenAI-compatible backend.
* ``openai`` — any OpenAI-compatible endpoint (completions or chat, with logprobs).
* ``vllm`` — pairwise judge on an in-process vLLM engine (``pofe.judges.vllm_backend``).
* ``rubric`` / ``expected-score`` — pointwise LLM judges (``backend`` picks
  transformers, llamacpp or openai).
* ``length``, ``keyword``, ``reference-overlap``, ``callable`` — programmatic judges.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import field_validator

from pofe.config import PofeConfig
from pofe.generation.base import VLLMSettings
from pofe.judges.cache import CacheConfig, open_cache
from pofe.models import DEFAULT_MODEL


class EndpointConfig(PofeConfig):
    """An OpenAI-compatible HTTP endpoint (kind ``openai``)."""

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
    concurrency: int = 4
    """Requests in flight at once."""
    timeout_s: float = 60.0
    """Per-request timeout."""
    max_retries: int = 3
    """Retries after the first attempt on connection errors, timeouts, 429 and 5xx."""
    backoff_s: float = 0.5
    """Base of the exponential backoff (full jitter: uniform(0, min(max_backoff_s, backoff_s * 2^attempt)))."""
    max_backoff_s: float = 20.0
    top_logprobs: int = 20
    """How many alternatives to request for the answer position (OpenAI caps chat at 20, legacy completions at 5)."""
    rate_limit: float | None = None
    """Maximum requests per second (None: unlimited)."""
    extra_body: dict[str, Any] = {}
    """Extra JSON fields merged into every request body."""


class LlamaCppConfig(PofeConfig):
    """A local llama.cpp server (kind ``llamacpp``)."""

    gguf: str | None = None
    """GGUF file; default: the embedded model's GGUF (``judge.model`` must then be an embedded name)."""
    n_ctx: int = 4096
    """Context per parallel slot."""
    n_parallel: int = 2
    """Parallel slots (= concurrent requests)."""
    n_threads: int | None = None
    """CPU threads (default: all cores)."""
    tokenizer: str | None = None
    """With ``gguf`` set: tokenizer (name/dir) whose chat template renders prompts (None: plain text).
    Without it the embedded model's own tokenizer is used."""
    top_logprobs: int = 20
    timeout_s: float = 120.0


class CotConfig(PofeConfig):
    """Chain-of-thought labels (Bai et al. 2022): reason first, then read the choice token."""

    enabled: bool = False
    max_new_tokens: int = 128
    temperature: float = 0.0
    clamp: list[float] | None = None
    """Clamp p to [lo, hi]; CAI uses [0.4, 0.6] because reasoning makes labels overconfident."""


class RubricConfig(PofeConfig):
    """Additive 5-point rubric (Self-Rewarding LMs): k samples, parse 'Score: N', average."""

    samples: int = 3
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 256
    score_range: list[float] = [0, 5]


class JudgeConfig(PofeConfig):
    """Which judge labels the pairs, and how."""

    kind: str = "llm"
    """Registry key: see ``JUDGES`` (llm, llamacpp, openai, rubric, expected-score, length, keyword, reference-overlap, callable)."""
    model: str = DEFAULT_MODEL
    """Judge model for LLM judges: embedded name, Hugging Face id or local directory."""
    revision: str | None = None
    """Model revision (part of the cache key)."""
    trust_remote_code: bool = False
    template: str = "helpful"
    """Template name shipped with pofe (helpful, helpful-short, helpful-very-short, summarize, harmless, constitution,
    rubric, expected-score) or a path to a template file."""
    choices: list[str] | None = None
    """Answer tokens to read (default: the template's, e.g. ['1', '2'] or ['A', 'B'])."""
    both_orders: bool = True
    """Score (A, B) and (B, A) and average (OAIF Appendix E). False halves the cost and keeps position bias."""
    require_both_orders: bool = True
    """With both orders on: p is None unless both orders were read (a single order keeps its position bias)."""
    batch_size: int = 8
    """Sequences per forward pass (transformers backend)."""
    max_length: int | None = 4096
    """Maximum judge prompt tokens (transformers backend; longer prompts keep their end)."""
    max_response_chars: int | None = 6000
    """Cut each response to this many characters before rendering (marked with ' [...]')."""
    dtype: str = "float32"
    device: str | None = None
    backend: Literal["transformers", "llamacpp", "openai", "vllm"] = "transformers"
    """Backend of the pointwise kinds (rubric, expected-score)."""
    vllm: VLLMSettings = VLLMSettings()
    """kind vllm / backend vllm: the in-process vLLM engine (shared with a vLLM policy of the same model)."""
    cot: CotConfig = CotConfig()
    constitution: str | None = None
    """Constitution name (pofe/constitutions/<name>.yaml) or path; used with the 'constitution' template."""
    principles_per_comparison: int = 1
    """Principles sampled per comparison; > 1 averages an ensemble (0 = all)."""
    seed: int = 0
    """Seeds principle sampling and sampled decoding."""
    rubric: RubricConfig = RubricConfig()
    scores: list[str] | None = None
    """expected-score: score strings (default: the template's, 1..10)."""
    endpoint: EndpointConfig = EndpointConfig()
    llamacpp: LlamaCppConfig = LlamaCppConfig()
    cache: CacheConfig = CacheConfig()
    # programmatic judges
    prefer: Literal["shorter", "longer"] = "shorter"
    """length judge: which response wins."""
    unit: Literal["chars", "words"] = "chars"
    """length judge: how length is counted."""
    temperature: float = 0.0
    """programmatic judges: 0 = hard 1/0/0.5 labels, > 0 = sigmoid((v_A - v_B) / temperature)."""
    keywords: list[str] = []
    """keyword judge: words whose presence is rewarded (mode include) or penalised (mode exclude)."""
    keyword_mode: Literal["include", "exclude"] = "include"
    callable: str | None = None
    """callable judge: 'module:function' with value(prompt, response, reference) -> float | None."""
    reward_model: str | None = None
    """reward-model judge: a sequence-classification checkpoint (one output); P(A>B) = sigmoid(r_A - r_B)."""

    @field_validator("cot")
    @classmethod
    def _check_clamp(cls, v: CotConfig) -> CotConfig:
        if v.clamp is not None and (len(v.clamp) != 2 or not 0.0 <= v.clamp[0] <= v.clamp[1] <= 1.0):
            raise ValueError(f"cot.clamp must be [lo, hi] with 0 <= lo <= hi <= 1, got {v.clamp}")
        return v


# -- builders ------------------------------------------------------------------------------
def _length(cfg: JudgeConfig, **_):
    from pofe.judges.programmatic import length_judge

    return length_judge(prefer=cfg.prefer, unit=cfg.unit, temperature=cfg.temperature)


def _keyword(cfg: JudgeConfig, **_):
    from pofe.judges.programmatic import keyword_judge

    return keyword_judge(cfg.keywords, mode=cfg.keyword_mode, temperature=cfg.temperature)


def _reference_overlap(cfg: JudgeConfig, **_):
    from pofe.judges.programmatic import reference_overlap_judge

    return reference_overlap_judge(temperature=cfg.temperature)


def _callable(cfg: JudgeConfig, **_):
    from pofe.judges.programmatic import callable_judge

    if not cfg.callable:
        raise ValueError("judge kind 'callable' needs judge.callable = 'module:function'")
    return callable_judge(cfg.callable, temperature=cfg.temperature)


def _cache(cfg: JudgeConfig, runtime: dict[str, Any]):
    if "cache" in runtime:  # a caller may share one JudgeCache object (or pass None to disable)
        return runtime["cache"]
    return open_cache(cfg.cache, path=runtime.get("cache_path"))


def make_backend(cfg: JudgeConfig, kind: str, **runtime):
    """The backend for ``kind`` (transformers | llamacpp | openai | vllm)."""
    from pofe.judges import backends as B

    if kind == "transformers":
        return B.TransformersBackend(cfg.model, model=runtime.get("model"), tokenizer=runtime.get("tokenizer"),
                                     revision=cfg.revision, dtype=cfg.dtype, device=cfg.device,
                                     trust_remote_code=cfg.trust_remote_code, batch_size=cfg.batch_size,
                                     max_length=cfg.max_length, cache_tag=runtime.get("cache_tag"))
    if kind == "llamacpp":
        from pofe.models import EMBEDDED_MODELS, embedded_gguf_path

        lc = cfg.llamacpp
        if lc.gguf:
            gguf, tok_name = lc.gguf, lc.tokenizer
        else:
            if cfg.model not in EMBEDDED_MODELS:
                raise ValueError(f"judge kind 'llamacpp': set judge.llamacpp.gguf (judge.model {cfg.model!r} is not an "
                                 f"embedded model with a bundled GGUF)")
            gguf, tok_name = str(embedded_gguf_path(cfg.model)), cfg.model
        return B.LlamaCppBackend(gguf, tokenizer_name=tok_name, tokenizer=runtime.get("tokenizer"), n_ctx=lc.n_ctx,
                                 n_parallel=lc.n_parallel, n_threads=lc.n_threads, top_logprobs=lc.top_logprobs,
                                 timeout_s=lc.timeout_s)
    if kind == "openai":
        e = cfg.endpoint
        return B.EndpointBackend(e.base_url, model=e.model, api=e.api, api_key_env=e.api_key_env,
                                 concurrency=e.concurrency, timeout_s=e.timeout_s, max_retries=e.max_retries,
                                 backoff_s=e.backoff_s, max_backoff_s=e.max_backoff_s, rate_limit=e.rate_limit,
                                 top_logprobs=e.top_logprobs, tokenizer=runtime.get("tokenizer"),
                                 tokenizer_name=e.tokenizer, chat_prefill=e.chat_prefill, extra_body=e.extra_body)
    if kind == "vllm":
        from pofe.judges.vllm_backend import VLLMBackend

        generator = runtime.get("generator")
        if generator is None and runtime.get("model") is not None:
            # a live model (self-rewarding: the current policy judges itself) is read through its
            # own vLLM generator, so policy sampling and judging share one engine and its syncs
            from pofe.generation.base import SamplingConfig
            from pofe.generation.vllm import generator_for

            generator = generator_for(runtime["model"], runtime.get("tokenizer"),
                                      SamplingConfig(engine="vllm", vllm=cfg.vllm))
        return VLLMBackend(cfg.model, settings=cfg.vllm, tokenizer=runtime.get("tokenizer"),
                           max_length=cfg.max_length, generator=generator)
    raise ValueError(f"unknown judge backend {kind!r}")


def _pairwise(backend_kind: str):
    def build(cfg: JudgeConfig, **runtime):
        from pofe.judges.llm import LLMPairwiseJudge
        from pofe.judges.templates import load_template

        template = load_template(cfg.template, kind="pairwise")
        constitution = None
        if cfg.constitution or "{principle}" in template.prompt:
            from pofe.constitutions import DEFAULT_CONSTITUTION, load_constitution

            constitution = load_constitution(cfg.constitution or DEFAULT_CONSTITUTION)
        backend = make_backend(cfg, backend_kind, **runtime)
        return LLMPairwiseJudge(
            backend, template, choices=cfg.choices, both_orders=cfg.both_orders,
            require_both_orders=cfg.require_both_orders, cot=cfg.cot.enabled, cot_max_new_tokens=cfg.cot.max_new_tokens,
            cot_temperature=cfg.cot.temperature, clamp_p=cfg.cot.clamp, constitution=constitution,
            principles_per_comparison=cfg.principles_per_comparison, seed=cfg.seed, cache=_cache(cfg, runtime),
            max_response_chars=cfg.max_response_chars, judge_id=runtime.get("judge_id"))

    return build


def _rubric(cfg: JudgeConfig, **runtime):
    from pofe.judges.pointwise import RubricJudge
    from pofe.judges.templates import load_template

    template = load_template(cfg.template if cfg.template != "helpful" else "rubric", kind="rubric")
    r = cfg.rubric
    return RubricJudge(make_backend(cfg, cfg.backend, **runtime), template, samples=r.samples,
                       temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                       score_range=r.score_range, seed=cfg.seed, cache=_cache(cfg, runtime),
                       max_response_chars=cfg.max_response_chars, judge_id=runtime.get("judge_id"))


def _expected_score(cfg: JudgeConfig, **runtime):
    from pofe.judges.pointwise import ExpectedScoreJudge
    from pofe.judges.templates import load_template

    template = load_template(cfg.template if cfg.template != "helpful" else "expected-score", kind="expected-score")
    return ExpectedScoreJudge(make_backend(cfg, cfg.backend, **runtime), template, scores=cfg.scores,
                              cache=_cache(cfg, runtime), max_response_chars=cfg.max_response_chars,
                              judge_id=runtime.get("judge_id"))


def _reward_model(cfg: JudgeConfig, **runtime):
    from pofe.judges.reward_model import RewardModelJudge

    return RewardModelJudge(cfg.reward_model, model=runtime.get("model"), tokenizer=runtime.get("tokenizer"),
                            batch_size=cfg.batch_size, max_length=cfg.max_length, dtype=cfg.dtype,
                            trust_remote_code=cfg.trust_remote_code)


JUDGES: dict[str, Callable[..., object]] = {
    "llm": _pairwise("transformers"),
    "llamacpp": _pairwise("llamacpp"),
    "openai": _pairwise("openai"),
    "vllm": _pairwise("vllm"),
    "rubric": _rubric,
    "expected-score": _expected_score,
    "length": _length,
    "keyword": _keyword,
    "reference-overlap": _reference_overlap,
    "callable": _callable,
    "reward-model": _reward_model,
}

POINTWISE_KINDS = {"rubric", "expected-score"}


def build_judge(cfg: JudgeConfig, **runtime):
    """Build the judge named by ``cfg.kind``.

    ``runtime`` passes live objects: ``model``/``tokenizer`` (share a loaded model),
    ``cache`` (a JudgeCache, or None to disable), ``cache_path``, ``cache_tag`` (makes a
    live model's reads cacheable; change it whenever the weights change), ``judge_id``.
    """
    try:
        builder = JUDGES[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown judge kind {cfg.kind!r}; choose one of {sorted(JUDGES)}") from None
    return builder(cfg, **runtime) if runtime else builder(cfg)
