"""The plain kind -> builder mapping (no substring matching, no import strings except the
explicit ``callable`` kind). Configs are in :mod:`pofe.judges.config`, one class per kind.

Kinds:

* ``llm`` — in-process transformers pairwise judge (token probabilities, both orders in
  one batch). Runtime ``model=``/``tokenizer=`` share an already loaded model.
* ``llamacpp`` — starts an xllamacpp server on 127.0.0.1 serving a GGUF (default: the
  embedded model's) and reads it through the OpenAI-compatible backend.
* ``openai`` — any OpenAI-compatible endpoint (completions or chat, with logprobs).
* ``rubric`` / ``expected-score`` — pointwise LLM judges (``backend`` picks
  transformers, llamacpp or openai).
* ``length``, ``keyword``, ``reference-overlap``, ``callable`` — programmatic judges.
* ``reward-model`` — a sequence-classification reward model.
* ``jury`` — several of the above pooled in log-odds (:mod:`pofe.judges.jury`).

Plugins (:mod:`pofe.plugins`): a kind from the entry-point group ``pofe.judges`` is built by
its options class's ``build(**runtime)``; a backend from ``pofe.judge_backends`` is called as
``backend(judge_config, **runtime)``.

Importing this module loads no model library; each builder imports what it needs.
"""

from __future__ import annotations

from typing import Any, Callable

from pofe.judges.base import JudgeConfigError
from pofe.judges.config import (
    JUDGE_CONFIGS,
    KINDS,
    AnyJudgeConfig,
    CacheConfig,
    CallableJudgeConfig,
    CotConfig,
    EndpointConfig,
    ExpectedScoreJudgeConfig,
    JudgeConfig,
    JuryJudgeConfig,
    KeywordJudgeConfig,
    LengthJudgeConfig,
    LlamaCppConfig,
    LlamaCppJudgeConfig,
    LLMJudgeConfig,
    VLLMJudgeConfig,
    OpenAIJudgeConfig,
    PluginJudgeConfig,
    ReferenceOverlapJudgeConfig,
    RewardModelJudgeConfig,
    RubricConfig,
    RubricJudgeConfig,
    parse_judge_config,
)

__all__ = ["JUDGES", "JUDGE_CONFIGS", "JudgeConfig", "AnyJudgeConfig", "build_judge", "build_shared_judge", "make_backend",
           "CacheConfig", "CotConfig", "EndpointConfig", "LlamaCppConfig", "RubricConfig", "LLMJudgeConfig",
           "LlamaCppJudgeConfig", "OpenAIJudgeConfig", "RubricJudgeConfig", "ExpectedScoreJudgeConfig",
           "LengthJudgeConfig", "KeywordJudgeConfig", "ReferenceOverlapJudgeConfig", "CallableJudgeConfig",
           "RewardModelJudgeConfig", "VLLMJudgeConfig", "PluginJudgeConfig", "JuryJudgeConfig", "KINDS",
           "judge_config_of", "parse_judge_config"]


# -- builders ------------------------------------------------------------------------------
def _length(cfg: LengthJudgeConfig, **_):
    from pofe.judges.programmatic import length_judge

    return length_judge(prefer=cfg.prefer, unit=cfg.unit, temperature=cfg.temperature)


def _keyword(cfg: KeywordJudgeConfig, **_):
    from pofe.judges.programmatic import keyword_judge

    return keyword_judge(cfg.keywords, mode=cfg.keyword_mode, temperature=cfg.temperature)


def _reference_overlap(cfg: ReferenceOverlapJudgeConfig, **_):
    from pofe.judges.programmatic import reference_overlap_judge

    return reference_overlap_judge(temperature=cfg.temperature)


def _callable(cfg: CallableJudgeConfig, **_):
    from pofe.judges.programmatic import callable_judge

    return callable_judge(cfg.callable, temperature=cfg.temperature)


def _cache(cfg, runtime: dict[str, Any]):
    if "cache" in runtime:  # a caller may share one JudgeCache object (or pass None to disable)
        return runtime["cache"]
    from pofe.judges.cache import open_cache

    return open_cache(cfg.cache, path=runtime.get("cache_path"))


