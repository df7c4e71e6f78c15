#!/usr/bin/env bash
# Issue #34's hybrid prefill on the GPU machine: the Gated DeltaNet GPU
# tests (chunked kernel and token-parallel conv against the CPU; no
# fixtures needed), then one GDN layer of the Qwen3.5-27B shape timed with
# the recurrent and the chunked kernel (tools/bench_cuda_delta.c: 32k x 1
# and 8 x 4k against the published 1.26 / 0.64 ms, and the crossover at
# 1-256 tokens). Results on stdout.
#
#   bash tools/device/gdn_bench.sh pack    here: builds build/dev (Hopper code
#                                          only) and packs lumen_tests and
#                                          bench_cuda_delta with the libraries
#                                          the GPU image lacks into
#                                          .device-carry/pack.tar.xz (~22 MB)
#   bash tools/device/gdn_bench.sh [reps]  there, from the checkout's root, with
#                                          .device-carry carried
# Without .device-carry it runs $LUMEN_BUILD (default build/gdn), building it
# with CUDA when missing (which needs lumen's build dependencies there).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
C=$root/.device-carry
if [[ ${1:-} == pack ]]; then
  set -e
  cmake -S . -B build/dev -DCMAKE_BUILD_TYPE=Release -DLUMEN_CUDA=ON -DLUMEN_CUDA_ARCHS=90-real >/dev/null
  cmake --build build/dev -j2 --target lumen_tests bench_cuda_delta
  rm -rf "$C" && mkdir -p "$C/bin" "$C/lib"
  for b in lumen_tests bench_cuda_delta; do strip -o "$C/bin/$b" "build/dev/$b"; done
  ldd build/dev/lumen_tests | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcublas[^/]*|libstdc\+\+|libgcc_s)\.so' |
    while read -r lib; do cp -L "$lib" "$C/lib/"; done
  tar -C "$C" -cJf "$C/pack.tar.xz" bin lib
  rm -rf "$C/bin" "$C/lib"
  du -sh "$C"
  exit 0
fi
if [[ -f $C/pack.tar.xz || -d $C/bin ]]; then
  source tools/device/lib.sh
  dev_extract
  dev_libs cublas
  export LUMEN_FIXTURES_PARTIAL=1 # the host-side kernel check stayed on the build machine: it skips
  B=$C/bin
else
  B=${LUMEN_BUILD:-build/gdn}
  if [[ ! -x $B/bench_cuda_delta || ! -x $B/lumen_tests ]]; then
    cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DLUMEN_CUDA=ON -DLUMEN_CUDA_ARCHS=90-real >/dev/null &&
      cmake --build "$B" -j"$(nproc)" --target lumen_tests bench_cuda_delta >/dev/null || { echo "build failed" >&2; exit 1; }
  fi
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
echo "## tests: cuda_delta (chunked kernel), cuda_conv (token-parallel conv), cuda_gated_delta (the existing GDN op test)"
for f in cuda_delta cuda_conv cuda_gated_delta; do
  timeout 300 "$B/lumen_tests" "$f" 2>&1 | grep -v "^ok "
done
echo "## bench"
timeout 500 "$B/bench_cuda_delta" "${1:-5}"
