#!/usr/bin/env bash
# prefill_step_h200.sh - where a 4,096-token prefill of a random
# Llama-3.1-8B Q4_K_M goes on one H200 (issue #26's 2x goal): prefill tok/s
# in the default and bf16 modes, the same with kinds of kernels left out
# (LUMEN_CUDA_SKIP, timing only), KNOBS="VAR=V,VAR2=V2 ..." alternated with
# the default, and one chunk's kernels under ncu summed by name (NCU=1);
# NCU_ATT=1: the tiled attention's first launch in each mode under ncu's
# main sections (stalls, pipes, occupancy).
# TESTS=1 first runs lumen_tests TEST_FILTER (cuda) and parity on the GPU.
# Carry .device-carry from
#   LUMEN_DEVICE_BINS="lumen lumen_tests" LUMEN_DEVICE_FIXTURES="gguf/llama-g256 llama qwen3" tools/device/pack.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack cublas
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
L=$C/bin/lumen
if [[ ${TESTS:-0} == 1 ]]; then
  log "GPU tests (${TEST_FILTER:-cuda})"
  timeout 300 "$C/bin/lumen_tests" ${TEST_FILTER:-cuda} 2>&1 | tee "$OUT/cuda_tests.log" | grep -E "FAIL|passed|DIFFERS|check failed" | head -40
  log "parity on the GPU"
  for d in "$C"/fixtures/models/*/; do "$L" parity "$d" --device cuda 2>&1 | tail -n 1 | cut -c1-200; done
fi
q=/dev/shm/l8.Q4_K_M.gguf
dev_random_gguf $q q4km
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
pre() { env "${@:2}" "$L" bench -m $q --device cuda --prompt-len "$1" --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | pick prefill_tok_s; }
P=${PLEN:-4096}
for r in 1 2; do
  line="round $r prefill $P: default $(pre $P) / bf16 $(pre $P LUMEN_CUDA_GEMM=bf16)"
  for k in ${KNOBS:-}; do line="$line / $k $(pre $P ${k//,/ })"; done
  log "$line tok/s"
done
for s in ${SKIPS-attention gemm gemm_split norm rope_kv attention,gemm}; do
  log "  without $s: $(pre $P LUMEN_CUDA_SKIP=$s) tok/s"
done
if [[ ${NCU:-1} == 1 ]]; then
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    "$L" bench -m $q --device cuda --prompt-len $P --chunk 4096 --gen 1 --reps 1 --no-membw --no-look-ahead > "$OUT/ncu_prefill.csv" 2>/dev/null
  python3 tools/device/ncu_agg.py "$OUT/ncu_prefill.csv" 30
fi
if [[ ${NCU_ATT:-0} == 1 ]]; then # the tiled attention's first launch in each mode, ncu's main sections
  for mode in exact bf16; do
    log "ncu: tiled attention, $mode mode"
    env $([[ $mode == bf16 ]] && echo LUMEN_CUDA_GEMM=bf16) timeout 200 ncu --clock-control none -k regex:att_bf_kernel -c 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section InstructionStats \
      "$L" bench -m $q --device cuda --prompt-len $P --chunk 4096 --gen 1 --reps 1 --no-membw --no-look-ahead 2>&1 |
      grep -vE "^==PROF==|^ *-{5,}|^\{" | grep -E "  [A-Z]" | head -80
  done
fi
log done
