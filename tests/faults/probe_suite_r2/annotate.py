"""Round-2 probes: the ``pofe annotate`` server and its log (tag ``r2-annot:``).

Each event of the log is whole or absent (a full disk is a 507 to the page, the partial bytes
are cut back off, a torn tail is cut when the log is opened), one server per (log,
annotator), texts with U+2028/U+2029/U+0085 or lone surrogates round-trip, and hostile
requests get a one-line JSON 4xx with no traceback, the server still serving and the log
unchanged. The full disk is real: ``RLIMIT_FSIZE`` makes the kernel do a short write (and
then EFBIG), as a full disk does; Python ignores SIGXFSZ.
"""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

TAG = "r2-annot: "


def _pairs(path: Path, n: int = 3, **first) -> Path:
    rows = [{"prompt": f"Question {i}?", "response_a": f"Answer {i}.", "response_b": f"A longer answer, number {i}."}
            for i in range(n)]
    rows[0].update(first)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().decode("utf-8").split("\n") if x]


class Served:
    """``pofe annotate`` as a subprocess; ``stop()`` sends SIGTERM and returns (rc, stdout, stderr)."""

    def __init__(self, P, ctx, pairs: Path, out: Path, who: str = "ann", fsize: int | None = None):
        pre = None
        if fsize is not None:
            def pre():
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.RLIM_INFINITY))
        self.proc = subprocess.Popen([sys.executable, "-m", "pofe", "annotate", str(pairs), "-a", who, "-o", str(out)],
                                     cwd=ctx.root, env={**ctx.env, "PYTHONDONTWRITEBYTECODE": "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pre)
        self.first = self.proc.stdout.readline()
        if not self.first.startswith("pofe annotate: http://127.0.0.1:"):
            _, err = self.proc.communicate(timeout=60)
            raise RuntimeError(f"server did not start (exit {self.proc.returncode}): {P.short(self.first + err)}")
        self.port = int(self.first.rsplit(":", 1)[1].strip(" /\n"))
        # Read the rest of the start-up lines here: readline() may have buffered them, and
        # communicate() reads the pipe's file descriptor, never that buffer (a lost line).
        while True:
            line = self.proc.stdout.readline()
            self.first += line
            if not line or line.startswith("  writing "):
                break

    def stop(self, sig=signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, self.first + out, err


def _raw(port: int, data: bytes, *, half_close: bool = False) -> tuple[int, dict | None]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, None  # no status line: the connection was dropped
    try:
        obj = json.loads(body) if b"application/json" in head else None
    except ValueError:
        obj = None
    return status, obj


def _post(port: int, body: bytes, *, path: str = "/api/decide", length: str | None = "auto",
          headers: dict | None = None, half_close: bool = False) -> tuple[int, dict | None]:
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json",
         "Content-Length": str(len(body)) if length == "auto" else length, **(headers or {})}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None) + "\r\n"
    return _raw(port, head.encode("latin-1") + body, half_close=half_close)


def _state(port: int) -> tuple[int, dict | None]:
    return _raw(port, f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())


def _label(port: int, choice: str = "left") -> tuple[int, dict | None]:
    st = _state(port)[1]
    return _post(port, json.dumps({"pair_id": st["pair"]["id"], "choice": choice}).encode())


def _finish(P, rc: int, err: str, obs: str, bad: str | None):
    if P.TRACEBACK in err or "Exception occurred" in err:
        return P.Outcome("traceback", obs + "; traceback on the server's stderr", False)
    if rc != 0:
        return P.Outcome("other", obs + f"; server exit {rc} on SIGTERM", False)
    if bad:
        return P.Outcome("silent wrong", obs + f"; {bad}", False)
    return P.Outcome("fine", obs, True)


# ------------------------------------------------------------------------------ hostile requests

def hostile(P, name: str, expected: str, requests: list) -> object:
    """``requests``: (label, send(port) -> (status, json), wanted status). Each must get a JSON
    error of one line with the wanted status; the server keeps serving; the log is unchanged."""

    def run(ctx):
        d = ctx.dir(name)
        pairs, out = _pairs(d / "pairs.jsonl"), d / "cal.jsonl"
        s = Served(P, ctx, pairs, out)
        got, bad = [], None
        try:
            before = out.read_bytes()
            for what, send, want in requests:
                status, obj = send(s.port)
                got.append(f"{what} {status}")
                if status != want or not (isinstance(obj, dict) and isinstance(obj.get("error"), str)
                                          and "\n" not in obj["error"] and len(obj["error"]) < 300):
                    bad = bad or f"{what}: status {status} (want {want}), body {P.short(str(obj), 60)}"
                if _state(s.port)[0] != 200:
                    bad = bad or f"not serving after {what}"
            if out.read_bytes() != before:
                bad = bad or "the log changed"
            if not bad and _label(s.port)[0] != 200:
                bad = "a good label was refused afterwards"
        finally:
            rc, _, err = s.stop()
        return _finish(P, rc, err, "; ".join(got), bad)

    return P.Probe(TAG + name, "annotate", expected, run)


def _hostile_probes(P) -> list:
    nested = b'{"pair_id": ' + b"[" * 30000 + b"]" * 30000 + b"}"
    deep_obj = b'{"a": ' * 9000 + b"1" + b"}" * 9000
    out = [
        hostile(P, "POST nested 30000 deep (array and object)", "400 JSON each; no traceback; log unchanged",
                [("array", lambda p: _post(p, nested), 400), ("object", lambda p: _post(p, deep_obj), 400)]),
        hostile(P, "POST body not UTF-8", "400 JSON 'not UTF-8'; no traceback; log unchanged",
                [("latin-1", lambda p: _post(p, b'{"pair_id": "caf\xe9", "choice": "left"}'), 400),
                 ("lone byte", lambda p: _post(p, b"\xff"), 400)]),
        hostile(P, "POST 5000-digit integer", "400 JSON (Python's int digit limit); no traceback",
                [("pair_id", lambda p: _post(p, b'{"pair_id": ' + b"9" * 5000 + b', "choice": "left"}'), 400),
                 ("choice", lambda p: _post(p, b'{"pair_id": "x", "choice": -' + b"1" * 4500 + b"}"), 400)]),
        hostile(P, "POST 1e999999, NaN and -Infinity", "400 JSON each (no pair, no choice); log unchanged",
                [("1e999999", lambda p: _post(p, b'{"p": 1e999999}'), 400),
                 ("NaN id", lambda p: _post(p, b'{"pair_id": NaN, "choice": "left"}'), 400),
                 ("-Infinity choice", lambda p: _post(p, b'{"pair_id": "x", "choice": -Infinity}'), 400)]),
        hostile(P, "POST missing fields and wrong types", "400 JSON each, error under 300 chars; log unchanged",
                [("{}", lambda p: _post(p, b"{}"), 400), ("null", lambda p: _post(p, b"null"), 400),
                 ("list", lambda p: _post(p, b'["pair_id"]'), 400),
                 ("object id, list choice", lambda p: _post(p, b'{"pair_id": {"a": 1}, "choice": ["left"]}'), 400),
                 ("60 KB id", lambda p: _post(p, b'{"pair_id": "' + b"x" * 60000 + b'", "choice": "left"}'), 400),
                 ("lone surrogate id", lambda p: _post(p, b'{"pair_id": "\\udc00", "choice": "tie"}'), 400),
                 ("undo with a list", lambda p: _post(p, b"[1]", path="/api/undo"), 400)]),
        hostile(P, "POST lying Content-Length", "negative/non-numeric/doubled 400, huge 413, short body 400",
                [("negative", lambda p: _post(p, b"{}", length="-5"), 400),
                 ("non-numeric", lambda p: _post(p, b"{}", length="1e3"), 400),
                 ("doubled", lambda p: _post(p, b"{}", headers={"content-length": "2"}), 400),
                 ("huge", lambda p: _post(p, b"{}", length="9" * 30), 413),
                 ("short body", lambda p: _post(p, b'{"pair', length="400", half_close=True), 400)]),
        hostile(P, "POST body over the limit or chunked", "70 KB body 413; chunked 411; log unchanged",
                [("70 KB", lambda p: _post(p, b'{"pair_id": "' + b"y" * 70000 + b'"}'), 413),
                 ("chunked", lambda p: _post(p, b"2\r\n{}\r\n0\r\n\r\n", length=None,
                                             headers={"Transfer-Encoding": "chunked"}), 411)]),
        hostile(P, "malformed request line, unknown method, 70 KB header", "JSON 400 / 501 / 431 like the API's errors",
                [("garbage line", lambda p: _raw(p, b"GARBAGE\r\n\r\n"), 400),
                 ("PUT", lambda p: _raw(p, b"PUT /api/decide HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % p), 501),
                 ("long header", lambda p: _raw(p, b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n"), 431)]),
    ]
    return out


# ------------------------------------------------------------------------------ the lock

def _second_server(P, name: str, out_name, *, who: str = "ann"):
    def run(ctx):
        d = ctx.dir(name)
        pairs, log = _pairs(d / "pairs.jsonl"), d / "cal.jsonl"
        s = Served(P, ctx, pairs, log)
        try:
            target = out_name(d)
            before = P.digest([log])
            res = P.pofe(ctx, "annotate", pairs, "-a", who, "-o", target, timeout=60)
            after = P.digest([log])
        finally:
            rc, _, err = s.stop()
        o = P.judge_result(res, code=2, needles=("cal.jsonl" if target == log else target.name, f"PID {s.proc.pid}"),
                           inputs_before=before, inputs_after=after)
        if P.TRACEBACK in err or rc != 0:
            return P.Outcome("other", o.observed + f"; first server exit {rc}", False)
        return o

    return run


def _lock_probes(P) -> list:
    def symlink(d: Path) -> Path:
        link = d / "link.jsonl"
        if not link.exists():
            link.symlink_to(d / "cal.jsonl")
        return link

    out = [
        P.Probe(TAG + "second server, same annotator and log", "annotate",
                "exit 2, one line naming the log and the first server's PID; log unchanged",
                _second_server(P, "second server same annotator", lambda d: d / "cal.jsonl"), serial=True),
        P.Probe(TAG + "second server through a symlink to the log", "annotate",
                "exit 2 naming the PID (one lock whatever the name); log unchanged",
                _second_server(P, "second server via symlink", symlink), serial=True),
    ]

    def two_annotators(ctx):
        d = ctx.dir("two annotators at once")
        pairs, log = _pairs(d / "pairs.jsonl"), d / "cal.jsonl"
        a = Served(P, ctx, pairs, log, "ann")
        b = Served(P, ctx, pairs, log, "bob")
        try:
            codes = [_label(a.port, "left")[0], _label(b.port, "right")[0], _label(a.port, "tie")[0],
                     _label(b.port, "tie")[0]]
        finally:
            ra, _, ea = a.stop()
            rb, _, eb = b.stop()
        from pofe.data.calibration import resolve_annotation_events

        ev = _events(log)
        standing = resolve_annotation_events(ev, str(log))
        who = sorted(x["annotator"] for x in standing)
        obs = f"POSTs {codes}; {len(ev)} events; standing {who}"
        bad = None if codes == [200] * 4 and who == ["ann", "ann", "bob", "bob"] and len(ev) == 6 else "wrong log"
        return _finish(P, ra or rb, ea + eb, obs, bad)

    out.append(P.Probe(TAG + "two annotators on one log at once", "annotate",
                       "both serve; 4 labels saved (2 each) and 2 open events, every line whole", two_annotators,
                       serial=True))

    def after_kill(ctx):
        d = ctx.dir("restart after SIGKILL")
        pairs, log = _pairs(d / "pairs.jsonl"), d / "cal.jsonl"
        s = Served(P, ctx, pairs, log)
        first = _label(s.port)[0]
        s.stop(signal.SIGKILL)
        s2 = Served(P, ctx, pairs, log)
        try:
            st = _state(s2.port)[1]
            second = _label(s2.port)[0]
        finally:
            rc, _, err = s2.stop()
        obs = f"labels {first}, {second}; resumed at {st['labelled']} labelled"
        bad = None if (first, second, st["labelled"]) == (200, 200, 1) else "did not resume"
        return _finish(P, rc, err, obs, bad)

    out.append(P.Probe(TAG + "restart after the first server was SIGKILLed", "annotate",
                       "starts (the dead server's lock is free), resumes at 1 labelled", after_kill, serial=True))
    return out


# ------------------------------------------------------------------------------ the log

def _log_probes(P) -> list:
    out = []

    def torn_tail(ctx):
        d = ctx.dir("torn last line on open")
        pairs, log = _pairs(d / "pairs.jsonl"), d / "cal.jsonl"
        s = Served(P, ctx, pairs, log)
        _label(s.port)
        s.stop()
        good = log.read_bytes()
        torn = '{"event": "label", "annotator": "ann", "prompt": "caf\u00e9'.encode()[:-1]
        log.write_bytes(good + torn)
        s = Served(P, ctx, pairs, log)
        try:
            st = _state(s.port)[1]
            status = _label(s.port)[0]
        finally:
            rc, stdout, err = s.stop()
        data = log.read_bytes()
        ev = _events(log)
        obs = f"label {status}; resumed at {st['labelled']}; {len(ev)} events"
        bad = None
        if not data.startswith(good) or torn in data:
            bad = "the torn bytes were kept or good rows changed"
        elif [e["event"] for e in ev] != ["open", "label", "open", "label"] or st["labelled"] != 1 or status != 200:
            bad = f"events {[e['event'] for e in ev]}"
        elif f"cut a torn last line ({len(torn)} bytes" not in stdout:
            bad = "the cut was not reported"
        return _finish(P, rc, err, obs, bad)

    out.append(P.Probe(TAG + "torn last line on open", "annotate",
                       "the torn bytes are cut and reported (count), resume at 1 labelled, next label on its own line",
                       torn_tail))

    def short_write(ctx):
        d = ctx.dir("real short write")
        pairs, log = _pairs(d / "pairs.jsonl"), d / "cal.jsonl"
        Served(P, ctx, pairs, log).stop()
        limit = 2 * log.stat().st_size + 40  # a second open event fits, a label line does not
        s = Served(P, ctx, pairs, log, fsize=limit)
        try:
            before = log.read_bytes()
            codes = [_label(s.port)[0], _label(s.port)[0]]  # the short write, then EFBIG
            kept = log.read_bytes() == before
            resource.prlimit(s.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            codes.append(_label(s.port)[0])
        finally:
            rc, _, err = s.stop()
        ev = [e["event"] for e in _events(log)]
        obs = f"POSTs {codes}; events {ev}"
        bad = None if codes == [507, 507, 200] and kept and ev == ["open", "open", "label"] else \
            ("partial bytes left in the log" if not kept else "wrong statuses or events")
        return _finish(P, rc, err, obs, bad)

    out.append(P.Probe(TAG + "disk full mid-label (a real short write)", "annotate",
                       "507 JSON twice, log byte-identical; with room again the label is saved on its own line",
                       short_write))

    def one_session(ctx, d):  # a log with one open event, before the inputs are digested
        Served(P, ctx, _pairs(d / "pairs.jsonl"), d / "cal.jsonl").stop()

    def no_room_at_start(ctx, d):
        return ["annotate", d / "pairs.jsonl", "-a", "ann", "-o", d / "cal.jsonl"]

    def prlimit_prefix(ctx, d):
        size = (d / "cal.jsonl").stat().st_size
        return ("prlimit", f"--fsize={size}:unlimited", "--")

    out.append(P.cli(TAG + "startup with no room for the open event", "annotate",
                     "exit 1, one line naming the log and the cause (not 'cannot serve'); log unchanged",
                     no_room_at_start, code=1, needles=("cal.jsonl", "could not write"),
                     inputs=lambda ctx, d: [d / "cal.jsonl"], setup=one_session, prefix=prlimit_prefix, env={"PYTHONDONTWRITEBYTECODE": "1"}))

    def separators(ctx):
        d = ctx.dir("line separators in texts")
        weird = "one\u2028two\u2029three\x85four"
        pairs, log = _pairs(d / "pairs.jsonl", prompt="Q " + weird, response_a="A " + weird), d / "cal.jsonl"
        s = Served(P, ctx, pairs, log)
        try:
            first = _label(s.port, "tie")[0]
        finally:
            s.stop()
        s = Served(P, ctx, pairs, log)
        try:
            resumed = _state(s.port)[1]["labelled"]
        finally:
            rc, _, err = s.stop()
        res = P.pofe(ctx, "audit", "--calibration", log, "--judge", "length", *P.sets("contrasts=false"),
                     "-o", d / "audit.json", timeout=120)
        n = json.loads((d / "audit.json").read_text())["calibration"]["n_items"] if (d / "audit.json").exists() else None
        rows = _events(log)
        obs = f"label {first}; resumed at {resumed}; audit exit {res.returncode} read {n} item(s)"
        bad = None
        if P.TRACEBACK in res.stderr:
            bad = "audit traceback"
        elif (first, resumed, n) != (200, 1, 1) or rows[1]["prompt"] != "Q " + weird:
            bad = "the text did not round-trip"
        return _finish(P, rc, err, obs, bad)

    out.append(P.Probe(TAG + "U+2028 / U+2029 / U+0085 inside the texts", "annotate",
                       "label saved; a restart resumes at 1 labelled; pofe audit reads 1 item with the same text",
                       separators))

    def surrogates(ctx):
        d = ctx.dir("lone surrogates in the pairs")
        pairs, log = d / "pairs.jsonl", d / "cal.jsonl"
        pairs.write_text(json.dumps({"prompt": "q\ud800", "response_a": "a\udfff", "response_b": "b"}) + "\n")
        s = Served(P, ctx, pairs, log)
        try:
            status, st = _state(s.port)
            label = _label(s.port)[0]
        finally:
            rc, _, err = s.stop()
        ev = _events(log)
        obs = f"state {status}; label {label}"
        bad = None if status == 200 and st["pair"]["prompt"] == "q\ud800" and label == 200 and \
            ev[-1].get("response_a") == "a\udfff" else "not served or not logged as written"
        return _finish(P, rc, err, obs, bad)

    out.append(P.Probe(TAG + "lone surrogates in the pairs file", "annotate",
                       "the page gets the pair, the label is logged and reads back the same text", surrogates))
    return out


def probes(P) -> list:
    return [*_lock_probes(P), *_log_probes(P), *_hostile_probes(P)]
