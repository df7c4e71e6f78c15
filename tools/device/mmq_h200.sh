#!/usr/bin/env bash
# mmq_h200.sh - issue #26's int8 tensor-core GEMM over quantised weights
# (src/backend/cuda/cuda_mmq.cu) on one H200 in one call (~8 minutes):
# the quantised GPU tests, then a random Llama-3.1-8B Q4_K_M GGUF
# (tools/make_random_gguf.py) through lumen: where the int8 GEMM and the
# widened bf16 product cross (SWEEP=1: batches 64-256, prefill chunks
# 128-4096), the defaults against the path before (LUMEN_CUDA_MMQ=0
# LUMEN_CUDA_QUANT_EXACT=1: weights widened to bf16, x in three bf16 terms),
# alternating: batched decode 16 / 32 / 64 / 128 and 4k prefill; and
# llama.cpp built from the source node-llama-cpp 3.21.1 bundles (built in
# the background meanwhile; PEER=0 leaves it out): llama-bench pp4096 /
# tg128 and llama-batched-bench at 1-128. TESTS=0 leaves the tests out,
# ROUNDS=n sets the alternating rounds (2).
# Carry .device-carry from
#   LUMEN_DEVICE_BINS="lumen lumen_tests" LUMEN_DEVICE_FIXTURES=gguf/llama-g256 tools/device/pack.sh
# plus /work/keep/llamacpp-src.tar.xz copied into it (see quant_peer.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LC=/tmp/lc; LB=$LC/b/bin
PEER=${PEER:-1}
bp=
if [[ $PEER == 1 ]]; then
  mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
  (cd $LC && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
     -DCMAKE_BUILD_TYPE=Release && cmake --build b -j14 --target llama-bench llama-batched-bench) > "$OUT/lc_build.log" 2>&1 &
  bp=$!
fi
dev_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
[[ ${TESTS:-1} == 1 ]] && log "GPU quant tests" &&
timeout 240 "$C/bin/lumen_tests" cuda_q 2>&1 | tee -a "$OUT/cuda_q.log" | grep -E "FAIL|passed|check failed|prompt:|bad outputs" | head -60
L=$C/bin/lumen; q=/dev/shm/l8.Q4_K_M.gguf
dev_random_gguf $q q4km
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
bat() { env "${@:2}" "$L" bench -m $q --device cuda --batch "$1" --prompt-len 32 --gen 64 --no-membw 2>&1 | pick decode_tok_s; }
pre() { env "${@:2}" "$L" bench -m $q --device cuda --prompt-len 4096 --chunk "$1" --gen 4 --reps 2 --no-membw 2>&1 | pick prefill_tok_s; }
if [[ ${SWEEP:-1} == 1 ]]; then # where the int8 GEMM and the widened bf16 product cross (tokens a forward)
  for B in 64 128 256; do
    log "batch $B: int8 GEMM $(bat $B LUMEN_CUDA_MMQ_MAX_T=100000) / widened, bf16 x $(bat $B LUMEN_CUDA_MMQ=0) tok/s"
  done
  for ch in 128 256 512 4096; do
    log "prefill 4096 in chunks of $ch: int8 GEMM $(pre $ch LUMEN_CUDA_MMQ_MAX_T=100000) / widened, bf16 x $(pre $ch LUMEN_CUDA_MMQ=0) tok/s"
  done
  log "batch 32: NT 8 $(bat 32 LUMEN_CUDA_MMQ_NT=8), 8 blocks an SM / split 8 $(bat 32 LUMEN_CUDA_MMQ_PER_SM=8 LUMEN_CUDA_MMQ_SPLIT=8), default $(bat 32) tok/s"
  log "batch 16: 8 blocks an SM / split 8 $(bat 16 LUMEN_CUDA_MMQ_PER_SM=8 LUMEN_CUDA_MMQ_SPLIT=8), default $(bat 16) tok/s"
fi
for B in 12 16; do log "batch $B: 16-token tiles (default) $(bat $B) / 32-token tiles $(bat $B LUMEN_CUDA_MMQ_NT=4) tok/s"; done
for round in $(seq "${ROUNDS:-2}"); do
  for B in 16 32 64 128; do
    log "round $round batch $B: default $(bat $B) / before (widened, three x terms) $(bat $B LUMEN_CUDA_MMQ=0 LUMEN_CUDA_QUANT_EXACT=1) tok/s"
  done
  log "round $round 4k prefill: default $(pre 4096) / before $(pre 4096 LUMEN_CUDA_MMQ=0 LUMEN_CUDA_QUANT_EXACT=1) tok/s"
done
log "batch 8 (the GEMV, unchanged): $(bat 8)"
log "decode batch 1: $("$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 2>&1 | pick decode_tok_s) tok/s"
[[ $PEER == 1 ]] || { log done; exit 0; }
log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"
log "llama.cpp 8B Q4_K_M: prefill 4096, decode 128"
"$LB/llama-bench" -o md -m $q -ngl 99 -fa 1 -p 4096 -n 128 -r 2 2>/dev/null | grep -E "^\| [a-z]"
log "llama.cpp batched (S_TG: decode tok/s)"
"$LB/llama-batched-bench" -m $q -ngl 99 -fa 1 -c 20000 -npp 32 -ntg 64 -npl 1,8,12,16,32,64,128 2>/dev/null | grep -E "^\|"
for B in 12 16 32 64 128; do log "after the peer, batch $B: int8 GEMM $(bat $B) tok/s"; done
log "after the peer, 4k prefill: $(pre 4096) tok/s"
log done
