"""``pofe export``'s config (a run's labelled pairs as TRL / alpaca_eval / ``datasets`` data;
library code: :mod:`pofe.data.export`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

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
    push_to_hub: str | None = None
    """A Hugging Face dataset repo id (``namespace/name``) to upload the exported file (or the
    ``datasets`` folder's files) to, at the repo's root; created when missing (``--push-to-hub
    REPO``; token from ``HF_TOKEN`` or ``hf auth login``). A failed upload is one line naming the
    repo; the exported file stays."""

    @field_validator("push_to_hub", mode="before")
    @classmethod
    def _repo_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("push_to_hub")
    @classmethod
    def _repo_id(cls, v: str | None) -> str | None:
        from pofe.hub import check_repo_id

        return v if v is None else check_repo_id(v)
