"""A frozen model's weights kept inside a shared CPU vLLM engine, put back by a swap instead of a reload.

Why: when pi_0 (the annotator and the reference) shares the sampler's engine, each online step
loads pi_0 before judging and the policy again before sampling. A ``reload_weights`` of
SmolLM2-135M takes ~0.2 s on 2 cores: ~0.08 s of it repacks every linear layer for oneDNN
(``create_onednn_mm_handler``), ~0.04 s copies, the rest is vLLM's layer-wise loading machinery;
pi_0's push also read its weights back from a file first. pi_0 never changes, so its packed
form can simply be kept: vLLM's CPU linears hold their packed weights in a ``cpu_linear``
closure (the ``weight`` parameter is emptied), and a reload makes *new* closures, so holding
pi_0's closures keeps its packed weights alive. The remaining parameters (embedding, norms,
biases) are copied back into the engine's own tensors, whose identity vLLM's reload preserves,
from the frozen weights' file where it holds them (plain reads: page cache, not this process's
memory), else from a copy taken when they were kept. Measured on the bar model: a swap takes
~0.01 s with copies in memory.

What it costs: while the policy's weights are in the engine, pi_0's packed linears beside them;
when pi_0 is swapped in, the policy's packed linears are dropped (the next reload makes new
ones). Without a file, also the copy of the remaining parameters (SmolLM2: the 56 MB tied
embedding and the norms).

Guard: the first swap is checked against pi_0's own prompt log-probs of a fixed probe sequence,
read before it was replaced; any difference (an architecture or vLLM version that derives weight
state elsewhere) drops the kept copy and falls back to reloading, with a warning. CPU engines
only: on CUDA vLLM's linears keep plain weights and graphs capture their addresses; that path is
untested, so it reloads as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Reader = Callable[[Sequence[str]], dict[str, torch.Tensor]]  # tensor names -> those the source holds

PROBE_TOKENS = 24  # prompt log-probs of this many fixed token ids: the swap's check


@dataclass
class KeptWeights:
    """One weight set kept beside the engine's live one: ``fp`` the fingerprint the engine records
    for it (``Engine.holds``), ``state`` what :func:`install` puts back, ``probe`` its log-probs on
    the probe ids, ``verified`` once a swap reproduced them exactly."""

    fp: tuple
    state: Any
    source: str | None = None  # the safetensors file some of ``state``'s tensors are read back from
    probe: list[float] = field(default_factory=list)
    verified: bool = False


def capture(model: torch.nn.Module, read: Reader | None = None) -> tuple[list, list]:
    """What :func:`install` needs to make ``model`` (vLLM's model object) compute with the weights
    it holds now: for each non-empty parameter (a tied one once) its module, name and value, and
    each module's ``cpu_linear`` closure (vLLM-CPU's packed linear weight lives in it).

    ``read`` (names -> tensors, e.g. of the frozen weights' file): a parameter the source holds under
    its own name with exactly the engine's values is recorded by name and read back at each swap
    instead of copied into memory here (SmolLM2: the 56 MB embedding); anything else is copied."""
    found: list[tuple[torch.nn.Module, str, str, torch.Tensor]] = []
    seen: set[int] = set()
    linears = []
    for qual, mod in model.named_modules():
        for name, p in mod._parameters.items():
            if p is None or p.numel() == 0 or id(p) in seen:
                continue
            seen.add(id(p))
            found.append((mod, name, f"{qual}.{name}" if qual else name, p))
        lin = mod.__dict__.get("cpu_linear")
        if lin is not None:
            linears.append((mod, lin))
    source = read([full for _, _, full, _ in found]) if read is not None else {}
    params = []
    with torch.no_grad():
        for mod, name, full, p in found:
            src = source.get(full)
            same = src is not None and src.shape == p.shape and src.dtype == p.dtype and torch.equal(src, p)
            params.append((mod, name, full if same else p.detach().clone()))
    return params, linears


def install(model: torch.nn.Module, state: tuple[list, list], read: Reader | None = None) -> None:
    """Put a :func:`capture`d weight set back into ``model``: copies into the engine's current
    tensors (in place: vLLM's reload and any captured graph keep referring to them) and the kept
    closures in place of the current ones (the current packed weights are freed with them)."""
    params, linears = state
    names = [v for _, _, v in params if isinstance(v, str)]
    source = read(names) if names else {}
    if names and (read is None or set(source) != set(names)):
        raise RuntimeError(f"the kept weights' source lacks {sorted(set(names) - set(source))[:3]}")
    pairs = []
    for mod, name, v in params:  # all checked before any is written: an error leaves the engine as it was
        saved = source[v] if isinstance(v, str) else v
        cur = mod._parameters.get(name)
        if cur is None or cur.shape != saved.shape or cur.dtype != saved.dtype:
            raise RuntimeError(f"{type(mod).__name__}.{name}: the engine's tensor changed shape or dtype "
                               f"({None if cur is None else tuple(cur.shape)} vs {tuple(saved.shape)})")
        pairs.append((cur, saved))
    with torch.no_grad():
        for cur, saved in pairs:
            cur.copy_(saved)
    for mod, lin in linears:
        mod.cpu_linear = lin


def probe_ids(vocab_size: int) -> list[int]:
    """A fixed token sequence inside any vocabulary (the check needs the same ids both times)."""
    return [(7 + 13 * i) % vocab_size for i in range(PROBE_TOKENS)]
