"""``pofe reproduce``: the seeds' headline claims, each as a fixed-seed miniature with the
paper's number beside pofe's and whether the paper's direction holds.

A CPU cannot run the papers' models or judges (no judge that fits is better than chance), so the
claims are checked in worlds where the truth is known (:mod:`pofe.loops.reproduce.worlds`): a
tiny policy trained by the real ``pofe online`` loop, planted annotators with one known knob
each, and a programmatic oracle as the evaluator. What holds here is the *mechanism's direction*
(online beats offline, a better annotator trains a better policy, the annotator's prompt moves
the policy), not the papers' magnitudes. ``--fast`` (CI, a few minutes) and the full tier differ
only in scale; ``docs/results.md`` holds the full tier's table.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pofe.loops.reproduce import claims as C

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    """The seed and section (and figure or table) the claim comes from."""
    paper: str
    """The paper's number, as it reports it."""
    measure: str
    """What pofe measures in miniature, and the direction that reproduces the claim."""
    run: Callable[[C.World], dict[str, Any]]


CLAIMS: tuple[Claim, ...] = (
    Claim("online-beats-offline", "OAIF Sec. 4.2, Table 2",
          "online over offline DAP: ~66% human win rate (TL;DR: offline DPO wins 7.69% against online)",
          "oracle win rate of online DPO against offline DPO, same annotator and label budget; its 95% interval above 0.5, and online no worse than pi_0 (win rate vs pi_0 >= 0.5)",
          C.online_beats_offline),
    Claim("annotator-quality", "OAIF Sec. 4.5, Fig. 5",
          "online DPO improves as the annotator grows (PaLM 2-XS < S < L; XS about RLHF: 3.41 vs 3.38 of 5)",
          "oracle loss (distance in words to 1) after training, annotator accuracy 0.6 / 0.8 / 1.0; highest at 0.6",
          C.annotator_quality),
    Claim("length-dial", "OAIF Sec. 4.6, Fig. 6a",
          "annotator asked for helpful / short / very short: ~120 / ~90 / ~40 tokens",
          "mean held-out words under the three annotator prompts; helpful > short > very short",
          C.length_dial),
    Claim("labelling-chain", "RLAIF seed, 'A toy run'",
          "the RM copies the judge's length preference (length/quality 0.51-0.54); both-order debiasing "
          "removes position bias, not length bias",
          "length/quality of the RM trained on debiased soft judge labels (pofe sim); > 0.4, a human-label RM's < 0.1",
          C.labelling_chain),
)

FAST = {"steps": 16, "eval_prompts": 16, "max_new_tokens": 24, "lr": 2e-3}
FULL = {"steps": 32, "eval_prompts": 48, "max_new_tokens": 24, "lr": 1e-3}


def reproduce(out: str | Path, *, fast: bool = False, only: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """Run the claims (``only``: some of their ids) into ``out``; returns and writes
    ``reproduce.json`` (every claim's row and the numbers behind it)."""
    from pofe.errors import PofeError

    known = {c.id for c in CLAIMS}
    bad = sorted(set(only or ()) - known)
    if bad:
        raise PofeError(f"reproduce: no claim {', '.join(bad)} (claims: {', '.join(sorted(known))})")
    out = Path(out)
    world = C.World(out, seed=seed, **(FAST if fast else FULL))
    rows, t0 = [], time.perf_counter()
    for claim in CLAIMS:
        if only and claim.id not in only:
            continue
        t = time.perf_counter()
        log.info("reproduce: %s (%s)", claim.id, claim.source)
        res = claim.run(world)
        rows.append({"id": claim.id, "source": claim.source, "paper": claim.paper, "measure": claim.measure,
                     **res, "seconds": round(time.perf_counter() - t, 1)})
    result = {"tier": "fast" if fast else "full", "seed": seed, "claims": rows, "all_hold": all(r["holds"] for r in rows),
              "seconds": round(time.perf_counter() - t0, 1), "world": {k: getattr(world, k) for k in (
                  "steps", "batch_size", "max_new_tokens", "eval_prompts", "lr", "target")}}
    result["machine"] = machine()
    (out / "reproduce.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "results.md").write_text(f"{table(result)}\n\n{result['tier']} tier, seed {seed}, {result['seconds']} s on "
                                    f"{result['machine']}, {time.strftime('%Y-%m-%d')}\n")
    return result


def machine() -> str:
    """The CPU model and core count (numbers are machine-dependent; a result names its machine)."""
    import os
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def _num(v: Any) -> str:
    if isinstance(v, list):
        return " / ".join(_num(x) for x in v)
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


def table(result: dict[str, Any]) -> str:
    """The claims as a Markdown table: claim, source, the paper's number, pofe's number (with its
    interval where it is a rate), whether the direction holds."""
    lines = ["| claim | source | paper | pofe measures | pofe | holds |", "|---|---|---|---|---|---|"]

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")  # a bar inside a cell would split the row

    for r in result["claims"]:
        ci = f" [{_num(r['ci95'][0])}, {_num(r['ci95'][1])}]" if r.get("ci95") and r["ci95"][0] is not None else ""
        lines.append(f"| {r['id']} | {cell(r['source'])} | {cell(r['paper'])} | {cell(r['measure'])} | {_num(r['value'])}{ci} | "
                     f"{'yes' if r['holds'] else '**no**'} |")
    return "\n".join(lines)


__all__ = ["CLAIMS", "Claim", "reproduce", "table"]
