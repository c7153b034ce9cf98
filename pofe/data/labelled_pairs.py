"""The pairs ``pofe label`` judges and the rows it writes (RL-CAI stage 2,
rlaif-constitutional-ai "Stage 2: AI preference labels").

* The input: a pair file (:func:`read_pairs`) or prompts sampled twice, cut to
  ``data.max_prompts`` (:func:`input_info` counts the cut). Both are saved once in the run
  folder, ``pairs.jsonl`` and ``input.json`` (:func:`save_pairs`), before any judging, so every
  batch -- and a resumed run -- labels exactly the same pairs and reports the same counts.
* One ``labels.jsonl`` row per judged pair (:func:`labelled_row`): p, the per-order p_ab /
  p_ba, consistency and everything that traces the label back to its annotation; with a
  calibration map, the calibrated ``p`` next to the judge's own ``p_raw``; and ``dropped``, the
  :class:`~pofe.labels.LabelPolicy` reason the pair stays out of ``preferences.jsonl`` (or null).
* ``preferences.jsonl`` rows (:func:`to_preference`): the pair oriented so the judge's
  favourite is ``chosen`` and ``p = max(p, 1 − p)`` (:meth:`PreferencePair.oriented`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pofe.jsonl import json_line
from pofe.labels import LabelPolicy, calibration_map
from pofe.records import Judgment, PreferencePair

DEFAULT_SAMPLED_PROMPTS = 32
"""Prompts sampled from when ``data.max_prompts`` is null (a given pair file is labelled whole)."""
PAIRS_FILE = "pairs.jsonl"
INPUT_FILE = "input.json"

Triple = tuple[str, str, str]


def read_pairs(path: str | Path) -> list[Triple]:
    """Pairs to label, read strictly by the data layer (a bad row anywhere is a located error)."""
    from pofe.data.preferences import load_unlabelled_pairs

    return load_unlabelled_pairs(path)


def input_info(source: str, available: int, used: int, max_prompts: int | None) -> dict[str, Any]:
    """How much of the input the run labels (``summary.json: input``)."""
    return {"source": str(source), "available": available, "used": used, "limited": available - used,
            "max_prompts": max_prompts}


def save_pairs(run_dir: Path, pairs: Sequence[Triple], info: dict[str, Any]) -> None:
    """``input.json`` and ``pairs.jsonl``, written once before any judging."""
    from pofe.runs import atomic_write_text

    atomic_write_text(run_dir / INPUT_FILE, json.dumps(info, indent=2) + "\n")
    atomic_write_text(run_dir / PAIRS_FILE, "".join(json_line({"prompt": x, "response_a": a, "response_b": b}) + "\n"
                                                    for x, a, b in pairs))


def saved_pairs(run_dir: Path) -> tuple[list[Triple], dict[str, Any] | None] | None:
    """The pairs (and input counts) a run saved, or None when it saved none yet."""
    from pofe.runs import read_run_text

    if not (run_dir / PAIRS_FILE).exists():
        return None
    info = json.loads(read_run_text(run_dir / INPUT_FILE)) if (run_dir / INPUT_FILE).is_file() else None
    return read_pairs(run_dir / PAIRS_FILE), info


def label_row(prompt: str, a: str, b: str, j: Judgment) -> dict[str, Any]:
    """One labels.jsonl row (everything needed to trace the label back to its annotation)."""
    return {
        "prompt": prompt, "response_a": a, "response_b": b,
        "p": j.p, "p_ab": j.p_ab, "p_ba": j.p_ba, "consistent": j.consistent, "parse_ok": j.parse_ok,
        "principle_id": j.principle_id, "constitution_version": j.constitution_version,
        "template_id": j.template_id, "template_hash": j.template_hash, "judge_id": j.judge_id,
        "cached": j.cached, "text_fallback": j.hard_label_fallback,
        "raw": list(j.raw),  # per-order generated text (the reasoning, with chain-of-thought)
        "extra": {k: v for k, v in (j.extra or {}).items() if isinstance(v, (str, int, float, bool, list, type(None)))},
    }


def calibrated(p: float | None, policy: LabelPolicy) -> dict[str, Any]:
    """The row fields of a calibrated label: ``p`` mapped by the audit's fitted map, the judge's
    own ``p_raw``, and where the map came from; nothing without a map (unparsed stays unparsed)."""
    if policy.calibration is None:
        return {}
    calib = calibration_map(policy.calibration)
    return {"p": policy.calibrated(p), "p_raw": p,
            "calibration": {k: calib.get(k) for k in ("method", "source", "calibration_sha256")}}


def labelled_row(prompt: str, a: str, b: str, j: Judgment, policy: LabelPolicy) -> dict[str, Any]:
    """The labels.jsonl row of one judged pair, calibrated, with the policy's drop reason."""
    row = {**label_row(prompt, a, b, j), **calibrated(j.p, policy)}
    row["dropped"] = policy.drop_reason(row["p"], row["consistent"])
    return row


_PROVENANCE = ("judge_id", "principle_id", "constitution_version", "template_id", "template_hash", "p_ab", "p_ba",
               "consistent", "text_fallback")


def to_preference(row: dict[str, Any]) -> PreferencePair | None:
    """The labelled pair oriented so ``chosen`` is the judge's favourite and ``p = max(p, 1 − p)``
    (soft losses do not care, BCE(Δ, p) = BCE(−Δ, 1 − p); hard-label consumers read the verdict
    directly); ``provenance["swapped"]`` says whether A and B were exchanged. An unparsed row
    (p is None) gives no pair: a judge never invents a label."""
    if row["p"] is None:
        return None
    prov = {**{k: row.get(k) for k in _PROVENANCE}, "source": "pofe-label", "swapped": False}
    return PreferencePair(prompt=row["prompt"], chosen=row["response_a"], rejected=row["response_b"], p=float(row["p"]),
                          provenance=prov).oriented()


def preferences_text(rows: Sequence[dict[str, Any]]) -> str:
    """``preferences.jsonl``: the oriented pair of every row the label policy kept."""
    prefs = (to_preference(r) for r in rows if r.get("dropped") is None)
    return "".join(json_line(q.to_dict()) + "\n" for q in prefs if q is not None)
