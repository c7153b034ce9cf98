"""OpenAI-compatible HTTP judge backend (vLLM, llama.cpp's server, hosted APIs).

Numbers are checked where they enter: a NaN/inf log-probability of a choice token is an
unreadable read (never a confident label); a ``Retry-After`` header is honoured but capped
(seconds or an HTTP date; huge values wait ``max_backoff_s``, never OverflowError); a 200
answer that is not JSON or has no choices is retried (bounded) and then counted as
unreadable with its reason. The serving model's identity as the server reports it
(``GET /v1/models``) is part of the cache fingerprint, so a model swapped behind the same
URL never serves old labels.

Every request has a total deadline of ``timeout_s`` per attempt (connect, headers and body
together): httpx's timeout bounds each socket read, so a server sending one byte every
0.3 s would otherwise hold a request forever. A reply is also capped in size (after
decompression) and a body that cannot be decoded (bad gzip) is a failed attempt, retried
and then counted, never a traceback. Replies and error texts are redacted
(:mod:`pofe.secrets`) as they are read: a server echoing the ``Authorization`` header
cannot put the API key into an error line, a log line, ``verdicts.jsonl`` or the cache.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from pofe.judges.base import (BackendStats, ChoiceRead, EndpointError, GenOut, JudgeConfigError, base_url_problem,
                               choice_variants, logprob_error)
from pofe.judges.probability import logsumexp
from pofe.judges.templates import Rendered
from pofe.secrets import redact, register

log = logging.getLogger(__name__)

__all__ = ["EndpointBackend", "EndpointError", "RateLimiter", "parse_choice_response", "parse_choice_text",
           "parse_generation_response", "parse_retry_after", "first_position_logprobs"]


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

MAX_REPLY_BYTES = 64 << 20
"""Largest reply body read (after decompression): a judge reply is a few KiB; a gzip bomb or a
server streaming forever must not exhaust memory."""

_deadline = threading.local()
"""The deadline (``time.monotonic()``) of the request the current thread is making, or None."""


def _clip(timeout: float | None, exc) -> float | None:
    """``timeout`` of one socket operation, shortened to what is left of the request's deadline."""
    d = getattr(_deadline, "at", None)
    if d is None:
        return timeout
    left = d - time.monotonic()
    if left <= 0:
        raise exc("request deadline passed")
    return left if timeout is None else min(timeout, left)


def _deadline_network_backend(inner):
    """A httpcore network backend whose every connect, read and write gives up at the calling
    thread's request deadline (the per-read timeout alone lets a trickling server hang it)."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, s):
            self._s = s

        def read(self, max_bytes, timeout=None):
            return self._s.read(max_bytes, _clip(timeout, httpcore.ReadTimeout))

        def write(self, buffer, timeout=None):
            return self._s.write(buffer, _clip(timeout, httpcore.WriteTimeout))

        def close(self):
            return self._s.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            return Stream(self._s.start_tls(ssl_context, server_hostname, _clip(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info):
            return self._s.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            return Stream(inner.connect_tcp(host, port, _clip(timeout, httpcore.ConnectTimeout), local_address,
                                            socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            return Stream(inner.connect_unix_socket(path, _clip(timeout, httpcore.ConnectTimeout), socket_options))

        def sleep(self, seconds):
            return inner.sleep(seconds)

    return Backend()


def _with_deadlines(client) -> bool:
    """Install the deadline-aware network backend in ``client``'s connection pool. httpx has
    no public hook for it; when its internals differ the body loop still checks the deadline
    between chunks (then a stall costs at most one more ``timeout_s``)."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if inner is None:
        log.debug("httpx internals changed: request deadlines are checked between body chunks only")
        return False
    pool._network_backend = _deadline_network_backend(inner)
    return True


