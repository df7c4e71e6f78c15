#!/usr/bin/env bash
# Builds lumen and starts its OpenAI-compatible server on the bundled demo
# model (models/demo: a small Qwen3.5-hybrid code model trained by this
# project) at http://127.0.0.1:8080. Extra arguments go to `lumen serve`
# (e.g. --port 9000, -m OTHER_MODEL). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
source scripts/build_progress.sh
mkdir -p build
echo "== configuring (log: build/quickstart.log)"
if ! cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >build/quickstart.log 2>&1 ||
   ! build_with_progress lumen build/quickstart.log cmake --build build/release -j"$(nproc)" --target lumen; then
  cat build/quickstart.log
  echo "== the build FAILED (log above, also in build/quickstart.log)"
  exit 1
fi
echo "+ build/release/lumen serve $*"
exec build/release/lumen serve "$@"
