#!/usr/bin/env bash
# make_gguf_fixtures.sh - GGUF test files written by llama.cpp's own tools, made on the GPU
# machine (it has torch + transformers). Run from the checkout root with .fixgen/ carried:
#   .fixgen/llamacpp-src.tar.xz  the llama.cpp source node-llama-cpp 3.21.1 bundles (trimmed)
#   .fixgen/make_fixtures.py     ../shared/tools/make_fixtures.py (HF fixtures + transformers reference)
#   .fixgen/models/<name>/       HF fixtures to convert (config, model.safetensors, tokenizer)
#   .fixgen/specs.json           specs of the new HF fixtures
# Writes to $OUT: the new HF fixtures and every fixture's bf16 GGUF (models.tar.xz), the demo
# model's bf16 GGUF. Quantising (llama-quantize) needs no torch: that runs on the CPU machine.
set -uo pipefail
R=$PWD; F=$R/.fixgen; OUT=${OUT:-/tmp/out}; W=/tmp/gg; LC=/tmp/lc
mkdir -p "$OUT" $W
log() { echo "[$(date +%T)] $*"; }
mkdir -p $LC && tar -C $LC -xJf $F/llamacpp-src.tar.xz
cp $F/make_fixtures.py $R/tools/device/fixture_bias.py $W/
log "HF fixtures (transformers)"
(cd $W && OUT=$W PYTHONUNBUFFERED=1 python3 fixture_bias.py $F/specs.json) > $OUT/make_fixtures.log 2>&1
tail -n 5 $OUT/make_fixtures.log
mkdir -p $W/models && cp -r $F/models/* $W/models/ && tar -C $W/models -xzf $W/extra.tar.gz --strip-components=1
conv() { # conv DIR OUTFILE [flags]
  local d=$1 o=$2; shift 2
  python3 $R/tools/device/conv_gguf.py $LC "$@" "$d" --outtype bf16 --outfile "$o" > "$o.log" 2>&1 ||
    { log "convert $d failed"; tail -n 8 "$o.log"; return 1; }
}
for m in $W/models/*/; do
  n=$(basename $m); flags=""
  [[ $n == gemma4* ]] && flags="--gpt2-vocab"
  [[ $n == qwen3.5* || $n == qwen3-next* ]] && flags="--no-mtp"
  conv $m $m/model.bf16.gguf $flags && log "converted $n"
done
mkdir -p $W/demo && conv $R/models/demo $W/demo/model.bf16.gguf --no-mtp && log "converted demo"
log "pack"
for n in $(ls $F/models); do find $W/models/$n -type f ! -name '*.gguf*' -delete; done # here already
find $W/models -name "*.gguf" | sed "s|$W/||" > $OUT/list.txt
(cd $W && tar -cJf $OUT/models.tar.xz models)
cp $W/demo/model.bf16.gguf $OUT/demo.bf16.gguf
ls -la $OUT; du -sh $W/*
log done
