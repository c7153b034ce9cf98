"""Every seed pofe derives, in one place: the process-wide reseed, the per-step and per-block
seeds a resume depends on, and the named streams of single commands.

Why one home: an exact ``--resume`` equals the uninterrupted run only if every random draw is a
function of ``(seed, step, rank)`` (or of an item's index), never of how far a process got; and
two streams must never collide (rank 1's step 1 is not rank 0's step 2). The hashed helpers
(:func:`step_seed`, :func:`block_seed`) guarantee both. The arithmetic ones below them are the
streams earlier releases shipped, kept bit for bit so that published numbers (the README's, the
benchmarks') reproduce; each is written once, here, with the collision argument beside it. A new
stream should use :func:`derived`.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's process-wide generators from one seed."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def derived(seed: int, *parts: object) -> int:
    """A 32-bit seed for the stream named by ``parts`` (a label, a step, a rank...): a hash, so no
    two distinct tuples share a stream by arithmetic accident."""
    key = "/".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")


def step_seed(seed: int, step: int, rank: int) -> int:
    """Every step reseeds from (seed, step, rank): a resumed run samples exactly what the
    uninterrupted one did, and each process samples different responses."""
    return derived(seed, step, rank)


def sampling_seed(seed: int, step: int, rank: int) -> int:
    """The sampling seed a generator draws from torch's RNG right after
    ``seed_everything(step_seed(seed, step, rank))``, computed on a private generator: a step
    sampled ahead in a background thread (mode=async) must not touch the process-wide one."""
    g = torch.Generator().manual_seed(step_seed(seed, step, rank))
    return int(torch.randint(0, 2**31 - 1, (1,), generator=g).item())


def block_seed(seed: int, rank: int) -> int:
    """The sampling seed of process ``rank``'s block of a labelling command's items: ``seed`` itself
    on rank 0 (a one-process run samples exactly as before) and a hash of ``(seed, rank)``
    elsewhere, so no two blocks share one random stream. A sampled text therefore depends on how
    many processes split the items (a batched ``generate`` draws one stream for its whole batch);
    greedy decoding and deterministic judges do not."""
    return seed if rank == 0 else step_seed(seed, 0, rank)


# -- the shipped arithmetic streams (bit for bit: published numbers depend on them)

def epoch_shuffle_seed(seed: int, epoch: int) -> int:
    """``pofe rm``'s order of the pairs in ``epoch``: a prime stride keeps two seeds'
    epochs apart for any realistic epoch count (< 1009)."""
    return seed * 1009 + epoch


def rl_prompts_seed(seed: int, step: int) -> int:
    """``pofe rl``'s prompts of ``step`` (every process draws the same batch, then takes its block):
    unique per (seed, step) below 100003 steps."""
    return seed * 100003 + step


def rl_sampling_seed(seed: int, step: int, rank: int) -> int:
    """``pofe rl``'s sampling seed of ``step`` on process ``rank``: rank 0 keeps the one-process seed;
    the others are offset past any step count, so no two processes (nor two steps) share one."""
    return seed * 1000 + step + 1_000_003 * rank


def chunk_seed(seed: int, index: int, stream: int = 0) -> int:
    """``pofe cai revise``'s chunk ``index`` of ``stream`` (0 red-team, 1 benign): a chunk's seed
    depends on its index only, so a resume after chunk k samples chunk k+1 as the whole run did."""
    return seed + stream + 7919 * index


def probe_seed(seed: int, step: int) -> int:
    """``pofe online``'s off-policy probe of ``step`` (its own stream, apart from the step's sampling)."""
    return seed * 1_000_003 + step


def critique_seed(seed: int, round_: int, revision: bool) -> int:
    """Constitutional AI's critique (or revision) of round ``round_`` (SL-CAI §3.1: critique, then
    revise, repeated): a different stream per round and per kind."""
    return seed + 1000 * (round_ + 1) + (500 if revision else 0)


__all__ = ["seed_everything", "derived", "step_seed", "sampling_seed", "block_seed", "epoch_shuffle_seed",
           "rl_prompts_seed", "rl_sampling_seed", "chunk_seed", "probe_seed", "critique_seed"]
