"""Pointwise judges: the additive 5-point rubric and the expected score.

Rubric (Self-Rewarding LMs, Yuan et al. 2024, Sec. 2 and Fig. 2): the judge writes a short
justification ending in "Score: N"; k samples (paper: 3, T = 0.7, top-p 0.9) are drawn
and the valid ones averaged. Parsing reads only the *generated* text (a regex run over
prompt + output would match the "Score:" in the instructions: prometheus-eval #58) and
takes the last in-range "Score: N"; out-of-range numbers and missing scores are not
values. An item with no valid sample is unscored (``score=None``), never a sentinel
like -1 (the llm-swarm / Oxen scripts write -1, which then ranks as a real score).

Expected score (direct RLAIF, Lee et al. 2023): the judge is asked for a 1-10 rating and
the reward is E[s] under its distribution over the score tokens, normalised to [0, 1].
Multi-token scores ("10" is "1" then "0" for SmolLM2) are read by teacher forcing: the
mass of "1" is split into "1" (stop) and "10" by a second read after "1".
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Sequence

from pofe.judges.base import Capability, JudgeConfigError, check_batch
from pofe.judges.cache import JudgeCache, cache_key
from pofe.judges.probability import logsumexp
from pofe.judges.templates import Rendered, Template
from pofe.judges.usage import Metered
from pofe.records import Score

_SCORE_RE = re.compile(r"(?i)\bscore\b\s*\**\s*[:=]\s*\**\s*(\d+(?:\.\d+)?)")


def parse_rubric_score(text: str | None, lo: float = 0.0, hi: float = 5.0) -> float | None:
    """The last "Score: N" in ``text`` with lo <= N <= hi; ``None`` if there is none.

    Last, because a justification may quote a score ("not a Score: 5 answer") before the
    final verdict; in range, because "Score: 7" on a 5-point scale is not a reading of the
    rubric. Earlier in-range scores are used only when a later one is out of range.
    """
    if not text:
        return None
    for m in reversed(list(_SCORE_RE.finditer(text))):
        v = float(m.group(1))
        if lo <= v <= hi:
            return v
    return None


def _pointwise_caps(backend, *, logprobs: bool) -> frozenset[Capability]:
    caps = {Capability.POINTWISE}
    if logprobs:
        caps.add(Capability.NEEDS_LOGPROBS)
    if backend.kind == "transformers":
        caps.add(Capability.SHARES_WEIGHTS)
    return frozenset(caps)


class RubricJudge(Metered):
    """Pointwise additive-rubric judge over any backend with ``generate``; ``usage()`` counts its
    samples and tokens (:mod:`pofe.judges.usage`)."""

    def __init__(self, backend, template: Template, *, samples: int = 3, temperature: float = 0.7, top_p: float = 0.9,
                 max_new_tokens: int = 256, score_range: Sequence[float] = (0, 5), seed: int = 0,
                 cache: JudgeCache | None = None, judge_id: str | None = None, max_response_chars: int | None = None):
        if template.kind != "rubric":
            raise JudgeConfigError(f"template {template.id!r} is a {template.kind} template; the rubric judge needs a rubric one")
        self.backend, self.template = backend, template
        self.samples, self.temperature, self.top_p = int(samples), float(temperature), float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.lo, self.hi = float(score_range[0]), float(score_range[1])
        self.seed = seed
        self.cache = cache if getattr(backend, "cacheable", True) else None
        self.max_response_chars = max_response_chars
        self.id = judge_id or f"{backend.kind}:rubric:{template.id}"
        self.capabilities = _pointwise_caps(backend, logprobs=False)

    def _key(self, fp: str, prompt: str, response: str) -> str:
        dec = {"samples": self.samples, "temperature": self.temperature, "top_p": self.top_p,
               "max_new_tokens": self.max_new_tokens, "seed": self.seed}
        return cache_key("rubric/v1", fp, self.template.hash, dec, prompt, response)

    def score(self, prompts: Sequence[str], responses: Sequence[str], *,
              references: Sequence[str | None] | None = None) -> list[Score]:
        check_batch(prompts, responses)
        fp = self.backend.fingerprint
        cache = self.cache if getattr(self.backend, "cacheable", True) else None  # after fp: it may turn caching off
        keys = [self._key(fp, x, y) for x, y in zip(prompts, responses)]
        texts: list[list[str | None] | None] = [None] * len(keys)
        tokens = [0] * len(keys)
        cached = [False] * len(keys)
        if cache is not None:
            for i, k in enumerate(keys):
                hit = cache.get(k)
                if hit is not None:
                    texts[i], cached[i] = hit["texts"], True
        todo = [i for i, t in enumerate(texts) if t is None]
        self.count(cached=(len(texts) - len(todo)) * self.samples)  # the samples the cache answered
        t0 = time.perf_counter()
        if todo:
            cut = (lambda s: s[: self.max_response_chars] + " [...]"
                   if self.max_response_chars and len(s) > self.max_response_chars else s)
            reqs = [self.template.render({"prompt": prompts[i], "response": cut(responses[i])},
                                         special_strings=self.backend.special_strings) for i in todo]
            gens = self.backend.generate(reqs, n=self.samples, temperature=self.temperature, top_p=self.top_p,
                                         max_new_tokens=self.max_new_tokens, seed=self.seed)
            outs = [o for g in gens for o in g]  # one request per sample
            self.count(calls=len(outs), tokens_in=sum(o.tokens - o.tokens_out for o in outs),
                       tokens_out=sum(o.tokens_out for o in outs), unmetered=sum(not o.metered for o in outs))
            for i, g in zip(todo, gens):
                texts[i] = [o.text for o in g]
                tokens[i] = sum(o.tokens for o in g)
                if cache is not None and all(o.text is not None for o in g):
                    cache.put(keys[i], {"texts": texts[i]})
        per_item_s = (time.perf_counter() - t0) / max(1, len(todo))
        out = []
        for i, ts in enumerate(texts):
            vals = tuple(parse_rubric_score(t, self.lo, self.hi) for t in ts)
            valid = [v for v in vals if v is not None]
            out.append(Score(
                score=sum(valid) / len(valid) if valid else None,
                parse_ok=bool(valid),
                judge_id=self.id,
                samples=vals,
                template_hash=self.template.hash,
                template_id=self.template.id,
                raw=tuple(t if t is not None else "" for t in ts),
                tokens=tokens[i],
                latency_s=0.0 if cached[i] else round(per_item_s, 6),
                cached=cached[i],
                extra={"valid_samples": len(valid), "failed_samples": len(vals) - len(valid),
                       "cache_hits": int(cached[i]), "cache_misses": int(not cached[i]), "backend": self.backend.kind},
            ))
        return out

    def close(self) -> None:
        self.backend.close()


class ExpectedScoreJudge(Metered):
    """Pointwise E[score] under the judge's distribution over score tokens, in [0, 1]; ``usage()``
    counts its reads (continuation reads included) and tokens (:mod:`pofe.judges.usage`)."""

    def __init__(self, backend, template: Template, *, scores: Sequence[str] | None = None,
                 cache: JudgeCache | None = None, judge_id: str | None = None, max_response_chars: int | None = None):
        if template.kind != "expected-score":
            raise JudgeConfigError(f"template {template.id!r} is a {template.kind} template; "
                                   "the expected-score judge needs an expected-score one")
        self.backend, self.template = backend, template
        self.scores = tuple(scores or template.scores or [str(i) for i in range(1, 11)])
        try:
            self.values = [float(s) for s in self.scores]
        except ValueError:
            raise JudgeConfigError(f"expected-score: scores must be numbers, got {list(self.scores)}") from None
        if len(set(self.values)) < 2:
            raise JudgeConfigError("expected-score: need at least two distinct score values")
        self.cache = cache if getattr(backend, "cacheable", True) else None
        self.max_response_chars = max_response_chars
        self.id = judge_id or f"{backend.kind}:expected-score:{template.id}"
        self.capabilities = _pointwise_caps(backend, logprobs=True)
        has_prefix_scores = any(p != s and s.startswith(p) for s in self.scores for p in self.scores)
        if has_prefix_scores and getattr(backend, "api", None) == "chat" and not getattr(backend, "chat_prefill", False):
            raise JudgeConfigError("expected-score with multi-digit scores over the chat API needs judge.endpoint.chat_prefill=true "
                             "(the continuation after '1' is read from a prefilled answer) or judge.endpoint.api=completions")

    def _key(self, fp: str, prompt: str, response: str) -> str:
        return cache_key("expected-score/v1", fp, self.template.hash, list(self.scores), prompt, response)

    def _distribution(self, reqs: list[Rendered]) -> list[tuple[dict[str, float] | None, int, str | None]]:
        """Absolute log-prob of each full score string; string-prefix scores are split by a
        continuation read ("1" -> "1" followed by a non-continuation, or "10")."""
        first = self.backend.read_choices(reqs, self.scores)
        # prefixes that start a longer score: "1" for "10"
        prefixes = sorted({p for s in self.scores for p in self.scores if p != s and s.startswith(p)})
        cont: dict[str, list[Any]] = {}
        for pfx in prefixes:
            suffixes = [s[len(pfx):] for s in self.scores if s != pfx and s.startswith(pfx)]
            # the suffix of a longer score is itself a string: read its first character as a token
            heads = sorted(set(sfx[:1] for sfx in suffixes))
            creqs = [Rendered(r.user, r.assistant_prefix + pfx) for r in reqs]
            cont[pfx] = [self.backend.read_choices(creqs, heads), heads]
        reads = list(first) + [rd for rs, _ in cont.values() for rd in rs]
        self.count(calls=len(reads), tokens_in=sum(r.tokens - r.tokens_out for r in reads),
                   tokens_out=sum(r.tokens_out for r in reads), unmetered=sum(not r.metered for r in reads))
        out = []
        for i, rd in enumerate(first):
            if rd.logprobs is None:
                out.append((None, rd.tokens, rd.error or "unreadable"))
                continue
            lp = dict(rd.logprobs)
            for pfx, (reads, heads) in cont.items():
                c = reads[i]
                if c.logprobs is None:
                    lp = None
                    break
                base = lp.get(pfx, -math.inf)
                total_cont = logsumexp(c.logprobs[h] for h in heads)
                # P(pfx as a complete score) = P(pfx) * (1 - P(continue to a longer score | pfx))
                p_cont = min(1.0, math.exp(total_cont)) if total_cont != -math.inf else 0.0
                lp[pfx] = base + math.log1p(-p_cont) if p_cont < 1.0 else -math.inf
                for s in self.scores:
                    if s != pfx and s.startswith(pfx) and len(s) == len(pfx) + 1:
                        lp[s] = logsumexp([lp.get(s, -math.inf), base + c.logprobs[s[len(pfx):]]])
            out.append((lp, rd.tokens, None if lp is not None else "continuation unreadable"))
        return out

    def score(self, prompts: Sequence[str], responses: Sequence[str], *,
              references: Sequence[str | None] | None = None) -> list[Score]:
        check_batch(prompts, responses)
        fp = self.backend.fingerprint
        cache = self.cache if getattr(self.backend, "cacheable", True) else None  # after fp: it may turn caching off
        keys = [self._key(fp, x, y) for x, y in zip(prompts, responses)]
        dists: list[Any] = [None] * len(keys)
        cached = [False] * len(keys)
        if cache is not None:
            for i, k in enumerate(keys):
                hit = cache.get(k)
                if hit is not None:
                    dists[i] = ({s: (-math.inf if v == "-inf" else v) for s, v in hit["lp"].items()}, 0, None)
                    cached[i] = True
        todo = [i for i, d in enumerate(dists) if d is None]
        self.count(cached=len(dists) - len(todo))
        t0 = time.perf_counter()
        if todo:
            cut = (lambda s: s[: self.max_response_chars] + " [...]"
                   if self.max_response_chars and len(s) > self.max_response_chars else s)
            reqs = [self.template.render({"prompt": prompts[i], "response": cut(responses[i])},
                                         special_strings=self.backend.special_strings) for i in todo]
            for i, d in zip(todo, self._distribution(reqs)):
                dists[i] = d
                if cache is not None and d[0] is not None and any(v != -math.inf for v in d[0].values()):
                    cache.put(keys[i], {"lp": {s: ("-inf" if v == -math.inf else v) for s, v in d[0].items()}})
        per_item_s = (time.perf_counter() - t0) / max(1, len(todo))
        lo, hi = min(self.values), max(self.values)
        out = []
        for i, (lp, tok, err) in enumerate(dists):
            score, extra = None, {"cache_hits": int(cached[i]), "cache_misses": int(not cached[i]),
                                  "backend": self.backend.kind}
            if lp is not None:
                z = logsumexp(lp.values())
                if z != -math.inf:
                    probs = {s: math.exp(lp[s] - z) for s in self.scores}
                    expected = sum(probs[s] * v for s, v in zip(self.scores, self.values))
                    score = (expected - lo) / (hi - lo)
                    extra.update(expected=expected, score_mass=math.exp(z),
                                 distribution={s: round(p, 6) for s, p in probs.items()})
                else:
                    err = "no mass on any score token"
            if err:
                extra["error"] = err
            out.append(Score(score=score, parse_ok=score is not None, judge_id=self.id,
                             template_hash=self.template.hash, template_id=self.template.id, tokens=tok,
                             latency_s=0.0 if cached[i] else round(per_item_s, 6), cached=cached[i], extra=extra))
        return out

    def close(self) -> None:
        self.backend.close()
