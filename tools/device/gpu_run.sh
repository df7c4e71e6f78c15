#!/usr/bin/env bash
# Runs on the GPU machine, from the checkout's root, with .device-carry/
# carried (tools/device/pack.sh made it here):
#   bash tools/device/gpu_run.sh check   GPU op tests, then the whole suite with
#                                         models on the GPU, then lumen parity
#   bash tools/device/gpu_run.sh cuda    the GPU op tests alone
#   bash tools/device/gpu_run.sh parity  lumen parity --device cuda alone
#   bash tools/device/gpu_run.sh suite F  the tests whose names contain F, models on the GPU
#   bash tools/device/gpu_run.sh bench   the H200 benchmarks of docs/benchmarks.md
# Modes run in the order given (bench SET... last): `cuda parity bench prefill`.
# Logs go to $OUT (what comes back) as well as stdout.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# the pack holds one of the fixture sets: the others' tests skip, saying so
dev_unpack cublas
L=$C/bin/lumen
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader
cuda_tests() { timeout 200 "$C/bin/lumen_tests" cuda 2>&1 | tee "$OUT/cuda_tests.log" | grep -v "^  ok\|^ok " | tail -n 60; }
parity() {
  for d in "$C"/fixtures/models/*/ "$root"/tests/data/{hybrid,moe,gemma}/*/ "$root/models/demo"; do
    [[ -f "$d/reference.safetensors" ]] || continue
    "$L" parity "$d" --device cuda 2>&1 | tail -n 1
  done | tee "$OUT/parity_gpu.jsonl" | cut -c1-220
}
[[ $# -gt 0 ]] || set -- usage
while [[ $# -gt 0 ]]; do
  mode=$1; shift
  case "$mode" in
  check)
    ldd "$L" | grep -E "not found|cublas" || true
    cuda_tests
    LUMEN_TEST_DEVICE=cuda timeout 300 "$C/bin/lumen_tests" 2>&1 | tee "$OUT/suite_on_gpu.log" | grep -E "FAIL|fail|passed|Abort|assert" | tail -n 40
    parity ;;
  cuda) cuda_tests ;; # the GPU op tests alone
  parity) parity ;;   # lumen parity --device cuda on every carried fixture and tests/data model
  suite) # the tests whose names contain $1 with models on the GPU
    LUMEN_TEST_DEVICE=cuda timeout 300 "$C/bin/lumen_tests" "$1" 2>&1 | tee "$OUT/suite_$1.log" | grep -v "^  ok\|^ok " | tail -n 40
    shift ;;
  bench) bash "$root/tools/device/h200_bench.sh" "$@" 2>&1 | tee "$OUT/bench.log"; break ;;
  *) echo "usage: $0 MODE... (check | cuda | parity | suite FILTER | bench SET..., bench last)" >&2; exit 2 ;;
  esac
done
