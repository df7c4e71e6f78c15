#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds lumen twice (Release, and
# with AddressSanitizer + UndefinedBehaviorSanitizer), runs every test in both
# builds, and ends with the combined line "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
jobs=$(nproc)

total_pass=0 total_fail=0 total_skip=0 status=0
run_suite() { # name build-dir cmake-args...
  local name=$1 dir=$2
  shift 2
  echo "== $name: configure and build ($dir)"
  if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.log" 2>&1 ||
     ! cmake --build "$dir" -j"$jobs" >>"$dir.log" 2>&1; then
    cat "$dir.log"
    echo "== $name: build FAILED"
    total_fail=$((total_fail + 1)); status=1
    return
  fi
  echo "== $name: tests"
  "$dir/lumen_tests" 2>&1 | tee "$dir.tests.log"
  local rc=${PIPESTATUS[0]}
  local out
  out=$(tail -n 1 "$dir.tests.log")
  if [[ $out =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
    total_pass=$((total_pass + BASH_REMATCH[1]))
    total_fail=$((total_fail + BASH_REMATCH[2]))
    total_skip=$((total_skip + BASH_REMATCH[3]))
  else
    echo "== $name: the test binary did not finish (exit $rc)"
    total_fail=$((total_fail + 1))
  fi
  [[ $rc == 0 ]] || status=1
}

mkdir -p build
run_suite release build/release
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_suite sanitizers build/asan -DLUMEN_SANITIZE=ON

echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
