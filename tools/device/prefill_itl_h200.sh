#!/usr/bin/env bash
# prefill_itl_h200.sh - issue #34: a 32k-token prompt on a GPU server
# (random Llama-3.1-8B bf16 GGUF): its time to first token alone and beside
# 4 decoding streams, and the streams' gaps meanwhile, per --prefill-tokens
# (PTS, default "512 4096": the budget before it existed, and the GPU
# default). tools/device/prefill_itl.py is the client.
# Carry .device-carry from LUMEN_DEVICE_BINS=lumen
# LUMEN_DEVICE_FIXTURES=gguf/llama-g256/model.Q4_K_M.gguf tools/device/pack.sh.
set -uo pipefail
source tools/device/lib.sh
dev_unpack
G=/dev/shm/l8.bf16.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
dev_random_gguf $G bf16
for r in $(seq 1 "${ROUNDS:-1}"); do
  for pt in ${PTS:-512 4096}; do
    log "round $r --prefill-tokens $pt"
    "$C/bin/lumen" serve -m $G --device cuda --port 18555 --parallel 5 --ctx 33000 --cache-ram 0 --quiet \
      --prefill-tokens $pt > "$OUT/serve_$pt.log" 2>&1 &
    sp=$!
    for i in $(seq 1 120); do curl -sf http://127.0.0.1:18555/health >/dev/null && break; sleep 1; done
    timeout 150 python3 tools/device/prefill_itl.py http://127.0.0.1:18555 --long ${LONG:-32768} --gen ${GEN:-2048} \
      --delay 2 2>&1
    kill $sp; wait $sp
  done
done
log done
