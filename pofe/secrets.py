"""Redaction of secrets from every text pofe shows or stores (error lines, log lines, files).

A secret can reach a text from places pofe does not control: a server that echoes the
request's ``Authorization`` header in a 401 body, an exception that quotes a URL with
credentials in it, a proxy's error page. Redacting where each secret is *used* is not
enough, so texts are redacted where they *leave*: endpoint replies as they are read, error
messages as they are raised and printed, log records as they are emitted.

What is redacted:

* every value registered with :func:`register` (the judge API key, read from the variable
  named by ``api_key_env``);
* the values of environment variables whose names say they hold a secret (``*_API_KEY``,
  ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*`` ...), whoever set them;
* shapes that are secrets whatever their value: URL userinfo (``https://user:pw@host``),
  ``Bearer``/``Basic`` credentials, ``api_key=...``-style assignments, ``sk-...`` / ``hf_...`` keys.

This module is a leaf: it imports nothing from pofe and nothing heavy.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

__all__ = ["MASK", "RedactingFilter", "install_log_redaction", "redact", "redact_obj", "register", "secret_values"]

MASK = "***"
MIN_SECRET_LEN = 6
"""Shorter values are not treated as secrets: masking every "true" or "1" would garble texts."""

_registered: set[str] = set()
_lock = threading.Lock()

_SECRET_NAME = re.compile(r"(API_?KEY|ACCESS_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)AUTH($|_)|(^|_)KEY$)",
                          re.IGNORECASE)
# Names that match the pattern but hold settings, not secrets.
_NOT_SECRET_NAME = re.compile(r"^TOKENIZERS?_|_(PATH|FILE|DIR|SOCK|URL|ENV|HOST|PORT)$", re.IGNORECASE)

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host -> scheme://***@host (also user-only userinfo)
    (re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@'\"<>]+@"), r"\1" + MASK + "@"),
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:(?:bearer|basic|token)\s+)?[^\s\"',;}<>]+"),
     r"\1" + MASK),
    (re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=\-]{8,}"), r"\1\2" + MASK),
    (re.compile(r"(?i)((?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password|passwd)"
                r"[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}<>]{4,}"), r"\1" + MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), "sk-" + MASK),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "hf_" + MASK),
)


def register(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (in this process)."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _lock:
            _registered.add(value)


def secret_values() -> list[str]:
    """Every secret value known now, longest first (so a key containing another is masked whole)."""
    with _lock:
        vals = set(_registered)
    for k, v in os.environ.items():
        if v and len(v) >= MIN_SECRET_LEN and _SECRET_NAME.search(k) and not _NOT_SECRET_NAME.search(k):
            vals.add(v)
    return sorted(vals, key=len, reverse=True)


def redact(text: Any) -> Any:
    """``text`` with every secret masked; anything that is not a string is returned as is."""
    if not isinstance(text, str) or not text:
        return text
    for v in secret_values():
        if v in text:
            text = text.replace(v, MASK)
    for pat, repl in _PATTERNS:
        text = pat.sub(repl, text)
    return text


def redact_obj(obj: Any) -> Any:
    """:func:`redact` applied to every string in nested dicts / lists / tuples."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


class RedactingFilter(logging.Filter):
    """A handler filter that masks secrets in the formatted message of every record (and in
    the text of an attached traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a record whose args do not format: leave it to the handler
            return True
        red = redact(msg)
        if red != msg:
            record.msg, record.args = red, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a :class:`RedactingFilter` to every handler of ``logger`` (default: the root
    logger), once. Handler filters see the records of every child logger as well."""
    logger = logger or logging.getLogger()
    for h in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())
