"""``pofe export``'s config (a run's labelled pairs as TRL / alpaca_eval / ``datasets`` data;
library code: :mod:`pofe.data.export`)."""

from __future__ import annotations

from typing import Literal

from pofe.config import PofeConfig


class ExportConfig(PofeConfig):
    """``pofe export``."""

    source: str | None = None
    """A run folder (``pofe label``, ``cai revise``, ``online``, ``judge``) or a pair file."""
    format: Literal["trl", "trl-conversational", "alpaca_eval", "datasets"] = "trl"
    """trl: prompt/chosen/rejected/p JSONL; trl-conversational: chat messages; alpaca_eval:
    annotations JSON (preference 1..2); datasets: a save_to_disk folder."""
    output: str | None = None
    """Output file (a folder for ``datasets``)."""
    include: Literal["trained", "all"] = "trained"
    """trained: the pairs the run trained on (an online ledger's ``status: trained`` rows; other pair files
    have no status and are kept whole); all: every judged pair. Ties (p = 0.5) are left out of the pair
    formats either way (alpaca_eval keeps them as preference 1.5); the summary counts what was left out."""
