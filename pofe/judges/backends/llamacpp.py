"""llama.cpp judge backend: an xllamacpp server (llama.cpp's C++ HTTP server in this
process) on 127.0.0.1, read through the OpenAI-compatible backend."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from pofe.judges.backends.endpoint import EndpointBackend
from pofe.judges.base import JudgeConfigError

log = logging.getLogger(__name__)


class LlamaCppServer:
    """An xllamacpp ``Server`` (llama.cpp's C++ HTTP server in this process) on 127.0.0.1.

    Loopback only: the judge server must not be reachable from the network.
    """

    def __init__(self, gguf: str | Path, *, n_ctx: int = 4096, n_parallel: int = 2, n_threads: int | None = None,
                 port: int = 0, verbosity: int = 0):
        try:
            import xllamacpp as xlc
        except ImportError as e:  # pragma: no cover - optional dependency
            raise JudgeConfigError("the llamacpp judge needs the PyPI wheel 'xllamacpp': pip install 'pofe[llamacpp]'") from e
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise JudgeConfigError(f"GGUF file not found: {self.gguf}")
        p = xlc.CommonParams()
        p.model.path = str(self.gguf)
        p.n_ctx = int(n_ctx) * int(n_parallel)  # llama.cpp splits n_ctx across slots
        p.n_parallel = int(n_parallel)
        p.hostnames = ["127.0.0.1"]
        p.port = int(port) or _free_port()
        # Default: half the cores (at most 8). llama.cpp worker threads spin while waiting, so
        # oversubscribing a busy CPU collapses throughput: on a shared 2-core box 2 threads
        # took 27.6 s for what 1 thread did in 4.4 s.
        threads = int(n_threads or max(1, min(8, (os.cpu_count() or 2) // 2)))
        self.threads = threads
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.verbosity = verbosity
        p.warmup = False
        t0 = time.perf_counter()
        self._server = xlc.Server(p)
        self.base_url = f"http://127.0.0.1:{p.port}/v1"
        log.info("llama.cpp server on %s serving %s (started in %.1f s)", self.base_url, self.gguf.name,
                 time.perf_counter() - t0)

    def close(self) -> None:
        srv, self._server = getattr(self, "_server", None), None
        del srv  # ~Server stops the HTTP loop


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaCppBackend(EndpointBackend):
    """EndpointBackend over a lazily started local llama.cpp server (completions API,
    prompts rendered with the model's own chat template so reads match the transformers
    backend token for token)."""

    kind = "llamacpp"

    @classmethod
    def from_config(cls, cfg, **runtime) -> "LlamaCppBackend":
        """Built from a judge config: ``judge.llamacpp.gguf``, else the embedded model's bundled GGUF."""
        from pofe.models import EMBEDDED_MODELS, embedded_gguf_path

        lc = cfg.llamacpp
        if lc.gguf:
            gguf, tok_name = lc.gguf, lc.tokenizer
        else:
            if cfg.model not in EMBEDDED_MODELS:
                raise JudgeConfigError(f"judge kind 'llamacpp': set judge.llamacpp.gguf (judge.model {cfg.model!r} is "
                                       f"not an embedded model with a bundled GGUF)")
            gguf, tok_name = str(embedded_gguf_path(cfg.model)), cfg.model
        return cls(gguf, tokenizer_name=tok_name, tokenizer=runtime.get("tokenizer"), n_ctx=lc.n_ctx,
                   n_parallel=lc.n_parallel, n_threads=lc.n_threads, top_logprobs=lc.top_logprobs,
                   timeout_s=lc.timeout_s)

    def __init__(self, gguf: str | Path, *, tokenizer_name: str | None, n_ctx: int = 4096, n_parallel: int = 2,
                 n_threads: int | None = None, top_logprobs: int = 20, timeout_s: float = 120.0, max_retries: int = 2,
                 tokenizer=None):
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise JudgeConfigError(f"GGUF file not found: {self.gguf} (judge.llamacpp.gguf)")
        st = self.gguf.stat()
        super().__init__("http://127.0.0.1:0/v1", api="completions", concurrency=n_parallel, timeout_s=timeout_s,
                         max_retries=max_retries, top_logprobs=top_logprobs, tokenizer=tokenizer,
                         tokenizer_name=tokenizer_name,
                         fingerprint=f"llamacpp:{self.gguf.name}:{st.st_size}")
        self._server_args = dict(n_ctx=n_ctx, n_parallel=n_parallel, n_threads=n_threads)
        self.server: LlamaCppServer | None = None
        self._start_lock = threading.Lock()

    def _ensure_server(self) -> None:
        with self._start_lock:
            if self.server is None:
                self.server = LlamaCppServer(self.gguf, **self._server_args)
                self.base_url = self.server.base_url

    def _request(self, method, path, body, *, what):
        self._ensure_server()
        return super()._request(method, path, body, what=what)

    def close(self) -> None:
        super().close()
        if self.server is not None:
            self.server.close()
            self.server = None
