"""In-process transformers judge backend: a causal LM in this process, batched with left
padding, reading the next-token distribution at the answer slot.

torch is imported inside the methods, so importing this module (and the backend mapping)
stays cheap for config validation.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Sequence

from pofe.judges.base import (BackendStats, ChoiceRead, GenOut, SingleTokenChoices, encode_keep_end, logprob_error,
                              render_chat)
from pofe.judges.probability import logsumexp
from pofe.judges.templates import Rendered

log = logging.getLogger(__name__)


class TransformersBackend(SingleTokenChoices):
    """A causal LM in this process, fp32 on CPU by default, batched with left padding.

    The model is loaded on first use, so a fully cached run never loads it. Only the last
    position's logits are computed (``logits_to_keep=1``): a (batch, length, vocab) tensor
    would be ~3 GB for 16 sequences of 1k tokens over a 49k vocabulary.
    """

    kind = "transformers"

    @classmethod
    def from_config(cls, cfg, **runtime) -> "TransformersBackend":
        """Built from a judge config (the backend contract, built-ins and plugins alike): runtime
        ``model``/``tokenizer`` share an already loaded model."""
        return cls(cfg.model, model=runtime.get("model"), tokenizer=runtime.get("tokenizer"),
                   revision=cfg.revision, dtype=cfg.dtype, device=cfg.device,
                   trust_remote_code=cfg.trust_remote_code, batch_size=cfg.batch_size,
                   max_length=cfg.max_length, cache_tag=runtime.get("cache_tag"))

    def __init__(self, model_name: str, *, model=None, tokenizer=None, revision: str | None = None,
                 dtype: str = "float32", device: str | None = None, trust_remote_code: bool = False,
                 batch_size: int = 8, max_length: int | None = None, cache_tag: str | None = None):
        self.model_name = model_name
        self._model, self._tok = model, tokenizer
        self.revision, self.dtype, self.device = revision, dtype, device
        self.trust_remote_code = trust_remote_code
        self.batch_size = max(1, int(batch_size))
        self.max_length = max_length
        self.live_model = model is not None
        self.cache_tag = cache_tag
        self.stats = BackendStats()
        self._variant_ids: dict[str, list[int]] = {}
        self._live_hash: str | None = None

    # -- identity ---------------------------------------------------------------------
    @property
    def cacheable(self) -> bool:
        """A live model object may be training; its reads are cacheable only under a tag
        the caller changes whenever the weights change."""
        return not self.live_model or self.cache_tag is not None

    @property
    def fingerprint(self) -> str:
        """Identity of the answering weights. A live model object is identified by a hash of
        its parameters, never by ``model_name``: a model passed to ``online.run`` under the
        default name must not share the embedded model's cache entries."""
        if self.live_model:
            if self._live_hash is None:
                self._live_hash = weights_hash(self._model)
            return f"transformers:live:{self._live_hash}" + (f":tag={self.cache_tag}" if self.cache_tag is not None else "")
        return f"transformers:{self.model_name}@{self.revision or ''}:{_weights_identity(self.model_name)}"

    # -- lazy loading -----------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tok is None:
            from pofe.models import load_tokenizer

            self._tok = load_tokenizer(self.model_name, trust_remote_code=self.trust_remote_code, revision=self.revision)
        return self._tok

    @property
    def model(self):
        if self._model is None:
            from pofe.models import load_model

            t0 = time.perf_counter()
            self._model, tok = load_model(self.model_name, dtype=self.dtype, device=self.device,
                                          trust_remote_code=self.trust_remote_code, revision=self.revision)
            self._tok = self._tok or tok
            log.info("judge model %s loaded in %.1f s", self.model_name, time.perf_counter() - t0)
        return self._model

    @property
    def special_strings(self) -> tuple[str, ...]:
        from pofe.chat_control import special_token_strings

        return special_token_strings(self.tokenizer)

    def render(self, req: Rendered) -> str:
        return render_chat(self.tokenizer, req)

    # -- choices ----------------------------------------------------------------------
    def _encode(self, texts: list[str]) -> list[list[int]]:
        return encode_keep_end(self.tokenizer, texts, self.max_length)

    def next_token_logprobs(self, texts: list[str]) -> tuple[list[Any], list[int]]:
        """(vocab,) log-softmax at the next position for each text; sorted-by-length batches."""
        import torch

        model = self.model
        device = next(model.parameters()).device
        ids = self._encode(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        result: list[Any] = [None] * len(ids)
        was_training = model.training  # a shared policy may be mid-training: judge without dropout
        model.eval()
        try:
            with torch.no_grad():
                self._forward_batches(model, device, ids, order, result)
        finally:
            if was_training:
                model.train()
        return result, [len(x) for x in ids]

    def _forward_batches(self, model, device, ids, order, result) -> None:
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            T = max(len(ids[i]) for i in idx)
            inp = torch.full((len(idx), T), pad, dtype=torch.long)
            att = torch.zeros((len(idx), T), dtype=torch.long)
            for r, i in enumerate(idx):  # left padding: the next-token slot is the last column for every row
                inp[r, T - len(ids[i]):] = torch.tensor(ids[i], dtype=torch.long)
                att[r, T - len(ids[i]):] = 1
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            t0 = time.perf_counter()
            kw = dict(input_ids=inp.to(device), attention_mask=att.to(device), position_ids=pos.to(device))
            try:
                logits = model(**kw, logits_to_keep=1).logits[:, -1]
            except TypeError:  # older architectures without logits_to_keep
                logits = model(**kw).logits[:, -1]
            lp = torch.log_softmax(logits.float(), dim=-1).cpu()
            self.stats.add(calls=1, tokens=int(att.sum()), seconds=time.perf_counter() - t0)
            for r, i in enumerate(idx):
                result[i] = lp[r]

    def read_choices(self, requests: Sequence[Rendered], choices: Sequence[str]) -> list[ChoiceRead]:
        texts = [self.render(r) for r in requests]
        lps, lens = self.next_token_logprobs(texts)
        out = []
        for lp, n in zip(lps, lens):
            vals = {c: [float(lp[i]) for i in self.variant_ids(c)] for c in choices}
            why = logprob_error(v for vs in vals.values() for v in vs)
            if why:
                # A NaN/inf is a broken read (e.g. overflowing fp16 logits), not a probability:
                # unreadable and counted, never p = 0 or an invented 0.5.
                out.append(ChoiceRead(None, tokens=n, error=why))
                continue
            out.append(ChoiceRead(logprobs={c: logsumexp(min(v, 0.0) for v in vs) for c, vs in vals.items()}, tokens=n))
        return out

    def generate(self, requests: Sequence[Rendered], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 128, seed: int | None = None) -> list[list[GenOut]]:
        import torch

        from pofe.generation.tokens import _eos_ids

        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        if seed is not None:
            torch.manual_seed(seed)
        texts = [self.render(r) for r in requests]
        ids = self._encode(texts)
        eos = _eos_ids(model, tok)
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
        out: list[list[GenOut]] = [[] for _ in texts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                self._generate_batches(model, tok, device, ids, order, out, eos, pad, n, temperature, top_p, max_new_tokens)
        finally:
            if was_training:
                model.train()
        return out

    def _generate_batches(self, model, tok, device, ids, order, out, eos, pad, n, temperature, top_p, max_new_tokens):
        import torch

        from pofe.generation.tokens import _cut_at_eos

        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            T = max(len(ids[i]) for i in idx)
            inp = torch.full((len(idx), T), pad, dtype=torch.long)
            att = torch.zeros((len(idx), T), dtype=torch.long)
            for r, i in enumerate(idx):
                inp[r, T - len(ids[i]):] = torch.tensor(ids[i], dtype=torch.long)
                att[r, T - len(ids[i]):] = 1
            kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, num_return_sequences=n, pad_token_id=pad,
                                      eos_token_id=eos, do_sample=temperature > 0)
            if temperature > 0:
                kw.update(temperature=temperature, top_p=top_p, top_k=0)
            t0 = time.perf_counter()
            seqs = model.generate(input_ids=inp.to(device), attention_mask=att.to(device), **kw)
            new_tokens = 0
            for r, i in enumerate(idx):
                for j in range(n):
                    gen, _ = _cut_at_eos(seqs[r * n + j, T:].tolist(), eos, pad)
                    new_tokens += len(gen)
                    out[i].append(GenOut(text=tok.decode(gen, skip_special_tokens=True), tokens=len(ids[i]) + len(gen),
                                          tokens_out=len(gen)))
            self.stats.add(calls=1, tokens=int(att.sum()) * n + new_tokens, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        pass


def weights_hash(model) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes) of a model object:
    the identity of live weights whose name says nothing (tiny test models, a policy
    passed in under the default name). Computed once per backend (~1 s for 135M on CPU)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            x = t.detach().cpu().contiguous()
            if x.dtype in (torch.bfloat16, torch.float16):
                x = x.view(torch.int16)
            h.update(x.numpy().tobytes() if x.numel() else b"")
    return h.hexdigest()[:24]


def _weights_identity(name_or_path: str) -> str:
    """Something that changes when the weights behind a name change (size + mtime of the
    weight files of a local directory; the GGUF of an embedded model)."""
    try:
        from pofe.models import EMBEDDED_MODELS, embedded_gguf_path

        if name_or_path in EMBEDDED_MODELS:
            st = embedded_gguf_path(name_or_path).stat()
            return f"gguf{st.st_size}"
        p = Path(name_or_path)
        if p.is_dir():
            parts = []
            for f in sorted(p.iterdir()):
                if f.suffix in (".safetensors", ".bin", ".gguf", ".pt"):
                    st = f.stat()
                    parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
            return "|".join(parts)
        if p.is_file():
            st = p.stat()
            return f"{p.name}:{st.st_size}:{st.st_mtime_ns}"
    except Exception:  # identity is best effort; the name is still part of the key
        pass
    return ""


