#!/usr/bin/env bash
# Builds lumen and starts its OpenAI-compatible server on the bundled demo
# model (models/demo: a small Qwen3.5-hybrid code model trained by this
# project) at http://127.0.0.1:8080. Extra arguments go to `lumen serve`
# (e.g. --port 9000, -m OTHER_MODEL). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" --target lumen >/dev/null
echo "+ build/release/lumen serve $*"
exec build/release/lumen serve "$@"
