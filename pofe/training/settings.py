"""Config sections several training commands share with the same meaning."""

from __future__ import annotations

from pydantic import Field

from pofe.config import PofeConfig


class CheckpointSettings(PofeConfig):
    """Resumable checkpoints (``checkpoints/step-N``, written atomically)."""

    every: int = Field(0, ge=0)
    """Checkpoint every N optimiser steps (0 = only at the end)."""
    keep_last: int = Field(2, ge=0)
    """Checkpoints kept (0 = all)."""
