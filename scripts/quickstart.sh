#!/usr/bin/env bash
# Builds lumen and runs its main job. Until the bundled demo model exists
# (a later issue), the job runs on a small random-weight Llama-shaped model
# that the build generates: it proves the whole path (load, prefill, cached
# decode, sampling) works on this machine, not that the output means anything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" --target lumen make_random_model >/dev/null
model=build/models/tiny-llama
[[ -f $model/model.safetensors ]] || build/release/make_random_model "$model" --shape tiny --seed 1
echo "+ lumen run -m $model --prompt-ids 1,2,3,4,5 -n 32"
build/release/lumen run -m "$model" --prompt-ids 1,2,3,4,5 -n 32 --ignore-eos