def make_backend(cfg, kind: str, **runtime):
    """The backend named ``kind`` built from the judge config: one contract for built-ins (a key of
    :data:`pofe.judges.backends.BACKENDS`, its class's ``from_config``) and ``pofe.judge_backends``
    plugins (the entry point itself), each called as ``(judge_config, **runtime)`` and reading what
    it needs from the config."""
    from pofe.judges.backends import BACKENDS
    from pofe.plugins import PluginError, call_error, lookup

    try:
        build = lookup("pofe.judge_backends", kind, BACKENDS)
    except PluginError as e:
        raise JudgeConfigError(str(e)) from None
    if kind in BACKENDS:
        return build(cfg, **runtime)
    try:
        return PluginBackend(kind, build(cfg, **runtime))
    except (Exception, SystemExit) as e:
        raise call_error("pofe.judge_backends", kind, "to build its backend", e) from e


def _pairwise(backend_kind: str):
    def build(cfg, **runtime):
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
            cot_temperature=cfg.cot.temperature, clamp_p=cfg.cot.effective_clamp(), constitution=constitution,
            principles_per_comparison=cfg.principles_per_comparison, seed=cfg.seed, cache=_cache(cfg, runtime),
            max_response_chars=cfg.max_response_chars, judge_id=runtime.get("judge_id"))

    return build


def _rubric(cfg: RubricJudgeConfig, **runtime):
    from pofe.judges.pointwise import RubricJudge
    from pofe.judges.templates import load_template

    template = load_template(cfg.template, kind="rubric")
    r = cfg.rubric
    return RubricJudge(make_backend(cfg, cfg.backend, **runtime), template, samples=r.samples,
                       temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                       score_range=r.score_range, seed=cfg.seed, cache=_cache(cfg, runtime),
                       max_response_chars=cfg.max_response_chars, judge_id=runtime.get("judge_id"))


def _expected_score(cfg: ExpectedScoreJudgeConfig, **runtime):
    from pofe.judges.pointwise import ExpectedScoreJudge
    from pofe.judges.templates import load_template

    template = load_template(cfg.template, kind="expected-score")
    return ExpectedScoreJudge(make_backend(cfg, cfg.backend, **runtime), template, scores=cfg.scores,
                              cache=_cache(cfg, runtime), max_response_chars=cfg.max_response_chars,
                              judge_id=runtime.get("judge_id"))


def _reward_model(cfg: RewardModelJudgeConfig, **runtime):
    from pofe.judges.reward_model import RewardModelJudge

    return RewardModelJudge(cfg.reward_model, model=runtime.get("model"), tokenizer=runtime.get("tokenizer"),
                            batch_size=cfg.batch_size, max_length=cfg.max_length, dtype=cfg.dtype,
                            device=cfg.device, trust_remote_code=cfg.trust_remote_code)


def _jury(cfg: JuryJudgeConfig, **runtime):
    from pofe.judges.jury import JuryJudge

    # a shared cache reaches every member; live weights do not (the jury does not share weights)
    shared = {k: runtime[k] for k in ("cache", "cache_path") if k in runtime}
    return JuryJudge([build_judge(m, **shared) for m in cfg.members], cfg.member_weights(), cfg.calibration_maps(),
                     judge_id=runtime.get("judge_id"))


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
    "jury": _jury,
}
assert set(JUDGES) == set(KINDS), "every judge kind has one config class and one builder"


def build_judge(cfg, **runtime):
    """Build the judge named by ``cfg.kind`` (a judge config, or a dict parsed as one).

    ``runtime`` passes live objects: ``model``/``tokenizer`` (share a loaded model; only
    kinds with the shares-weights capability take them), ``cache`` (a JudgeCache, or None
    to disable), ``cache_path``, ``cache_tag`` (makes a live model's reads cacheable: the
    caller promises the weights stay frozen; the fingerprint is still their hash),
    ``judge_id``.
    """
    if isinstance(cfg, dict):
        cfg = parse_judge_config(cfg)
    if isinstance(cfg, PluginJudgeConfig):  # a plugin kind builds its judge from its own options
        from pofe.plugins import call_error

        try:
            judge = PluginJudge(cfg.kind, cfg.options.build(**runtime))
        except (Exception, SystemExit) as e:
            raise call_error("pofe.judges", cfg.kind, "to build its judge", e) from e
        return _built_from(judge, cfg)
    builder = JUDGES[cfg.kind]
    judge = builder(cfg, **runtime) if runtime else builder(cfg)
    if getattr(cfg, "price", None) is not None and hasattr(judge, "count"):  # a metered judge: its usage() prices its tokens
        judge.price = cfg.price
    return _built_from(judge, cfg)


