#!/usr/bin/env bash
# `make demo`: OAIF on the embedded SmolLM2-135M-Instruct, told in three steps.
#   1. audit the embedded LLM judge (template helpful-very-short) on 24 labelled pairs
#      (examples/demo/): it picks the first-shown reply, so its audit fails and it cannot label;
#   2. audit the programmatic `length` judge on the same pairs: it passes;
#   3. `pofe online` (examples/online-length.yaml) trains with the length judge, gated on that
#      audit (--require-audit), then `pofe report` writes the HTML page, whose path is printed last.
# POFE_DEMO_MODEL, POFE_DEMO_STEPS, POFE_DEMO_EVAL_PROMPTS and POFE_DEMO_DIR exist for the smoke
# test (tests/project/test_demo.py), which runs this on a tiny random model.
set -euo pipefail
POFE=${POFE:-.venv/bin/pofe}
MODEL=${POFE_DEMO_MODEL:-smollm2-135m-instruct}
OUT=${POFE_DEMO_DIR:-runs/demo-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
# 12 of the config's 16 steps: the mean length is ~10 tokens by then (from ~48) and the demo
# stays within 10 minutes on a shared 2-core machine
STEPS=${POFE_DEMO_STEPS:-12}
EVAL_PROMPTS=${POFE_DEMO_EVAL_PROMPTS:-16}

echo "== 1/3 audit: the embedded LLM judge ($MODEL, template helpful-very-short), 24 pairs labelled 'the shorter reply'"
rc=0
"$POFE" audit --config examples/demo/audit.yaml --judge llm --set judge.model="$MODEL" \
  --set judge.template=helpful-very-short --set judge.cache.enabled=false -o "$OUT/audit-llm.json" || rc=$?
# exit 1 is a failed check (what this step shows); anything else is an error
if [ "$rc" -gt 1 ]; then exit "$rc"; fi
if [ "$rc" -eq 1 ]; then
  echo "-> the embedded judge cannot label this run: its verdicts follow the position, not the replies."
  if [ "$MODEL" = smollm2-135m-instruct ]; then  # measured on this model (README); not on another one
    echo "   Its two orders combined in log-odds (a constant position offset cancels) still do not prefer the"
    echo "   shorter reply: 7/24 on these pairs, 42/100 [0.33, 0.52] on HH-RLHF pairs labelled by length."
  fi
else
  echo "-> the embedded judge passed this audit"
fi

echo
echo "== 2/3 audit: the programmatic length judge (prefers the shorter reply), same pairs and thresholds"
"$POFE" audit --config examples/demo/audit.yaml --judge length -o "$OUT/audit-length.json" > "$OUT/audit-length.txt"
# the full table is in $OUT/audit-length.txt; its last line is the verdict
echo "length judge $(tail -n 1 "$OUT/audit-length.txt" | sed 's/^ *//')"

echo
echo "== 3/3 pofe online with the length judge (gated on its audit), then the report"
"$POFE" online --config examples/online-length.yaml --model "$MODEL" --steps "$STEPS" --set eval.num_prompts="$EVAL_PROMPTS" \
  --set run.output_dir="$OUT" --set run.name=online --require-audit "$OUT/audit-length.json"
"$POFE" report "$OUT/online"
echo "report: $OUT/online/report/report.html"
