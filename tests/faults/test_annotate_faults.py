"""The annotate log under a full disk, a second server, line separators inside texts and
hostile POST bodies: each event is whole or absent, never acknowledged when it is not saved,
and no request makes the server print a traceback or change the log."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pofe.annotate import log as annotate_log
from pofe.annotate.log import EventLog
from pofe.annotate.server import AnnotateConfig, Handler, Session, make_server
from pofe.data.calibration import load_calibration
from pofe.data.prompts import DataError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import env as cli_env  # noqa: E402 - after the sys.path line above

SEPARATORS = "one\u2028two\u2029three\x85four"  # str.splitlines() splits on each of these


def _pairs(path: Path, n: int = 3, **texts) -> Path:
    rows = [{"prompt": f"Question {i}?", "response_a": f"Answer {i}.", "response_b": f"A longer answer, number {i}."}
            for i in range(n)]
    if texts:
        rows[0].update(texts)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(tmp_path: Path, who: str = "ann", out: str | Path | None = None) -> AnnotateConfig:
    if not (tmp_path / "pairs.jsonl").exists():
        _pairs(tmp_path / "pairs.jsonl")
    return AnnotateConfig(data={"pairs": str(tmp_path / "pairs.jsonl")}, annotator=who,
                          output=str(out or tmp_path / "cal.jsonl"))


def _raw(port: int, data: bytes, *, half_close: bool = False, timeout: float = 10) -> tuple[int, dict]:
    """Send raw bytes, read the reply to EOF: (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head, reply[:300]
    return status, json.loads(body)


def _post(port: int, body: bytes, *, path: str = "/api/decide", headers: dict | None = None,
          length: str | None = None, **kw) -> tuple[int, dict]:
    h = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json",
         "Content-Length": str(len(body)) if length is None else length, **(headers or {})}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None) + "\r\n"
    return _raw(port, head.encode("latin-1") + body, **kw)


def _get_state(port: int) -> tuple[int, dict]:
    return _raw(port, f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())


@pytest.fixture
def server(tmp_path):
    srv = make_server(_cfg(tmp_path))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    srv.session.close()


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().decode("utf-8").split("\n") if x]


# ------------------------------------------------------------------------------ full disk

