#!/usr/bin/env bash
# build_server.sh - builds llama.cpp's llama-server (CPU only) from the
# llama.cpp source, as a peer for `lumen bench-serve` on the same GGUF.
#
#   bash tools/llamacpp/build_server.sh SRC [BUILD_DIR]
#
# SRC: a llama.cpp source tree, or a .tar.xz of one (tools/device/quant_peer.sh
# describes the one made from the source node-llama-cpp 3.21.1 bundles).
# BUILD_DIR defaults to build/llama-server; the binary ends in BUILD_DIR/bin.
# JOBS (default: all cores) and nice: a 2-core machine takes tens of minutes.
set -euo pipefail
src=${1:?usage: build_server.sh SRC [BUILD_DIR]}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${2:-$root/build/llama-server}" && cd "${2:-$root/build/llama-server}" && pwd)
if [[ -f $src ]]; then
  mkdir -p "$out/src"
  tar -C "$out/src" -xJf "$src"
  src=$out/src
fi
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$out/configure.log"
nice cmake --build "$out" -j"${JOBS:-$(nproc)}" --target llama-server
echo "built $out/bin/llama-server"
