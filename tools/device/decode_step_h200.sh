#!/usr/bin/env bash
# decode_step_h200.sh - where a batch-1 decode step of a random
# Llama-3.1-8B goes on one H200 (issue #26's 640 tok/s goal), Q4_K_M against
# the same shape in bf16 (tools/make_random_gguf.py): decode tok/s, the
# graph's host and device time (LUMEN_CUDA_GRAPH_STATS), the step with
# kinds of kernels left out (LUMEN_CUDA_SKIP, timing only), and one step's
# kernels under ncu (graphs off; tools/device/ncu_step.py). BF16=0 leaves
# the bf16 file out, NCU=0 the profile. ~5 minutes.
# Carry .device-carry from
#   LUMEN_DEVICE_BINS=lumen LUMEN_DEVICE_FIXTURES=gguf/llama-g256 tools/device/pack.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
L=$C/bin/lumen
q=/dev/shm/l8.Q4_K_M.gguf; b=/dev/shm/l8.bf16.gguf
dev_random_gguf $q q4km
[[ ${BF16:-1} == 1 ]] && { dev_random_gguf $b bf16; }
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
dec() { env "${@:2}" "$L" bench -m "$1" --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>&1 | pick decode_tok_s; }
files=$q; [[ ${BF16:-1} == 1 ]] && files="$q $b"
for f in $files; do
  log "$(basename $f): decode $(dec $f) / $(dec $f) tok/s"
  LUMEN_CUDA_GRAPH_STATS=1 "$L" bench -m $f --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>&1 | grep -iE "graph|host|decode_tok" | tail -n 4
  skips="gemv_n,gemv_glu,gemv_add,gemv_down" # the bf16 file: what is outside its GEMVs
  [[ $f == "$q" ]] && skips="attention rope_kv norm gemv_n gemv_glu gemv_add gemv_down $skips
      attention,rope_kv,norm,$skips"
  for s in $skips; do
    log "  without $s: $(dec $f LUMEN_CUDA_SKIP=$s) tok/s"
  done
  [[ $f == "$q" ]] && log "  graphs off: $(dec $f LUMEN_CUDA_GRAPHS=0) tok/s; exact activations: $(dec $f LUMEN_CUDA_QUANT_EXACT=1)"
  if [[ ${NCU:-1} == 1 ]]; then
    n=$(basename $f .gguf)
    LUMEN_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 2500 \
      "$L" bench -m $f --device cuda --batch 1 --prompt-len 16 --gen 4 --no-membw --no-look-ahead > "$OUT/ncu_$n.csv" 2>/dev/null
    python3 tools/device/ncu_step.py "$OUT/ncu_$n.csv"
  fi
done
log done
