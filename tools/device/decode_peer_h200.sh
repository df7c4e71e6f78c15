#!/usr/bin/env bash
# decode_peer_h200.sh - issue #26's batch-1 decode of a random
# Llama-3.1-8B Q4_K_M GGUF (tools/make_random_gguf.py) on one H200 against
# llama.cpp built from the source node-llama-cpp 3.21.1 bundles (built in
# the background meanwhile): the GPU op tests and the FP8 / MLX affine
# models on the GPU first (TESTS=0 leaves them out), then lumen's default
# and the env settings in AB (default: the staged GEMV's old 16 KiB stages)
# alternating ROUNDS times (3), llama-bench tg128 / pp4096, and lumen again
# after it. ~7 minutes.
# Carry .device-carry from
#   LUMEN_DEVICE_BINS="lumen lumen_tests" LUMEN_DEVICE_FIXTURES=gguf/llama-g256 tools/device/pack.sh
# plus /work/keep/llamacpp-src.tar.xz copied into it (see quant_peer.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_llamacpp_cuda
dev_unpack cublas
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [[ ${TESTS:-1} == 1 ]]; then
  log "GPU op tests"
  timeout 240 "$C/bin/lumen_tests" cuda 2>&1 | tee "$OUT/cuda_tests.log" | grep -E "^FAIL|passed|DIFFERS" | head -30
  log "FP8 and MLX affine checkpoints on the GPU"
  timeout 200 "$C/bin/lumen_tests" hf_quant_cuda 2>&1 | tee "$OUT/hf_quant_cuda.log" | grep -E "on the GPU|FAIL|passed|check failed"
fi
L=$C/bin/lumen; q=/dev/shm/l8.Q4_K_M.gguf
dev_random_gguf $q q4km
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
dec() { env "$@" "$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 --no-membw 2>&1 | pick decode_tok_s; }
AB=${AB:-LUMEN_CUDA_QSTAGED_STAGE=16}
for r in $(seq "${ROUNDS:-3}"); do log "round $r: default $(dec) / $AB $(dec $AB) tok/s"; done
for n in 2 8; do log "batch $n: $("$L" bench -m $q --device cuda --batch $n --prompt-len 32 --gen 64 --no-membw 2>&1 | pick decode_tok_s) tok/s"; done
log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"
log "llama.cpp 8B Q4_K_M: decode 128, prefill 4096"
"$LB/llama-bench" -o md -m $q -ngl 99 -fa 1 -p 4096 -n 128 -r 3 2>/dev/null | grep -E "^\| [a-z]"
log "lumen after the peer: default $(dec) / $AB $(dec $AB) tok/s"
"$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*|"decode_pct_of_copy":[0-9.]*|"copy_GB_s":[0-9.]*' | tr '\n' ' '; echo
log done