class _ReplyError(Exception):
    """A reply that arrived but cannot be used (undecodable, too large): a failed attempt."""


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

    @classmethod
    def from_config(cls, cfg, **runtime) -> "EndpointBackend":
        """Built from a judge config's ``endpoint`` section."""
        e = cfg.endpoint
        return cls(e.base_url, model=e.model, api=e.api, api_key_env=e.api_key_env,
                   concurrency=e.concurrency, timeout_s=e.timeout_s, max_retries=e.max_retries,
                   backoff_s=e.backoff_s, max_backoff_s=e.max_backoff_s, rate_limit=e.rate_limit,
                   top_logprobs=e.top_logprobs, tokenizer=runtime.get("tokenizer"),
                   tokenizer_name=e.tokenizer, chat_prefill=e.chat_prefill, extra_body=e.extra_body,
                   identify=e.identify)

    def __init__(self, base_url: str, *, model: str = "", api: str = "completions", api_key_env: str | None = None,
                 concurrency: int = 4, timeout_s: float = 60.0, max_retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 20.0, rate_limit: float | None = None, top_logprobs: int = 20,
                 tokenizer=None, tokenizer_name: str | None = None, chat_prefill: bool = False,
                 extra_body: dict[str, Any] | None = None, fingerprint: str | None = None, identify: bool = True):
        import httpx

        if api not in ("completions", "chat"):
            raise JudgeConfigError(f"endpoint api must be 'completions' or 'chat', got {api!r}")
        problem = base_url_problem(base_url)
        if problem:
            raise JudgeConfigError(f"judge endpoint base_url: {problem}")
        if api_key_env and not os.environ.get(api_key_env):
            raise JudgeConfigError(f"judge endpoint: environment variable {api_key_env} (named by api_key_env) is not set")
        if api_key_env:
            register(os.environ.get(api_key_env))  # masked wherever a server or a library echoes it
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
        _with_deadlines(self._client)
        self.stats = BackendStats()
        self.cacheable = True
        self.identify = identify
        self.served: dict[str, Any] | None = None  # what /v1/models said last time
        self._down = False  # a request of the current batch failed after all its retries
        self._rng = random.Random()

    # -- identity ---------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """URL, API, configured name and the serving model as the server reports it.

        Asked again on every access (the judge reads it once per ``judge()`` call): a model
        swapped behind the same URL between two calls gets a new fingerprint, so its reads
        miss the cache instead of replaying the old model's labels.
        A server that cannot say what it serves makes the backend uncacheable."""
        if self._fingerprint is not None:
            return self._fingerprint
        base = f"openai:{self.base_url}:{self.api}:{self.model_id}"
        if not self.identify:
            return base
        served = self.server_model()
        if served is None:
            return base + ":served=unknown"
        return base + ":served=" + json.dumps(served, sort_keys=True, separators=(",", ":"))

    _SERVED_KEYS = ("id", "root", "parent", "revision", "fingerprint", "system_fingerprint", "meta", "owned_by")

    def server_model(self) -> dict[str, Any] | None:
        """The entry of ``GET /v1/models`` for the configured model (or the only/first one),
        reduced to the fields that identify weights (``created`` is left out: vLLM reports
        the time of the request). None, with a warning and caching turned off, when the
        server does not answer it readably."""
        text = self._request("GET", "/models", None, what="model list")
        try:
            data = _loads(text)
            entries = [e for e in data["data"] if isinstance(e, dict)] if isinstance(data, dict) else []
        except (ValueError, KeyError, TypeError):
            entries = []
        entry = next((e for e in entries if self.model_id and e.get("id") == self.model_id), None)
        if entry is None and entries and (not self.model_id or len(entries) == 1):
            entry = entries[0]
        if entry is None:
            if self.cacheable:
                log.warning("judge endpoint %s: GET /models does not identify the served model; "
                            "judge cache disabled for this endpoint", self.base_url)
            self.cacheable = False
            self.served = None
            return None
        self.served = {k: entry[k] for k in self._SERVED_KEYS if k in entry}
        return self.served

    @property
    def tokenizer(self):
        if self._tok is None and self._tok_name:
            from pofe.models import load_tokenizer

            self._tok = load_tokenizer(self._tok_name)
        return self._tok

    @property
    def special_strings(self) -> tuple[str, ...]:
        tok = self.tokenizer
        from pofe.chat_control import special_token_strings

        return special_token_strings(tok) if tok is not None else ()

    def validate_choices(self, choices: Sequence[str]) -> None:
        if len(set(choices)) != len(choices):
            raise JudgeConfigError(f"judge choices must differ, got {list(choices)}")

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
            register(key)
            h["Authorization"] = f"Bearer {key}"
        return h

    def _post(self, path: str, body: dict[str, Any]) -> str:
        return self._request("POST", path, body, what="request")

    def _request(self, method: str, path: str, body: dict[str, Any] | None, *, what: str) -> str:
        """One HTTP call with bounded retries; returns the 200 body. Raises EndpointError."""
        import httpx

        url = self.base_url + path
        last = ""
        # Once a request of this batch has failed for good, the others try once each: a dead
        # endpoint fails a 64-row chunk in seconds, not 128 x the full backoff schedule.
        retries = 0 if self._down else self.max_retries
        for attempt in range(retries + 1):
            self._rate.wait()
            t0 = time.perf_counter()
            retry_after = None
            try:
                status, headers, text = self._send(method, url, body)
            except httpx.TransportError as e:  # refused, reset, DNS, timeouts, the deadline
                last = redact(f"{type(e).__name__}: {e}")
            except _ReplyError as e:
                last = redact(str(e))
            else:
                if method == "POST":  # model calls; the identity GET is not one
                    self.stats.add(calls=1, seconds=time.perf_counter() - t0)
                if status == 200:
                    self._down = False
                    return text
                last = f"HTTP {status}: {text[:200]!r}"
                if status not in _RETRY_STATUS and status < 500:
                    if method == "GET" and status in (404, 405, 501):
                        return ""  # no model list on this server: caller treats as unidentified
                    raise EndpointError(f"judge endpoint {url} rejected the {what} ({last})")
                retry_after = parse_retry_after(headers.get("retry-after"))
            if attempt < retries:
                time.sleep(self._delay(attempt, retry_after))
                log.warning("judge endpoint %s: %s; retry %d/%d", url, last, attempt + 1, retries)
        self._down = True
        raise EndpointError(f"judge endpoint {url} failed after {retries + 1} attempts ({last})")

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, Any, str]:
        """(status, headers, redacted body text) of one attempt, within ``timeout_s`` in all."""
        import httpx

        deadline = time.monotonic() + self.timeout_s
        _deadline.at = deadline
        try:
            with self._client.stream(method, url, json=body, headers=self._headers()) as r:
                chunks, size = [], 0
                try:
                    for chunk in r.iter_bytes():
                        size += len(chunk)
                        if size > MAX_REPLY_BYTES:
                            raise _ReplyError(f"reply larger than {MAX_REPLY_BYTES >> 20} MiB")
                        chunks.append(chunk)
                        if time.monotonic() > deadline:  # also without the network-level deadline
                            raise httpx.ReadTimeout(f"request deadline of {self.timeout_s:g} s passed")
                except httpx.DecodingError as e:  # Content-Encoding: gzip with a body that is not
                    raise _ReplyError(f"undecodable reply ({e})") from None
                raw = b"".join(chunks)
                try:
                    text = raw.decode(r.encoding or "utf-8", errors="replace")
                except LookupError:  # a charset Python does not know
                    text = raw.decode("utf-8", errors="replace")
                return r.status_code, r.headers, redact(text)
        finally:
            _deadline.at = None

    def _delay(self, attempt: int, retry_after: float | None = None) -> float:
        # Full jitter: uniform(0, min(cap, base * 2^attempt)) spreads retries of concurrent
        # workers instead of having them hit the server in lock-step. ``2 ** attempt`` is
        # capped before multiplying so no attempt count overflows a float.
        delay = self._rng.uniform(0, min(self.max_backoff_s, self.backoff_s * (2 ** min(attempt, 30))))
        if retry_after is not None:  # honour the server, but never wait longer than the cap
            delay = max(delay, min(retry_after, self.max_backoff_s))
        return delay

    def _map(self, fn, items: Sequence[Any]) -> list[Any]:
        if self.concurrency == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(fn, items))

    # -- reads ------------------------------------------------------------------------
    def read_choices(self, requests: Sequence[Rendered], choices: Sequence[str]) -> list[ChoiceRead]:
        def one(req: Rendered) -> ChoiceRead:
            path, body = self._payload(req, max_tokens=1, temperature=0.0, logprobs=True)
            try:
                return self._read_with_retries(lambda: parse_choice_response(self._post(path, body), choices))
            except EndpointError as e:  # this request failed for good; the others of the batch may not have
                return ChoiceRead(None, error=f"{self._FAILED}{e}")

        self._down = False
        out = self._map(one, list(requests))
        self.stats.add(tokens=sum(r.tokens for r in out))
        self._refuse_all_failed([r.error for r in out])
        return out

    _FAILED = "request failed: "

    def _refuse_all_failed(self, errors: list[str | None]) -> None:
        """One request that failed after its retries is an unreadable read (counted), so the
        successful reads of the same batch still reach the judge and its cache (paid API work
        is not lost). A batch in which *every* request failed, or came back as garbage, is a
        broken endpoint, not a judge with opinions: one clear error instead of a run that
        labels nothing."""
        if not errors or not all(e is not None and (e.startswith(self._TRANSIENT) or e.startswith(self._FAILED))
                                 for e in errors):
            return
        if errors[0].startswith(self._FAILED):
            raise EndpointError(errors[0][len(self._FAILED):])
        raise EndpointError(f"judge endpoint {self.base_url} answered all {len(errors)} requests of a batch "
                            f"unreadably ({errors[0]}); is it an OpenAI-compatible server?")

    # Answers a proxy or an overloaded server can give once and not the next time: retried.
    _TRANSIENT = ("malformed JSON", "no choices in response", "no text in response")

    def _read_with_retries(self, attempt_once):
        """A 200 answer that is not JSON or has no choices is retried like a 5xx; after the
        last attempt it is returned unreadable, its error naming the attempts (counted by
        the judge, never a label)."""
        res = attempt_once()
        for attempt in range(self.max_retries):
            if res.error not in self._TRANSIENT:
                return res
            time.sleep(self._delay(attempt))
            res = attempt_once()
        if res.error in self._TRANSIENT:
            res.error = f"{res.error} (after {self.max_retries + 1} attempts)"
        return res

    def generate(self, requests: Sequence[Rendered], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, seed: int | None = None) -> list[list[GenOut]]:
        jobs = [(i, j) for i in range(len(requests)) for j in range(n)]

        def one(job) -> GenOut:
            i, j = job
            s = None if seed is None else seed + j
            path, body = self._payload(requests[i], max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       logprobs=False, seed=s)
            try:
                return self._read_with_retries(lambda: parse_generation_response(self._post(path, body)))
            except EndpointError as e:
                return GenOut(None, error=f"{self._FAILED}{e}")

        self._down = False
        res = self._map(one, jobs)
        self.stats.add(tokens=sum(g.tokens for g in res))
        self._refuse_all_failed([g.error for g in res])
        out: list[list[GenOut]] = [[] for _ in requests]
        for (i, _), g in zip(jobs, res):
            out[i].append(g)
        return out

    def close(self) -> None:
        self._client.close()


def _loads(text: str) -> Any:
    """``json.loads``; a reply nested too deeply for the parser is malformed (ValueError), not
    a RecursionError escaping to the top."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_retry_after(v: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: a number of seconds or an HTTP date
    (RFC 9110 10.2.3). Negative, NaN or unreadable values are ignored (None); the caller caps
    huge ones, so ``Retry-After: 1e308`` or a date in the year 9999 cannot overflow a sleep."""
    if v is None:
        return None
    v = v.strip()
    try:
        secs = float(v)
    except ValueError:
        try:
            dt = email.utils.parsedate_to_datetime(v)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if dt is None:
            return None
        try:
            secs = dt.timestamp() - (time.time() if now is None else now)
        except (OverflowError, OSError, ValueError):
            return None
    if math.isnan(secs):
        return None
    return max(0.0, secs)


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
    # Keep non-finite values: the caller decides (a NaN on a choice token makes the read
    # unreadable; dropping it would turn the choice into "absent" and the label into p = 0/1).
    good = [(t, float(v), i) for t, v, i in cands if isinstance(t, str) and isinstance(v, (int, float))
            and not isinstance(v, bool)]
    return good or None


def parse_choice_response(text: str, choices: Sequence[str]) -> ChoiceRead:
    """Choice log-probs from an endpoint answer; falls back to a hard label from the
    generated text when there are no log-probs; unreadable -> ``logprobs=None``."""
    try:
        data = _loads(text)
    except ValueError:
        return ChoiceRead(None, raw=text[:300], error="malformed JSON")
    choice = _first_choice(data)
    if choice is None:
        return ChoiceRead(None, raw=text[:300], error="no choices in response")
    tokens, out, metered = _usage(data)
    meter = {"tokens": tokens, "tokens_out": out, "metered": metered}
    gen = _text_of(choice) or ""
    cands = first_position_logprobs(choice)
    if cands is None:
        label = parse_choice_text(gen, choices)
        if label is None:
            return ChoiceRead(None, raw=gen, **meter, error="no logprobs and no readable verdict")
        d = {c: (0.0 if c == label else -math.inf) for c in choices}
        return ChoiceRead(d, raw=gen, **meter, hard_label=True)
    seen: dict[Any, tuple[str, float]] = {}
    for t, v, i in cands:  # the sampled token also appears in top_logprobs: count it once
        seen[(i if i is not None else t)] = (t, v)
    # A log-probability above 0 (a probability above 1) or NaN anywhere in the reply is a
    # broken server, not a reading: the whole read is unparseable, never used.
    why = logprob_error(v for _, v in seen.values())
    if why:
        return ChoiceRead(None, raw=gen, **meter, error=why)
    d = {}
    for c in choices:
        vs = set(choice_variants(c))
        d[c] = logsumexp(min(v, 0.0) for t, v in seen.values() if t in vs)
    if all(v == -math.inf for v in d.values()):
        return ChoiceRead(None, raw=gen, **meter, error="no choice token among the returned top_logprobs")
    return ChoiceRead(d, raw=gen, **meter, truncated=any(v == -math.inf for v in d.values()))


def parse_choice_text(text: str, choices: Sequence[str]) -> str | None:
    """Hard label from generated text: the text starts with a choice ("1", "(A)", "B."), or
    exactly one choice appears as a standalone word. Anything else is unreadable."""
    s = text.strip()
    for c in choices:
        if re.match(r"^[\s\(\[\*\"']*" + re.escape(c) + r"(?![\w])", s):
            return c
    found = [c for c in choices if re.search(r"(?<![\w])" + re.escape(c) + r"(?![\w])", s)]
    return found[0] if len(found) == 1 else None


def _usage(data: Any) -> tuple[int, int, bool]:
    """(tokens in + out, tokens out, reported) from the answer's OpenAI ``usage``
    (``prompt_tokens``, ``completion_tokens``, ``total_tokens``): what the server bills. No
    usage: (0, 0, False), counted as unmetered, never guessed."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, False
    try:
        out = int(usage.get("completion_tokens") or 0)
        n_in = usage.get("prompt_tokens")
        total = int(n_in) + out if n_in is not None else int(usage.get("total_tokens") or 0)
    except (TypeError, ValueError, OverflowError):
        return 0, 0, False
    if total < 0 or out < 0 or out > total:
        return 0, 0, False
    return total, out, True


def parse_generation_response(text: str) -> GenOut:
    try:
        data = _loads(text)
    except ValueError:
        return GenOut(None, error="malformed JSON")
    choice = _first_choice(data)
    gen = _text_of(choice) if choice else None
    if gen is None:
        return GenOut(None, error="no text in response")
    tokens, out, metered = _usage(data)
    return GenOut(gen, tokens=tokens, tokens_out=out, metered=metered)
