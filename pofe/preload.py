"""tcmalloc under pofe's commands: found on the machine, preloaded by restarting the command once.

Why: a training step frees and re-allocates the same large buffers every step (autocast's bf16
weight casts, activations, gradients, the engine push's casts). glibc malloc, even tuned
(:func:`pofe.runtime.allocator.keep_freed_memory`), leaves holes that the next step's
differently-sized buffers do not fit; tcmalloc's size classes reuse them. The online bar
(``benchmarks/online_step.py $(cat benchmarks/best-setting.txt)``, Intel Xeon with AMX, 5 pairs
glibc / tcmalloc in separate processes): peak RSS 4.25-4.37 -> 3.90-4.00 GB in every pair, level
over 16 steps (3.97 GB), and the policy's forward+backward faster in every pair
(1.42/1.57/2.29/2.26/1.87 -> 1.32/1.27/2.02/1.42/1.38 s; benchmarks/online-notes.md). This is what
PyTorch's CPU performance guide and vLLM's CPU backend (for its own workers) do.

An allocator can only be chosen before the process starts (``LD_PRELOAD``), so a model command
restarts itself once with the library preloaded (:func:`restart_with_tcmalloc`, called first thing
by ``pofe``'s entry point, before torch is imported): same PID, same arguments. Nothing happens
when no tcmalloc is installed (Debian/Ubuntu: ``apt-get install libtcmalloc-minimal4``), off Linux,
with ``POFE_TCMALLOC=0``, when another allocator is already preloaded, or when the user tuned
glibc (any ``MALLOC_*`` variable).
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence

MODEL_COMMANDS = frozenset({"online", "sft", "rm", "rl", "self-reward", "cai", "label", "judge", "audit", "eval",
                            "chat", "export"})
"""Commands that load a model (the others start in a fraction of a second and allocate little)."""

_RESTARTED = "_POFE_TCMALLOC_RESTARTED"  # set in the restarted process: never a second restart


def tcmalloc_library() -> str | None:
    """A tcmalloc shared library for ``LD_PRELOAD``: the one vLLM's CPU wheels bundle under
    ``vllm/libs``, else the system's ``libtcmalloc_minimal`` / ``libtcmalloc`` (by soname)."""
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    for root in (spec.submodule_search_locations or []) if spec else []:
        for pattern in ("libtcmalloc_minimal*.so*", "libtcmalloc.so*"):
            found = sorted(glob.glob(os.path.join(root, "libs", pattern)))
            if found:
                return found[0]
    for name in ("tcmalloc_minimal", "tcmalloc"):
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def command_of(argv: Sequence[str]) -> str | None:
    """The command of a ``pofe`` argument list: its first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def preload_env(command: str | None, argv: Sequence[str], environ: Mapping[str, str],
                library: Callable[[], str | None], platform: str = sys.platform) -> dict[str, str] | None:
    """The environment to restart ``command`` with, or None to go on as is (see the module docstring).
    ``library`` (:func:`tcmalloc_library`) is asked last: it runs ``ldconfig``, which neither
    ``pofe --help`` nor the restarted process needs."""
    if (not platform.startswith("linux") or command not in MODEL_COMMANDS
            or environ.get("POFE_TCMALLOC", "1") == "0" or environ.get(_RESTARTED)
            or preloaded_allocator(environ) is not None
            or any(k.startswith("MALLOC_") for k in environ)
            or any(a in ("--help", "-h") for a in argv)):
        return None
    lib = library()
    if lib is None:
        return None
    preload = environ.get("LD_PRELOAD", "")
    env = dict(environ)
    env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    env[_RESTARTED] = "1"
    # gperftools prints a line with a stack for every allocation over 1 GiB (its default threshold;
    # a 7B model's weights): noise on stderr, not a problem
    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(2**60))
    return env


def restart_with_tcmalloc(command: str | None, argv: Sequence[str] = ()) -> None:
    """Replace this process with the same command line under tcmalloc when :func:`preload_env`
    says so; returns (and the command runs on glibc) otherwise or if the restart fails."""
    env = preload_env(command, argv, os.environ, tcmalloc_library)
    orig = getattr(sys, "orig_argv", None)
    if env is None or not sys.executable or not orig:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, orig, env)
    except OSError:
        return


def preloaded_allocator(environ: Mapping[str, str] = os.environ) -> str | None:
    """The tcmalloc or jemalloc library in ``LD_PRELOAD``, if any: the user's (or this module's) choice."""
    return next((p for p in environ.get("LD_PRELOAD", "").split(":") if "tcmalloc" in p or "jemalloc" in p), None)


def allocator() -> str:
    """The allocator this process runs on, for the run's log: the preloaded library or ``glibc``."""
    return preloaded_allocator() or "glibc"
