#!/usr/bin/env bash
# disk_tier_h200.sh - issue #31's disk-tier benchmark on the GPU machine:
# TTFT of a repeated 8k and 32k prompt after a restart (served from
# --cache-dir, page cache dropped) against cold prefill and a RAM hit, and
# the disk's sequential read rate, all in one run (tools/disk_cache_ttft.sh
# does each), for random models of the Llama-3.1-8B and Qwen3.5-27B shapes.
#
#   bash tools/device/disk_tier_h200.sh
#
# Carry: LUMEN_DEVICE_FIXTURES="tokenizers/llama3 tokenizers/qwen3" bash tools/device/pack.sh
# (random weights have no tokenizer, and `lumen serve` needs one: the
# shape's own is copied in; the prompts are token ids).
# Environment: SHAPES (shape:tokenizer[:layers] ..., default
# "llama-3.1-8b:llama3 qwen3.5-27b:qwen3:16": 16 of the 27B's 64 layers,
# so that weights and the cache fit the machine's disk), TOKENS (default
# "8192 32768"), DEVICE (cuda), BIN (the binaries; default the carry's),
# WORK (where models and caches go; default /tmp).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [[ -z ${BIN:-} ]]; then
  dev_unpack
  BIN=$C/bin
  TOK=$C/fixtures/tokenizers
else
  TOK=${TOK:-../shared/fixtures/tokenizers}
fi
SHAPES=${SHAPES:-llama-3.1-8b:llama3 qwen3.5-27b:qwen3:16}
TOKENS=${TOKENS:-8192 32768}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp}
log "disk: $(df -h "$WORK" | tail -n 1)"
for spec in $SHAPES; do
  IFS=: read -r shape tok layers <<<"$spec"
  dir=$WORK/rand-$shape
  rm -rf "$dir"
  log "making $shape${layers:+ ($layers layers)}"
  "$BIN/make_random_model" "$dir" --shape "$shape" ${layers:+--layers "$layers"} | tail -n 1
  cp "$TOK/$tok"/tokenizer*.json "$dir/"
  for n in $TOKENS; do
    log "$shape: $n tokens"
    # the same prefill with no prefix cache and no disk tier: what the cold
    # TTFT below pays beyond it is the disk tier's copies (and HTTP)
    "$BIN/lumen" bench -m "$dir" --device "$DEVICE" --prompt-len "$n" --gen 2 --reps 1 --no-membw 2>/dev/null |
      tail -n 1 | grep -oE '"prefill_(tok_s|ms)":[^,]*' | tr '\n' ' ' || true
    echo
    # KV and checkpoints of n tokens fit twice over (bf16 KV)
    bash tools/disk_cache_ttft.sh --bin "$BIN/lumen" --model "$dir" --tokens "$n" --drop-caches --no-cold2 \
      --work "$WORK" --cache-disk 16G --serve-args "--device $DEVICE --ctx $((n + 16)) --parallel 1" ||
      log "$shape at $n tokens failed"
  done
  rm -rf "$dir"
done
log done
