"""Pairwise LLM annotator: debiased soft preference from choice-token probabilities.

OAIF Appendix E / Lee et al. (2023): the judge sees (prompt, response 1, response 2), the
probabilities of the answer tokens ("1"/"2", or "A"/"B") are read from the next-token
distribution and renormalised over the choice set, and position bias is removed by
scoring both orders and averaging, p = ½(p₁₂ + 1 − p₂₁). Both orders go into the same
backend batch. Optional:

* chain-of-thought (Bai et al. 2022): the judge first writes a comparison, then the
  choice token is read after it; p is clamped to [lo, hi] (the config's default with CoT
  on is CAI's [0.4, 0.6]);
* a constitution: one principle sampled per comparison (or an ensemble of K averaged),
  recorded with the label.

Every ordered read goes through the judge cache. Unreadable reads (including NaN/inf
log-probs) give ``None`` and are counted, never replaced by 0.5.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

from pofe.judges.base import Capability, JudgeConfigError, check_batch
from pofe.judges.cache import JudgeCache, cache_key
from pofe.judges.probability import clamp, combine_orders, first_choice_probability, is_consistent
from pofe.judges.templates import Rendered, Template
from pofe.judges.usage import Metered
from pofe.records import Judgment


@dataclass
class _Read:
    """One ordered read (cached as a dict)."""

    lp_first: float | None
    lp_second: float | None
    mass: float | None  # probability the judge put on the two choices together
    raw: str
    tokens: int
    hard_label: bool
    truncated: bool
    error: str | None
    cached: bool = False
    tokens_out: int = 0  # of ``tokens``, the generated ones (CoT rationale, an endpoint's answer)
    metered: bool = True  # the backend knew the tokens (an endpoint reported usage)

    @property
    def ok(self) -> bool:
        return first_choice_probability(self.lp_first, self.lp_second) is not None

    def to_cache(self) -> dict[str, Any]:
        return {"lp": [_enc(self.lp_first), _enc(self.lp_second)], "mass": self.mass, "raw": self.raw,
                "tokens": self.tokens, "hard_label": self.hard_label, "truncated": self.truncated}

    @classmethod
    def from_cache(cls, d: dict[str, Any]) -> "_Read":
        return cls(_dec(d["lp"][0]), _dec(d["lp"][1]), d.get("mass"), d.get("raw", ""), int(d.get("tokens", 0)),
                   bool(d.get("hard_label")), bool(d.get("truncated")), None, cached=True)


def _enc(x: float | None):
    return "-inf" if x == -math.inf else x


def _dec(x):
    return -math.inf if x == "-inf" else x


class LLMPairwiseJudge(Metered):
    """Pairwise judge over any :class:`~pofe.judges.base.JudgeBackend`; ``usage()`` counts its
    backend reads, cache hits and tokens (:mod:`pofe.judges.usage`)."""

    def __init__(self, backend, template: Template, *, judge_id: str | None = None, choices: Sequence[str] | None = None,
                 both_orders: bool = True, require_both_orders: bool = True, cot: bool = False,
                 cot_max_new_tokens: int = 128, cot_temperature: float = 0.0, clamp_p: Sequence[float] | None = None,
                 constitution=None, principles_per_comparison: int = 1, seed: int = 0,
                 cache: JudgeCache | None = None, max_response_chars: int | None = None):
        if template.kind != "pairwise":
            raise JudgeConfigError(f"template {template.id!r} is a {template.kind} template; a pairwise judge needs a pairwise one")
        self.backend = backend
        self.template = template
        self.choices = tuple(choices or template.choices)
        if len(self.choices) != 2:
            raise JudgeConfigError(f"a pairwise judge needs exactly two choices, got {list(self.choices)}")
        self.both_orders = both_orders
        self.require_both_orders = require_both_orders and both_orders
        self.cot = cot
        if cot and getattr(backend, "api", None) == "chat" and not getattr(backend, "chat_prefill", False):
            # The choice is read after the rationale, which must be sent back as the start of
            # the judge's own answer: only possible with a prefilled assistant turn.
            raise JudgeConfigError("chain-of-thought over the chat API needs judge.endpoint.chat_prefill=true "
                             "(or judge.endpoint.api=completions)")
        self.cot_max_new_tokens, self.cot_temperature = cot_max_new_tokens, cot_temperature
        if clamp_p is not None and (len(clamp_p) != 2 or not 0.0 <= clamp_p[0] <= clamp_p[1] <= 1.0):
            raise JudgeConfigError(f"clamp must be [lo, hi] with 0 <= lo <= hi <= 1, got {clamp_p}")
        self.clamp_p = tuple(clamp_p) if clamp_p else None
        self.constitution = constitution
        if constitution is not None and "{principle}" not in template.prompt:
            raise JudgeConfigError(f"template {template.id!r} has no {{principle}} slot; use the 'constitution' template")
        if constitution is None and "{principle}" in template.prompt:
            raise JudgeConfigError(f"template {template.id!r} needs a constitution (judge.constitution)")
        self.k = principles_per_comparison
        self.seed = seed
        self.cache = cache if getattr(backend, "cacheable", True) else None
        self.max_response_chars = max_response_chars
        self.id = judge_id or f"{backend.kind}:{getattr(backend, 'model_name', getattr(backend, 'model_id', ''))}:{template.id}"
        self._validated = False
        caps = {Capability.PAIRWISE, Capability.NEEDS_LOGPROBS}
        if backend.kind == "transformers":
            caps.add(Capability.SHARES_WEIGHTS)
        self.capabilities = frozenset(caps)

    # -- helpers ----------------------------------------------------------------------
    def _decoding(self) -> dict[str, Any]:
        d: dict[str, Any] = {"choices": list(self.choices), "read": "next-token"}
        if self.cot:
            d.update(cot=True, cot_max_new_tokens=self.cot_max_new_tokens, cot_temperature=self.cot_temperature,
                     cot_seed=self.seed if self.cot_temperature > 0 else None)
        return d

    def _principles(self, prompt: str, a: str, b: str) -> list:
        if self.constitution is None:
            return [None]
        return self.constitution.for_comparison(self.seed, prompt, a, b, self.k)

    def _cut(self, text: str) -> str:
        if self.max_response_chars and len(text) > self.max_response_chars:
            return text[: self.max_response_chars] + " [...]"
        return text

    def _key(self, fingerprint, prompt, first, second, principle, reference) -> str:
        pr = None if principle is None else [principle.id, self.constitution.version, principle.text]
        return cache_key("pairwise-read/v1", fingerprint, self.template.hash, self._decoding(), prompt,
                         first, second, pr, reference)

    def _render(self, prompt, first, second, principle, reference) -> Rendered:
        fields = {"prompt": prompt, "response_1": self._cut(first), "response_2": self._cut(second),
                  "reference": reference or ""}
        if principle is not None:
            fields["principle"] = principle.text
        return self.template.render(fields, cot=self.cot, special_strings=self.backend.special_strings)

    def _run(self, reqs: list[tuple]) -> list[_Read]:
        """Backend reads for the cache misses (one batch, both orders together)."""
        if not self._validated:
            self.backend.validate_choices(self.choices)
            self._validated = True
        rendered = [self._render(*r) for r in reqs]
        raws = [""] * len(rendered)
        gen_tokens = [0] * len(rendered)
        gen_out, gen_metered = [0] * len(rendered), [True] * len(rendered)
        if self.cot:
            gens = self.backend.generate(rendered, n=1, temperature=self.cot_temperature,
                                         max_new_tokens=self.cot_max_new_tokens, seed=self.seed)
            new = []
            for i, (r, g) in enumerate(zip(rendered, gens)):
                text = g[0].text
                gen_tokens[i], gen_out[i], gen_metered[i] = g[0].tokens, g[0].tokens_out, g[0].metered
                if text is None:
                    new.append(None)
                    continue
                raws[i] = text
                new.append(Rendered(r.user, r.assistant_prefix + text.rstrip() + self.template.cot_answer_prefix))
            todo = [i for i, r in enumerate(new) if r is not None]
            reads_sub = self.backend.read_choices([new[i] for i in todo], self.choices) if todo else []
            reads: list[Any] = [None] * len(rendered)
            for i, rd in zip(todo, reads_sub):
                reads[i] = rd
        else:
            reads = self.backend.read_choices(rendered, self.choices)
        out = []
        c1, c2 = self.choices
        for i, rd in enumerate(reads):
            if rd is None:
                out.append(_Read(None, None, None, raws[i], gen_tokens[i], False, False, "rationale could not be read",
                                 tokens_out=gen_out[i], metered=gen_metered[i]))
                continue
            meter = {"tokens_out": gen_out[i] + rd.tokens_out, "metered": gen_metered[i] and rd.metered}
            if rd.logprobs is None:
                out.append(_Read(None, None, None, raws[i] or rd.raw, gen_tokens[i] + rd.tokens, rd.hard_label,
                                 rd.truncated, rd.error or "unreadable", **meter))
                continue
            l1, l2 = rd.logprobs[c1], rd.logprobs[c2]
            mass = math.exp(l1) + math.exp(l2) if not rd.hard_label else None
            out.append(_Read(l1, l2, mass, raws[i] or rd.raw, gen_tokens[i] + rd.tokens, rd.hard_label, rd.truncated,
                             None if first_choice_probability(l1, l2) is not None else "no mass on either choice", **meter))
        return out

    # -- protocol ---------------------------------------------------------------------
    def judge(self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str], *,
              references: Sequence[str | None] | None = None) -> list[Judgment]:
        check_batch(prompts, responses_a, responses_b)
        refs = list(references) if references is not None else [None] * len(prompts)
        t0 = time.perf_counter()
        # 1. every ordered read we need: (item, principle index, order)
        plan: list[list[list[tuple]]] = []
        for x, a, b, ref in zip(prompts, responses_a, responses_b, refs):
            per_item = []
            for pr in self._principles(x, a, b):
                orders = [(x, a, b, pr, ref)]
                if self.both_orders:
                    orders.append((x, b, a, pr, ref))
                per_item.append(orders)
            plan.append(per_item)
        flat = [req for item in plan for pr in item for req in pr]
        fp = self.backend.fingerprint  # once per call: it may stat weight files or ask the server
        # after the fingerprint: an endpoint that could not say what it serves turns caching off
        cache = self.cache if getattr(self.backend, "cacheable", True) else None
        keys = [self._key(fp, *r) for r in flat]
        reads: list[_Read | None] = [None] * len(flat)
        # 2. cache
        if cache is not None:
            for i, k in enumerate(keys):
                hit = cache.get(k)
                if hit is not None:
                    reads[i] = _Read.from_cache(hit)
        # 3. backend for the misses, deduplicated (the same ordered read can occur twice)
        miss_keys = list(dict.fromkeys(k for k, r in zip(keys, reads) if r is None))
        first_idx: dict[str, int] = {}
        for i, k in enumerate(keys):
            first_idx.setdefault(k, i)
        t_model = time.perf_counter()
        fresh = self._run([flat[first_idx[k]] for k in miss_keys]) if miss_keys else []
        model_s = time.perf_counter() - t_model
        by_key = dict(zip(miss_keys, fresh))
        # what this call cost: each read sent once (duplicates in the batch are one read), hits free
        self.count(calls=len(fresh), cached=sum(r is not None and r.cached for r in reads),
                   tokens_in=sum(r.tokens - r.tokens_out for r in fresh), tokens_out=sum(r.tokens_out for r in fresh),
                   unmetered=sum(not r.metered for r in fresh))
        for i, k in enumerate(keys):
            if reads[i] is None:
                reads[i] = by_key[k]
        if cache is not None:
            # Every successful read is stored, also when others in the batch failed (paid API
            # work is not lost); failures never are: a transient error must be retried next
            # time. A cache that cannot be written degrades to uncached (warning, no error).
            cache.put_many([(k, rd.to_cache()) for k, rd in by_key.items() if rd.ok])
        # 4. assemble verdicts
        n_orders = 2 if self.both_orders else 1
        per_read_s = model_s / max(1, len(miss_keys))
        out, pos = [], 0
        for item in plan:
            item_reads = []
            for _ in item:
                item_reads.append(reads[pos:pos + n_orders])
                pos += n_orders
            out.append(self._verdict(item, item_reads, per_read_s, fp))
        self.last_seconds = time.perf_counter() - t0
        return out

    def _verdict(self, item, item_reads, per_read_s, fingerprint: str) -> Judgment:
        per_principle, p_abs, p_bas, ps = [], [], [], []
        all_reads = [r for rs in item_reads for r in rs]
        for orders, rs in zip(item, item_reads):
            p_ab = first_choice_probability(rs[0].lp_first, rs[0].lp_second)
            p_ba = None
            if self.both_orders:
                q = first_choice_probability(rs[1].lp_first, rs[1].lp_second)
                p_ba = None if q is None else 1.0 - q  # A is shown second in this order
            p = combine_orders(p_ab, p_ba, require_both=self.require_both_orders) if self.both_orders else p_ab
            pr = orders[0][3]
            per_principle.append({"principle_id": pr.id if pr else None, "p_ab": p_ab, "p_ba": p_ba, "p": p})
            if p_ab is not None:
                p_abs.append(p_ab)
            if p_ba is not None:
                p_bas.append(p_ba)
            if p is not None:
                ps.append(p)
        # Ensemble over principles: mean of the principles that could be read.
        p = sum(ps) / len(ps) if ps else None
        p_ab = sum(p_abs) / len(p_abs) if p_abs else None
        p_ba = sum(p_bas) / len(p_bas) if p_bas else None
        p_final = clamp(p, self.clamp_p)
        misses = sum(not r.cached for r in all_reads)
        principles = [o[0][3] for o in item]
        extra: dict[str, Any] = {
            "backend": self.backend.kind,
            "model": fingerprint,
            "orders_read": sum(r.ok for r in all_reads),
            "orders_failed": sum(not r.ok for r in all_reads),
            "cache_hits": len(all_reads) - misses,
            "cache_misses": misses,
            "hard_label_orders": sum(r.hard_label for r in all_reads),
            "truncated_orders": sum(r.truncated for r in all_reads),
            "choice_mass": [None if r.mass is None else round(r.mass, 6) for r in all_reads],
        }
        errors = [r.error for r in all_reads if r.error]
        if errors:
            extra["errors"] = errors
        if self.clamp_p and p is not None and p_final != p:
            extra["p_unclamped"] = p
        if len(per_principle) > 1:
            extra["per_principle"] = per_principle
        return Judgment(
            p=p_final,
            p_ab=p_ab,
            p_ba=p_ba,
            consistent=is_consistent(p_ab, p_ba) if self.both_orders else None,
            parse_ok=p is not None,
            judge_id=self.id,
            template_hash=self.template.hash,
            template_id=self.template.id,
            principle_id="+".join(pr.id for pr in principles) if principles[0] is not None else None,
            constitution_version=self.constitution.version if self.constitution is not None else None,
            raw=tuple(r.raw for r in all_reads if r.raw),
            hard_label_fallback=any(r.hard_label for r in all_reads),
            tokens=sum(r.tokens for r in all_reads if not r.cached),
            latency_s=round(per_read_s * misses, 6),
            cached=misses == 0,
            extra=extra,
        )

    def close(self) -> None:
        self.backend.close()
