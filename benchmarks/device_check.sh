#!/usr/bin/env bash
# The device check: runs as it is on the GPU machine this project can be lent (one H100 or H200,
# Python 3.12 with torch + CUDA and transformers, nothing reachable outside it), in <= 8 minutes.
#
#   here, once:   .venv/bin/python scripts/device_kit.py        (wheels + tokenizer into .device-kit/)
#   there:        bash benchmarks/device_check.sh               (the device tool's run, carry [".device-kit"])
#   dry run:      bash benchmarks/device_check.sh --cpu [--kit DIR]   (tiny shapes on the CPU; CI runs it)
#
# 1. installs the kit's wheels with pip --no-index --no-deps into $POFE_SITE (default /tmp/site); pofe
#    itself is not installed: it runs from this checkout (PYTHONPATH=.:$POFE_SITE);
# 2. runs benchmarks/device_check.py offline (HF_HUB_OFFLINE=1, no index for pip): one line per item,
#    "ITEM: PASS", "ITEM: FAIL ..." or "ITEM: <number>" ("#" lines are notes). Everything goes into $OUT
#    (device_check.txt: the lines, device_check.json, device_check.log: stderr); models and runs go into
#    a temporary folder, never $OUT (its files travel back, 16 MiB each).
# Exit status: 0 when no line is FAIL.
set -uo pipefail
cd "$(dirname "$0")/.."
cpu=()
kit=${POFE_KIT:-.device-kit}
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=(--cpu) ;;
    --kit) kit=$2; shift ;;
    *) echo "usage: bash benchmarks/device_check.sh [--cpu] [--kit DIR]" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-/tmp/pofe-device-check}
site=${POFE_SITE:-/tmp/site}
py=${PYTHON:-python3}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  TOKENIZERS_PARALLELISM=false WANDB_DISABLED=true PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 \
  VLLM_ENABLE_V1_MULTIPROCESSING=0 CUBLAS_WORKSPACE_CONFIG=:4096:8
if [ ! -f "$kit/tokenizer/tokenizer_config.json" ]; then
  echo "kit: FAIL no tokenizer in $kit (build the kit first: .venv/bin/python scripts/device_kit.py)" | tee "$OUT/device_check.txt"
  exit 1
fi
shopt -s nullglob
wheels=("$kit"/wheels/*.whl)
rm -rf "$site" && mkdir -p "$site"
if [ ${#wheels[@]} -gt 0 ] && ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --upgrade --target "$site" "${wheels[@]}" 2>"$OUT/device_check.log"; then
  echo "kit/install: FAIL  # pip install --no-index of ${#wheels[@]} wheels (tail of $OUT/device_check.log)" | tee "$OUT/device_check.txt"
  tail -5 "$OUT/device_check.log"
  exit 1
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "kit/wheels_installed: ${#wheels[@]}"
  "$py" benchmarks/device_check.py "${cpu[@]}" --kit "$kit" --out "$OUT" 2>>"$OUT/device_check.log"
} | tee "$OUT/device_check.txt"
status=${PIPESTATUS[0]}
exit "$status"
