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
from pofe.runtime.activations import lean_activations, sparse_tied_embedding
from pofe.runtime.precision import (
    Precision,
    attention_for,
    autocast,
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


def packed_pair_logps(model, pairs: Sequence[TokenPair], pad_token_id: int, device) -> torch.Tensor | None:
    """What ``completion_logps(model, *pairs_batch(pairs))`` returns, (2m,) chosen then rejected, in
    one forward of m rows: each row is a pair's prompt followed by both its responses, and a 4D
    attention mask keeps the rejected response from seeing the chosen one (it sees the prompt and
    itself, at the positions it has in its own sequence).

    Why: a pair's two responses share their prompt, which the joint batch computes (and for the
    policy back-propagates) twice. Packing runs it once, in one forward over one batch: every
    weight's gradient is one matmul (two passes over a KV cache add two), the matmuls see all
    the pair's tokens at once, and the logits of the last prompt position, which predict both
    responses' first tokens, are computed once. Prompts are left-padded to one length, so the
    positions that need logits are the same last ``1 + wc + wr`` columns of every row and the
    model's own forward (its lm_head, any logit scaling) computes them (``logits_to_keep``).

    Returns None, and callers use the joint batch, when the model cannot take a custom mask
    faithfully: attention other than eager or SDPA, a sliding window shorter than the packed row,
    non-full attention layers, a mask over :data:`PACKED_MASK_BUDGET`, an empty response, a DDP-wrapped or sharded model (one layout for
    every process), or a model whose packed numbers were found to differ from the joint batch's
    (:func:`_packing_agrees`, checked once per model).
    """
    base = hf_model(model)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or not pairs or sharded(model) \
            or any(not p.chosen_ids or not p.rejected_ids for p in pairs):
        return None
    layout = _pack(pairs, pad_token_id)
    if not _packable(base, layout.length, len(pairs)) or not _packing_agrees(model, base, pairs, pad_token_id, device):
        return None
    return _packed_logps(model, base, layout, device)


@dataclass
class _Packed:
    """m rows ``[left-padded prompt | chosen[:-1] | rejected[:-1]]`` (each segment padded to its
    longest), with positions, segment ids (0 prompt, 1 chosen, 2 rejected, -1 padding) and, for the
    last ``1 + wc + wr`` columns, the token each column's logits score and whether it counts."""

    input_ids: torch.Tensor  # (m, L)
    position_ids: torch.Tensor  # (m, L)
    segment: torch.Tensor  # (m, L)
    targets: torch.Tensor  # (m, 1 + wc + wr): column 0 scores chosen[0]; rejected[0] is in first_rejected
    counts: torch.Tensor  # (m, 1 + wc + wr) 0/1
    first_rejected: torch.Tensor  # (m,)
    wc: int

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]


def _pack(pairs: Sequence[TokenPair], pad_token_id: int) -> _Packed:
    m = len(pairs)
    P = max(len(p.prompt_ids) for p in pairs)
    wc = max(len(p.chosen_ids) for p in pairs) - 1  # the last token of a response is never an input
    wr = max(len(p.rejected_ids) for p in pairs) - 1
    L, K = P + wc + wr, 1 + wc + wr
    ids = torch.full((m, L), pad_token_id, dtype=torch.long)
    pos = torch.zeros((m, L), dtype=torch.long)
    seg = torch.full((m, L), -1, dtype=torch.long)
    targets = torch.full((m, K), pad_token_id, dtype=torch.long)
    counts = torch.zeros((m, K))
    for i, p in enumerate(pairs):
        n, c, r = len(p.prompt_ids), len(p.chosen_ids) - 1, len(p.rejected_ids) - 1
        for start, toks, s in ((P - n, p.prompt_ids, 0), (P, p.chosen_ids[:-1], 1), (P + wc, p.rejected_ids[:-1], 2)):
            k = len(toks)
            ids[i, start:start + k] = torch.tensor(toks, dtype=torch.long)
            pos[i, start:start + k] = torch.arange(k) + (0 if s == 0 else n)  # each response continues its prompt
            seg[i, start:start + k] = s
        targets[i, :1 + c] = torch.tensor(p.chosen_ids, dtype=torch.long)  # column j predicts chosen[j]
        targets[i, 1 + wc:1 + wc + r] = torch.tensor(p.rejected_ids[1:], dtype=torch.long)
        counts[i, :1 + c] = 1
        counts[i, 1 + wc:1 + wc + r] = 1
    first = torch.tensor([p.rejected_ids[0] for p in pairs], dtype=torch.long)
    return _Packed(ids, pos, seg, targets, counts, first, wc)


