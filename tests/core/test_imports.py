"""Rot guards (shared/docs/style-anchors.md #12): every module imports, and no undefined
names anywhere in the package (torchtune shipped a loss module that raised NameError on
import because its linter ignored F821)."""

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pofe

ROOT = Path(pofe.__file__).parent


def _modules():
    for m in pkgutil.walk_packages([str(ROOT)], prefix="pofe."):
        if m.name != "pofe.__main__":
            yield m.name


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_imports(name):
    importlib.import_module(name)


@pytest.mark.slow
def test_no_undefined_names():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff not installed (pip install -e .[test])")
    r = subprocess.run([ruff, "check", "--no-cache", "--select", "F821,F822,F823,F811,E9", str(ROOT)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
