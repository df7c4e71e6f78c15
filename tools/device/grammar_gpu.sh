#!/usr/bin/env bash
# grammar_gpu.sh - issue #32 on the GPU machine: grammar masks computed
# while the forward runs (mask_ahead) against after it, and decode with and
# without a grammar, through tools/bench_grammar.c on the GPU: the demo
# model (a 4,096-token vocabulary), then a random Qwen3-8B-shaped model
# (8 of 36 layers) with the Qwen3 tokenizer copied in, where a mask is over
# 151,669 ids, at REQUESTS constrained requests at once (default "1 8 32").
#
# Carry: LUMEN_DEVICE_GRAMMAR_BENCH=1 LUMEN_DEVICE_FIXTURES="tokenizers/qwen3" bash tools/device/pack.sh
# The GPU tests of the engine's grammar requests run first
# (LUMEN_TEST_DEVICE=cuda lumen_tests engine_grammar). Elsewhere: BIN (the
# binaries, default the carry's), DEVICE (cuda), REQUESTS ("" leaves the
# Qwen3-shaped model out), LAYERS (its layers, default 8), DEMO (0 leaves
# the demo out), FULL (1: every part of the bench on the Qwen3-shaped
# model, decode with and without a grammar included, at one request).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [[ -z ${BIN:-} ]]; then
  dev_unpack
  BIN=$C/bin
  TOK=$C/fixtures/tokenizers/qwen3
else
  TOK=${TOK:-../shared/fixtures/tokenizers/qwen3}
fi
B=$BIN
DEVICE=${DEVICE:-cuda}
REQUESTS=${REQUESTS-1 8 32}
if [[ -x $B/lumen_tests ]]; then
  log "tests"
  LUMEN_TEST_DEVICE=$DEVICE "$B/lumen_tests" engine_grammar 2>&1 | tail -n 5
else
  log "no lumen_tests in the carry: the tests left out"
fi
if [[ -d models/demo && ${DEMO:-1} != 0 ]]; then
  log "demo model"
  "$B/bench_grammar" --tokenizer "$TOK" --device "$DEVICE" --requests 8 2>&1 | tail -n 16
fi
[[ -n $REQUESTS ]] || exit 0
dir=/tmp/rand-qwen3-8b
LAYERS=${LAYERS:-8}
"$B/make_random_model" "$dir" --shape qwen3-8b --layers "$LAYERS" | tail -n 1
cp "$TOK"/tokenizer*.json "$dir/"
if [[ ${FULL:-0} == 1 ]]; then
  log "qwen3-8b shape ($LAYERS layers), every part, one request"
  "$B/bench_grammar" --tokenizer "$TOK" --model "$dir" --device "$DEVICE" --requests 1 2>&1 | tail -n 20
  REQUESTS=
fi
for n in $REQUESTS; do
  log "qwen3-8b shape ($LAYERS layers), $n requests"
  "$B/bench_grammar" --tokenizer "$TOK" --model "$dir" --device "$DEVICE" --requests "$n" --only-ahead 1 2>&1 |
    tail -n 5
done
log done
