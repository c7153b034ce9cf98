"""The pairs ``pofe rm`` trains and evaluates on: several sources mixed, a held-out split, and
hard labels made from soft ones when asked (:meth:`pofe.records.PreferencePair.hardened`, the
one hardening rule of :mod:`pofe.labels`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pofe.errors import DataError
from pofe.records import PreferencePair


def hardened(pairs: Sequence[PreferencePair]) -> list[PreferencePair]:
    """Hard labels from soft ones: the favourite becomes chosen with p = 1; exact ties dropped."""
    return [h for h in (q.hardened() for q in pairs) if h is not None]


def split_pairs(pairs: list[PreferencePair], fraction: float, seed: int) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Deterministic train/eval split; at least one eval pair when fraction > 0 and n > 1."""
    idx = list(range(len(pairs)))
    random.Random(seed).shuffle(idx)
    k = round(len(pairs) * fraction)
    if fraction > 0 and k == 0 and len(pairs) > 1:
        k = 1
    ev = set(idx[:k])
    return [q for i, q in enumerate(pairs) if i not in ev], [q for i, q in enumerate(pairs) if i in ev]


def load_rm_pairs(data: Any, seed: int) -> tuple[list[PreferencePair], list[PreferencePair], dict[str, int]]:
    """(train pairs, held-out pairs, pairs read per train source) of ``pofe rm``'s ``data``
    section (``train``, ``eval``, ``eval_fraction``, ``max_pairs_per_source``, ``labels``).
    Without ``data.eval`` the held-out pairs are a seeded ``eval_fraction`` of the train pairs;
    ``labels: hard`` hardens the train pairs only (held-out metrics read the labels as given)."""
    from pofe.data.preferences import load_pairs

    if not data.train:
        raise DataError("rm: data.train is empty; give at least one pair source (e.g. runs/label-*/preferences.jsonl)")
    train: list[PreferencePair] = []
    per_source = {}
    for src in data.train:
        got = load_pairs(src, limit=data.max_pairs_per_source)
        per_source[src] = len(got)
        train += got
    if data.eval:
        eval_pairs = [q for src in data.eval for q in load_pairs(src, limit=data.max_pairs_per_source)]
    else:
        train, eval_pairs = split_pairs(train, data.eval_fraction, seed)
    if data.labels == "hard":
        train = hardened(train)
    if not train:
        raise DataError("rm: no training pairs left")
    return train, eval_pairs, per_source
