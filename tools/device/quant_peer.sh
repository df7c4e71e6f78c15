#!/usr/bin/env bash
# quant_peer.sh - issue #26 on one H200 host in one call: lumen's GPU op tests, then the
# random Llama-3.1-8B Q4_K_M GGUF (tools/make_random_gguf.py) decoded and prefilled by lumen
# (h200_bench.sh quant) and by llama.cpp built from the source node-llama-cpp 3.21.1 bundles
# (CUDA, sm_90; built in the background meanwhile), then both on the CPU at 16 threads on a
# random Llama-3.2-1B Q4_K_M / Q8_0 (GPU hidden), while time is left.
# Carry .device-carry (pack.sh, with gguf/llama-g256/model.Q4_K_M.gguf) holding also
# llamacpp-src.tar.xz (the bundled source without .git, docs, models, examples, tests):
#   git clone tools/llamacpp/node_modules/node-llama-cpp/llama/gitRelease.bundle S && cd S &&
#   tar --exclude=./.git --exclude=./docs --exclude=./models --exclude=./examples --exclude=./tests \
#       --exclude=./tools/server/webui --exclude=./media -cJf llamacpp-src.tar.xz .
# (top-level folders only: tools/mtmd/models is part of the build).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LC=/tmp/lc; LB=$LC/b/bin; S=/dev/shm
mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
(cd $LC && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
   -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release &&
 cmake --build b -j16 --target llama-bench llama-batched-bench) > "$OUT/lc_build.log" 2>&1 &
bp=$!
[[ -n ${SKIP_OPS:-} ]] || { log "lumen GPU op tests"; bash tools/device/gpu_run.sh cuda; }
log "lumen quant bench"; bash tools/device/gpu_run.sh bench quant
q=$S/l8.Q4_K_M.gguf
log "waiting for the llama.cpp build"; wait $bp || { tail -n 20 "$OUT/lc_build.log"; exit 1; }
lbench() { "$LB/llama-bench" -o md "$@" 2>/dev/null | grep -E "^\| [a-z]"; }
log "llama.cpp 8B Q4_K_M: decode 128, prefill 4096"; lbench -m $q -ngl 99 -fa 1 -p 4096 -n 128 -r 3
log "llama.cpp batched"; "$LB/llama-batched-bench" -m $q -ngl 99 -fa 1 -c 20000 -npp 32 -ntg 64 -npl 1,8,32,128 2>/dev/null | grep -E "^\|"
log "lumen 8B Q4_K_M decode again (same run, after the peer)"
"$C/bin/lumen" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 --no-membw 2>&1 | tail -n 2
(( SECONDS - t0 < 420 )) || { log "no time left for the CPU comparison"; exit 0; }
dev_libs
for k in q4km q8; do
  f=$S/l1.$k.gguf
  python3 tools/make_random_gguf.py "$C/fixtures/gguf/llama-g256/model.Q4_K_M.gguf" $f $k >/dev/null || continue
  log "llama.cpp CPU 16 threads $k"; CUDA_VISIBLE_DEVICES= lbench -m $f -ngl 0 -t 16 -p 512 -n 64 -r 2
  log "lumen CPU 16 threads $k"; timeout 90 "$C/bin/lumen" bench -m $f --device cpu --threads 16 --prompt-len 512 --gen 64 --reps 2 --no-membw 2>&1 | tail -n 2
  (( SECONDS - t0 < 540 )) || break
done
if (( SECONDS - t0 < 520 )); then # bf16 GGUF against bf16 safetensors of the same shape (the issue's 21.6 vs 39.2)
  "$C/bin/make_random_model" $S/l1st --shape llama-3.2-1b --threads 16 >/dev/null &&
  python3 tools/make_random_gguf.py "$C/fixtures/gguf/llama-g256/model.Q4_K_M.gguf" $S/l1.bf16.gguf bf16 >/dev/null &&
  for m in $S/l1st $S/l1.bf16.gguf; do
    log "lumen CPU 16 threads bf16 decode: $m"; timeout 40 "$C/bin/lumen" bench -m $m --device cpu --threads 16 --prompt-len 16 --gen 64 --reps 2 2>&1 | tail -n 2
  done
fi
log done