def _built_from(judge, cfg):
    """Keep the config a judge was built from on it (``judge.judge_config``): an audit of the
    judge object alone (``run_audit(build_judge({"kind": "length"}), items)``) then names the
    kind and settings that were judged, not the audit config's default judge."""
    try:
        judge.judge_config = cfg
    except (AttributeError, TypeError):  # a judge object that takes no attributes: audits name it by its id
        pass
    return judge


def judge_config_of(judge):
    """The config :func:`build_judge` built ``judge`` from, or None for a judge made by hand."""
    return getattr(judge, "judge_config", None)


class PluginBackend:
    """A plugin backend, contained: each of its methods that raises or exits (``read_choices``,
    ``generate``, ...) is one line naming the plugin and its package
    (:func:`pofe.plugins.contained`); its attributes (``kind``, ``stats``, ``fingerprint``) are its own."""

    def __init__(self, plugin: str, inner: Any):
        self._plugin, self._inner = plugin, inner

    def __getattr__(self, name: str) -> Any:
        from pofe.plugins import contained

        v = getattr(self.__dict__["_inner"], name)
        return contained("pofe.judge_backends", self.__dict__["_plugin"], v) if callable(v) and not isinstance(v, type) else v

    def __setattr__(self, name: str, value: Any) -> None:
        # what a judge sets on its backend is the backend's own
        object.__setattr__(self, name, value) if name in ("_plugin", "_inner") else setattr(self._inner, name, value)


class PluginJudge:
    """A plugin kind's judge, contained: what its ``judge`` / ``score`` raises (or an exit), a
    verdict count that is not the batch's, and a probability or score that is not a finite number
    in range become one line naming the plugin and its package (:class:`pofe.plugins.PluginCallError`),
    never an internal error or a NaN row; the rows a command wrote before stay. Everything else
    is the plugin's own object."""

    def __init__(self, plugin: str, inner: Any):
        self._plugin, self._inner = plugin, inner  # private names: the judge's own attributes show through
        if hasattr(inner, "judge"):  # only the methods the plugin has (callers test with hasattr)
            self.judge = self._judge
        if hasattr(inner, "score"):
            self.score = self._score

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        # a caller's attribute (a budget, a price) is the judge's own; the wrapper keeps only its own three
        own = ("_plugin", "_inner", "judge", "score", "judge_config")  # judge_config: pofe's record, not the plugin's
        object.__setattr__(self, name, value) if name in own else setattr(self._inner, name, value)

    def _call(self, method: str, prompts, *args, **kwargs) -> list:
        from pofe.plugins import call_error

        try:
            out = getattr(self._inner, method)(prompts, *args, **kwargs)
        except (Exception, SystemExit) as e:
            raise call_error("pofe.judges", self._plugin, f"in {method}() on a batch of {len(prompts)}", e) from e
        try:
            out = list(out)
        except TypeError:
            out = None
        if out is None or len(out) != len(prompts):
            got = "a " + type(out).__name__ if out is None else f"{len(out)} verdicts"
            raise call_error("pofe.judges", self._plugin, f"in {method}(): it returned {got} for {len(prompts)} items")
        return out

    def _bad(self, method: str, i: int, what: str, v: Any):
        from pofe.plugins import call_error

        return call_error("pofe.judges", self._plugin, f"in {method}(): verdict {i} has {what} = {v!r} "
                                                    f"(a finite number{' in [0, 1]' if what != 'score' else ''} or None)")

    def _judge(self, prompts, responses_a, responses_b, **kwargs) -> list:
        import math

        out = self._call("judge", prompts, responses_a, responses_b, **kwargs)
        for i, v in enumerate(out):
            for key in ("p", "p_ab", "p_ba"):
                x = getattr(v, key, None)
                if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                                      or not 0.0 <= x <= 1.0):
                    raise self._bad("judge", i, key, x)
        return out

    def _score(self, prompts, responses, **kwargs) -> list:
        import math

        out = self._call("score", prompts, responses, **kwargs)
        for i, v in enumerate(out):
            x = getattr(v, "score", None)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)):
                raise self._bad("score", i, "score", x)
        return out


def build_shared_judge(jcfg, *, model=None, tokenizer=None, judge_id: str | None = None):
    """Build a judge; with ``model`` a judge that can share weights reads those (no cache:
    they change — self-rewarding's M_t judging itself)."""
    from pofe.judges.base import Capability, has_capability

    if has_capability(jcfg, Capability.SHARES_WEIGHTS) and model is not None:
        return build_judge(jcfg, model=model, tokenizer=tokenizer, cache=None, judge_id=judge_id)
    return build_judge(jcfg)
