#!/usr/bin/env bash
# spec_gpu.sh - issue #30 on one GPU: the speculation exactness tests with
# the models on the GPU (the demo and the carried fixtures), then
# `lumen bench --spec` on the demo model, each mode against plain decoding
# in the same process, batch 1 and 8. The prompt sets come in the carry
# (.device-carry/specw, made here by `python3 tools/spec_bench/workloads.py
# .device-carry/specw 8`): the GPU image's Python library holds other files.
# Results: $OUT/spec_gpu.jsonl and the logs. A draft model in the carry:
# MODES="mtp draft:carry/demo.Q4_K_M.gguf" (carry/ is the unpacked carry;
# make it here with `lumen quantize models/demo .device-carry/...` before
# packing).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack
L=$C/bin/lumen
if [[ -x $C/bin/lumen_tests ]]; then
  log "speculation exactness, models on the GPU"
  LUMEN_TEST_DEVICE=cuda timeout 240 "$C/bin/lumen_tests" engine_spec 2>&1 | tee "$OUT/spec_tests.log" |
    grep -E "^(ok|FAIL|skip)|check failed|passed"
else
  log "no lumen_tests in the carry: the exactness tests left out"
fi
for B in ${BATCHES:-1 8}; do
  for w in code chat edit; do
    for mode in ${MODES:-lookup mtp auto}; do
      mode=${mode//carry\//$C/}
      j=$(timeout 120 "$L" bench -m models/demo --device cuda --spec "$mode" --prompts "$C/specw/$w.jsonl" \
          --gen 128 --reps "${REPS:-3}" --batch "$B" 2>"$OUT/spec.err" | tail -n 1)
      [[ $j == "{"* ]] || { echo "$w $mode B=$B: failed: $(tail -n 2 "$OUT/spec.err")"; continue; }
      echo "{\"workload\":\"$w\",${j:1}" >> "$OUT/spec_gpu.jsonl"
      echo "$w $mode B=$B: $(grep -oE '"(speedup|speedup_median|plain_tok_s|spec_tok_s|same_tokens)":[^,]*' <<< "$j" | tr '\n' ' ')"
    done
  done
done
log done