def _pair_mask(seg: torch.Tensor, boolean: bool, dtype: torch.dtype) -> torch.Tensor:
    """(m, 1, L, L) mask: causal, padding never attended, rejected never sees chosen; a padding
    query sees itself only (no empty softmax row). Boolean (True = attend) for SDPA, additive
    (0 / dtype's min) for eager attention, as transformers builds its own for each."""
    L = seg.shape[1]
    col = torch.arange(L, device=seg.device)
    q, k = seg.unsqueeze(2), seg.unsqueeze(1)
    allowed = (col.unsqueeze(1) >= col.unsqueeze(0)) & (k >= 0) & (q >= 0) & ~((q == 2) & (k == 1))
    allowed |= torch.eye(L, dtype=torch.bool, device=seg.device)
    allowed = allowed.unsqueeze(1)
    if boolean:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=seg.device).masked_fill_(~allowed, torch.finfo(dtype).min)


def _packed_logps(model, base, layout: _Packed, device) -> torch.Tensor:
    ids, pos, seg, targets, counts, first = (t.to(device) for t in (layout.input_ids, layout.position_ids, layout.segment,
                                                                     layout.targets, layout.counts, layout.first_rejected))
    weight = base.get_input_embeddings().weight
    # Under autocast the attention scores are in the autocast dtype, and adding 0 or that dtype's min
    # leaves them exact in it: the softmax (in fp32) sees the values transformers' own fp32 mask gives,
    # while the masked scores are not promoted to fp32 (one (m, heads, L, L) tensor per layer, half
    # the bytes), and the gradients are bit for bit the same.
    kind = ids.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else \
        weight.dtype if weight.is_floating_point() else torch.float32
    mask = _pair_mask(seg, base.config._attn_implementation == "sdpa", dtype)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=targets.shape[1]).logits
    lp = selective_logprobs(logits, targets) * counts.to(torch.float32)  # (m, 1 + wc + wr)
    first_r = selective_logprobs(logits[:, 0], first)  # the last prompt position predicts rejected[0] too
    del logits
    c = 1 + layout.wc
    return torch.cat([lp[:, :c].sum(-1), first_r + lp[:, c:].sum(-1)])


PACKED_MASK_BUDGET = 256 * 2**20
"""Bytes (at 4 per entry) the packed pass's (m, 1, L, L) mask may take (the bar's 4 pairs: 0.3 MB);
longer rows use the joint batch, whose mask transformers builds itself."""


def _packable(base, length: int, rows: int) -> bool:
    """Whether the model's attention honours a custom 4D mask as the whole mask: transformers
    passes one through as-is, so a sliding window (when the row is longer) or chunked / non-full
    attention layers would be lost, and flash / flex attention take no such mask. And whether the
    mask is small enough (:data:`PACKED_MASK_BUDGET`)."""
    cfg = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if base.config._attn_implementation not in ("eager", "sdpa") or rows * length * length * 4 > PACKED_MASK_BUDGET:
        return False
    window = getattr(cfg, "sliding_window", None)
    if window and length > window:
        return False
    if getattr(cfg, "attention_chunk_size", None):
        return False
    return all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or ()))


_PACKING: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()
"""Per model: whether its packed numbers matched the joint batch's (:func:`_packing_agrees`)."""


