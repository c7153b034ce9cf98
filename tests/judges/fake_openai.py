"""A scripted OpenAI-compatible server on 127.0.0.1 for judge tests (shared by
tests/judges and tests/faults): POST /v1/completions and /v1/chat/completions answer from
a script, GET /v1/models reports ``model_id``."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chat_shape(first_lp: dict[str, float], text: str = "1") -> dict:
    """llama.cpp / OpenAI chat style: logprobs.content[0].top_logprobs = [{token, logprob}]."""
    top = [{"token": t, "logprob": v, "id": i} for i, (t, v) in enumerate(first_lp.items())]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": {"content": [{"token": top[0]["token"], "logprob": top[0]["logprob"], "id": 0,
                                                   "top_logprobs": top}]}}],
            "usage": {"total_tokens": 42}}


def legacy_shape(first_lp: dict[str, float], text: str = "1") -> dict:
    """Legacy completions: logprobs.top_logprobs = [{token: logprob}]."""
    return {"choices": [{"index": 0, "text": text,
                         "logprobs": {"tokens": [text], "token_logprobs": [first_lp.get(text, -9.0)],
                                      "top_logprobs": [first_lp]}}], "usage": {"total_tokens": 40}}


class FakeServer:
    """A scripted OpenAI-compatible server on 127.0.0.1. ``script`` is a list of
    (status, body) consumed in order; when empty, ``default`` answers."""

    def __init__(self, default=None):
        self.script: list[tuple[int, object]] = []
        self.default = default or (200, chat_shape({"1": -0.4, "2": -1.3}))
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        self.model_id = "fake-model"
        """What GET /v1/models reports (change it to swap the model behind the URL)."""
        self.models_status = 200
        self.gets: list[str] = []
        self.reply_headers: dict[str, str] = {}
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                # GET /v1/models: which model serves this URL (the judge-cache identity).
                with outer.lock:
                    outer.gets.append(self.path)
                    status, payload = outer.models_reply()
                self._answer(status, payload)

            def _answer(self, status, payload):
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in outer.reply_headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(n))
                with outer.lock:
                    outer.requests.append({"path": self.path, **body})
                    outer.headers.append(dict(self.headers))
                    status, payload = outer.script.pop(0) if outer.script else outer.default
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                if callable(payload):
                    payload = payload(body)
                time.sleep(outer.delay)
                # Leave the in-flight count before answering: once the reply is written the
                # client may already send its next request, which must not count as overlap.
                with outer.lock:
                    outer.in_flight -= 1
                self._answer(status, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def models_reply(self):
        if self.models_status != 200:
            return self.models_status, {"error": "no model list"}
        return 200, {"object": "list", "data": [{"id": self.model_id, "object": "model", "owned_by": "fake",
                                                  "created": int(time.time())}]}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
