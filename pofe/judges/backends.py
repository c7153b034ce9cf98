"""Where judge reads come from: an in-process transformers model, or an OpenAI-compatible
HTTP endpoint (vLLM, llama.cpp's server, hosted APIs). A backend does two things:

* ``read_choices(requests, choices)`` — the *absolute* next-token log-probability of each
  answer string right after the rendered request (the judge renormalises over the choice
  set). Tokenizer variants of a choice (``"1"`` and ``" 1"``) are summed.
* ``generate(requests, n=, temperature=, ...)`` — sampled text (chain-of-thought
  rationales, rubric justifications).

Judge logic (orders, principles, caching, parsing) lives in the judges, so every backend
gets the same semantics.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from pofe.judges.probability import logsumexp
from pofe.judges.templates import Rendered

log = logging.getLogger(__name__)


@dataclass
class ChoiceRead:
    """One next-token read. ``logprobs`` maps each choice to its absolute log-prob (-inf when
    the choice is absent); ``None`` when nothing could be read (parse failure)."""

    logprobs: dict[str, float] | None
    raw: str = ""
    tokens: int = 0
    hard_label: bool = False  # read from generated text, not log-probs
    truncated: bool = False  # some choice missing from a top-k list
    error: str | None = None


@dataclass
class GenOut:
    text: str | None  # None when the endpoint answer could not be read
    tokens: int = 0
    error: str | None = None


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


def choice_variants(choice: str) -> tuple[str, ...]:
    """The spellings of one answer that count as that answer: as written and with a
    leading space (BPE vocabularies often have both)."""
    return tuple(dict.fromkeys([choice, " " + choice]))


# ======================================================================================
# In-process transformers
# ======================================================================================
class TransformersBackend:
    """A causal LM in this process, fp32 on CPU by default, batched with left padding.

    The model is loaded on first use, so a fully cached run never loads it. Only the last
    position's logits are computed (``logits_to_keep=1``): a (batch, length, vocab) tensor
    would be ~3 GB for 16 sequences of 1k tokens over a 49k vocabulary.
    """

    kind = "transformers"

    def __init__(self, model_name: str, *, model=None, tokenizer=None, revision: str | None = None,
                 dtype: str = "float32", device: str | None = None, trust_remote_code: bool = False,
                 batch_size: int = 8, max_length: int | None = None, cache_tag: str | None = None):
        self.model_name = model_name
        self._model, self._tok = model, tokenizer
        self.revision, self.dtype, self.device = revision, dtype, device
        self.trust_remote_code = trust_remote_code
        self.batch_size = max(1, int(batch_size))
        self.max_length = max_length
        self.live_model = model is not None
        self.cache_tag = cache_tag
        self.stats = BackendStats()
        self._variant_ids: dict[str, list[int]] = {}

    # -- identity ---------------------------------------------------------------------
    @property
    def cacheable(self) -> bool:
        """A live model object may be training; its reads are cacheable only under a tag
        the caller changes whenever the weights change."""
        return not self.live_model or self.cache_tag is not None

    @property
    def fingerprint(self) -> str:
        return f"transformers:{self.model_name}@{self.revision or ''}:{_weights_identity(self.model_name)}" + (
            f":tag={self.cache_tag}" if self.cache_tag is not None else "")

    # -- lazy loading -----------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tok is None:
            from pofe.models import load_tokenizer

            self._tok = load_tokenizer(self.model_name, trust_remote_code=self.trust_remote_code, revision=self.revision)
        return self._tok

    @property
    def model(self):
        if self._model is None:
            from pofe.models import load_model

            t0 = time.perf_counter()
            self._model, tok = load_model(self.model_name, dtype=self.dtype, device=self.device,
                                          trust_remote_code=self.trust_remote_code, revision=self.revision)
            self._tok = self._tok or tok
            log.info("judge model %s loaded in %.1f s", self.model_name, time.perf_counter() - t0)
        return self._model

    @property
    def special_strings(self) -> tuple[str, ...]:
        return tuple(getattr(self.tokenizer, "all_special_tokens", ()) or ())

    def render(self, req: Rendered) -> str:
        from pofe.models import apply_chat_template

        return apply_chat_template(self.tokenizer, req.user) + req.assistant_prefix

    # -- choices ----------------------------------------------------------------------
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
                raise ValueError(f"judge choice {c!r} is not a single token (with or without a leading space) for "
                                 f"{self.model_name}; pick choices the tokenizer encodes as one token, e.g. '1'/'2' or 'A'/'B'")
        sets = [set(self.variant_ids(c)) for c in choices]
        if len(set().union(*sets)) != sum(len(s) for s in sets):
            raise ValueError(f"judge choices {list(choices)} share a token for {self.model_name}")

    def _encode(self, texts: list[str]) -> list[list[int]]:
        out = []
        for t in texts:
            ids = self.tokenizer(t, add_special_tokens=False)["input_ids"]
            if self.max_length and len(ids) > self.max_length:
                # Keep the end: it holds the instruction and the answer slot; the start of a
                # long prompt is the least informative part to lose.
                ids = ids[-self.max_length:]
            out.append(ids)
        return out

    @torch.no_grad()
    def next_token_logprobs(self, texts: list[str]) -> tuple[list[torch.Tensor], list[int]]:
        """(vocab,) log-softmax at the next position for each text; sorted-by-length batches."""
        model = self.model
        device = next(model.parameters()).device
        ids = self._encode(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        result: list[Any] = [None] * len(ids)
        was_training = model.training  # a shared policy may be mid-training: judge without dropout
        model.eval()
        try:
            self._forward_batches(model, device, ids, order, result)
        finally:
            if was_training:
                model.train()
        return result, [len(x) for x in ids]

    def _forward_batches(self, model, device, ids, order, result) -> None:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            T = max(len(ids[i]) for i in idx)
            inp = torch.full((len(idx), T), pad, dtype=torch.long)
            att = torch.zeros((len(idx), T), dtype=torch.long)
            for r, i in enumerate(idx):  # left padding: the next-token slot is the last column for every row
                inp[r, T - len(ids[i]):] = torch.tensor(ids[i], dtype=torch.long)
                att[r, T - len(ids[i]):] = 1
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            t0 = time.perf_counter()
            kw = dict(input_ids=inp.to(device), attention_mask=att.to(device), position_ids=pos.to(device))
            try:
                logits = model(**kw, logits_to_keep=1).logits[:, -1]
            except TypeError:  # older architectures without logits_to_keep
                logits = model(**kw).logits[:, -1]
            lp = torch.log_softmax(logits.float(), dim=-1).cpu()
            self.stats.add(calls=1, tokens=int(att.sum()), seconds=time.perf_counter() - t0)
            for r, i in enumerate(idx):
                result[i] = lp[r]

    def read_choices(self, requests: Sequence[Rendered], choices: Sequence[str]) -> list[ChoiceRead]:
        texts = [self.render(r) for r in requests]
        lps, lens = self.next_token_logprobs(texts)
        out = []
        for lp, n in zip(lps, lens):
            d = {c: logsumexp(float(lp[i]) for i in self.variant_ids(c)) for c in choices}
            out.append(ChoiceRead(logprobs=d, tokens=n))
        return out

    @torch.no_grad()
    def generate(self, requests: Sequence[Rendered], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, seed: int | None = None) -> list[list[GenOut]]:
        from pofe.generation.sampling import _eos_ids

        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        if seed is not None:
            torch.manual_seed(seed)
        texts = [self.render(r) for r in requests]
        ids = self._encode(texts)
        eos = _eos_ids(model, tok)
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
        out: list[list[GenOut]] = [[] for _ in texts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        was_training = model.training
        model.eval()
        try:
            self._generate_batches(model, tok, device, ids, order, out, eos, pad, n, temperature, top_p, max_new_tokens)
        finally:
            if was_training:
                model.train()
        return out

    def _generate_batches(self, model, tok, device, ids, order, out, eos, pad, n, temperature, top_p, max_new_tokens):
        from pofe.generation.sampling import _cut_at_eos

        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            T = max(len(ids[i]) for i in idx)
            inp = torch.full((len(idx), T), pad, dtype=torch.long)
            att = torch.zeros((len(idx), T), dtype=torch.long)
            for r, i in enumerate(idx):
                inp[r, T - len(ids[i]):] = torch.tensor(ids[i], dtype=torch.long)
                att[r, T - len(ids[i]):] = 1
            kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad,
                                      eos_token_id=eos, do_sample=temperature > 0)
            if temperature > 0:
                kw.update(temperature=temperature, top_p=top_p, top_k=0)
            t0 = time.perf_counter()
            seqs = model.generate(input_ids=inp.to(device), attention_mask=att.to(device), **kw)
            new_tokens = 0
            for r, i in enumerate(idx):
                for j in range(n):
                    gen, _ = _cut_at_eos(seqs[r * n + j, T:].tolist(), eos, pad)
                    new_tokens += len(gen)
                    out[i].append(GenOut(text=tok.decode(gen, skip_special_tokens=True), tokens=len(ids[i]) + len(gen)))
            self.stats.add(calls=1, tokens=int(att.sum()) * n + new_tokens, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        pass


def _weights_identity(name_or_path: str) -> str:
    """Something that changes when the weights behind a name change (size + mtime of the
    weight files of a local directory; the GGUF of an embedded model)."""
    try:
        from pofe.models import EMBEDDED_MODELS, embedded_gguf_path

        if name_or_path in EMBEDDED_MODELS:
            st = embedded_gguf_path(name_or_path).stat()
            return f"gguf{st.st_size}"
        p = Path(name_or_path)
        if p.is_dir():
            parts = []
            for f in sorted(p.iterdir()):
                if f.suffix in (".safetensors", ".bin", ".gguf", ".pt"):
                    st = f.stat()
                    parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
            return "|".join(parts)
        if p.is_file():
            st = p.stat()
            return f"{p.name}:{st.st_size}:{st.st_mtime_ns}"
    except Exception:  # identity is best effort; the name is still part of the key
        pass
    return ""


# ======================================================================================
# OpenAI-compatible HTTP endpoint
# ======================================================================================
class EndpointError(RuntimeError):
    """The endpoint could not be reached or refused the request (after retries)."""


class RateLimiter:
    """At most ``rate`` requests per second across threads (evenly spaced)."""

    def __init__(self, rate: float | None):
        self.interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            time.sleep(start - now)


_RETRY_STATUS = {408, 409, 425, 429}


class EndpointBackend:
    """Completions or chat-completions with ``logprobs``/``top_logprobs``.

    Accepts both response shapes: legacy completions (``logprobs.top_logprobs`` = list of
    {token: logprob} dicts) and the chat-style ``logprobs.content`` list of
    {token, logprob, top_logprobs: [{token, logprob}]} entries (what llama.cpp returns on
    both endpoints). Requests run on a thread pool (``concurrency``), each with a timeout
    and retries with exponential backoff and full jitter on connection errors, timeouts,
    429 and 5xx. The API key is read from the environment variable named in the config
    at request time and exists only in the request header.
    """

    kind = "openai"

    def __init__(self, base_url: str, *, model: str = "", api: str = "completions", api_key_env: str | None = None,
                 concurrency: int = 4, timeout_s: float = 60.0, max_retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 20.0, rate_limit: float | None = None, top_logprobs: int = 20,
                 tokenizer=None, tokenizer_name: str | None = None, chat_prefill: bool = False,
                 extra_body: dict[str, Any] | None = None, fingerprint: str | None = None):
        import httpx

        if api not in ("completions", "chat"):
            raise ValueError(f"endpoint api must be 'completions' or 'chat', got {api!r}")
        if api_key_env and not os.environ.get(api_key_env):
            raise ValueError(f"judge endpoint: environment variable {api_key_env} (named by api_key_env) is not set")
        self.base_url = base_url.rstrip("/")
        self.model_id, self.api, self.api_key_env = model, api, api_key_env
        self.concurrency = max(1, int(concurrency))
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.top_logprobs = int(top_logprobs)
        self.chat_prefill = chat_prefill
        self.extra_body = dict(extra_body or {})
        self._tok, self._tok_name = tokenizer, tokenizer_name
        self._fingerprint = fingerprint
        self._rate = RateLimiter(rate_limit)
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s))
        self.stats = BackendStats()
        self.cacheable = True
        self._rng = random.Random()

    @property
    def fingerprint(self) -> str:
        return self._fingerprint or f"openai:{self.base_url}:{self.model_id}:{self.api}"

    @property
    def tokenizer(self):
        if self._tok is None and self._tok_name:
            from pofe.models import load_tokenizer

            self._tok = load_tokenizer(self._tok_name)
        return self._tok

    @property
    def special_strings(self) -> tuple[str, ...]:
        tok = self.tokenizer
        return tuple(getattr(tok, "all_special_tokens", ()) or ()) if tok is not None else ()

    def validate_choices(self, choices: Sequence[str]) -> None:
        if len(set(choices)) != len(choices):
            raise ValueError(f"judge choices must differ, got {list(choices)}")

    # -- requests ---------------------------------------------------------------------
    def _payload(self, req: Rendered, *, max_tokens: int, temperature: float, top_p: float = 1.0,
                 logprobs: bool, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
        if self.model_id:
            body["model"] = self.model_id
        if top_p < 1.0:
            body["top_p"] = top_p
        if seed is not None:
            body["seed"] = seed
        if self.api == "completions":
            if self.tokenizer is not None:
                from pofe.models import apply_chat_template

                prompt = apply_chat_template(self.tokenizer, req.user) + req.assistant_prefix
            else:
                prompt = req.user + ("\n\n" + req.assistant_prefix if req.assistant_prefix else "")
            body["prompt"] = prompt
            if logprobs:
                body["logprobs"] = self.top_logprobs
            path = "/completions"
        else:
            messages = [{"role": "user", "content": req.user}]
            if self.chat_prefill and req.assistant_prefix:
                messages.append({"role": "assistant", "content": req.assistant_prefix})
            body["messages"] = messages
            if logprobs:
                body["logprobs"] = True
                body["top_logprobs"] = self.top_logprobs
            path = "/chat/completions"
        body.update(self.extra_body)
        return path, body

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise EndpointError(f"environment variable {self.api_key_env} (judge API key) is not set")
            h["Authorization"] = f"Bearer {key}"
        return h

    def _post(self, path: str, body: dict[str, Any]) -> tuple[str, int]:
        """POST with retries; returns (response text, attempts). Raises EndpointError."""
        import httpx

        url = self.base_url + path
        last = ""
        for attempt in range(self.max_retries + 1):
            self._rate.wait()
            t0 = time.perf_counter()
            retry_after = None
            try:
                r = self._client.post(url, json=body, headers=self._headers())
            except httpx.TransportError as e:  # refused, reset, DNS, timeouts
                last = f"{type(e).__name__}: {e}"
            else:
                self.stats.add(calls=1, seconds=time.perf_counter() - t0)
                if r.status_code == 200:
                    return r.text, attempt + 1
                last = f"HTTP {r.status_code}: {r.text[:200]!r}"
                if r.status_code not in _RETRY_STATUS and r.status_code < 500:
                    raise EndpointError(f"judge endpoint {url} rejected the request ({last})")
                retry_after = _retry_after(r.headers.get("retry-after"))
            if attempt < self.max_retries:
                # Full jitter: uniform(0, min(cap, base * 2^attempt)) spreads retries of
                # concurrent workers instead of having them hit the server in lock-step.
                delay = self._rng.uniform(0, min(self.max_backoff_s, self.backoff_s * (2 ** attempt)))
                if retry_after is not None:
                    delay = max(delay, min(retry_after, self.max_backoff_s))
                log.warning("judge endpoint %s: %s; retry %d/%d in %.2f s", url, last, attempt + 1, self.max_retries, delay)
                time.sleep(delay)
        raise EndpointError(f"judge endpoint {url} failed after {self.max_retries + 1} attempts ({last})")

    def _map(self, fn, items: Sequence[Any]) -> list[Any]:
        if self.concurrency == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(fn, items))

    # -- reads ------------------------------------------------------------------------
    def read_choices(self, requests: Sequence[Rendered], choices: Sequence[str]) -> list[ChoiceRead]:
        def one(req: Rendered) -> ChoiceRead:
            path, body = self._payload(req, max_tokens=1, temperature=0.0, logprobs=True)
            text, _ = self._post(path, body)
            return parse_choice_response(text, choices)

        out = self._map(one, list(requests))
        self.stats.add(tokens=sum(r.tokens for r in out))
        return out

    def generate(self, requests: Sequence[Rendered], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, seed: int | None = None) -> list[list[GenOut]]:
        jobs = [(i, j) for i in range(len(requests)) for j in range(n)]

        def one(job) -> GenOut:
            i, j = job
            s = None if seed is None else seed + j
            path, body = self._payload(requests[i], max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       logprobs=False, seed=s)
            text, _ = self._post(path, body)
            return parse_generation_response(text)

        res = self._map(one, jobs)
        self.stats.add(tokens=sum(g.tokens for g in res))
        out: list[list[GenOut]] = [[] for _ in requests]
        for (i, _), g in zip(jobs, res):
            out[i].append(g)
        return out

    def close(self) -> None:
        self._client.close()


def _retry_after(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


# -- response parsing ------------------------------------------------------------------
def _first_choice(data: Any) -> dict[str, Any] | None:
    if isinstance(data, dict) and isinstance(data.get("choices"), list) and data["choices"]:
        c = data["choices"][0]
        return c if isinstance(c, dict) else None
    return None


def _text_of(choice: dict[str, Any]) -> str | None:
    if isinstance(choice.get("text"), str):
        return choice["text"]
    msg = choice.get("message")
    if isinstance(msg, dict) and isinstance(msg.get("content"), str):
        return msg["content"]
    return None


def first_position_logprobs(choice: dict[str, Any]) -> list[tuple[str, float, Any]] | None:
    """(token, logprob, id) candidates for the first generated position, from either shape;
    ``None`` when the response carries no log-probabilities."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")
    if isinstance(content, list) and content:  # chat shape (and llama.cpp completions)
        first = content[0]
        if not isinstance(first, dict):
            return None
        cands = [(e.get("token"), e.get("logprob"), e.get("id")) for e in (first.get("top_logprobs") or [])
                 if isinstance(e, dict)]
        cands.append((first.get("token"), first.get("logprob"), first.get("id")))
    elif isinstance(lp.get("top_logprobs"), list) and lp["top_logprobs"]:  # legacy completions shape
        top = lp["top_logprobs"][0]
        if not isinstance(top, dict):
            return None
        cands = [(t, v, None) for t, v in top.items()]
        toks, tlps = lp.get("tokens") or [], lp.get("token_logprobs") or []
        if toks and tlps:
            cands.append((toks[0], tlps[0], None))
    else:
        return None
    good = [(t, float(v), i) for t, v, i in cands if isinstance(t, str) and isinstance(v, (int, float))
            and math.isfinite(float(v))]
    return good or None


