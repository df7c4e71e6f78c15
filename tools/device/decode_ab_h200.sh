#!/usr/bin/env bash
# decode_ab_h200.sh - batch-1 decode of a random Llama-3.1-8B (Q4_K_M and
# bf16, tools/make_random_gguf.py) on one H200: bin/lumen_base (pack.sh's
# LUMEN_DEVICE_BASE_BIN) and bin/lumen alternating ROUNDS times (2), then
# the staged GEMV's knobs on Q4_K_M (SWEEP=1: LUMEN_CUDA_QSTAGED_STAGE /
# _INFLIGHT in KiB, timing only). TESTS=1 first runs the GPU op tests
# (lumen_tests cuda) and lumen parity --device cuda on the carried fixtures.
# BATCH="1 8" sets the batches (1); KNOBS="VAR=V,VAR2=V2 ..." alternates the
# default with each setting on Q4_K_M, NCU=1 adds one step's kernels under ncu;
# TEST_FILTER picks the tests (cuda); BF16=0 leaves the bf16 file out. ~6 minutes.
# Carry .device-carry from
#   LUMEN_DEVICE_BINS="lumen lumen_tests" LUMEN_DEVICE_BASE_BIN=OLD/lumen \
#   LUMEN_DEVICE_FIXTURES="gguf/llama-g256 qwen3 llama" tools/device/pack.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack cublas
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
L=$C/bin/lumen; B=$C/bin/lumen_base
if [[ ${TESTS:-1} == 1 ]]; then
  log "GPU op tests"
  timeout 240 "$C/bin/lumen_tests" ${TEST_FILTER:-cuda} 2>&1 | tee "$OUT/cuda_tests.log" | grep -E "FAIL|passed|DIFFERS|check failed" | head -40
  grep -E "fused .* the composed" "$OUT/cuda_tests.log" | head -4
  log "parity on the GPU"
  for d in "$C"/fixtures/models/*/; do "$L" parity "$d" --device cuda 2>&1 | tail -n 1 | cut -c1-200; done
fi
q=/dev/shm/l8.Q4_K_M.gguf; b=/dev/shm/l8.bf16.gguf
dev_random_gguf $q q4km
files=$q
if [[ ${BF16:-1} == 1 ]]; then dev_random_gguf $b bf16; files="$q $b"; fi
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
dec() { local bin=$1 f=$2 n=$3; shift 3; env "$@" "$bin" bench -m "$f" --device cuda --batch "$n" --prompt-len 32 --gen 128 --no-membw 2>&1 | pick decode_tok_s; }
for r in $(seq "${ROUNDS:-2}"); do
  for n in ${BATCH:-1}; do
    for f in $files; do
      [[ -x $B ]] && log "round $r batch $n $(basename $f): base $(dec $B $f $n) / new $(dec $L $f $n) tok/s"
    done
  done
done
if [[ -n ${KNOBS:-} ]]; then # the default against each setting of KNOBS (space-separated VAR=VALUE), alternating
  for r in $(seq "${ROUNDS:-2}"); do
    line="round $r Q4_K_M: default $(dec $L $q 1)"
    for k in $KNOBS; do line="$line / $k $(dec $L $q 1 ${k//,/ })"; done
    log "$line tok/s"
  done
fi
if [[ ${NCU:-0} == 1 ]]; then # one decode step's kernels (graphs off)
  LUMEN_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 2500 \
    "$L" bench -m $q --device cuda --batch 1 --prompt-len 16 --gen 4 --no-membw --no-look-ahead > "$OUT/ncu_q.csv" 2>/dev/null
  python3 tools/device/ncu_step.py "$OUT/ncu_q.csv"
fi
if [[ ${SWEEP:-1} == 1 ]]; then
  for st in 16 24 32 48; do
    for inf in 64 96 128; do
      log "Q4_K_M stage $st KiB, in flight $inf KiB: $(dec $L $q 1 LUMEN_CUDA_QSTAGED_STAGE=$st LUMEN_CUDA_QSTAGED_INFLIGHT=$inf) tok/s"
    done
  done
  for bl in 1 3; do log "Q4_K_M $bl blocks an SM: $(dec $L $q 1 LUMEN_CUDA_QSTAGED_BLOCKS=$bl) tok/s"; done
fi
log done
