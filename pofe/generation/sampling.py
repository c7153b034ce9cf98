"""Sampling entry point and the ``hf`` engine. Prompts are rendered with the chat template,
left-padded, and ``n`` samples per prompt are drawn in one ``generate`` call (the KV cache is
reused for all of them). Token ids are kept on each :class:`Completion` so later stages never
re-tokenise (log-prob computation reuses them). :func:`generate` is the one entry point every
command samples through; ``sampling.engine`` routes it to vLLM in this process
(:mod:`pofe.generation.vllm`) or to ``vllm serve`` processes (:mod:`pofe.generation.vllm_server`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pofe.config import ConfigError
from pofe.errors import DataError
from pofe.generation.base import Generator, SamplingConfig, VLLMSettings
from pofe.generation.tokens import _cut_at_eos, _eos_ids, _render
from pofe.records import Completion

__all__ = ["ENGINES", "Generator", "HFGenerator", "SamplingConfig", "VLLMSettings", "generate", "make_generator"]


def generate(
    model,
    tokenizer,
    prompts: Sequence[str | list[dict[str, str]]],
    *,
    n: int = 1,
    sampling: SamplingConfig | None = None,
    seed: int | None = None,
    chat_template: bool = True,
) -> list[list[Completion]]:
    """Sample ``n`` completions for each prompt from ``model``'s current weights; returns one
    list of ``n`` per prompt. ``sampling.engine`` picks the engine (hf, vllm or vllm-server).

    ``chat_template=False``: string prompts are raw completion prompts (tokenised as is, with
    the tokenizer's own special tokens), e.g. a few-shot list the model should continue
    rather than answer (Self-Instruct)."""
    sampling = sampling or SamplingConfig()
    return make_generator(model, tokenizer, sampling).generate(prompts, n, sampling, seed, chat_template=chat_template)


class HFGenerator:
    """The ``hf`` engine: transformers ``generate`` on the in-process model (always current:
    it samples from the very tensors the optimiser updates, so :meth:`sync` is free)."""

    name = "hf"

    def __init__(self, model, tokenizer, sampling: SamplingConfig | None = None):
        self.model, self.tokenizer = model, tokenizer
        if sampling is not None:
            check_max_new_tokens(model, sampling)  # when the engine is bound: before any step samples

    @classmethod
    def bind(cls, model, tokenizer, sampling: SamplingConfig | None = None) -> HFGenerator:
        return cls(model, tokenizer, sampling)

    def sync(self) -> float:
        return 0.0

    @torch.no_grad()
    def generate(self, prompts, n: int = 1, sampling: SamplingConfig | None = None,
                 seed: int | None = None, *, chat_template: bool = True) -> list[list[Completion]]:
        sampling = sampling or SamplingConfig()
        dtype = None if sampling.hf.dtype == "model" else getattr(torch, sampling.hf.dtype)
        if dtype is not None and any(p.is_floating_point() and p.dtype != dtype for p in self.model.parameters()):
            # a copy for this call only (freed on return), so it can never be stale
            half = half_precision_copy(self.model, dtype)
            return HFGenerator(half, self.tokenizer)._generate(prompts, n, sampling, seed, chat_template)
        return self._generate(prompts, n, sampling, seed, chat_template)  # already in that dtype: no copy

    def _generate(self, prompts, n: int, sampling: SamplingConfig, seed: int | None,
                  chat_template: bool) -> list[list[Completion]]:
        model, tokenizer = self.model, self.tokenizer
        if seed is not None:
            torch.manual_seed(seed)
        device = next(model.parameters()).device
        eos_ids = _eos_ids(model, tokenizer)
        out: list[list[Completion]] = []
        was_training = model.training
        model.eval()
        old_side = tokenizer.padding_side
        tokenizer.padding_side = "left"  # generation appends on the right, so pad on the left
        try:
            for start in range(0, len(prompts), sampling.batch_size):
                chunk = prompts[start : start + sampling.batch_size]
                texts = [_render(tokenizer, p) if chat_template else p for p in chunk]
                enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat_template).to(device)
                check_prompt_lengths(model, enc["attention_mask"], chunk, sampling)
                do_sample = sampling.temperature > 0
                # Greedy decoding gives n identical samples: decode once and repeat (transformers
                # refuses num_return_sequences > 1 without sampling).
                n_gen = n if do_sample else 1
                gen_kwargs = dict(
                    max_new_tokens=sampling.max_new_tokens,
                    do_sample=do_sample,
                    num_return_sequences=n_gen,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=eos_ids,
                )
                if do_sample:
                    gen_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
                if sampling.logprobs:  # raw logits (temperature 1, no top-p): what vLLM's raw_logprobs returns
                    gen_kwargs.update(output_logits=True, return_dict_in_generate=True)
                res = model.generate(**enc, **gen_kwargs)  # (len(chunk)*n, P+new)
                seqs = res.sequences if sampling.logprobs else res
                P = enc["input_ids"].shape[1]
                lps = None
                if sampling.logprobs:
                    steps = torch.stack([torch.log_softmax(x.float(), -1) for x in res.logits], 1)  # (rows, new, V)
                    lps = steps.gather(-1, seqs[:, P:P + steps.shape[1], None]).squeeze(-1)
                for i, prompt in enumerate(chunk):
                    mask = enc["attention_mask"][i].bool()
                    p_ids = tuple(enc["input_ids"][i][mask].tolist())
                    group = []
                    for j in range(n):
                        row = i * n_gen + (j if do_sample else 0)
                        new = seqs[row, P:].tolist()
                        ids, finished = _cut_at_eos(new, eos_ids, tokenizer.pad_token_id)
                        text = tokenizer.decode(ids, skip_special_tokens=True)
                        ptxt = prompt if isinstance(prompt, str) else prompt[-1]["content"]
                        lp = tuple(float(x) for x in lps[row, :len(ids)]) if lps is not None else None
                        group.append(Completion(prompt=ptxt, text=text, token_ids=tuple(ids),
                                                prompt_token_ids=p_ids, logprobs=lp, finished=finished))
                    out.append(group)
        finally:
            tokenizer.padding_side = old_side
            if was_training:
                model.train()
        return out


def context_length(model) -> int | None:
    """The longest sequence ``model`` reads (its config's position limit), or None when its config
    does not say."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def check_max_new_tokens(model, sampling: SamplingConfig) -> None:
    """``sampling.max_new_tokens`` must leave room in the model's context: 10^12 generated past it
    until the process was killed."""
    ctx = context_length(model)
    if ctx is not None and sampling.max_new_tokens >= ctx:
        raise ConfigError(f"sampling.max_new_tokens={sampling.max_new_tokens} does not fit the model's context of {ctx} "
                          f"tokens (max_position_embeddings in its config.json); lower it below {ctx}")


def check_prompt_lengths(model, attention_mask: torch.Tensor, chunk, sampling: SamplingConfig) -> None:
    """A prompt whose tokens and ``sampling.max_new_tokens`` are over the model's context is one
    line naming it, before ``generate`` sizes its buffers from it (a 10 MB prompt asked for 4 TB)."""
    ctx = context_length(model)
    if ctx is None:
        return
    lengths = attention_mask.sum(dim=1).tolist()
    i = max(range(len(lengths)), key=lambda k: lengths[k])
    if lengths[i] + sampling.max_new_tokens > ctx:
        p = chunk[i] if isinstance(chunk[i], str) else str(chunk[i][-1].get("content", ""))
        # the prompt's own words, not its index: this call's numbering is not the data file's
        raise DataError(f"a prompt ({' '.join(p[:40].split())!r}...) is {lengths[i]} tokens: with "
                        f"sampling.max_new_tokens={sampling.max_new_tokens} that is over the model's context of {ctx} "
                        f"tokens; shorten it or leave it out of the prompts")


def half_precision_copy(model, dtype: torch.dtype):
    """A copy of ``model`` whose floating-point parameters are ``dtype`` casts of the current
    ones, made without copying them in their own dtype first (``deepcopy`` is handed the casts
    through its memo, so a tied embedding / LM head stays one tensor). Buffers are copied as
    they are: RoPE's inverse frequencies stay fp32. A PEFT model keeps its adapter state (an
    adapter switched off stays off in the copy)."""
    import copy

    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) if p.is_floating_point() else
            torch.nn.Parameter(p.detach().clone(), requires_grad=False) for p in model.parameters()}
    half = copy.deepcopy(model, memo)
    half.eval()
    return half


def _hf():
    return HFGenerator


def _vllm():
    from pofe.generation.vllm import VLLMGenerator

    return VLLMGenerator


def _vllm_server():
    from pofe.generation.vllm_server import ServerGenerator

    return ServerGenerator


# name -> class (behind a function only so that importing this module never imports vllm or an
# HTTP client). The table lives with the hf engine, above the other engines: they build on the
# shared helpers below it (pofe.generation.tokens), never on this module.
ENGINES = {"hf": _hf, "vllm": _vllm, "vllm-server": _vllm_server}


def make_generator(model, tokenizer, sampling: SamplingConfig) -> Generator:
    """The engine ``sampling.engine`` bound to ``model`` (the weights it samples from)."""
    try:
        cls = ENGINES[sampling.engine]()
    except KeyError:
        raise ValueError(f"unknown generation engine {sampling.engine!r}; choose one of {sorted(ENGINES)}") from None
    return cls.bind(model, tokenizer, sampling)
