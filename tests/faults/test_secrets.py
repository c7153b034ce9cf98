"""A planted API key appears in no file, no log line and no error, whichever way it was given
(the key env var, URL userinfo, a query string, pasted into ``api_key_env``) or echoed (a
401/500 body repeating the request headers, a 200 reply quoting them, a config error quoting
a value). Every test greps every output file and the whole stderr/stdout for the key."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from _cli import error_lines, pofe
from pofe.secrets import MASK, RedactingFilter, redact, register

pytestmark = pytest.mark.faults

KEY = "sk-planted-0123456789abcdefXYZ"
GOOD = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "1"},
                     "logprobs": {"content": [{"token": "1", "logprob": -0.4, "id": 0,
                                               "top_logprobs": [{"token": "1", "logprob": -0.4, "id": 0},
                                                                {"token": "2", "logprob": -1.3, "id": 1}]}]}}]}


class EchoServer:
    """OpenAI-compatible server whose ``reply(n, headers) -> (status, body)`` sees the request
    headers (the n-th POST, from 0): it can echo them like a misconfigured proxy."""

    def __init__(self, reply):
        self.posts = 0
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "m", "object": "model"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                with outer.lock:
                    n = outer.posts
                    outer.posts += 1
                self._send(*reply(n, dict(self.headers)))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pairs(tmp_path):
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}", "response_a": "a", "response_b": "bb"}) + "\n" for i in range(3)))
    return p


def judge(tmp_path, pairs, url, *extra, key_env="POFE_R2_JUDGE_KEY"):
    sets = [f"judge.endpoint.base_url={url}", "judge.endpoint.max_retries=2", "judge.endpoint.backoff_s=0.01",
            "judge.endpoint.max_backoff_s=0.02", "judge.endpoint.concurrency=1", f"judge.cache.path={tmp_path / 'c.sqlite'}",
            f"run.output_dir={tmp_path / 'runs'}", "run.name=r", *extra]
    if key_env:
        sets.append(f"judge.endpoint.api_key_env={key_env}")
    return pofe("judge", str(pairs), "--judge", "openai", *[a for s in sets for a in ("--set", s)], timeout=120,
                POFE_R2_JUDGE_KEY=KEY)


def assert_nowhere(res, root: Path):
    """The key is in no output stream and no file under ``root`` (run folder, cache, ...)."""
    assert KEY not in res.stdout and KEY not in res.stderr, "key in the output streams"
    leaks = [str(f) for f in root.rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]
    assert leaks == [], f"key in {leaks}"
    files = [f for f in root.rglob("*") if f.is_file()]
    return files


@pytest.mark.slow
def test_401_echoing_the_authorization_header_is_redacted_from_the_error(tmp_path, pairs):
    s = EchoServer(lambda n, h: (401, {"error": f"bad key {h.get('Authorization')}", "you_sent": h}))
    try:
        res = judge(tmp_path, pairs, s.url)
    finally:
        s.close()
    lines = error_lines(res)
    assert res.returncode == 1 and len(lines) == 1 and "HTTP 401" in lines[0], res.stderr
    assert MASK in lines[0]  # the echoed header is there, masked
    assert_nowhere(res, tmp_path)


@pytest.mark.slow
def test_some_requests_failing_with_an_echoed_key_keep_it_out_of_verdicts_logs_and_cache(tmp_path, pairs):
    # the first read fails its 3 attempts with a 500 echoing the headers; the other 5 succeed
    s = EchoServer(lambda n, h: (500, {"error": f"boom for {h.get('Authorization')}", "headers": h}) if n < 3 else (200, GOOD))
    try:
        res = judge(tmp_path, pairs, s.url)
    finally:
        s.close()
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (tmp_path / "runs" / "r" / "verdicts.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["p"] is None and rows[1]["p"] is not None
    errors = json.dumps(rows[0])
    assert "HTTP 500" in errors and MASK in errors
    assert "retry 1/2" in res.stderr  # the retry log lines were written (and masked)
    files = assert_nowhere(res, tmp_path)
    assert {"verdicts.jsonl", "config.yaml", "c.sqlite"} <= {f.name for f in files}


@pytest.mark.slow
def test_a_200_reply_quoting_the_key_is_redacted_from_raw_texts_and_the_cache(tmp_path, pairs):
    def reply(n, h):
        body = json.loads(json.dumps(GOOD))
        body["choices"][0]["message"]["content"] = f"1 (you sent Authorization: {h.get('Authorization')} and {KEY})"
        return 200, body

    s = EchoServer(reply)
    try:
        res = judge(tmp_path, pairs, s.url, "judge.endpoint.api=chat")
    finally:
        s.close()
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (tmp_path / "runs" / "r" / "verdicts.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["p"] is not None for r in rows)
    assert_nowhere(res, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["userinfo", "user-only", "query"])
def test_a_key_in_the_base_url_is_refused_without_echoing_it(tmp_path, pairs, shape):
    url = {"userinfo": f"http://user:{KEY}@127.0.0.1:9/v1", "user-only": f"http://{KEY}@127.0.0.1:9/v1",
           "query": f"http://127.0.0.1:9/v1?api_key={KEY}"}[shape]
    for verbose in ((), ("-v",)):
        res = pofe(*verbose, "judge", str(pairs), "--judge", "openai", "--set", f"judge.endpoint.base_url={url}",
                   "--set", f"run.output_dir={tmp_path / 'runs'}", timeout=120)
        lines = error_lines(res) if not verbose else [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert "judge.endpoint.base_url" in lines[0] and "api_key_env" in lines[0]
        assert_nowhere(res, tmp_path)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_key_pasted_into_api_key_env_is_refused_without_echoing_it(tmp_path, pairs):
    res = judge(tmp_path, pairs, "http://127.0.0.1:9/v1", key_env=KEY)
    lines = error_lines(res)
    assert res.returncode == 2 and len(lines) == 1 and "judge.endpoint.api_key_env" in lines[0], res.stderr
    assert_nowhere(res, tmp_path)


@pytest.mark.slow
def test_an_error_quoting_a_secret_env_value_is_masked(tmp_path, pairs):
    # a config error quotes the bad value; the value happens to be the key held in OPENAI_API_KEY
    res = pofe("-v", "judge", str(pairs), "--judge", "openai", "--set", f"judge.endpoint.concurrency={KEY}",
               "--set", f"run.output_dir={tmp_path / 'runs'}", timeout=120, OPENAI_API_KEY=KEY)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(lines) == 1 and "judge.endpoint.concurrency" in lines[0], res.stderr
    assert MASK in lines[0]
    assert_nowhere(res, tmp_path)


# ----------------------------------------------------------------------------- the redactor
def test_redact_masks_registered_values_env_secrets_and_known_shapes(monkeypatch):
    register("reg-value-123456")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-value-abcdef")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "falsefalse")  # a setting, not a secret
    text = ("a reg-value-123456 b tok-value-abcdef c https://bob:pw123@h/v1 Authorization: Bearer abcdefghijk "
            "api_key=zzzz9999 hf_abcdefghijklmnopqrstuv falsefalse")
    assert redact(text) == ("a *** b *** c https://***@h/v1 Authorization: *** api_key=*** hf_*** falsefalse")
    assert redact("no choice token among the returned top_logprobs") == "no choice token among the returned top_logprobs"


def test_the_log_filter_masks_messages_and_arguments():
    register(KEY)
    rec = logging.LogRecord("x", logging.WARNING, __file__, 1, "endpoint said %s", (f"Bearer {KEY}",), None)
    assert RedactingFilter().filter(rec) and rec.getMessage() == f"endpoint said Bearer {MASK}"