def parse_choice_response(text: str, choices: Sequence[str]) -> ChoiceRead:
    """Choice log-probs from an endpoint answer; falls back to a hard label from the
    generated text when there are no log-probs; unreadable -> ``logprobs=None``."""
    import json

    try:
        data = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return ChoiceRead(None, raw=text[:300], error="malformed JSON")
    choice = _first_choice(data)
    if choice is None:
        return ChoiceRead(None, raw=text[:300], error="no choices in response")
    tokens = 0
    usage = data.get("usage") if isinstance(data, dict) else None
    if isinstance(usage, dict):
        tokens = int(usage.get("total_tokens") or 0)
    gen = _text_of(choice) or ""
    cands = first_position_logprobs(choice)
    if cands is None:
        label = parse_choice_text(gen, choices)
        if label is None:
            return ChoiceRead(None, raw=gen, tokens=tokens, error="no logprobs and no readable verdict")
        d = {c: (0.0 if c == label else -math.inf) for c in choices}
        return ChoiceRead(d, raw=gen, tokens=tokens, hard_label=True)
    seen: dict[Any, tuple[str, float]] = {}
    for t, v, i in cands:  # the sampled token also appears in top_logprobs: count it once
        seen[(i if i is not None else t)] = (t, v)
    d = {}
    for c in choices:
        vs = set(choice_variants(c))
        d[c] = logsumexp(v for t, v in seen.values() if t in vs)
    if all(v == -math.inf for v in d.values()):
        return ChoiceRead(None, raw=gen, tokens=tokens, error="no choice token among the returned top_logprobs")
    return ChoiceRead(d, raw=gen, tokens=tokens, truncated=any(v == -math.inf for v in d.values()))


