#!/usr/bin/env bash
# precision_peer.sh PHASE... - issue #34 on one H200: the GPU's activation
# precision (--gpu-precision exact | bf16) tested, its quality measured and
# its speed set against llama.cpp on the same random Llama-3.1-8B bf16 GGUF
# (tools/make_random_gguf.py ... bf16 8b). Phases, each under the 10-minute
# limit of one call; /tmp and /dev/shm persist while the machine stays warm:
#   tests  the GPU tests of both precisions (matmul, GEMV, attention over
#          the KV formats, models against the CPU, the engine suite with
#          the models on the GPU), KL of the demo on the GPU against the
#          CPU's f32 on held-out text, parity of the carried fixtures
#   peer   llama.cpp (the source node-llama-cpp 3.21.1 bundles, CUDA sm_90)
#          built, the GGUF written meanwhile; llama-bench pp4096 / pp32768 /
#          tg128 and llama-batched-bench at 1, 2, 4, 8 and 16 sequences
#   bench  lumen exact / bf16 on the same GGUF: prefill 4k and 32k, decode
#          at batch 1, 2, 4, 8 and 16; an op profile of the bf16 4k prefill
#   final  peer and bench in one call (llama.cpp builds while lumen's
#          prefill runs on the GPU), lumen's modes alternated
# Carry .device-carry from LUMEN_DEVICE_FIXTURES="qwen3.5 gguf/llama-g256/model.Q4_K_M.gguf"
# tools/device/pack.sh, plus heldout.txt (tools/kv_quality.sh's held-out
# text) for tests and /work/keep's llamacpp-src.tar.xz for peer.
set -uo pipefail
source tools/device/lib.sh
dev_unpack
LC=/tmp/lc; LB=$LC/b/bin; S=/dev/shm
mount -o remount,size=100G $S 2>/dev/null
L=$C/bin/lumen; G=$S/l8.bf16.gguf
field() { grep -oE "\"$1\":[0-9.e+-]*" | head -n 1; }
for phase in "$@"; do
  log "== $phase"
  case $phase in
  tests) # the GPU tests in both precisions, KL against the CPU, parity
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    for f in cuda_matmul cuda_gemv cuda_model cuda_kv_formats cuda_attention; do
      timeout 150 "$C/bin/lumen_tests" $f 2>&1 | tee -a "$OUT/tests.log" | grep -E "FAIL|check failed|passed|GPU \(|skip|vs CPU" | grep -v "^  ok"
    done
    for p in exact bf16; do # the engine's exactness tests with the models on the GPU
      v=split; [[ $p == bf16 ]] && v=bf16
      log "suite 'engine' on the GPU, $p"
      LUMEN_TEST_DEVICE=cuda LUMEN_CUDA_GEMM=$v timeout 150 "$C/bin/lumen_tests" engine 2>&1 |
        tee "$OUT/suite_engine_$p.log" | grep -E "FAIL|check failed|passed" | tail -n 15
    done
    for p in exact bf16; do
      for ctx in 1024 4096; do
        log "KL, demo on the GPU ($p) against the CPU's f32, ctx $ctx"
        "$L" eval -m models/demo --reference models/demo --reference-device cpu --device cuda --gpu-precision $p \
          --text "$C/heldout.txt" --ctx $ctx --kv-type f32 2>&1 | tail -n 1 | tee -a "$OUT/kl.jsonl" | cut -c1-400
      done
    done
    for d in "$C"/fixtures/models/*/ "$root/models/demo"; do
      [[ -f "$d/reference.safetensors" ]] || continue
      for p in exact bf16; do echo -n "$p "; "$L" parity "$d" --device cuda --gpu-precision $p 2>&1 | tail -n 1 | cut -c1-300; done
    done | tee "$OUT/parity.log" ;;
  peer) # llama.cpp built (~4.5 min), the GGUF, llama.cpp's figures
    if [[ ! -x $LB/llama-bench ]]; then
      mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
      (cd $LC && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
         -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
         -DCMAKE_BUILD_TYPE=Release && cmake --build b -j15 --target llama-bench llama-batched-bench) \
        > "$OUT/lc_build.log" 2>&1 &
      bp=$!
      dev_random_gguf $G bf16
      log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"
    fi
    dev_random_gguf $G bf16
    ls -la $G $LB/llama-bench
    lbench() { "$LB/llama-bench" -o md "$@" 2>/dev/null | grep -E "^\| [a-z]"; }
    log "llama.cpp: pp4096, tg128"; lbench -m $G -ngl 99 -fa 1 -p 4096 -n 128 -r 2 | tee -a "$OUT/llama.log"
    log "llama.cpp: pp32768"; lbench -m $G -ngl 99 -fa 1 -p 32768 -n 0 -r 1 | tee -a "$OUT/llama.log"
    log "llama.cpp: batched"
    "$LB/llama-batched-bench" -m $G -ngl 99 -fa 1 -c 8192 -npp 32 -ntg 64 -npl 1,2,4,8,16 2>/dev/null | grep -E "^\|" | tee -a "$OUT/llama.log" ;;
  bench)
    for p in exact bf16; do
      log "lumen $p: prefill 4k"
      "$L" bench -m $G --device cuda --gpu-precision $p --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | tail -n 1 | field prefill_tok_s
      log "lumen $p: prefill 32k (chunks of 4096)"
      "$L" bench -m $G --device cuda --gpu-precision $p --prompt-len 32768 --chunk 4096 --gen 4 --reps 1 --no-membw 2>&1 | tail -n 1 | field prefill_tok_s
      for B in 1 2 4 8 16; do
        echo -n "lumen $p batch $B "
        "$L" bench -m $G --device cuda --gpu-precision $p --batch $B --prompt-len 32 --gen 64 --no-membw 2>&1 | tail -n 1 | field decode_tok_s
      done
    done 2>&1 | tee "$OUT/lumen.log"
    log "op profile, bf16 4k prefill"
    LUMEN_PROFILE=1 "$L" bench -m $G --device cuda --gpu-precision bf16 --prompt-len 4096 --chunk 4096 --gen 1 --reps 1 --no-membw 2>&1 | tail -n 30 > "$OUT/profile.log"
    head -n 30 "$OUT/profile.log"
    ;;
  final) # one call: llama.cpp built in the background while lumen's prefill runs (GPU-bound), then
    # lumen's decode at batch 1-16 and llama.cpp's figures, all in the same run
    bp=
    if [[ ! -x $LB/llama-bench ]]; then
      mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
      (cd $LC && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
         -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
         -DCMAKE_BUILD_TYPE=Release && nice cmake --build b -j14 --target llama-bench llama-batched-bench) \
        > "$OUT/lc_build.log" 2>&1 &
      bp=$!
    fi
    dev_random_gguf $G bf16
    for p in exact bf16 exact bf16; do
      for P in 4096 32768; do
        echo -n "lumen $p prefill $P "
        "$L" bench -m $G --device cuda --gpu-precision $p --prompt-len $P --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | tail -n 1 | field prefill_tok_s
      done
    done 2>&1 | tee -a "$OUT/lumen.log"
    [[ -n $bp ]] && { log "waiting for the llama.cpp build"; wait $bp || tail -n 20 "$OUT/lc_build.log"; }
    for p in exact bf16; do
      for B in 1 2 4 8 16; do
        echo -n "lumen $p batch $B "
        "$L" bench -m $G --device cuda --gpu-precision $p --batch $B --prompt-len 32 --gen 64 --no-membw 2>&1 | tail -n 1 | field decode_tok_s
      done
    done 2>&1 | tee -a "$OUT/lumen.log"
    lbench() { "$LB/llama-bench" -o md "$@" 2>/dev/null | grep -E "^\| [a-z]"; }
    lbench -m $G -ngl 99 -fa 1 -p 4096,32768 -n 0 -r 2 | tee -a "$OUT/llama.log"
    "$LB/llama-batched-bench" -m $G -ngl 99 -fa 1 -c 8192 -npp 32 -ntg 64 -npl 1,2,4,8,16 2>/dev/null | grep -E "^\|" | tee -a "$OUT/llama.log"
    echo -n "lumen bf16 prefill 4096 again "
    "$L" bench -m $G --device cuda --gpu-precision bf16 --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw 2>&1 | tail -n 1 | field prefill_tok_s ;;
  *) echo "usage: $0 tests|peer|bench|final..." >&2; exit 2 ;;
  esac
done
log done
