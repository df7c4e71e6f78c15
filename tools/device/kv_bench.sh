#!/usr/bin/env bash
# kv_bench.sh - issue #29 on one H200 in one call (about 6 minutes): the
# KV-format GPU tests (op tests against the CPU, then the engine's
# batched == solo and cached == cold tests per format with models on the
# GPU), then batch-1 decode tok/s of the Llama-3.1-8B and Qwen3.5-27B shapes
# (random bf16 models, tools/make_random_model.c, in /dev/shm) at 4k, 32k
# and 128k context (CTXS) per KV format, with the KV bytes a token and the largest
# context (batch 1) and batch (at 32k) that fit the GPU beside the weights.
# Decode runs with `lumen bench --batch 1 --no-prefill`: the context is
# there as allocated (zeros), read in full each step, without spending
# minutes of prefill on it. Carry .device-carry from tools/device/pack.sh
# (fixtures: LUMEN_DEVICE_FIXTURES="llama qwen3" is enough). Results:
# $OUT/kv_bench.jsonl (one bench line each, tagged) and the log.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack
L=$C/bin/lumen
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
(( $(df --output=size -BG /dev/shm | tail -n 1 | tr -dc 0-9) < 80 )) && mount -o remount,size=80G /dev/shm

# the models are written in the background while the tests run
# SHAPES="l8" leaves the 27B shape out (a shorter call)
SHAPES=${SHAPES:-l8 q27}
( [[ -f /dev/shm/l8/model.safetensors ]] || "$C/bin/make_random_model" /dev/shm/l8 --shape llama-3.1-8b --threads 12
  [[ $SHAPES != *q27* || -f /dev/shm/q27/model.safetensors ]] ||
    "$C/bin/make_random_model" /dev/shm/q27 --shape qwen3.5-27b --threads 12
) > "$OUT/models.log" 2>&1 &
mk=$!
log "GPU tests: KV formats against the CPU"
timeout 120 "$C/bin/lumen_tests" cuda_kv 2>&1 | tee "$OUT/cuda_kv.log" | grep -E "^(ok|FAIL|skip)|check failed|passed"
timeout 60 "$C/bin/lumen_tests" cuda_attention 2>&1 | tee -a "$OUT/cuda_kv.log" | grep -E "^FAIL|check failed|passed"
log "engine tests per KV format, models on the GPU"
LUMEN_TEST_DEVICE=cuda timeout 120 "$C/bin/lumen_tests" _kv_ 2>&1 | tee "$OUT/engine_kv.log" | grep -E "^(ok|FAIL|skip)|check failed|passed"
log "waiting for the random models"; wait $mk || { cat "$OUT/models.log"; exit 1; }

free_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
bench() { # bench TAG MODEL KV CTX (env BLK: LUMEN_CUDA_ATT_BLOCKS_SM)
  local j
  j=$(LUMEN_CUDA_ATT_BLOCKS_SM=${BLK:-} "$L" bench -m "$2" --device cuda --kv-type "$3" --batch 1 --prompt-len "$4" --gen 32 --no-prefill --no-membw \
      2>"$OUT/bench.err" | tail -n 1)
  [[ $j == "{"* ]] || { echo "$1 $3 ctx $4: failed: $(tail -n 2 "$OUT/bench.err")"; return; }
  echo "{\"tag\":\"$1\",\"ctx\":$4,${j:1}" >> "$OUT/kv_bench.jsonl"
  echo "$1 $3 ctx $4: $(grep -oE '"decode_tok_s":[0-9.]*|"kv_bytes_per_token":[0-9]*' <<< "$j" | tr '\n' ' ')"
}
fits() { # fits TAG MODEL_BYTES KV_BYTES_PER_TOKEN: the largest batch-1 context and batch at 32k in 90 % of the GPU
  python3 -c "
t=$free_gib*2**20*0.9-$2; b=$3
print('$1: KV %d B/token; fits %d tokens at batch 1, batch %d at 32k' % (b, t//b, t//(b*32768)))"
}
for kv in f32 bf16; do # prefill over each cache format (the tensor-core attention reads it)
  log "l8 prefill 4096, KV $kv"
  "$L" bench -m /dev/shm/l8 --device cuda --kv-type $kv --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 |
    tail -n 1 | grep -oE '"prefill_tok_s":[0-9.]*'
done
for shape in $SHAPES; do
  wbytes=$(stat -c %s /dev/shm/$shape/model.safetensors)
  for kv in bf16 q8 q4r q4 f32; do
    for ctx in ${CTXS:-4096 32768 131000}; do
      [[ $kv == f32 && $ctx == 131000 && $shape == l8 ]] && continue # 32 GiB of f32 KV: measured at 4k and 32k
      [[ $kv == q4 && $ctx != 32768 ]] && continue                   # plain q4: one point, for its cost
      bench $shape /dev/shm/$shape $kv $ctx
    done
    per=$(grep "\"tag\":\"$shape\"" "$OUT/kv_bench.jsonl" | grep "\"kv\":\"$kv\"" | head -n 1 |
          grep -oE '"kv_bytes_per_token":[0-9]*' | cut -d: -f2)
    [[ -n $per ]] && fits "$shape $kv" "$wbytes" "$per"
  done
done
# BLOCKS="4 8": the 32k points again with the decode attention's split
# target at that many blocks an SM (default 2)
for shape in $SHAPES; do
  for b in ${BLOCKS:-}; do
    for kv in bf16 q8 q4r f32; do BLK=$b bench "$shape-blk$b" /dev/shm/$shape $kv 32768; done
  done
done
log done
