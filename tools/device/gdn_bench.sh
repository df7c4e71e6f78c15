#!/usr/bin/env bash
# Issue #34's hybrid prefill on the GPU machine, from the checkout's root:
# the Gated DeltaNet GPU tests (chunked kernel and token-parallel conv
# against the CPU; no fixtures needed), then one GDN layer of the
# Qwen3.5-27B shape timed with the recurrent and the chunked kernel
# (tools/bench_cuda_delta.c: 32k x 1 and 8 x 4k against the published
# 1.26 / 0.64 ms, and the crossover at 1-256 tokens). Results on stdout.
#
# Binaries: .device-carry/ when carried (LUMEN_DEVICE_GDN_BENCH=1
# tools/device/pack.sh packs bench_cuda_delta beside lumen_tests), else
# $LUMEN_BUILD (default build/gdn), built here with CUDA when missing.
#   bash tools/device/gdn_bench.sh [reps]
set -uo pipefail
root=$PWD
C=$root/.device-carry
if [[ -f $C/pack.tar.xz || -d $C/bin ]]; then
  [[ -f $C/pack.tar.xz && ! -d $C/bin ]] && tar -C "$C" -xJf "$C/pack.tar.xz"
  cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null || true)
  export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${cublas_dir}:${LD_LIBRARY_PATH:-}
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
echo "## tests: cuda_delta (chunked kernel, conv), cuda_gated_delta_ops (the existing GDN op test)"
for f in cuda_delta cuda_conv cuda_gated_delta; do
  timeout 300 "$B/lumen_tests" "$f" 2>&1 | grep -v "^ok " | tail -n 200
done
echo "## bench"
timeout 400 "$B/bench_cuda_delta" "${1:-5}"