def _packing_agrees(model, base, pairs: Sequence[TokenPair], pad_token_id: int, device) -> bool:
    """Once per model: the packed pass and the joint batch give the same log-probs on a short cut
    of the first pairs (eval mode, no grad, under the caller's autocast: a bf16 reference's weights
    need it), so an architecture whose forward does not
    honour the custom mask as the mask (a mask it combines with its own, positions it derives
    itself) is found before it trains on wrong numbers, and falls back to the joint batch."""
    if base not in _PACKING:
        cut = [TokenPair(p.prompt_ids[-8:], p.chosen_ids[:4], p.rejected_ids[:4]) for p in pairs[:2]]
        if len(cut) == 1 or len(cut[0].prompt_ids) == len(cut[1].prompt_ids):  # padding must be in the check
            cut.append(TokenPair(cut[0].prompt_ids[-3:], cut[0].rejected_ids[:2], cut[0].chosen_ids[:3]))
        was = base.training
        base.eval()
        try:
            with torch.no_grad():
                packed = _packed_logps(model, base, _pack(cut, pad_token_id), device)
                joint = completion_logps(model, *pairs_batch(cut, pad_token_id, device))
        finally:
            base.train(was)
        fp32 = not torch.is_autocast_enabled(torch.device(device).type) and all(
            p.dtype in (torch.float32, torch.float64) for p in base.parameters() if p.is_floating_point())
        _PACKING[base] = bool(torch.allclose(packed.float(), joint.float(), atol=1e-3 if fp32 else 0.1,
                                             rtol=1e-4 if fp32 else 0.02))
    return _PACKING[base]


def pair_logps(model, pairs: Sequence[TokenPair], pad_token_id: int, device, *, shared: bool = True) -> torch.Tensor:
    """Summed response log-probs (2m,), chosen then rejected: the packed pass (each prompt once,
    :func:`packed_pair_logps`) when ``shared`` and the model allows it, else the joint left-padded
    batch (same numbers up to float rounding)."""
    lp = packed_pair_logps(model, pairs, pad_token_id, device) if shared else None
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
        reference: a :class:`pofe.runtime.Reference`; its ``model()`` gives pi_0 (no grad).
        pairs: the labelled pairs of this process for this optimiser step.
        loss_fn: one of :data:`pofe.losses.LOSSES` (pure function, soft labels via ``p``).
        micro_batches: gradient-accumulation steps; the pairs are split evenly over them.
        normaliser: divide the summed loss by this (see module docstring).
        backward: how to back-propagate (``accelerator.backward``); default ``loss.backward()``.
        no_sync: context manager factory suppressing the gradient all-reduce on all but the
            last micro-batch (``lambda: accelerator.no_sync(model)``).
        lockstep: run a zero-weight dummy pass for empty micro-batches (data parallel).
        precision: ``bf16`` runs both forwards (and so the backward) under bf16 autocast, fp32
            master weights (:mod:`pofe.runtime.precision`).

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
            # the packed pass's rows (packed_pair_logps): the longest prompt, then both responses
            length = max(len(pr.prompt_ids) for pr in chunk) + max(len(pr.chosen_ids) for pr in chunk) \
                + max(len(pr.rejected_ids) for pr in chunk)
            eager = eager_attention_pays(policy, precision, device, m, length)
            # Packing pays in every precision (bar benchmark's pairs, CPU, policy forward+backward:
            # bf16 eager 1.08 -> 0.90 s, bf16 SDPA 1.23 -> 0.99 s, fp32 2.41 -> 1.96 s against the joint
            # batch; benchmarks/online-notes.md), so pair_logps packs whenever the model allows it.
            t0 = time.perf_counter()
            if getattr(reference, "from_engine", False):  # pi_0 on the annotator's vLLM engine (engine_reference)
                ref_lp = reference.engine_logps(chunk).to(device)
            else:
                with reference.model() as ref_model, autocast(precision, device), attention_for(ref_model, eager):
                    ref_lp = pair_logps(ref_model, chunk, pad_token_id, device)  # pi_0, no grad, (2m,)
            t1 = time.perf_counter()
            with autocast(precision, device), attention_for(policy, eager), lean_activations(policy), \
                    sparse_tied_embedding(policy):
                pol_lp = pair_logps(policy, chunk, pad_token_id, device)  # log pi_theta(y|x), (2m,)
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
