"""A scripted stand-in for ``VLLM_SERVER_DEV_MODE=1 vllm serve`` on 127.0.0.1, for the
``vllm-server`` engine's tests that need no vLLM: the OpenAI completions route (token-id
prompts, ``return_token_ids``) and the weight-update routes (``/pause``, ``/collective_rpc``
``reload_weights`` reading the pushed safetensors, ``/reset_prefix_cache``,
``/update_weight_version``, ``/weight_info``, ``/resume``, ``/v1/load_lora_adapter``), every
request recorded.

Its "model" is a rule, so tests can tell which server answered which prompt with which seed:
choice ``k`` of a request with prompt ``p`` and seed ``s`` is ``[p[-1], marker] + [100 + (s + k)
% 500] * (1 + (s + k) % 3) + [eos]``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion_tokens(prompt: list[int], seed: int, k: int, marker: int, eos: int) -> list[int]:
    x = seed + k
    return [prompt[-1], marker] + [100 + x % 500] * (1 + x % 3) + [eos]


class FakeVLLM:
    def __init__(self, *, marker: int = 7, eos: int = 2, model_id: str = "tiny"):
        self.marker, self.eos, self.model_id = marker, eos, model_id
        self.version = "default"
        self.ignore_versions = False  # True: /update_weight_version answers OK but changes nothing
        self.delay = 0.0  # seconds before answering /v1/completions
        self.missing: set[str] = set()  # routes answering 404 (a server without VLLM_SERVER_DEV_MODE)
        self.calls: list[tuple[str, str]] = []  # (method, path) in arrival order
        self.completions: list[dict] = []  # request bodies
        self.loaded: list[dict] = []  # the tensors of every reload_weights, in order
        self.adapters: list[str] = []  # LoRA adapters loaded (/v1/load_lora_adapter) and not unloaded
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                with outer.lock:
                    outer.calls.append(("GET", self.path))
                if self.path in outer.missing:
                    return self._answer(404, {"detail": "Not Found"})
                if self.path == "/v1/models":
                    data = [{"id": outer.model_id, "parent": None}] + [{"id": a, "parent": outer.model_id}
                                                                       for a in outer.adapters]
                    return self._answer(200, {"object": "list", "data": data})
                if self.path == "/weight_info":
                    return self._answer(200, {"weight_version": outer.version})
                self._answer(404, {"detail": "Not Found"})

            def do_POST(self):
                n = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(n)) if n else {}
                with outer.lock:
                    outer.calls.append(("POST", self.path))
                if self.path.split("?")[0] in outer.missing:
                    return self._answer(404, {"detail": "Not Found"})
                status, payload = outer.route(self.path.split("?")[0], body)
                self._answer(status, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def route(self, path: str, body: dict):
        if path == "/v1/completions":
            with self.lock:
                self.completions.append(body)
            time.sleep(self.delay)
            p = body["prompt"]
            choices = [{"index": k, "text": "", "finish_reason": "stop", "prompt_token_ids": p if k == 0 else None,
                        "token_ids": completion_tokens(p, body["seed"], k, self.marker, self.eos),
                        "logprobs": None} for k in range(body.get("n", 1))]
            return 200, {"choices": choices, "model": body["model"]}
        if path == "/collective_rpc":
            if body.get("method") == "reload_weights":
                from safetensors.torch import load_file

                with self.lock:
                    self.loaded.append(load_file(body["kwargs"]["weights_path"] + "/model.safetensors"))
            return 200, {"results": [None]}
        if path == "/update_weight_version":
            if not self.ignore_versions:
                self.version = body["new_version"]
            return 200, {"success": True, "new_version": body["new_version"]}
        if path == "/v1/load_lora_adapter":
            self.adapters.append(body["lora_name"])
            return 200, {"status": "loaded"}
        if path == "/v1/unload_lora_adapter":
            self.adapters.remove(body["lora_name"])
            return 200, {"status": "unloaded"}
        if path == "/reset_prefix_cache":
            return 200, {"success": True}
        if path in ("/pause", "/resume"):
            return 200, {"status": path[1:] + "d"}
        return 404, {"detail": "Not Found"}

    def posts(self, path: str) -> int:
        return sum(1 for m, p in self.calls if m == "POST" and p.split("?")[0] == path)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
