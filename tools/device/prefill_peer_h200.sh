#!/usr/bin/env bash
# prefill_peer_h200.sh - issue #26's 4,096-token prefill of a random
# Llama-3.1-8B Q4_K_M GGUF (and #34's of the same shape in bf16, exact
# mode, 4k and 32k) on one H200 against llama.cpp built from the source
# node-llama-cpp 3.21.1 bundles (built in the background meanwhile). lumen's
# default alternates with AB (default LUMEN_CUDA_ATT_BF16=0: the TF32
# attention kernel) ROUNDS times (2); batch-1 decode once; llama-bench
# pp4096 / tg128 (Q4_K_M) and pp4096 / pp32768 (bf16); lumen's Q4_K_M
# prefill again after it. BF16=0 leaves the bf16 file out. ~8 minutes.
# Carry .device-carry from
#   LUMEN_DEVICE_BINS=lumen LUMEN_DEVICE_FIXTURES=gguf/llama-g256 tools/device/pack.sh
# plus /work/keep/llamacpp-src.tar.xz copied into it (see quant_peer.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_llamacpp_cuda
dev_unpack cublas
mount -o remount,size=100G /dev/shm 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
L=$C/bin/lumen
q=/dev/shm/l8.Q4_K_M.gguf; b=/dev/shm/l8.bf16.gguf
dev_random_gguf $q q4km
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
pre() { local f=$1 n=$2; shift 2; env "$@" "$L" bench -m $f --device cuda --prompt-len $n --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | pick prefill_tok_s; }
AB=${AB:-LUMEN_CUDA_ATT_BF16=0}
for r in $(seq "${ROUNDS:-2}"); do log "round $r Q4_K_M prefill 4096: default $(pre $q 4096) / $AB $(pre $q 4096 $AB) tok/s"; done
log "Q4_K_M decode batch 1: $("$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 --no-membw 2>&1 | pick decode_tok_s) tok/s"
if [[ ${BF16:-1} == 1 ]]; then
  dev_random_gguf $b bf16
  for r in $(seq "${ROUNDS:-2}"); do
    log "round $r bf16 exact prefill 4096: default $(pre $b 4096) / $AB $(pre $b 4096 $AB); 32768: $(pre $b 32768) / $(pre $b 32768 $AB) tok/s"
  done
fi
log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"
log "llama.cpp 8B Q4_K_M: prefill 4096, decode 128"
"$LB/llama-bench" -o md -m $q -ngl 99 -fa 1 -p 4096 -n 128 -r 2 2>/dev/null | grep -E "^\| [a-z]"
if [[ ${BF16:-1} == 1 ]]; then
  log "llama.cpp 8B bf16: prefill 4096, 32768"
  "$LB/llama-bench" -o md -m $b -ngl 99 -fa 1 -p 4096,32768 -n 0 -r 2 2>/dev/null | grep -E "^\| [a-z]"
fi
log "lumen after the peer: Q4_K_M prefill 4096 $(pre $q 4096) tok/s"
log done
