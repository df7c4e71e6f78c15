#!/usr/bin/env bash
# qgemv_i8.sh - issue #26 on one H200 in one call: the quantised GEMVs with
# int8 activations (cuda_qgemv_cs.cu for 1-2 tokens, cuda_qgemv.cu's int8
# form above) against the exact f32 one (LUMEN_CUDA_QUANT_EXACT=1). Carry
# .device-carry from
#   LUMEN_DEVICE_KERNEL_BENCH=1 LUMEN_DEVICE_FIXTURES="gguf/llama-g256/model.Q4_K_M.gguf ..." bash tools/device/pack.sh
# Runs: the GPU op tests (also with the column-stationary kernel off,
# LUMEN_CUDA_QGEMV_ROWS=0); bench_cuda_gemv's quantised GEMVs (GB/s of the
# stored bytes against the copy) by mode; a random Llama-3.1-8B Q4_K_M GGUF
# decoded at batch 1 and 8 by mode and rows a block; with NCU=1, each
# kernel of one decode step timed by ncu (graphs off).
set -uo pipefail
root=$PWD; C=$root/.device-carry; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; t0=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - t0))s] $*"; }
log "GPU op tests"; bash tools/device/gpu_run.sh cuda | grep -E "FAIL|passed|int8|experts, 1 tok" 
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LUMEN_FIXTURES=$C/fixtures LUMEN_FIXTURES_PARTIAL=1
log "GPU quant tests, LUMEN_CUDA_QGEMV_ROWS=0"; LUMEN_CUDA_QGEMV_ROWS=0 "$C/bin/lumen_tests" cuda_q 2>&1 | grep -E "FAIL|passed|check failed"
L=$C/bin/lumen
for env in "" LUMEN_CUDA_QGEMV_ROWS=0 LUMEN_CUDA_QUANT_EXACT=1; do
  log "kernels $env"; env $env "$C/bin/bench_cuda_gemv" 0 quant 2>&1 | grep -E "copy|qgemv .* [12]  " | tee -a "$OUT/kernels.log"
done
q=/dev/shm/l8.Q4_K_M.gguf
python3 tools/make_random_gguf.py "$C/fixtures/gguf/llama-g256/model.Q4_K_M.gguf" $q q4km 8b >/dev/null || exit 1
for env in LUMEN_CUDA_QGEMV_ROWS=16 LUMEN_CUDA_QGEMV_ROWS=8 LUMEN_CUDA_QGEMV_ROWS=32 LUMEN_CUDA_QGEMV_ROWS=0 LUMEN_CUDA_QUANT_EXACT=1; do
  log "8B Q4_K_M decode, $env"
  env $env "$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*|"decode_pct_of_copy":[0-9.]*'
  env $env "$L" bench -m $q --device cuda --batch 2 --prompt-len 32 --gen 64 --no-membw 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*'
done
if [[ -n ${NCU:-} ]]; then
  log "ncu: kernels of 8B Q4_K_M decode steps (graphs off)"
  LUMEN_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    "$L" bench -m $q --device cuda --prompt-len 8 --gen 4 --no-membw > "$OUT/ncu_q4km.csv" 2>/dev/null
  python3 tools/device/ncu_agg.py "$OUT/ncu_q4km.csv" 20
fi
log done
