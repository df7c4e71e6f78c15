#!/usr/bin/env bash
# quant_gpu_peer.sh - issue #26 on one H200 in one call (under 10 minutes):
# the quantised-GEMV tests, then a random Llama-3.1-8B Q4_K_M GGUF
# (tools/make_random_gguf.py) by lumen (int8 activations, the default;
# exact f32 activations) and by llama.cpp built from the
# source node-llama-cpp 3.21.1 bundles (built in the background meanwhile):
# batch-1 decode, 4k prefill, batched decode 8/32/128; the Q4_K / Q6_K
# decode with the staged kernel (the default on sm_90) and the slice kernel
# (LUMEN_CUDA_QSTAGED=0) in the same run. PEER=0 leaves llama.cpp out (a
# quick A/B of lumen alone, ~2 minutes); SPLIT=1 adds the decode step with
# each kind of kernel left out (LUMEN_CUDA_SKIP), ~40 s. Carry .device-carry
# from LUMEN_DEVICE_KERNEL_BENCH=1 LUMEN_DEVICE_FIXTURES="gguf/llama-g256/model.Q4_K_M.gguf ..." tools/device/pack.sh
# plus llamacpp-src.tar.xz (see quant_peer.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LC=/tmp/lc; LB=$LC/b/bin
PEER=${PEER:-1}
[[ $PEER == 1 ]] && mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
[[ $PEER == 1 ]] && (cd $LC && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
   -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release &&
 cmake --build b -j14 --target llama-bench llama-batched-bench) > "$OUT/lc_build.log" 2>&1 &
bp=$!; [[ $PEER == 1 ]] || bp=
dev_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
log "GPU quant tests"; timeout 150 "$C/bin/lumen_tests" cuda_q 2>&1 | tee -a "$OUT/cuda_q.log" | grep -E "FAIL|passed|check failed|prompt:"
L=$C/bin/lumen; q=/dev/shm/l8.Q4_K_M.gguf
dev_random_gguf $q q4km
if [[ -x $C/bin/bench_cuda_gemv ]]; then
  more=; [[ ${SPLIT:-0} == 1 ]] && more="LUMEN_CUDA_QSTAGED_BLOCKS=1 LUMEN_CUDA_QSTAGED_BLOCKS=2"
  for st in LUMEN_CUDA_QSTAGED=1 LUMEN_CUDA_QSTAGED=0 $more; do
    log "kernels, $st"
    env $st "$C/bin/bench_cuda_gemv" 0 quant 2>&1 | grep -E "copy|qgemv .* 1  " | tee -a "$OUT/kernels.log"
  done
fi
for env in LUMEN_CUDA_QSTAGED=1 LUMEN_CUDA_QSTAGED=0 LUMEN_CUDA_QUANT_EXACT=1 LUMEN_CUDA_QSTAGED=1; do
  log "lumen 8B Q4_K_M decode, $env"
  env $env "$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*|"decode_pct_of_copy":[0-9.]*' | tr '\n' ' '; echo
done
if [[ ${SPLIT:-0} == 1 ]]; then # where a decode step goes: the same step with one kind of kernel left out (timing only)
  dec() { env "$@" "$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 2 --no-membw 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*'; }
  for b in 1 2 4; do log "LUMEN_CUDA_QSTAGED_BLOCKS=$b"; dec LUMEN_CUDA_QSTAGED_BLOCKS=$b; done
  for k in attention rope_kv norm gemv_n gemv_glu gemv_add gemv_down gemv_n,gemv_glu,gemv_add,gemv_down; do
    log "LUMEN_CUDA_SKIP=$k"; dec LUMEN_CUDA_SKIP=$k
  done
fi
[[ $PEER == 1 ]] || { log done; exit 0; }
log "lumen 4k prefill"; "$L" bench -m $q --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | tail -n 1 | grep -oE '"prefill_tok_s":[0-9.]*'
log "waiting for the llama.cpp build"; wait $bp || { tail -n 20 "$OUT/lc_build.log"; }
lbench() { "$LB/llama-bench" -o md "$@" 2>/dev/null | grep -E "^\| [a-z]"; }
log "llama.cpp 8B Q4_K_M: decode 128, prefill 4096"; lbench -m $q -ngl 99 -fa 1 -p 4096 -n 128 -r 3
log "lumen 8B Q4_K_M decode again (after the build, same run), int8 then exact"
LUMEN_CUDA_QUANT_EXACT=1 "$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 --no-membw 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*'
"$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*|"decode_pct_of_copy":[0-9.]*|"copy_GB_s":[0-9.]*' | tr '\n' ' '; echo
log "llama.cpp batched"; "$LB/llama-batched-bench" -m $q -ngl 99 -fa 1 -c 20000 -npp 32 -ntg 64 -npl 1,8,32,128 2>/dev/null | grep -E "^\|"
for B in 1 2 8 32 128; do log "lumen batch $B"; "$L" bench -m $q --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*'; done
log done
