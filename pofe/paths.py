"""Where pofe keeps its own files (``POFE_HOME``, default ``~/.cache/pofe``). A leaf module:
the output guard needs the judge cache's default path without importing the judges, and the
model store needs the home folder without importing anything of pofe."""

from __future__ import annotations

import os
from pathlib import Path


def pofe_home() -> Path:
    return Path(os.environ.get("POFE_HOME", Path.home() / ".cache" / "pofe"))


def default_judge_cache_path() -> Path:
    """The SQLite judge cache used when a judge's ``cache.path`` is unset."""
    return pofe_home() / "judge-cache.sqlite"
