#!/usr/bin/env bash
# build_server.sh - llama.cpp's OpenAI-compatible server (llama-server), CPU
# only, from the llama.cpp source node-llama-cpp 3.21.1 bundles, for
# `lumen bench-serve` comparisons on the same GGUF. Offline: no web UI (the
# UI would need npm or a download; the API does not need it), no curl, no
# OpenSSL. Nothing is built inside the repository.
#
# Usage: tools/llamacpp/build_server.sh [DIR]   (default /tmp/lcfull)
#   then DIR/b/bin/llama-server -m MODEL.gguf --threads 2 -c 16384 --port 8091
# Needs `npm ci` in tools/llamacpp first (the bundle ships in the package).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-/tmp/lcfull}"
bundle="$here/node_modules/node-llama-cpp/llama/gitRelease.bundle"
[ -f "$bundle" ] || { echo "no $bundle: run 'npm ci' in $here" >&2; exit 1; }
# the full tree: tools/server's CMake needs tools/ui even with the UI off
[ -d "$dir/.git" ] || git clone -q "$bundle" "$dir"
cmake -S "$dir" -B "$dir/b" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
nice cmake --build "$dir/b" -j2 --target llama-server
echo "$dir/b/bin/llama-server"
