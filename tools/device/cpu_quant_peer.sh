#!/usr/bin/env bash
# cpu_quant_peer.sh - issue #26's CPU goal on the H200 host's 16 cores in one
# call (~6 minutes): lumen's int8 GEMV kernels one core at a time
# (bench_qdot, in cache and streaming), then a random Llama-3.2-1B Q4_K_M and
# Q8_0 GGUF (tools/make_random_gguf.py) by lumen (this build and, when
# carried, a base build: alternating) and by llama.cpp built for this CPU
# from the source node-llama-cpp 3.21.1 bundles (CPU only, built in the
# background meanwhile): prefill 512 and decode 64 at THREADS (default "16 8").
# BINS: the lumen binaries compared, alternating (default "lumen_base lumen";
# any bin/lumen_* carried); PEER=0 leaves llama.cpp out; PROFILE=1 adds
# LUMEN_PROFILE=1's op table of bin/lumen's decode at 16 threads; LONG=1
# adds Q4_K_M decode of 32 after a 3,968-token context (the random file's
# limit is 4,096) at 16 threads (llama.cpp: -d 3968). PREFILL_PROFILE=1 adds
# LUMEN_PROFILE=1's op table of a 512-token Q4_K_M prefill at 16 threads by
# each of BINS. A bin may be a script (e.g. `VAR=1 exec lumen "$@"`: the
# same build with an environment knob set). WAIT_BUILD=1 waits for the
# llama.cpp build before lumen runs (no compiler beside them); PEER_ROUNDS
# (default 1) alternates llama.cpp and lumen that many times; MEMBW=1 adds
# lumen's copy and read bandwidth probe (decode roofline) at 16 threads.
# KINDS: the random files (make_random_gguf.py kinds, default "q4km q8");
# PREFILL_PROFILE and LONG need q4km among them, MEMBW q8.
# Carry .device-carry holding: bin/{lumen,bench_qdot} and optionally
# bin/{lumen_base,bench_qdot_base} (CPU-only builds: cmake -DLUMEN_CUDA=OFF),
# lib/ (their shared libraries outside glibc), template.gguf (the llama-g256
# Q4_K_M fixture) and llamacpp-src.tar.xz (see quant_peer.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LC=/tmp/lc; LB=$LC/b/bin; S=/dev/shm
PEER=${PEER:-1}
[[ $PEER == 1 ]] && mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
[[ $PEER == 1 ]] && (cd $LC && cmake -B b -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
   -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release &&
 nice cmake --build b -j8 --target llama-bench) > "$OUT/lc_build.log" 2>&1 &
bp=$!; [[ $PEER == 1 ]] || bp=
export LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-}
export CUDA_VISIBLE_DEVICES=
cat /sys/kernel/mm/transparent_hugepage/enabled; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node|L2|L3|Flags" | sed 's/\(Flags:.\{0,40\}\).*\(avx512_vnni\|amx\).*/\1 ... (has \2)/'
grep -o -w -E "avx512_vnni|avx_vnni|amx_int8|amx_tile|avx512_bf16" /proc/cpuinfo | sort | uniq -c
for b in bench_qdot_base bench_qdot; do
  [[ -x $C/bin/$b ]] || continue
  log "$b, one core, in cache"; "$C/bin/$b" | grep -E "Q4_K|Q6_K|Q8_0|IQ4_XS"
  log "$b, one core, streaming"; "$C/bin/$b" --stream | grep -E "Q4_K|Q6_K|Q8_0"
done
KINDS=${KINDS:-q4km q8}
wait_build() { # the background llama.cpp build, once
  [[ -n $bp ]] || return 0
  log "waiting for the llama.cpp build"; wait $bp || { tail -n 20 "$OUT/lc_build.log"; exit 1; }
  bp=
}
[[ ${WAIT_BUILD:-0} == 1 ]] && wait_build
for k in $KINDS; do
  python3 tools/make_random_gguf.py "$C/template.gguf" $S/l1.$k.gguf $k >/dev/null || exit 1
done
run_lumen() { # binary file threads
  timeout 120 "$1" bench -m "$2" --device cpu --threads "$3" --prompt-len 512 --gen 64 --reps 2 --no-membw 2>&1 |
    tail -n 1 | grep -oE '"prefill_tok_s":[0-9.]*|"decode_tok_s":[0-9.]*' | tr '\n' ' '; echo
}
if [[ ${PROFILE:-0} == 1 ]]; then
  for k in $KINDS; do
    log "LUMEN_PROFILE=1 lumen $k 16 threads, decode 64 after 16"
    LUMEN_PROFILE=1 timeout 60 "$C/bin/lumen" bench -m $S/l1.$k.gguf --device cpu --threads 16 --prompt-len 16 --gen 64 --reps 1 --no-membw 2>&1 | tail -n 16
  done
fi
if [[ ${PREFILL_PROFILE:-0} == 1 ]]; then
  for b in ${BINS:-lumen_base lumen}; do
    [[ -x $C/bin/$b ]] || continue
    log "LUMEN_PROFILE=1 $b q4km 16 threads, prefill 512"
    LUMEN_PROFILE=1 timeout 90 "$C/bin/$b" bench -m $S/l1.q4km.gguf --device cpu --threads 16 --prompt-len 512 --gen 1 --reps 1 --no-membw 2>&1 | tail -n 14
  done
fi
for th in ${THREADS:-16 8}; do
  for k in $KINDS; do
    for round in $(seq ${ROUNDS:-2}); do
      for b in ${BINS:-lumen_base lumen}; do
        [[ -x $C/bin/$b ]] || continue
        log "$b $k $th threads (round $round)"; run_lumen "$C/bin/$b" $S/l1.$k.gguf $th
      done
    done
  done
done
run_long() { # binary
  timeout 200 "$1" bench -m $S/l1.q4km.gguf --device cpu --threads 16 --prompt-len 3968 --chunk 512 --gen 32 --reps 2 \
    --no-membw 2>&1 | tail -n 1 | grep -oE '"decode_tok_s":[0-9.]*'
}
if [[ ${LONG:-0} == 1 ]]; then
  for round in 1 2; do
    for b in ${BINS:-lumen_base lumen}; do log "$b q4km decode after 3968, 16 threads (round $round)"; run_long "$C/bin/$b"; done
  done
fi
[[ $PEER == 1 ]] || { log done; exit 0; }
wait_build
if [[ ${MEMBW:-0} == 1 ]]; then
  log "lumen q8 16 threads with the bandwidth probe"
  timeout 120 "$C/bin/lumen" bench -m $S/l1.q8.gguf --device cpu --threads 16 --prompt-len 16 --gen 64 --reps 2 2>&1 | tail -n 1
fi
for th in ${THREADS:-16 8}; do
  for k in $KINDS; do
    for round in $(seq ${PEER_ROUNDS:-1}); do
      log "llama.cpp $k $th threads (round $round)"
      "$LB/llama-bench" -o md -m $S/l1.$k.gguf -ngl 0 -t $th -p 512 -n 64 -r 2 2>/dev/null | grep -E "^\| [a-z]"
      log "lumen $k $th threads (after the peer)"; run_lumen "$C/bin/lumen" $S/l1.$k.gguf $th
    done
  done
done
if [[ ${LONG:-0} == 1 ]]; then
  log "llama.cpp q4km decode 32 at depth 3968, 16 threads"
  "$LB/llama-bench" -o md -m $S/l1.q4km.gguf -ngl 0 -t 16 -p 0 -n 32 -d 3968 -r 2 2>/dev/null | grep -E "^\| [a-z]"
  log "lumen (after the peer)"; run_long "$C/bin/lumen"
fi
log done
