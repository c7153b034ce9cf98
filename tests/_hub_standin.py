"""A loopback stand-in for the Hugging Face Hub: just the endpoints ``huggingface_hub``'s
``create_repo`` and ``upload_folder`` / ``upload_file`` call (repo creation, the README's
``validate-yaml``, ``preupload``, the ndjson ``commit``), recording what was uploaded. Every file is answered as a regular
(base64) upload, so no LFS or Xet storage is involved. Point ``HF_ENDPOINT`` at ``url``."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

_REPO = r"(?P<type>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+|[^/]+)"


class HubStandIn:
    """``with HubStandIn(token="t") as hub:``: ``hub.url``, ``hub.repos`` (created: (type, id)),
    ``hub.files[(type, repo)]`` (path -> bytes), ``hub.calls`` (method, path), ``hub.fail``
    (an HTTP status every request gets, to test failures)."""

    def __init__(self, token: str = "hf_standin"):
        self.token = token
        self.repos: list[tuple[str, str]] = []
        self.files: dict[tuple[str, str], dict[str, bytes]] = {}
        self.calls: list[tuple[str, str]] = []
        self.validated: list[str] = []
        self.fail: int | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet test output
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                hub.calls.append(("POST", path))
                if hub.fail:
                    return self._send(hub.fail, {"error": "stand-in refuses"})
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials in Authorization header"})
                if path == "/api/validate-yaml":  # the Hub checks a README.md's front matter before the upload
                    content = json.loads(body)["content"]
                    hub.validated.append(content)
                    m = re.match(r"---\n(.*?)\n---\n", content, re.DOTALL)
                    try:
                        ok = m is None or isinstance(yaml.safe_load(m.group(1)), dict)
                    except yaml.YAMLError:
                        ok = False
                    return self._send(200 if ok else 400, {"errors": [] if ok else [{"message": "invalid YAML"}],
                                                           "warnings": []})
                if path == "/api/repos/create":
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    hub.repos.append((req.get("type") or "model", repo))
                    return self._send(200, {"url": f"{hub.url}/{repo}", "name": repo})
                m = re.fullmatch(rf"/api/{_REPO}/preupload/(?P<rev>[^/]+)", path)
                if m:
                    files = json.loads(body)["files"]
                    return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                      for f in files]})
                m = re.fullmatch(rf"/api/{_REPO}/commit/(?P<rev>[^/]+)", path)
                if m:
                    got = hub.files.setdefault((m["type"][:-1], m["repo"]), {})
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            got[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                        elif item["key"] != "header":
                            return self._send(400, {"error": f"the stand-in takes regular files only, got {item['key']}"})
                    oid = hashlib.sha1(body).hexdigest()
                    return self._send(200, {"commitUrl": f"{hub.url}/{m['repo']}/commit/{oid}", "commitOid": oid})
                return self._send(404, {"error": f"the stand-in has no {path}"})

            def do_GET(self):
                hub.calls.append(("GET", self.path))
                return self._send(404, {"error": f"the stand-in has no {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def point_hub_at(monkeypatch, hub: HubStandIn) -> None:
    """``HF_ENDPOINT`` and ``HF_TOKEN`` for the stand-in, online (the test session sets
    ``HF_HUB_OFFLINE=1``, which ``huggingface_hub`` reads once at import)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", hub.token)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
