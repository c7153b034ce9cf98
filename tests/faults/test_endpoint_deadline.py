"""Every read from a judge endpoint has a total deadline, and no reply can make the client
crash: a server that trickles one byte every 0.3 s (headers or body, with Content-Length or
chunked) fails the request after ``timeout_s`` per attempt, never hangs; a reply nested
100 000 levels deep, a gzip body that is not gzip, or a body past the size cap is a counted
failed read or one error line; a ``base_url`` that is not an http(s) URL is a config error
naming ``judge.endpoint.base_url``, before anything runs."""

from __future__ import annotations

import gzip
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "judges"))  # the shared fake server
from fake_openai import FakeServer, chat_shape  # noqa: E402

from _cli import error_lines, invoke  # noqa: E402
from pofe.judges import EndpointError, build_judge  # noqa: E402
from pofe.judges.backends.endpoint import parse_choice_response, parse_generation_response  # noqa: E402
from pofe.judges.config import OpenAIJudgeConfig  # noqa: E402

pytestmark = pytest.mark.faults

GOOD = json.dumps(chat_shape({"1": -0.4, "2": -1.3})).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


class RawServer:
    """A socket server that answers each request with ``reply(path) -> list of (delay, bytes)``:
    every piece is sent after its delay, then the connection is closed. The trickle of one
    piece is capped at ``cap_s`` seconds so that a client without a deadline still ends."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.paths: list[str] = []
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    n = int(v)
            while len(rest) < n:
                rest += conn.recv(65536)
            path = head.split(b" ")[1].decode()
            self.paths.append(path)
            for delay, piece in self.reply(path):
                if self.closed:
                    return
                time.sleep(delay)
                conn.sendall(piece)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.closed = True
        self.sock.close()


def answer(body: bytes, status: str = "200 OK", headers: str = "Content-Type: application/json\r\n") -> list:
    # Connection: close, as the server hangs up after each reply (a reused connection would reset)
    return [(0, f"HTTP/1.1 {status}\r\n{headers}Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
             + body)]


def trickle(mode: str, cap_s: float = 6.0, every: float = 0.3) -> list:
    """Headers and body of a reply that arrives one byte every ``every`` seconds (for at most
    ``cap_s`` seconds; then the server hangs up)."""
    n = int(cap_s / every)
    if mode == "content-length":
        return [(0, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")] + \
            [(every, b" ")] * n
    if mode == "chunked":
        return [(0, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")] + \
            [(every, b"1\r\n \r\n")] * n
    assert mode == "headers"
    return [(0, b"HTTP/1.1 200 OK\r\n")] + [(every, b"X")] * n


def judge_for(url, **endpoint):
    ep = {"base_url": url, "backoff_s": 0.01, "max_backoff_s": 0.02, "max_retries": 1, "timeout_s": 1.0,
          "concurrency": 1, **endpoint}
    return build_judge(OpenAIJudgeConfig(endpoint=ep, cache={"enabled": False}, both_orders=False))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["content-length", "chunked", "headers"])
def test_trickling_read_fails_within_the_deadline(mode):
    # /models answers at once; the read trickles. timeout_s = 1 s, 2 attempts: ~2 s, never 2 x 6 s
    s = RawServer(lambda path: answer(MODELS) if path.endswith("/models") else trickle(mode))
    try:
        j = judge_for(s.url)
        t0 = time.monotonic()
        with pytest.raises(EndpointError, match=r"failed after 2 attempts \(.*(deadline|[Tt]imeout)"):
            j.judge(["q"], ["a"], ["b"])
        elapsed = time.monotonic() - t0
    finally:
        s.close()
    assert elapsed < 1.0 * 2 + 1.5, elapsed
    assert sum(p.endswith("/completions") for p in s.paths) == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["content-length", "chunked"])
def test_trickling_endpoint_fails_the_command_within_the_deadline(tmp_path, mode):
    """Everything trickles, the model list included: ``pofe judge`` ends with one line, exit 1."""
    s = RawServer(lambda path: trickle(mode))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "q", "response_a": "a", "response_b": "b"}) + "\n")
    try:
        t0 = time.monotonic()
        res = invoke("judge", str(pairs), "--judge", "openai", "--set", f"judge.endpoint.base_url={s.url}",
                     "--set", "judge.endpoint.timeout_s=1", "--set", "judge.endpoint.max_retries=2",
                     "--set", "judge.endpoint.backoff_s=0.01", "--set", "judge.endpoint.max_backoff_s=0.02",
                     "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "judge.cache.enabled=false")
        elapsed = time.monotonic() - t0
    finally:
        s.close()
    lines = error_lines(res)
    assert res.returncode == 1, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: judge endpoint") and "failed after 3 attempts" in lines[0]
    assert elapsed < 1.0 * 3 + 2.0, elapsed


def test_a_healthy_slow_reply_within_the_deadline_is_read():
    # 4 pieces 0.2 s apart (0.8 s in all) under a 3 s deadline: a normal reply, read in full
    pieces = [(0, f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  f"Content-Length: {len(GOOD)}\r\n\r\n".encode())]
    pieces += [(0.2, GOOD[i * len(GOOD) // 4:(i + 1) * len(GOOD) // 4]) for i in range(4)]
    s = RawServer(lambda path: answer(MODELS) if path.endswith("/models") else pieces)
    try:
        [v] = judge_for(s.url, timeout_s=3.0).judge(["q"], ["a"], ["b"])
    finally:
        s.close()
    assert v.parse_ok and v.p == pytest.approx(1 / (1 + 2.718281828459045 ** -0.9))


# ----------------------------------------------------------------------------- replies that crash parsers
def test_deeply_nested_json_is_malformed_not_a_recursion_error():
    deep = "[" * 100_000 + "]" * 100_000
    rd = parse_choice_response(deep, ["1", "2"])
    assert rd.logprobs is None and rd.error == "malformed JSON"
    g = parse_generation_response('{"a":' * 100_000 + "1" + "}" * 100_000)
    assert g.text is None and g.error == "malformed JSON"


def test_deeply_nested_replies_from_a_server_are_counted_unreadable():
    s = FakeServer(default=(200, "[" * 100_000 + "]" * 100_000))
    s.models_reply = lambda: (200, '{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    try:
        j = judge_for(s.url, max_retries=0)
        with pytest.raises(EndpointError, match="unreadably \\(malformed JSON"):
            j.judge(["q"], ["a"], ["b"])
        assert j.backend.cacheable is False  # the unreadable model list turned caching off
    finally:
        s.close()


def test_bad_gzip_reply_is_a_failed_read_not_an_internal_error():
    bad = answer(b"this is not gzip at all", headers="Content-Type: application/json\r\nContent-Encoding: gzip\r\n")
    s = RawServer(lambda path: answer(MODELS) if path.endswith("/models") else bad)
    try:
        with pytest.raises(EndpointError, match=r"failed after 2 attempts \(undecodable reply"):
            judge_for(s.url).judge(["q"], ["a"], ["b"])
    finally:
        s.close()


def test_bad_gzip_on_one_request_is_counted_and_the_others_are_kept():
    bad = answer(b"\x1f\x8bgarbage", headers="Content-Type: application/json\r\nContent-Encoding: gzip\r\n")
    n = {"posts": 0}

    def reply(path):
        if path.endswith("/models"):
            return answer(MODELS)
        n["posts"] += 1
        return bad if n["posts"] <= 2 else answer(GOOD)  # the first read fails both attempts

    s = RawServer(reply)
    try:
        v1, v2 = judge_for(s.url).judge(["q1", "q2"], ["a", "a"], ["b", "b"])
    finally:
        s.close()
    assert v1.p is None and not v1.parse_ok and "undecodable reply" in v1.extra["errors"][0]
    assert v2.parse_ok and v2.p == pytest.approx(1 / (1 + 2.718281828459045 ** -0.9))


def test_a_reply_past_the_size_cap_is_a_failed_read(monkeypatch):
    import pofe.judges.backends.endpoint as ep

    monkeypatch.setattr(ep, "MAX_REPLY_BYTES", 1 << 20)
    big = gzip.compress(b" " * (3 << 20))  # 3 MiB once inflated, 3 KiB on the wire
    body = answer(big, headers="Content-Type: application/json\r\nContent-Encoding: gzip\r\n")
    s = RawServer(lambda path: answer(MODELS) if path.endswith("/models") else body)
    try:
        with pytest.raises(EndpointError, match=r"reply larger than 1 MiB"):
            judge_for(s.url).judge(["q"], ["a"], ["b"])
    finally:
        s.close()


# ----------------------------------------------------------------------------- base_url
@pytest.mark.parametrize("url", ["http://[::1", "ftp://x/v1", "localhost:8000", "127.0.0.1:8000/v1", "http://",
                                 "http://host:99999/v1", "", "http://ho st/v1"])
def test_malformed_base_url_is_a_config_error_naming_the_key(tmp_path, url):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "q", "response_a": "a", "response_b": "b"}) + "\n")
    res = invoke("judge", str(pairs), "--judge", "openai", "--set", f"judge.endpoint.base_url={url}",
                 "--set", f"run.output_dir={tmp_path / 'runs'}")
    lines = error_lines(res)
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and "judge.endpoint.base_url" in lines[0] and "internal error" not in lines[0], lines
    assert not (tmp_path / "runs").exists()  # refused when parsed, before a run folder
