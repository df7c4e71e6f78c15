#!/usr/bin/env bash
# fp8_h200.sh - issue #26's FP8 weights on the GPU, one H200 call (~5
# minutes): the GPU tests of the quantised types (FP8_B128 among them) and
# of an FP8 checkpoint against the CPU, then a random Llama-3.1-8B in bf16
# (make_random_model) and the same weights as a Hugging Face FP8 checkpoint
# (tools/device/fp8_model.py: e4m3, 128x128 f32 scales), alternating:
# decode batch 1, batch 32, 4k prefill. Carry .device-carry from
#   LUMEN_DEVICE_FIXTURES=gguf/llama-g256 tools/device/pack.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
log "GPU tests"
timeout 240 "$C/bin/lumen_tests" cuda_q hf_quant_cuda 2>&1 | tee -a "$OUT/tests.log" |
  grep -E "FAIL|passed|check failed|FP8 on the GPU|bad outputs" | head -40
L=$C/bin/lumen; b=/dev/shm/l8-bf16; f=/dev/shm/l8-fp8
"$C/bin/make_random_model" $b --shape llama-3.1-8b --threads 16 >/dev/null || exit 1
mkdir -p $f && python3 tools/device/fp8_model.py $b $f || exit 1
log "sizes: $(du -sh $b | cut -f1) bf16, $(du -sh $f | cut -f1) fp8"
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
dec() { "$L" bench -m "$1" --device cuda --prompt-len 128 --gen 128 --reps 3 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*|"decode_pct_of_copy":[0-9.]*' | tr '\n' ' '; }
bat() { "$L" bench -m "$1" --device cuda --batch 32 --prompt-len 32 --gen 64 --no-membw 2>&1 | pick decode_tok_s; }
pre() { "$L" bench -m "$1" --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | pick prefill_tok_s; }
for round in 1 2; do
  for m in $b $f; do
    log "round $round $(basename $m): decode $(dec $m)| batch 32 $(bat $m) | 4k prefill $(pre $m) tok/s"
  done
done
log done
