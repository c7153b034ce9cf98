"""The ``pofe annotate`` server: the page in ``static/`` and a four-route JSON API, on loopback.

Standard library only (``http.server.ThreadingHTTPServer``): the page is a labelling form
for one person on one machine, so a framework would add a dependency and nothing else.

Routes: ``GET /`` (the page), ``GET /static/annotate.{js,css}``, ``GET /api/state`` (the next
pair to label and the progress), ``POST /api/decide`` (``{pair_id, choice}``, choice one of
left/right/tie/skip), ``POST /api/undo``. Every decision is in the log (fsync'd) before the
reply, and the server's state is rebuilt from the log when it starts, so the page resumes
where this annotator stopped.

Security (a page that writes files, reachable from any site the user's browser visits):
binds loopback addresses only; refuses a ``Host`` header that is not this loopback server
(DNS rebinding) and a cross-origin ``Origin`` on writes; writes need a JSON body of bounded
size naming a pair of this file; static files come from a fixed name -> file table, so no
request path ever reaches the file system. Hostile requests (bodies that are not UTF-8, not
JSON, nested past the parser's depth, numbers past its digit limit, wrong field types,
lengths that lie) get a one-line JSON 4xx and leave the log and the server as they were.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import field_validator, model_validator

from pofe.annotate.log import FULL_DISK, AnnotatorLock, EventLog, LogWriteError, json_text
from pofe.annotate.pairs import AnnotationPair, load_pairs, shown_swapped, subset
from pofe.runs import file_sha256
from pofe.config import PofeConfig, Seed
from pofe.errors import PofeError
from pofe.data.prompts import DataError

log = logging.getLogger(__name__)

_ANNOTATOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LOOPBACK_NAMES = ("localhost",)
MAX_BODY = 64 * 1024
CHOICES = ("left", "right", "tie", "skip")


def is_loopback(host: str) -> bool:
    h = host.strip("[]").lower()
    if h in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


class AnnotateDataConfig(PofeConfig):
    """The pairs to label."""

    pairs: str
    """Pair file to label (pofe label output, an online ledger, prompt/chosen/rejected or
    prompt/response_a/response_b rows)."""
    limit: int | None = None
    """Label a seeded random subset of this many pairs (the same subset for every annotator
    with the same seed, so their labels overlap), shown in file order; all pairs when null."""

    @field_validator("limit")
    @classmethod
    def _check_limit(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"data.limit {v}: give at least 1 (or null for every pair)")
        return v


class AnnotateConfig(PofeConfig):
    """``pofe annotate``: which pairs, who labels them, where the labels go."""

    data: AnnotateDataConfig
    """The pairs to label (``data.pairs``, ``data.limit``)."""
    annotator: str
    """Who labels: written into every row, so two people's labels of the same pairs give the
    human-human agreement. Letters, digits, '_', '.', '-' (at most 64)."""
    output: str
    """The calibration file (append-only JSONL event log; resumed when it exists)."""
    host: str = "127.0.0.1"
    """Loopback address to serve on (127.0.0.1, ::1 or localhost): the page writes files."""
    port: int = 0
    """0 = any free port (the URL is printed)."""
    seed: Seed = 0
    """Seeds the per-pair, per-annotator left/right order and the ``data.limit`` subset."""

    @model_validator(mode="before")
    @classmethod
    def _data_section(cls, v: Any) -> Any:
        # An absent data section is reported as its required key (``data.pairs``), not as "data".
        if isinstance(v, dict) and "data" not in v:
            v = {**v, "data": {}}
        return v

    @field_validator("annotator")
    @classmethod
    def _check_annotator(cls, v: str) -> str:
        if not _ANNOTATOR.match(v):
            raise ValueError(f"annotator id {v!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter "
                             "or digit")
        return v

    @field_validator("host")
    @classmethod
    def _check_host(cls, v: str) -> str:
        if not is_loopback(v):
            raise ValueError(f"host {v!r} is not a loopback address: pofe annotate serves on 127.0.0.1, ::1 or "
                             "localhost only")
        return v

    @field_validator("port")
    @classmethod
    def _check_port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError(f"port {v} is not in 0..65535")
        return v


def _shown(v: Any, n: int = 60) -> str:
    """``repr(v)`` cut to ``n`` characters: error messages echo what was sent, not 60 KB of it."""
    try:
        r = repr(v)
    except ValueError:  # an int past Python's digit limit cannot even be printed
        r = f"<{type(v).__name__}>"
    return r if len(r) <= n else r[: n - 3] + "..."


class Session:
    """One annotator's labelling state over one pair file, backed by the event log.
    ``lock`` (the server's hold on this log for this annotator) is released by :meth:`close`."""

    def __init__(self, cfg: AnnotateConfig, lock: AnnotatorLock | None = None):
        self.cfg = cfg
        self.owner_lock = lock
        pairs, self.skipped_rows = load_pairs(cfg.data.pairs)
        self.n_in_file = len(pairs)
        self.pairs = subset(pairs, cfg.data.limit, cfg.seed)
        self.by_id: dict[str, AnnotationPair] = {p.id: p for p in self.pairs}
        self.log = EventLog(cfg.output)
        self._lock = threading.Lock()
        # Decisions that stand, oldest first: {pair_id: event}; insertion order = undo order.
        self.decided: dict[str, dict[str, Any]] = {}
        foreign = 0
        for d in self.log.standing(cfg.annotator):
            if d["pair_id"] in self.by_id:
                self.decided[d["pair_id"]] = d
            else:
                foreign += 1
        self.foreign = foreign  # standing decisions on pairs of another file (kept, not shown)

    def open_event(self) -> None:
        """Provenance of this labelling session (written once the server is bound)."""
        cfg = self.cfg
        self.log.append({"event": "open", "annotator": cfg.annotator, "pairs": str(cfg.data.pairs),
                         "pairs_sha256": file_sha256(cfg.data.pairs), "n_pairs": len(self.pairs),
                         "n_in_file": self.n_in_file, "limit": cfg.data.limit, "seed": cfg.seed, "pofe": _version()})

    # ------------------------------------------------------------------ state
    def swapped(self, pair: AnnotationPair) -> bool:
        return shown_swapped(pair.id, self.cfg.annotator, self.cfg.seed)

    def counts(self) -> dict[str, int]:
        labelled = sum(d["event"] == "label" for d in self.decided.values())
        return {"total": len(self.pairs), "labelled": labelled, "skipped": len(self.decided) - labelled}

    def state(self, note: str | None = None) -> dict[str, Any]:
        nxt = next(((i, p) for i, p in enumerate(self.pairs) if p.id not in self.decided), None)
        pair = None
        if nxt is not None:
            i, p = nxt
            left, right = (p.response_b, p.response_a) if self.swapped(p) else (p.response_a, p.response_b)
            pair = {"id": p.id, "index": i + 1, "prompt": p.prompt, "left": left, "right": right}
        last = next(reversed(self.decided.values()), None)
        return {"annotator": self.cfg.annotator, "output": str(self.cfg.output), **self.counts(),
                "can_undo": last is not None, "pair": pair, "done": pair is None, "note": note}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.state()

    # ------------------------------------------------------------------ writes
    def decide(self, pair_id: Any, choice: Any) -> dict[str, Any]:
        if not isinstance(choice, str) or choice not in CHOICES:
            raise BadRequest(f"choice must be one of {', '.join(CHOICES)}, got {_shown(choice)}")
        if not isinstance(pair_id, str) or pair_id not in self.by_id:
            raise BadRequest(f"unknown pair id {_shown(pair_id)}: not a pair of {self.cfg.data.pairs}")
        with self._lock:
            if pair_id in self.decided:
                raise Conflict(f"pair {pair_id!r} is already decided by {self.cfg.annotator!r} (undo it first)")
            p = self.by_id[pair_id]
            base = {"annotator": self.cfg.annotator, "pair_id": pair_id}
            if choice == "skip":
                row = self.log.append({"event": "skip", **base})
                note = f"skipped pair {self.pairs.index(p) + 1}"
            else:
                swapped = self.swapped(p)
                label = "tie" if choice == "tie" else ("A" if (choice == "left") != swapped else "B")
                row = self.log.append({"event": "label", **base, "label": label, "choice": choice,
                                       "shown": "ba" if swapped else "ab", "prompt": p.prompt,
                                       "response_a": p.response_a, "response_b": p.response_b,
                                       "pairs": str(self.cfg.data.pairs)})
                note = None
            self.decided[pair_id] = row
            return self.state(note)

    def undo(self) -> dict[str, Any]:
        with self._lock:
            if not self.decided:
                raise Conflict("nothing to undo")
            pair_id = next(reversed(self.decided))
            self.log.append({"event": "undo", "annotator": self.cfg.annotator, "pair_id": pair_id})
            gone = self.decided.pop(pair_id)
            what = {"skip": "skip", "label": f"label {gone.get('choice')}"}[gone["event"]]
            return self.state(f"undid the {what} of pair {self.pairs.index(self.by_id[pair_id]) + 1}")

    def close(self) -> None:
        self.log.close()
        if self.owner_lock is not None:
            self.owner_lock.release()
            self.owner_lock = None


def _version() -> str:
    from pofe import __version__

    return __version__


class ServeError(PofeError, OSError):
    """The server cannot listen on the configured host and port (in use, not an address of
    this machine): change ``--port`` / ``--host``."""

    exit_code = 2


class BadRequest(Exception):
    status = HTTPStatus.BAD_REQUEST


class Conflict(Exception):
    status = HTTPStatus.CONFLICT


class Refused(Exception):
    """A request refused before it reaches the session (its body unread or unusable)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


_STATIC = {  # request path -> (file in pofe/annotate/static, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/static/annotate.js": ("annotate.js", "text/javascript; charset=utf-8"),
    "/static/annotate.css": ("annotate.css", "text/css; charset=utf-8"),
}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _static(name: str) -> bytes:
    return resources.files("pofe.annotate").joinpath("static", name).read_bytes()


class Handler(BaseHTTPRequestHandler):
    server: AnnotateServer
    server_version = "pofe-annotate"
    sys_version = ""
    timeout = 30  # a client that promises a body and never sends it frees its thread

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", _CSP)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        # json_text: texts of the pair file may hold lone surrogates, which UTF-8 cannot encode.
        self._send(status, json_text(obj).encode("utf-8"), "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _host_ok(self) -> bool:
        """The Host header names this server on a loopback name (refuses DNS-rebinding pages)."""
        host = self.headers.get("Host", "")
        try:
            parts = urlsplit(f"//{host}")
            name, port = parts.hostname, parts.port
        except ValueError:
            return False
        return bool(name) and is_loopback(name) and port == self.server.server_address[1]

    def _origin_ok(self) -> bool:
        origin = self.headers.get("Origin")
        if origin is None:
            return True
        try:
            parts = urlsplit(origin)
            return parts.scheme == "http" and bool(parts.hostname) and is_loopback(parts.hostname) \
                and parts.port == self.server.server_address[1]
        except ValueError:
            return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors (malformed request line, headers too long, unknown
        method) as this API's one-line JSON, like every other answer; the status line carries
        only the standard phrase, never text from the request."""
        self.log_error("code %d, message %s", code, message)
        if self.request_version == "HTTP/0.9":  # an unparsable request line: still answer with a status line
            self.request_version = "HTTP/1.0"
        self.close_connection = True
        self._unread_body = True
        phrase = self.responses.get(code, ("error", ""))[0]
        body = json.dumps({"error": message or phrase}).encode("ascii")
        self.send_response(code)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def finish(self) -> None:
        super().finish()
        if getattr(self, "_unread_body", False):
            self._linger()

    def _linger(self) -> None:
        """After refusing a request whose body was not read, stop sending and read what the
        client still sends (bounded), so that closing does not reset the connection and
        throw away the error reply before the client has read it."""
        deadline = time.monotonic() + 2.0  # bounded in time too: a trickling client cannot hold the thread
        try:
            self.connection.shutdown(socket.SHUT_WR)
            left = 4 * MAX_BODY
            while left > 0 and time.monotonic() < deadline:
                self.connection.settimeout(max(0.05, deadline - time.monotonic()))
                got = self.connection.recv(min(left, 65536))
                if not got:
                    break
                left -= len(got)
        except OSError:
            pass

    def handle_one_request(self) -> None:
        self._unread_body = False
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError):
            raise  # the client went away: AnnotateServer.handle_error notes it quietly
        except Exception as e:  # a request must never take the page down or print a traceback
            log.error("annotate: internal error on %s %s: %s: %s", getattr(self, "command", None),
                      _shown(getattr(self, "path", None), 80), type(e).__name__, e)
            log.debug("traceback", exc_info=True)
            try:
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(e).__name__}")
            except OSError:
                pass
            self.close_connection = True

    def do_GET(self) -> None:
        if not self._host_ok():
            return self._error(HTTPStatus.FORBIDDEN, "forbidden host: pofe annotate answers on its loopback address only")
        path = urlsplit(self.path).path
        if path == "/api/state":
            return self._json(HTTPStatus.OK, self.server.session.snapshot())
        if path in _STATIC:
            name, ctype = _STATIC[path]
            return self._send(HTTPStatus.OK, _static(name), ctype)
        return self._error(HTTPStatus.NOT_FOUND, "not found")

    def do_POST(self) -> None:
        self._unread_body = True
        try:
            body = self._read_json_body()
        except Refused as e:
            return self._error(e.status, str(e))
        path = urlsplit(self.path).path
        try:
            s = self.server.session
            state = s.decide(body.get("pair_id"), body.get("choice")) if path == "/api/decide" else s.undo()
        except (BadRequest, Conflict) as e:
            return self._error(e.status, str(e))
        except LogWriteError as e:  # the log could not be written: say so, never pretend it was saved
            log.error("annotate: %s", e)
            status = HTTPStatus.INSUFFICIENT_STORAGE if e.errno in FULL_DISK else HTTPStatus.INTERNAL_SERVER_ERROR
            return self._error(status, f"could not save the label: {e}")
        return self._json(HTTPStatus.OK, state)

    def _read_json_body(self) -> dict[str, Any]:
        """The request's JSON object, or :class:`Refused` with the status and the reason."""
        if not self._host_ok() or not self._origin_ok():
            raise Refused(HTTPStatus.FORBIDDEN, "forbidden host or origin")
        if urlsplit(self.path).path not in ("/api/decide", "/api/undo"):
            raise Refused(HTTPStatus.NOT_FOUND, "not found")
        # A JSON content type cannot be sent cross-site without a CORS preflight, which this
        # server never grants: a page elsewhere cannot post labels.
        if self.headers.get_content_type() != "application/json":
            raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
        if self.headers.get("Transfer-Encoding") is not None:
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not a Transfer-Encoding")
        lengths = self.headers.get_all("Content-Length") or ["0"]
        text = lengths[0].strip()
        if len(lengths) > 1 or not text.isascii() or not text.isdigit():
            raise Refused(HTTPStatus.BAD_REQUEST, "bad Content-Length: give one non-negative integer")
        if len(text) > 12 or int(text) > MAX_BODY:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
        n = int(text)
        try:
            raw = self.rfile.read(n)
        except TimeoutError:
            self.close_connection = True
            raise Refused(HTTPStatus.REQUEST_TIMEOUT, f"the body did not arrive within {self.timeout:g} s") from None
        self._unread_body = False
        if len(raw) < n:
            raise Refused(HTTPStatus.BAD_REQUEST, f"body shorter than its Content-Length ({len(raw)} of {n} bytes)")
        try:
            body = json.loads(raw.decode("utf-8") or "{}")
        except UnicodeDecodeError as e:
            raise Refused(HTTPStatus.BAD_REQUEST, f"body is not UTF-8 (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise Refused(HTTPStatus.BAD_REQUEST, f"body is not JSON ({e.msg} at character {e.pos})") from None
        except RecursionError:
            raise Refused(HTTPStatus.BAD_REQUEST, "body is not usable JSON: nested too deeply") from None
        except ValueError as e:  # e.g. an integer past Python's digit limit
            raise Refused(HTTPStatus.BAD_REQUEST, f"body is not usable JSON: {_shown(str(e), 100)}") from None
        if not isinstance(body, dict):
            raise Refused(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return body


class AnnotateServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, session: Session, host: str, port: int):
        self.session = session
        bind = "127.0.0.1" if host.lower() == "localhost" else host.strip("[]")
        self.address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        super().__init__((bind, port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line, not the standard library's traceback on stderr: what reaches here is
        a client that went away (or a failure Handler already answered)."""
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, TimeoutError)):
            log.debug("annotate: %s went away: %s", client_address[0], e)
        else:
            log.error("annotate: request from %s failed: %s: %s", client_address[0], type(e).__name__, e)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def check_output(cfg: AnnotateConfig) -> None:
    """Refuse an output that is the pairs file or an existing file that is not an annotate
    log: opening it would append to (and repair the tail of) someone else's data."""
    from pofe.outputs import guard_outputs

    out = Path(cfg.output)
    # samefile: the same file under another name too (a symlink or a hard link)
    if out.exists() and Path(cfg.data.pairs).exists() and os.path.samefile(out, cfg.data.pairs):
        raise ValueError(f"output {cfg.output} is the pairs file itself: write the labels to a new file")
    if out.is_dir():
        raise ValueError(f"output {cfg.output} is a folder: give a .jsonl file name")
    if out.exists() and out.stat().st_size:
        with open(out, "rb") as f:
            first = f.readline()
        try:
            row = json.loads(first)
        except ValueError:
            row = None
        if not (isinstance(row, dict) and "event" in row and "annotator" in row):
            raise ValueError(f"output {cfg.output}:1 is not a pofe annotate log (no 'event'/'annotator'): "
                             "refusing to append to it")
    # The one output guard as well: never inside a live run's folder, never under a file.
    guard_outputs({"-o": cfg.output}, [cfg.data.pairs])


def make_server(cfg: AnnotateConfig) -> AnnotateServer:
    """Take this annotator's lock on the log, load the pairs, replay the log, bind, and record
    the session's ``open`` event (not yet serving). Raises ``DataError`` / ``ValueError`` for
    bad input (``LogInUse`` when another server holds the log for this annotator),
    ``LogWriteError`` when the ``open`` event cannot be saved, ``ServeError`` (an ``OSError``)
    when the port cannot be bound."""
    check_output(cfg)
    try:
        lock = AnnotatorLock(cfg.output, cfg.annotator)
    except OSError as e:
        raise DataError(f"output {cfg.output}: cannot create its lock file ({e.strerror or e})") from None
    try:
        session = Session(cfg, lock)
    except OSError as e:
        lock.release()
        raise DataError(f"output {cfg.output}: cannot open it ({e.strerror or e})") from None
    except BaseException:
        lock.release()
        raise
    try:
        server = AnnotateServer(session, cfg.host, cfg.port)
    except OSError as e:
        session.close()
        raise ServeError(f"cannot serve on {cfg.host}:{cfg.port} ({e.strerror or e})") from None
    try:
        session.open_event()
    except BaseException:
        server.server_close()
        session.close()
        raise
    return server
