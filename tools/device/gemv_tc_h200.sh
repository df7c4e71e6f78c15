#!/usr/bin/env bash
# gemv_tc_h200.sh - issue #34's small-batch decode on one GPU: GEMV forms
# compared on the same random Llama-3.1-8B bf16 GGUF, and llama.cpp in the
# same call. VARIANTS lists "BIN[:ENV=VALUE[+ENV=VALUE]]" (BIN under the carry's bin/;
# default: main's tensor-core tiles LUMEN_CUDA_GEMV_TC=1 against its CUDA
# cores, =0); KBENCH the bench_cuda_gemv binaries (default bench_cuda_gemv
# with each VARIANTS env).
#   1. llama.cpp (the source node-llama-cpp 3.21.1 bundles) builds in the
#      background while the GPU tests run (TESTS=1: every cuda_* op test,
#      the engine's exactness tests with the models on the GPU)
#   2. lumen bench at BATCHES (1 2 4 8 16) per variant, alternating (ROUNDS);
#      SKIP=1 adds the step without its GEMVs (LUMEN_CUDA_SKIP, timing only)
#      at each batch, first variant
#   3. bench_cuda_gemv's GEMV table (GB/s of weight bytes against the copy)
#   4. llama-batched-bench at the same batches (PEER=1)
# Carry .device-carry from LUMEN_DEVICE_BINS="lumen lumen_tests"
# LUMEN_DEVICE_KERNEL_BENCH=1 LUMEN_DEVICE_FIXTURES=gguf/llama-g256/model.Q4_K_M.gguf
# tools/device/pack.sh (LUMEN_DEVICE_BASE_BIN for a lumen_base), plus
# /work/keep/llamacpp-src.tar.xz copied into it.
set -uo pipefail
source tools/device/lib.sh
dev_unpack
G=/dev/shm/l8.bf16.gguf
field() { grep -oE "\"$1\":[0-9.e+-]*" | head -n 1; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
[[ ${PEER:-1} == 1 ]] && dev_llamacpp_cuda llama-batched-bench
log "random Llama-3.1-8B bf16 GGUF"
dev_random_gguf $G bf16
if [[ ${TESTS:-1} == 1 ]]; then
  log "tests cuda_*"
  timeout 300 "$C/bin/lumen_tests" cuda 2>&1 | tee -a "$OUT/tests.log" | grep -E "FAIL|check failed|passed|bitwise|DIFF" | tail -n 12
  log "suite 'engine' with the models on the GPU"
  LUMEN_TEST_DEVICE=cuda timeout 150 "$C/bin/lumen_tests" engine 2>&1 | tee "$OUT/engine.log" |
    grep -E "FAIL|check failed|passed" | tail -n 12
fi
VARIANTS=${VARIANTS:-lumen:LUMEN_CUDA_GEMV_TC=1 lumen:LUMEN_CUDA_GEMV_TC=0}
run_variant() { # VARIANT, then lumen bench's arguments
  local b=${1%%:*} e=; [[ $1 == *:* ]] && e=${1#*:}
  shift
  env ${e//+/ } timeout 120 "$C/bin/$b" bench -m $G --device cuda "$@" --prompt-len 32 --gen 64 --no-membw 2>&1 |
    tail -n 1 | field decode_tok_s
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for B in ${BATCHES:-1 2 4 8 16}; do
    for v in $VARIANTS; do
      echo "round $r $v batch $B $(run_variant $v --batch $B)"
    done
    if [[ $r == 1 && ${SKIP:-0} == 1 ]]; then
      v=${VARIANTS%% *}; [[ $v == *:* ]] && v=$v+ || v=$v:
      echo "round $r batch $B without GEMVs $(run_variant ${v}LUMEN_CUDA_SKIP=gemv_n,gemv_glu,gemv_add,gemv_down --batch $B)"
    fi
  done
done | tee "$OUT/decode.log"
if [[ ${KERNELS:-1} == 1 ]]; then
  for k in ${KBENCH:-$VARIANTS}; do
    b=${k%%:*} e=; [[ $k == *:* ]] && e=${k#*:}
    b=${b/lumen/bench_cuda_gemv} # lumen_base: bench_cuda_gemv_base
    log "$b $e"
    env ${e//+/ } timeout 120 "$C/bin/$b" 2>&1 | grep -E "^gemv|^copy" | tee -a "$OUT/kernels.log"
  done
fi
if [[ ${PEER:-1} == 1 ]]; then
  log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"
  log "llama-batched-bench"
  "$LB/llama-batched-bench" -m $G -ngl 99 -fa 1 -c 8192 -npp 32 -ntg 64 -npl $(echo ${BATCHES:-1 2 4 8 16} | tr " " ,) 2>/dev/null | grep -E "^\|" |
    tee "$OUT/llama.log"
fi
log done
