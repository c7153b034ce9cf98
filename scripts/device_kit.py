"""Build the carry kit for the lent GPU machine: the wheels pofe needs there and the embedded
tokenizer's files, in a git-ignored folder of the repository (it travels with the working tree).

    .venv/bin/python scripts/device_kit.py [--kit .device-kit]

The machine (the tool library's device README and KINDS.md) runs Python 3.12 on x86-64 with
torch, transformers, accelerate, peft, safetensors, typer, rich, httpx, numpy, pyarrow and pytest,
and reaches nothing outside itself: a missing package travels as a wheel, at most 64 MiB of tree
per call. So the kit holds exactly the wheels pinned in ``scripts/device-kit.lock`` (cp312
manylinux or pure wheels, downloaded with ``--no-deps``: the lock names every one), and the
tokenizer of the embedded SmolLM2 (``pofe.models.load_tokenizer()`` saved with
``save_pretrained``): its model wheel (93 MB) cannot travel, and the check builds random-weight
models on this vocabulary. ``benchmarks/device_check.sh`` installs the wheels with ``pip install
--no-index --no-deps --target`` and reads the tokenizer from ``<kit>/tokenizer``.

Writes ``<kit>/kit.lock`` (each wheel's file name and sha256) and prints the kit's size, which
must stay at most 40 MiB (the rest of the 64 MiB is the tree itself); over it, the script exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "scripts" / "device-kit.lock"
LIMIT = 40 * 2**20
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
            *(a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                          "manylinux2014_x86_64", "manylinux1_x86_64") for a in ("--platform", p))]
# Pinned packages with no wheel of that version on PyPI: built here from the sdist (pure Python).
BUILT_FROM_SDIST = {"rouge-score"}


def pins(lock: Path = LOCK) -> list[str]:
    """``NAME==VERSION`` lines of the lock file (comments and blank lines skipped)."""
    out = [line.split("#", 1)[0].strip() for line in lock.read_text().splitlines()]
    out = [x for x in out if x]
    bad = [x for x in out if "==" not in x]
    if bad:
        sys.exit(f"{lock}: every line must be NAME==VERSION, got {bad[0]!r}")
    return out


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"], check=True)


def download(wheels: Path, wanted: list[str]) -> None:
    binary = [p for p in wanted if p.split("==")[0] not in BUILT_FROM_SDIST]
    pip("download", "--no-deps", "--only-binary=:all:", *PLATFORM, "-d", str(wheels), *binary)
    for spec in (p for p in wanted if p.split("==")[0] in BUILT_FROM_SDIST):
        with tempfile.TemporaryDirectory() as sd:
            pip("download", "--no-deps", "--no-binary=:all:", "-d", sd, spec)
            pip("wheel", "--no-deps", "-w", str(wheels), *map(str, Path(sd).iterdir()))


def export_tokenizer(target: Path) -> None:
    """The embedded model's tokenizer files only (no weights)."""
    sys.path.insert(0, str(REPO))
    from pofe.models import load_tokenizer

    load_tokenizer().save_pretrained(str(target))


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", default=str(REPO / ".device-kit"), help="kit folder (default: .device-kit, git-ignored)")
    args = ap.parse_args(argv)
    kit = Path(args.kit)
    wanted = pins()
    shutil.rmtree(kit, ignore_errors=True)  # a stale wheel of another version would stop the whole install
    (kit / "wheels").mkdir(parents=True)
    download(kit / "wheels", wanted)
    export_tokenizer(kit / "tokenizer")
    files = sorted((kit / "wheels").glob("*.whl"))
    names = {f.name.split("-")[0].lower().replace("_", "-") for f in files}
    missing = [p for p in wanted if p.split("==")[0].lower().replace("_", "-") not in names]
    if missing or len(files) != len(wanted):
        print(f"kit: {len(files)} wheels for {len(wanted)} pins; missing: {missing}", file=sys.stderr)
        return 1
    (kit / "kit.lock").write_text("".join(f"{f.name} sha256={hashlib.sha256(f.read_bytes()).hexdigest()}\n"
                                          for f in files))
    total = size(kit)
    print(f"kit: {kit} holds {len(files)} wheels and the tokenizer: {total / 2**20:.1f} MiB (limit 40 MiB)")
    if total > LIMIT:
        print(f"kit: {total / 2**20:.1f} MiB is over the 40 MiB limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