def _half_then(fail: str):
    real = os.write

    def write(fd, data):
        real(fd, bytes(data[: len(data) // 2]))
        if fail == "short":
            return len(data) // 2
        raise OSError(errno.ENOSPC, "No space left on device")

    return write


@pytest.mark.parametrize("fail", ["short", "enospc"])
def test_short_write_leaves_the_log_as_it_was_and_the_next_event_is_whole(tmp_path, monkeypatch, fail):
    path = tmp_path / "cal.jsonl"
    log = EventLog(path)
    log.append({"event": "label", "annotator": "ann", "pair_id": "p1"})
    before = path.read_bytes()
    monkeypatch.setattr(annotate_log.os, "write", _half_then(fail))
    with pytest.raises(OSError, match="cal.jsonl"):
        log.append({"event": "skip", "annotator": "ann", "pair_id": "p2"})
    assert path.read_bytes() == before  # the partial bytes are cut back off
    monkeypatch.undo()
    log.append({"event": "skip", "annotator": "ann", "pair_id": "p3"})
    log.close()
    assert [(e["event"], e["pair_id"]) for e in _events(path)] == [("label", "p1"), ("skip", "p3")]


def test_failed_fsync_takes_the_event_back_out(tmp_path, monkeypatch):
    path = tmp_path / "cal.jsonl"
    log = EventLog(path)
    log.append({"event": "label", "annotator": "ann", "pair_id": "p1"})
    before = path.read_bytes()

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(annotate_log.os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        log.append({"event": "skip", "annotator": "ann", "pair_id": "p2"})
    monkeypatch.undo()
    assert path.read_bytes() == before
    log.close()


def test_full_disk_during_a_post_is_a_507_and_nothing_is_glued(server, monkeypatch):
    port = server.server_address[1]
    path = Path(server.session.log.path)
    pid = _get_state(port)[1]["pair"]["id"]
    before = path.read_bytes()
    monkeypatch.setattr(annotate_log.os, "write", _half_then("enospc"))
    status, body = _post(port, json.dumps({"pair_id": pid, "choice": "left"}).encode())
    assert status == 507 and "could not save" in body["error"] and "No space left" in body["error"]
    assert path.read_bytes() == before
    assert _get_state(port)[1]["labelled"] == 0  # the page is not told it was saved
    monkeypatch.setattr(annotate_log.os, "write", _half_then("short"))
    assert _post(port, json.dumps({"pair_id": pid, "choice": "left"}).encode())[0] == 507
    monkeypatch.undo()  # space again: the retry is saved, on its own line
    status, body = _post(port, json.dumps({"pair_id": pid, "choice": "left"}).encode())
    assert status == 200 and body["labelled"] == 1
    saved = path.read_bytes()
    monkeypatch.setattr(annotate_log.os, "write", _half_then("enospc"))
    status, body = _post(port, b"{}", path="/api/undo")  # an undo that cannot be saved does not happen
    monkeypatch.undo()
    assert status == 507 and path.read_bytes() == saved
    assert _get_state(port)[1]["labelled"] == 1
    assert [e["event"] for e in _events(path)] == ["open", "label"]


def test_torn_tail_is_cut_counted_and_never_glued(tmp_path, caplog):
    path = tmp_path / "cal.jsonl"
    good = json.dumps({"event": "label", "annotator": "ann", "pair_id": "p1", "label": "A", "prompt": "q",
                       "response_a": "x", "response_b": "y"}, ensure_ascii=False)
    torn = '{"event": "label", "annotator": "ann", "prompt": "caf\u00e9'.encode()[:-1]  # cut inside the é
    path.write_bytes(good.encode() + b"\n" + torn)
    log = EventLog(path)
    assert log.torn_bytes_dropped == len(torn)
    assert f"dropping a torn last line ({len(torn)} bytes" in caplog.text
    log.append({"event": "skip", "annotator": "ann", "pair_id": "p2"})
    log.close()
    assert path.read_bytes().decode().split("\n")[0] == good
    assert [e["event"] for e in _events(path)] == ["label", "skip"]
    again = EventLog(path)
    assert again.torn_bytes_dropped == 0
    again.close()


def test_a_torn_tail_left_by_another_writer_is_cut_before_the_next_append(tmp_path):
    """Another process died mid-line after this log was opened: the next event still starts
    a line of its own."""
    path = tmp_path / "cal.jsonl"
    log = EventLog(path)
    log.append({"event": "skip", "annotator": "ann", "pair_id": "p1"})
    with open(path, "ab") as f:
        f.write(b'{"event": "skip", "annot')
    log.append({"event": "skip", "annotator": "ann", "pair_id": "p2"})
    log.close()
    assert [e["pair_id"] for e in _events(path)] == ["p1", "p2"]


def test_startup_on_a_full_disk_exits_1_naming_the_log(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pofe.cli.main import app

    _pairs(tmp_path / "pairs.jsonl")
    monkeypatch.setattr(annotate_log.os, "write", _half_then("enospc"))
    r = CliRunner().invoke(app, ["annotate", str(tmp_path / "pairs.jsonl"), "-a", "ann", "-o", str(tmp_path / "cal.jsonl")])
    assert r.exit_code == 1, r.output
    assert r.output.startswith("error: ") and r.output.strip().count("\n") == 0, r.output
    assert "cal.jsonl" in r.output and "No space left" in r.output and "cannot serve" not in r.output
    assert (tmp_path / "cal.jsonl").read_bytes() == b""


# ------------------------------------------------------------------------------ one server per annotator

def test_second_server_for_the_same_annotator_and_log_is_refused(tmp_path):
    first = make_server(_cfg(tmp_path))
    try:
        with pytest.raises(DataError) as e:
            make_server(_cfg(tmp_path))
        msg = str(e.value)
        assert "cal.jsonl" in msg and f"PID {os.getpid()}" in msg and "'ann'" in msg and "\n" not in msg
        link = tmp_path / "link.jsonl"  # the same log under another name
        link.symlink_to(tmp_path / "cal.jsonl")
        with pytest.raises(DataError, match="PID"):
            make_server(_cfg(tmp_path, out=link))
        other = make_server(_cfg(tmp_path, who="bob"))  # another annotator on the same log is fine
        other.server_close()
        other.session.close()
    finally:
        first.server_close()
        first.session.close()
    again = make_server(_cfg(tmp_path))  # the lock goes with the first server
    again.server_close()
    again.session.close()
    assert [(e["event"], e["annotator"]) for e in _events(tmp_path / "cal.jsonl")] == [
        ("open", "ann"), ("open", "bob"), ("open", "ann")]


def _start_cli(tmp_path: Path, who: str = "ann") -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "pofe", "annotate", str(tmp_path / "pairs.jsonl"), "-a", who,
                             "-o", str(tmp_path / "cal.jsonl")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())
    first = proc.stdout.readline()
    assert first.startswith("pofe annotate: http://127.0.0.1:"), first + proc.stderr.read()
    return proc, int(first.rsplit(":", 1)[1].strip(" /\n"))


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


@pytest.mark.slow
def test_cli_second_server_exits_2_with_one_line_naming_log_and_pid(tmp_path):
    _pairs(tmp_path / "pairs.jsonl")
    proc, _ = _start_cli(tmp_path)
    try:
        before = (tmp_path / "cal.jsonl").read_bytes()
        r = subprocess.run([sys.executable, "-m", "pofe", "annotate", str(tmp_path / "pairs.jsonl"), "-a", "ann",
                            "-o", str(tmp_path / "cal.jsonl")], capture_output=True, text=True, env=cli_env(), timeout=60)
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "cal.jsonl" in lines[0] and f"PID {proc.pid}" in lines[0]
        assert (tmp_path / "cal.jsonl").read_bytes() == before  # no second open event
    finally:
        _stop(proc)


# ------------------------------------------------------------------------------ line separators in texts

def test_line_separators_inside_texts_round_trip_through_the_log(tmp_path):
    _pairs(tmp_path / "pairs.jsonl", prompt="Q " + SEPARATORS, response_a="A " + SEPARATORS, response_b="B\u2028")
    s = Session(_cfg(tmp_path))
    st = s.state()
    assert st["pair"]["index"] == 1
    s.decide(st["pair"]["id"], "tie")
    s.close()
    rows = EventLog(tmp_path / "cal.jsonl").rows()
    assert len(rows) == 1 and rows[0]["prompt"] == "Q " + SEPARATORS and rows[0]["response_a"] == "A " + SEPARATORS
    again = Session(_cfg(tmp_path))  # a restart reads the log back
    assert again.counts() == {"total": 3, "labelled": 1, "skipped": 0}
    again.close()
    items = load_calibration([tmp_path / "cal.jsonl"])  # and the audit's reader does too
    assert [(it.prompt, it.response_b, it.label) for it in items] == [("Q " + SEPARATORS, "B\u2028", "tie")]


def test_log_written_with_raw_separators_is_read_on_newlines_only(tmp_path):
    path = tmp_path / "cal.jsonl"
    row = {"event": "skip", "annotator": "ann", "pair_id": "p\u2028" + SEPARATORS}
    path.write_bytes((json.dumps(row, ensure_ascii=False) + "\n").encode())
    assert EventLog(path).rows() == [row]


def test_lone_surrogates_in_pairs_are_served_and_logged(tmp_path):
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "q\ud800", "response_a": "a\udfff", "response_b": "b"})
                                          + "\n", encoding="utf-8")
    srv = make_server(_cfg(tmp_path))
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        port = srv.server_address[1]
        status, st = _get_state(port)
        assert status == 200 and st["pair"]["prompt"] == "q\ud800"
        status, body = _post(port, json.dumps({"pair_id": st["pair"]["id"], "choice": "tie"}).encode())
        assert status == 200 and body["done"]
    finally:
        srv.shutdown()
        srv.server_close()
        srv.session.close()
    rows = EventLog(tmp_path / "cal.jsonl").rows()
    assert (rows[1]["prompt"], rows[1]["response_a"]) == ("q\ud800", "a\udfff")


# ------------------------------------------------------------------------------ hostile POST bodies

HOSTILE = [  # (name, body, extra headers / Content-Length, expected status)
    ("deeply nested", b'{"pair_id": ' + b"[" * 30000 + b"]" * 30000 + b"}", {}, 400),
    ("nested object", b'{"a": ' * 9000 + b"1" + b"}" * 9000, {}, 400),
    ("not UTF-8", b'{"pair_id": "caf\xe9", "choice": "left"}', {}, 400),
    ("5000-digit int", b'{"pair_id": ' + b"9" * 5000 + b', "choice": "left"}', {}, 400),
    ("1e999999", b'{"p": 1e999999}', {}, 400),
    ("infinite choice", b'{"pair_id": "x", "choice": -Infinity}', {}, 400),
    ("missing fields", b"{}", {}, 400),
    ("list as object", b'["pair_id", "choice"]', {}, 400),
    ("wrong types", b'{"pair_id": {"a": 1}, "choice": ["left"]}', {}, 400),
    ("null", b"null", {}, 400),
    ("lone surrogate id", b'{"pair_id": "\\ud800", "choice": "left"}', {}, 400),
    ("huge string id", b'{"pair_id": "' + b"x" * 60000 + b'", "choice": "left"}', {}, 400),
    ("huge Content-Length", b"{}", {"length": "99999999999999999999999"}, 413),
    ("negative Content-Length", b"{}", {"length": "-5"}, 400),
    ("non-numeric Content-Length", b"{}", {"length": "12abc"}, 400),
    ("body over the limit", b'{"pair_id": "' + b"x" * 70000 + b'"}', {}, 413),
    ("body shorter than promised", b'{"pair_id"', {"length": "500", "half_close": True}, 400),
    ("chunked", b"5\r\n{}\r\n0\r\n\r\n", {"length": None, "headers": {"Transfer-Encoding": "chunked"}}, 411),
    ("undo with a bad body", b"[1", {"path": "/api/undo"}, 400),
]


@pytest.mark.slow
def test_hostile_posts_get_a_json_4xx_and_change_nothing(tmp_path):
    _pairs(tmp_path / "pairs.jsonl")
    proc, port = _start_cli(tmp_path)
    try:
        log_before = (tmp_path / "cal.jsonl").read_bytes()
        got = {}
        for name, body, extra, _ in HOSTILE:
            kw = dict(extra)
            length = kw.pop("length", str(len(body)))
            status, reply = _post(port, body, length=length, **kw)
            got[name] = status
            assert isinstance(reply.get("error"), str) and len(reply["error"]) < 300, (name, reply)
            assert _get_state(port)[0] == 200, name  # still serving
        assert got == {name: want for name, _, _, want in HOSTILE}
        assert (tmp_path / "cal.jsonl").read_bytes() == log_before
        pid = _get_state(port)[1]["pair"]["id"]  # and a good label still works
        assert _post(port, json.dumps({"pair_id": pid, "choice": "left"}).encode())[0] == 200
    finally:
        err = _stop(proc)
    assert "Traceback" not in err and "Exception" not in err, err


@pytest.mark.slow
def test_malformed_requests_get_json_errors(tmp_path):
    _pairs(tmp_path / "pairs.jsonl")
    proc, port = _start_cli(tmp_path)
    try:
        cases = [
            (b"PUT /api/decide HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port, 501),
            (b"GARBAGE\r\n\r\n", 400),
            (b"GET /api/state HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n", 431),
        ]
        for raw, want in cases:
            status, reply = _raw(port, raw)
            assert status == want and isinstance(reply["error"], str), (raw[:30], status, reply)
        assert _get_state(port)[0] == 200
    finally:
        err = _stop(proc)
    assert "Traceback" not in err, err


def test_a_client_that_never_sends_its_body_gets_408(server, monkeypatch):
    monkeypatch.setattr(Handler, "timeout", 0.5)
    port = server.server_address[1]
    before = Path(server.session.log.path).read_bytes()
    head = (f"POST /api/decide HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100\r\n\r\n").encode()
    status, reply = _raw(port, head + b'{"pair_id"')
    assert status == 408 and "body" in reply["error"]
    assert Path(server.session.log.path).read_bytes() == before


@pytest.mark.slow
def test_a_real_short_write_under_a_file_size_limit_is_a_507_and_cut_back(tmp_path):
    """The kernel's own short write: under RLIMIT_FSIZE a write that crosses the limit writes
    the bytes that fit and the next one fails with EFBIG (Python ignores SIGXFSZ)."""
    import resource

    _pairs(tmp_path / "pairs.jsonl")
    log_path = tmp_path / "cal.jsonl"
    _stop(_start_cli(tmp_path)[0])  # a first session: one open event
    size = log_path.stat().st_size
    limit = 2 * size + 40  # room for a second open event and 40 more bytes: a label line does not fit
    proc = subprocess.Popen([sys.executable, "-m", "pofe", "annotate", str(tmp_path / "pairs.jsonl"), "-a", "ann",
                             "-o", str(log_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(PYTHONDONTWRITEBYTECODE="1"),
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY)))
    try:
        first = proc.stdout.readline()
        assert first.startswith("pofe annotate: http://127.0.0.1:"), first + proc.stderr.read()
        port = int(first.rsplit(":", 1)[1].strip(" /\n"))
        before = log_path.read_bytes()
        assert len(before) < limit
        pid = _get_state(port)[1]["pair"]["id"]
        label = json.dumps({"pair_id": pid, "choice": "right"}).encode()
        for _ in range(2):  # the short write, then EFBIG at the limit
            status, body = _post(port, label)
            assert status == 507 and "could not save the label" in body["error"], body
            assert log_path.read_bytes() == before
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        status, body = _post(port, label)
        assert status == 200 and body["labelled"] == 1
    finally:
        err = _stop(proc)
    assert "Traceback" not in err
    assert [e["event"] for e in _events(log_path)] == ["open", "open", "label"]


def test_output_hard_linked_to_the_pairs_file_is_refused(tmp_path):
    pairs = _pairs(tmp_path / "pairs.jsonl")
    before = pairs.read_bytes()
    os.link(pairs, tmp_path / "cal.jsonl")
    with pytest.raises(ValueError, match=r"cal\.jsonl is the pairs file itself"):
        make_server(_cfg(tmp_path))
    assert pairs.read_bytes() == before
