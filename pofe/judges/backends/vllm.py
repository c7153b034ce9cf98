"""Judge reads on an in-process vLLM engine (``judge.kind: vllm``, or ``judge.backend: vllm``
for the pointwise kinds). Same two operations as every judge backend:

* ``read_choices``: one prefill + one decoded position per request (``max_tokens=1``), all
  requests - both orders of every pair - in one ``generate`` batch, reading the raw log-prob
  of every single-token spelling of every choice at the answer position (vLLM's
  ``logprob_token_ids``), so a choice is never given probability 0 because it fell outside a
  truncated top-k list. A vLLM without ``logprob_token_ids`` reads the top-k list
  (``logprobs=top_k``) and a spelling missing from it *exactly*: the prompt log-prob of that
  token appended to the prompt (``prompt_logprobs``) -- a second prefill of the whole prompt,
  since vLLM skips its prefix cache for prompt log-probs.
* ``generate``: sampled text (rubric justifications, chain of thought).

Prompts are rendered with pofe's chat template and tokenised by the HF tokenizer, so the
engine sees exactly the token ids the transformers backend feeds its model.

The engine comes from the pool in :mod:`pofe.generation.vllm`: a judge of the same model as
a LoRA policy (or an untouched one) shares the policy's engine and reads its base weights
(pi_0, the frozen annotator); ``generator=`` reads through a policy's generator instead
(the current policy judging itself: Self-Rewarding LMs).

Written against today's backend interface (``read_choices`` / ``generate`` /
``validate_choices`` / ``render`` / ``fingerprint`` / ``cacheable``); :class:`VLLMBackend`
is that adapter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pofe.generation.base import VLLMSettings
from pofe.judges.backends.transformers import _weights_identity
from pofe.judges.base import (BackendStats, ChoiceRead, GenOut, SingleTokenChoices, encode_keep_end, logprob_error,
                              render_chat)
from pofe.judges.probability import logsumexp
from pofe.judges.templates import Rendered


def reads_token_ids() -> bool:
    """Whether this vLLM returns the log-probs of given token ids (``SamplingParams.logprob_token_ids``)."""
    from vllm import SamplingParams

    return "logprob_token_ids" in getattr(SamplingParams, "__struct_fields__", ())


class VLLMBackend(SingleTokenChoices):
    kind = "vllm"

    @classmethod
    def from_config(cls, cfg, **runtime) -> "VLLMBackend":
        """Built from a judge config's ``vllm`` section. A live ``model`` (self-rewarding: the current
        policy judges itself) is read through its own vLLM generator, so policy sampling and judging
        share one engine and its syncs."""
        generator = runtime.get("generator")
        if generator is None and runtime.get("model") is not None:
            from pofe.generation.base import SamplingConfig
            from pofe.generation.vllm import generator_for

            generator = generator_for(runtime["model"], runtime.get("tokenizer"),
                                      SamplingConfig(engine="vllm", vllm=cfg.vllm))
        return cls(cfg.model, settings=cfg.vllm, tokenizer=runtime.get("tokenizer"), max_length=cfg.max_length,
                   generator=generator)

    def __init__(self, model_name: str, *, settings: VLLMSettings | None = None, tokenizer=None, top_logprobs: int = 20,
                 max_length: int | None = None, generator=None):
        self.model_name = model_name
        self.settings = settings or VLLMSettings()
        self.top_logprobs = int(top_logprobs)
        self.max_length = max_length
        self.generator = generator
        self._tok = tokenizer if tokenizer is not None else (generator.tokenizer if generator is not None else None)
        self._engine = None
        self._variant_ids: dict[str, list[int]] = {}
        self.stats = BackendStats()
        self.exact_reads = 0  # choices read through prompt log-probs (absent from the top-k list)

    # -- identity -----------------------------------------------------------------------
    @property
    def cacheable(self) -> bool:
        return self.generator is None  # a live policy's weights change under the cache

    @property
    def fingerprint(self) -> str:
        return f"vllm:{self.model_name}:{self.settings.dtype}:{_weights_identity(self.model_name)}"

    @property
    def tokenizer(self):
        if self._tok is None:
            from pofe.models import load_tokenizer

            self._tok = load_tokenizer(self.model_name)
        return self._tok

    @property
    def special_strings(self) -> tuple[str, ...]:
        from pofe.chat_control import special_token_strings

        return special_token_strings(self.tokenizer)

    @property
    def engine(self):
        if self.generator is not None:
            return self.generator.engine
        if self._engine is None:
            from pofe.generation.vllm import shared_engine
            from pofe.models import resolve_model_path

            self._engine = shared_engine(resolve_model_path(self.model_name), self.settings, judge=True)
        return self._engine

    def _lora(self):
        return self.generator._ensure_current() if self.generator is not None else None

    def render(self, req: Rendered) -> str:
        return render_chat(self.tokenizer, req)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return encode_keep_end(self.tokenizer, texts, self.max_length)

    # -- choices ------------------------------------------------------------------------
    def read_choices(self, requests: Sequence[Rendered], choices: Sequence[str]) -> list[ChoiceRead]:
        from vllm import SamplingParams

        ids = self._encode([self.render(r) for r in requests])
        if not ids:
            return []
        t0 = time.perf_counter()
        lora = self._lora()
        outs = self.engine.generate(ids, self._answer_params(choices), lora_request=lora)
        reads: list[dict[int, float]] = []
        for o in outs:
            first = o.outputs[0].logprobs[0]  # {token id: Logprob} at the answer position (asked ids or top-k, + sampled)
            reads.append({int(t): float(lp.logprob) for t, lp in first.items()})
        # Exact reads for spellings outside the top-k: log P(token | prompt) from the prompt
        # log-probs of prompt + token (one more prefill batch, only for what is missing).
        missing = [(i, v) for i, d in enumerate(reads) for c in choices for v in self.variant_ids(c) if v not in d]
        if missing:
            exact = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
            outs2 = self.engine.generate([ids[i] + [v] for i, v in missing], exact, lora_request=lora)
            for (i, v), o in zip(missing, outs2):
                reads[i][v] = float(o.prompt_logprobs[-1][v].logprob)
            self.exact_reads += len(missing)
        self.stats.add(calls=1 + bool(missing), tokens=sum(len(x) for x in ids) + sum(len(ids[i]) + 1 for i, _ in missing),
                       seconds=time.perf_counter() - t0)
        # what each read cost: its prompt, the one decoded answer position, and any exact-read prefill
        extra = [0] * len(ids)
        for i, _ in missing:
            extra[i] += len(ids[i]) + 1
        out = []
        for d, x, more in zip(reads, ids, extra):
            meter = {"tokens": len(x) + 1 + more, "tokens_out": 1}
            # every single-token spelling was read (exactly when outside the top-k); a choice with
            # no single-token spelling is -inf, as on the transformers backend
            why = logprob_error(d[v] for c in choices for v in self.variant_ids(c))
            if why:  # NaN from overflowing half-precision logits, or a probability above 1: never a read
                out.append(ChoiceRead(None, error=why, **meter))
                continue
            lps = {c: logsumexp(min(d[v], 0.0) for v in self.variant_ids(c)) for c in choices}
            out.append(ChoiceRead(logprobs=lps, **meter))
        return out

    def _answer_params(self, choices: Sequence[str]):
        """The answer position's read: the choices' spellings by id where vLLM can, so they come
        exactly from the one prefill (a top-k list can miss one, and each miss costs a second
        prefill of the whole prompt), else the top-k list."""
        from vllm import SamplingParams

        if reads_token_ids():
            want = sorted({v for c in choices for v in self.variant_ids(c)})
            return SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=want, detokenize=False)
        return SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs, detokenize=False)

    def generate(self, requests: Sequence[Rendered], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, seed: int | None = None) -> list[list[GenOut]]:
        from vllm import SamplingParams

        from pofe.generation.tokens import _cut_at_eos, _eos_ids

        tok = self.tokenizer
        ids = self._encode([self.render(r) for r in requests])
        if not ids:
            return []
        eos = self.generator.eos_ids if self.generator is not None else _eos_ids(None, tok)
        greedy = temperature <= 0
        params = [SamplingParams(n=1 if greedy else n, temperature=0.0 if greedy else temperature,
                                 top_p=1.0 if greedy else top_p, top_k=0, max_tokens=max_new_tokens,
                                 seed=None if seed is None else seed + i, stop_token_ids=eos, detokenize=False)
                  for i in range(len(ids))]
        t0 = time.perf_counter()
        outs = self.engine.generate(ids, params, lora_request=self._lora())
        res: list[list[GenOut]] = []
        new = 0
        for x, o in zip(ids, outs):
            group = []
            for j in range(n):
                c = o.outputs[j if len(o.outputs) > 1 else 0]
                gen, _ = _cut_at_eos(list(c.token_ids), eos, tok.pad_token_id)
                new += len(gen)
                group.append(GenOut(text=tok.decode(gen, skip_special_tokens=True), tokens=len(x) + len(gen),
                                       tokens_out=len(gen)))
            res.append(group)
        self.stats.add(calls=1, tokens=sum(len(x) for x in ids) + new, seconds=time.perf_counter() - t0)
        return res

    def close(self) -> None:
        pass
