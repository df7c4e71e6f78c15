#!/usr/bin/env bash
# Builds lumen with CUDA on this machine and packs what a run on the GPU
# machine needs into .device-carry/ (git-ignored; name it in the device
# call's carry): stripped binaries, the shared libraries they link that the
# GPU image lacks, and the fixture models the GPU tests read. The GPU machine
# gets the checkout (sources, models/demo, tests/data) but not ../shared, and
# everything that travels must stay under 64 MiB. Since issue #26's GGUF
# fixtures the tracked tree alone is ~67 MB: for a call, move models/demo
# (28.7 MB) out of the checkout and back afterwards (the GPU tests that load
# it, or a tests/data folder left out, then skip, saying so: lib.sh sets
# LUMEN_FIXTURES_PARTIAL).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Hopper machine code only: a fraction of the default fat binary (sm_90 +
# PTX + sm_80), which leaves room for fixtures beside the checkout
cmake -S . -B build/dev -DCMAKE_BUILD_TYPE=Release -DLUMEN_CUDA_ARCHS=90-real >/dev/null
# bench_cuda_gemv (the `kernels` bench set; LUMEN_DEVICE_KERNEL_BENCH=1) and
# bench_handoff (LUMEN_DEVICE_HANDOFF_BENCH=1), bench_cuda_delta
# (LUMEN_DEVICE_GDN_BENCH=1: tools/device/gdn_bench.sh), bench_grammar
# (LUMEN_DEVICE_GRAMMAR_BENCH=1: tools/device/grammar_gpu.sh) only when
# asked: each lumen binary carries every kernel, and the upload limit is tight
# LUMEN_DEVICE_BINS replaces the first three (a call that needs only a bench)
bins="${LUMEN_DEVICE_BINS:-lumen lumen_tests make_random_model}${LUMEN_DEVICE_KERNEL_BENCH:+ bench_cuda_gemv}${LUMEN_DEVICE_HANDOFF_BENCH:+ bench_handoff}${LUMEN_DEVICE_GDN_BENCH:+ bench_cuda_delta}${LUMEN_DEVICE_GRAMMAR_BENCH:+ bench_grammar}"
cmake --build build/dev -j2 --target $bins
rm -rf .device-carry
mkdir -p .device-carry/bin .device-carry/lib .device-carry/fixtures/models
for b in $bins; do strip -o ".device-carry/bin/$b" "build/dev/$b"; done
# LUMEN_DEVICE_BASE_BIN: another build's binaries (paths), each as
# bin/NAME_base (lumen_base: the `ab` bench set)
for b in ${LUMEN_DEVICE_BASE_BIN:-}; do strip -o ".device-carry/bin/$(basename "$b")_base" "$b"; done
# libraries outside glibc, the C++ runtime and CUDA (the GPU image has those)
ldd build/dev/lumen_tests build/dev/lumen | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcublas[^/]*|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" .device-carry/lib/; done
cp ../shared/fixtures/README.md .device-carry/fixtures/ # tests find the fixtures by it
# all of them do not fit beside the checkout (64 MiB): three sets, one per
# call (`pack.sh a`, the default, b or c; gpu_run.sh check runs the tests of
# the absent ones as skips), or any list in LUMEN_DEVICE_FIXTURES
case "${1:-a}" in
a) set_models="qwen3 qwen3.5 gemma4 llama-2-tiny-random.gguf llama-2-tiny-random.llamacpp.json" ;;
b) set_models="llama llama3-rope-mqa qwen3-next" ;;
c) set_models="qwen3-moe gemma3" ;;
*) echo "usage: $0 [a|b|c]" >&2; exit 2 ;;
esac
# a name with a slash is a path under ../shared/fixtures (gguf/llama-g256/model.Q4_K_M.gguf)
for m in ${LUMEN_DEVICE_FIXTURES:-$set_models}; do
  if [[ $m == */* ]]; then
    mkdir -p ".device-carry/fixtures/$(dirname "$m")"
    cp -r "../shared/fixtures/$m" ".device-carry/fixtures/$m"
  else
    cp -r "../shared/fixtures/models/$m" .device-carry/fixtures/models/
  fi
done
# one compressed archive; the binaries share most of their CUDA code, which
# a dictionary larger than one binary (~36 MB) stores once: three binaries
# take 18 MB instead of 45
tar -C .device-carry -c bin lib fixtures | xz -T1 --lzma2=preset=6,dict=128MiB > .device-carry/pack.tar.xz
rm -rf .device-carry/bin .device-carry/lib .device-carry/fixtures
du -sh .device-carry
