#!/usr/bin/env bash
# gemv_tc_h200.sh - issue #34's small-batch decode on one GPU: the default
# bf16 GEMV (CUDA cores) against the tensor-core tiles
# (LUMEN_CUDA_GEMV_TC=1: 5-8 tokens in main; every T in the reverted forms of
# docs/history/34-gemv-tensor-cores.md), and llama.cpp on the same random
# Llama-3.1-8B bf16 GGUF in the same call.
#   1. llama.cpp (the source node-llama-cpp 3.21.1 bundles) builds in the
#      background while the GPU tests run: the GEMV and matmul op tests, the
#      models and graphs against the CPU, the engine's exactness tests with
#      the models on the GPU
#   2. lumen bench at batch 1 2 4 8 16 per form, alternating (ROUNDS)
#   3. llama-batched-bench at the same batches
#   4. bench_cuda_gemv's GEMV table (GB/s of weight bytes against the copy)
#      per form
# Carry .device-carry from LUMEN_DEVICE_BINS="lumen lumen_tests"
# LUMEN_DEVICE_KERNEL_BENCH=1 LUMEN_DEVICE_FIXTURES=gguf/llama-g256/model.Q4_K_M.gguf
# tools/device/pack.sh, plus /work/keep/llamacpp-src.tar.xz copied into it.
set -uo pipefail
source tools/device/lib.sh
dev_unpack
L=$C/bin/lumen; G=/dev/shm/l8.bf16.gguf
field() { grep -oE "\"$1\":[0-9.e+-]*" | head -n 1; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
[[ ${PEER:-1} == 1 ]] && dev_llamacpp_cuda llama-batched-bench
log "random Llama-3.1-8B bf16 GGUF"
dev_random_gguf $G bf16
if [[ ${TESTS:-1} == 1 ]]; then
  for f in cuda_gemv cuda_matmul cuda_fused cuda_moe cuda_graphs cuda_model; do
    log "tests $f"
    timeout 200 "$C/bin/lumen_tests" $f 2>&1 | tee -a "$OUT/tests.log" | grep -E "FAIL|check failed|passed|bitwise|DIFF" | tail -n 12
  done
  log "suite 'engine' with the models on the GPU"
  LUMEN_TEST_DEVICE=cuda timeout 150 "$C/bin/lumen_tests" engine 2>&1 | tee "$OUT/engine.log" |
    grep -E "FAIL|check failed|passed" | tail -n 12
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  for B in ${BATCHES:-1 2 4 8 16}; do
    for v in 1 0; do
      echo -n "round $r gemv_tc=$v batch $B "
      LUMEN_CUDA_GEMV_TC=$v timeout 120 "$L" bench -m $G --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw 2>&1 |
        tail -n 1 | field decode_tok_s
    done
  done
done | tee "$OUT/decode.log"
if [[ ${PEER:-1} == 1 ]]; then
  log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"
  log "llama-batched-bench"
  "$LB/llama-batched-bench" -m $G -ngl 99 -fa 1 -c 8192 -npp 32 -ntg 64 -npl 1,2,4,8,16 2>/dev/null | grep -E "^\|" |
    tee "$OUT/llama.log"
fi
if [[ ${KERNELS:-1} == 1 ]]; then
  for v in LUMEN_CUDA_GEMV_TC=0 LUMEN_CUDA_GEMV_TC=1; do
    log "bench_cuda_gemv $v"
    env $v timeout 120 "$C/bin/bench_cuda_gemv" 2>&1 | grep -E "^gemv|^copy" | tee -a "$OUT/kernels.log"
  done
fi
log done