def parse_choice_text(text: str, choices: Sequence[str]) -> str | None:
    """Hard label from generated text: the text starts with a choice ("1", "(A)", "B."), or
    exactly one choice appears as a standalone word. Anything else is unreadable."""
    s = text.strip()
    for c in choices:
        if re.match(r"^[\s\(\[\*\"']*" + re.escape(c) + r"(?![\w])", s):
            return c
    found = [c for c in choices if re.search(r"(?<![\w])" + re.escape(c) + r"(?![\w])", s)]
    return found[0] if len(found) == 1 else None


def parse_generation_response(text: str) -> GenOut:
    import json

    try:
        data = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return GenOut(None, error="malformed JSON")
    choice = _first_choice(data)
    gen = _text_of(choice) if choice else None
    if gen is None:
        return GenOut(None, error="no text in response")
    usage = data.get("usage") if isinstance(data, dict) else None
    return GenOut(gen, tokens=int(usage.get("total_tokens") or 0) if isinstance(usage, dict) else 0)


# ======================================================================================
# llama.cpp through xllamacpp
# ======================================================================================
class LlamaCppServer:
    """An xllamacpp ``Server`` (llama.cpp's C++ HTTP server in this process) on 127.0.0.1.

    Loopback only: the judge server must not be reachable from the network.
    """

    def __init__(self, gguf: str | Path, *, n_ctx: int = 4096, n_parallel: int = 2, n_threads: int | None = None,
                 port: int = 0, verbosity: int = 0):
        try:
            import xllamacpp as xlc
        except ImportError as e:  # pragma: no cover - optional dependency
            raise RuntimeError("the llamacpp judge needs the PyPI wheel 'xllamacpp': pip install 'pofe[llamacpp]'") from e
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.gguf}")
        p = xlc.CommonParams()
        p.model.path = str(self.gguf)
        p.n_ctx = int(n_ctx) * int(n_parallel)  # llama.cpp splits n_ctx across slots
        p.n_parallel = int(n_parallel)
        p.hostnames = ["127.0.0.1"]
        p.port = int(port) or _free_port()
        # Default: half the cores (at most 8). llama.cpp worker threads spin while waiting, so
        # oversubscribing a busy CPU collapses throughput: on a shared 2-core box 2 threads
        # took 27.6 s for what 1 thread did in 4.4 s.
        threads = int(n_threads or max(1, min(8, (os.cpu_count() or 2) // 2)))
        self.threads = threads
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.verbosity = verbosity
        p.warmup = False
        t0 = time.perf_counter()
        self._server = xlc.Server(p)
        self.base_url = f"http://127.0.0.1:{p.port}/v1"
        log.info("llama.cpp server on %s serving %s (started in %.1f s)", self.base_url, self.gguf.name,
                 time.perf_counter() - t0)

    def close(self) -> None:
        srv, self._server = getattr(self, "_server", None), None
        del srv  # ~Server stops the HTTP loop


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaCppBackend(EndpointBackend):
    """EndpointBackend over a lazily started local llama.cpp server (completions API,
    prompts rendered with the model's own chat template so reads match the transformers
    backend token for token)."""

    kind = "llamacpp"

    def __init__(self, gguf: str | Path, *, tokenizer_name: str | None, n_ctx: int = 4096, n_parallel: int = 2,
                 n_threads: int | None = None, top_logprobs: int = 20, timeout_s: float = 120.0, max_retries: int = 2,
                 tokenizer=None):
        self.gguf = Path(gguf)
        st = self.gguf.stat()
        super().__init__("http://127.0.0.1:0/v1", api="completions", concurrency=n_parallel, timeout_s=timeout_s,
                         max_retries=max_retries, top_logprobs=top_logprobs, tokenizer=tokenizer,
                         tokenizer_name=tokenizer_name,
                         fingerprint=f"llamacpp:{self.gguf.name}:{st.st_size}")
        self._server_args = dict(n_ctx=n_ctx, n_parallel=n_parallel, n_threads=n_threads)
        self.server: LlamaCppServer | None = None
        self._start_lock = threading.Lock()

    def _ensure_server(self) -> None:
        with self._start_lock:
            if self.server is None:
                self.server = LlamaCppServer(self.gguf, **self._server_args)
                self.base_url = self.server.base_url

    def _post(self, path, body):
        self._ensure_server()
        return super()._post(path, body)

    def close(self) -> None:
        super().close()
        if self.server is not None:
            self.server.close()
            self.server = None
