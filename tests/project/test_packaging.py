"""What ``pyproject.toml`` promises matches the source: every file named in the package data
exists (a declared ``py.typed`` that was missing told type checkers nothing), and every runtime
dependency is one pofe uses (an unused ``openai`` was installed for every user)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

# Dependencies pofe needs without importing them itself, and why.
INDIRECT = {
    "gguf": "transformers reads the embedded model's GGUF file with it",
    "rich": "typer formats --help and usage errors with it",
}
MODULE = {"pyyaml": "yaml", "rouge-score": "rouge_score"}  # distribution name -> import name


def test_every_package_data_pattern_names_a_file():
    pkg = REPO / "pofe"
    missing = [g for g in PYPROJECT["tool"]["setuptools"]["package-data"]["pofe"] if not list(pkg.glob(g))]
    assert missing == []


def test_every_runtime_dependency_is_imported_by_pofe():
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "pofe").rglob("*.py"))
    unused = []
    for spec in PYPROJECT["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower()
        module = MODULE.get(name, name.replace("-", "_"))
        if name not in INDIRECT and not re.search(rf"^\s*(import|from) {module}\b", source, re.M):
            unused.append(name)
    assert unused == []
    assert "openai" not in [re.match(r"[A-Za-z0-9_.-]+", s).group(0) for s in PYPROJECT["project"]["dependencies"]]
