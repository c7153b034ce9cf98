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
request path ever reaches the file system.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import field_validator

from pofe.annotate.log import EventLog
from pofe.annotate.pairs import AnnotationPair, file_sha256, load_pairs, shown_swapped, subset
from pofe.config import PofeConfig

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


class AnnotateConfig(PofeConfig):
    """``pofe annotate``: which pairs, who labels them, where the labels go."""

    pairs: str
    """Pair file to label (pofe label output, an online ledger, prompt/chosen/rejected or
    prompt/response_a/response_b rows)."""
    annotator: str
    """Who labels: written into every row, so two people's labels of the same pairs give the
    human-human agreement. Letters, digits, '_', '.', '-' (at most 64)."""
    output: str
    """The calibration file (append-only JSONL event log; resumed when it exists)."""
    host: str = "127.0.0.1"
    """Loopback address to serve on (127.0.0.1, ::1 or localhost): the page writes files."""
    port: int = 0
    """0 = any free port (the URL is printed)."""
    limit: int | None = None
    """Label a seeded random subset of this many pairs (the same subset for every annotator
    with the same seed, so their labels overlap), shown in file order; all pairs when null."""
    seed: int = 0
    """Seeds the per-pair, per-annotator left/right order and the ``limit`` subset."""

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

    @field_validator("limit")
    @classmethod
    def _check_limit(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"limit {v}: give at least 1 (or null for every pair)")
        return v

    @field_validator("port")
    @classmethod
    def _check_port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError(f"port {v} is not in 0..65535")
        return v


class Session:
    """One annotator's labelling state over one pair file, backed by the event log."""

    def __init__(self, cfg: AnnotateConfig):
        self.cfg = cfg
        pairs, self.skipped_rows = load_pairs(cfg.pairs)
        self.n_in_file = len(pairs)
        self.pairs = subset(pairs, cfg.limit, cfg.seed)
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
        self.log.append({"event": "open", "annotator": cfg.annotator, "pairs": str(cfg.pairs),
                         "pairs_sha256": file_sha256(cfg.pairs), "n_pairs": len(self.pairs), "n_in_file": self.n_in_file,
                         "limit": cfg.limit, "seed": cfg.seed, "pofe": _version()})

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
        if choice not in CHOICES:
            raise BadRequest(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
        if not isinstance(pair_id, str) or pair_id not in self.by_id:
            raise BadRequest(f"unknown pair id {pair_id!r}: not a pair of {self.cfg.pairs}")
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
                                       "pairs": str(self.cfg.pairs)})
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


def _version() -> str:
    from pofe import __version__

    return __version__


class BadRequest(Exception):
    status = HTTPStatus.BAD_REQUEST


class Conflict(Exception):
    status = HTTPStatus.CONFLICT


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
        self._send(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8")

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
        if not self._host_ok() or not self._origin_ok():
            return self._error(HTTPStatus.FORBIDDEN, "forbidden host or origin")
        path = urlsplit(self.path).path
        if path not in ("/api/decide", "/api/undo"):
            return self._error(HTTPStatus.NOT_FOUND, "not found")
        # A JSON content type cannot be sent cross-site without a CORS preflight, which this
        # server never grants: a page elsewhere cannot post labels.
        if self.headers.get_content_type() != "application/json":
            return self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send application/json")
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return self._error(HTTPStatus.BAD_REQUEST, "bad Content-Length")
        if n < 0 or n > MAX_BODY:
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            s = self.server.session
            state = s.decide(body.get("pair_id"), body.get("choice")) if path == "/api/decide" else s.undo()
        except json.JSONDecodeError:
            return self._error(HTTPStatus.BAD_REQUEST, "body is not JSON")
        except (BadRequest, Conflict) as e:
            return self._error(e.status, str(e))
        except OSError as e:  # the log could not be written: say so, never pretend it was saved
            log.error("annotate: could not write %s: %s", self.server.session.log.path, e)
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"could not save the label: {e}")
        return self._json(HTTPStatus.OK, state)


class AnnotateServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, session: Session, host: str, port: int):
        import socket

        self.session = session
        bind = "127.0.0.1" if host.lower() == "localhost" else host.strip("[]")
        self.address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        super().__init__((bind, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def check_output(cfg: AnnotateConfig) -> None:
    """Refuse an output that is the pairs file or an existing file that is not an annotate
    log: opening it would append to (and repair the tail of) someone else's data."""
    out = Path(cfg.output)
    if out.exists() and Path(cfg.pairs).exists() and out.resolve() == Path(cfg.pairs).resolve():
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


def make_server(cfg: AnnotateConfig) -> AnnotateServer:
    """Load the pairs, replay the log, bind, and record the session's ``open`` event (not yet
    serving). Raises ``DataError`` / ``ValueError`` for bad input, ``OSError`` when the port
    cannot be bound."""
    check_output(cfg)
    session = Session(cfg)
    try:
        server = AnnotateServer(session, cfg.host, cfg.port)
    except OSError:
        session.close()
        raise
    session.open_event()
    return server
