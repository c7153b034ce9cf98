"""The host memory allocator, tuned for training loops.

A training step frees and re-allocates the same large buffers every step: gradients, the bf16
weight casts of autocast, activations. With glibc malloc's defaults a block over the mmap
threshold (128 KiB, rising as such blocks are freed) is mapped and unmapped each time, and free
memory at the top of the heap is trimmed, so each step page-faults its buffers in again and the
kernel zeroes every page. On the bar benchmark (``benchmarks/online_step.py``, bf16, vLLM
generator and judge) two profiles of the same 3-pair policy pass in one run differed only in
``copy_`` (0.14 vs 0.36 s) and ``fill_`` (0.04 vs 0.17 s). ``benchmarks/policy_pass.py --malloc``:
1.09-1.25 s -> 0.98-1.13 s per pass. This is the glibc side of what PyTorch's CPU tuning guide
gets from jemalloc or tcmalloc.

Blocks over 32 MiB are still mapped and unmapped (:data:`MMAP_MAX` left at glibc's default).
Turning mmap off altogether was faster (reused blocks are not page-faulted in again) but the heap
never stopped growing: those blocks (the completion logits, their gradient) change size with every
step's longest response, a larger one does not fit the holes the smaller ones left, and trimming is
off. The online bar, 16 steps: peak RSS 4.49 -> 5.15 GB and still rising with mmap off; 4.49 ->
4.59 GB with it on, for +0.23 s/step (4.98 -> 5.22; benchmarks/online-notes.md). A run's memory
that levels off is worth more than 5% of its speed; ``MALLOC_MMAP_MAX_=0`` in the environment
buys the speed back (pofe then leaves glibc to it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc <malloc.h>
MMAP_THRESHOLD = 32 * 2**20
"""Blocks up to this size come from the heap (glibc's maximum on 64-bit: HEAP_MAX_SIZE / 2)."""
TRIM_THRESHOLD = -1
"""-1: never give free memory at the top of the heap back (man mallopt: disables trimming)."""
MMAP_MAX = None
"""None: glibc's own limit on mapped blocks (65536), so blocks over :data:`MMAP_THRESHOLD` are
mapped and returned on free. 0 (no block mapped) was tried: faster, but a heap that kept growing
(module docstring)."""
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Ask glibc malloc to keep freed memory for reuse instead of returning it to the OS; once
    per process, before the first step. Returns whether it is in effect.

    Left alone when the user has chosen: ``POFE_MALLOC_TUNING=0``, any ``MALLOC_*`` tunable in the
    environment, or another allocator preloaded (jemalloc, tcmalloc), and off glibc."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    from pofe.preload import preloaded_allocator

    if os.environ.get("POFE_MALLOC_TUNING", "1") == "0" or any(k in os.environ for k in _ENV) \
            or preloaded_allocator() is not None:
        return False
    try:  # glibc's soname first: find_library runs ``ldconfig -p`` in a subprocess, once per process
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:  # no C library by either name: nothing to tune
            return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    options = [(_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    if MMAP_MAX is not None:
        options.append((_M_MMAP_MAX, MMAP_MAX))
    _applied = all(mallopt(k, v) for k, v in options)
    log.debug("glibc malloc: keep freed memory for reuse (%s)", "on" if _applied else "refused")
    return _applied


PRIMITIVE_CACHE = 16
"""oneDNN primitives kept per process (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; oneDNN's default: 1024)."""


def bound_primitive_cache() -> bool:
    """Keep at most :data:`PRIMITIVE_CACHE` oneDNN primitives (the bf16 matmuls' kernels and their
    buffers) instead of oneDNN's 1024; before the first bf16 matmul (oneDNN reads the variable on
    first use). Returns whether pofe set it (a user's own value is left alone).

    Why: a primitive is built per matrix shape, and an online step's shapes change with its
    sequence lengths, so with 1024 slots every step's new shapes add to the process's memory and
    it never levels off. SmolLM2-135M, bf16 autocast, 8 rows of 100-200 tokens, fwd + bwd + AdamW,
    16 steps, glibc tuned (:func:`keep_freed_memory`): RSS 4.30 -> 5.19 GB and still rising with
    1024; 4.26 -> 4.45 GB with 16 and 4.31 -> 4.70 with 64, at the same step times
    (benchmarks/online-notes.md)."""
    if "ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ or "DNNL_PRIMITIVE_CACHE_CAPACITY" in os.environ:
        return False
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(PRIMITIVE_CACHE)
    return True
