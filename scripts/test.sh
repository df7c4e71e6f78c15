#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds lumen twice (Release, and
# with AddressSanitizer + UndefinedBehaviorSanitizer), runs every test in both
# builds (the CUDA backend is compiled in the Release build only: the
# sanitizers do not reach GPU code, and its nvcc time was a fifth of the
# suite on 2 cores), then the end-to-end tests against the Release server (the openai SDK,
# real agent CLIs), and ends with the combined line "N passed, N failed, N skipped".
#
# Speed (CI has 2 cores and 15 minutes for this): the tests of a build run
# in one runner a core, sharing the test files through a counter
# (LUMEN_TEST_QUEUE, tests/runner.c); the tests alone use ~1.2 cores. With
# no GPU visible the CUDA code is compiled for Hopper only (sm_90, the
# GPUs lumen is tuned and measured on) and unoptimised (LUMEN_CUDA_CHECK_ONLY:
# nvcc -G): every GPU test skips there, each further architecture is
# another full pass of nvcc (~40 s of cuda_gemv.cu alone), and the
# optimiser is half of nvcc's time (the Release build 214-226 s -> ~110 s
# on the 2-core VM). LUMEN_CUDA_ARCHS overrides the targets (and keeps the
# optimiser).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
source scripts/build_progress.sh
jobs=$(nproc)

total_pass=0 total_fail=0 total_skip=0 status=0
run_suite() { # name build-dir cmake-args...
  local name=$1 dir=$2
  shift 2
  echo "== $name: configure and build ($dir)"
  if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.log" 2>&1 ||
     ! build_with_progress "$name" "$dir.log" cmake --build "$dir" -j"$jobs"; then
    cat "$dir.log"
    echo "== $name: build FAILED"
    total_fail=$((total_fail + 1)); status=1
    return
  fi
  echo "== $name: tests ($runners runners)"
  local t0=$SECONDS r queue="$dir.tests.queue" ran=0 want
  local -a pids=()
  want=$("$dir/lumen_tests" --count)
  rm -f "$queue"
  for ((r = 0; r < runners; r++)); do
    LUMEN_TEST_QUEUE=$queue "$dir/lumen_tests" >"$dir.tests.$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < runners; r++)); do
    wait "${pids[r]}"
    local rc=$?
    cat "$dir.tests.$r.log"
    local out
    out=$(tail -n 1 "$dir.tests.$r.log")
    if [[ $out =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
      total_pass=$((total_pass + BASH_REMATCH[1]))
      total_fail=$((total_fail + BASH_REMATCH[2]))
      total_skip=$((total_skip + BASH_REMATCH[3]))
      ran=$((ran + BASH_REMATCH[1] + BASH_REMATCH[2] + BASH_REMATCH[3]))
    else
      echo "== $name: test runner $r did not finish (exit $rc)"
      total_fail=$((total_fail + 1))
    fi
    [[ $rc == 0 ]] || status=1
  done
  if [[ $ran != "$want" ]]; then # a file the runners lost, or ran twice
    echo "== $name: the runners ran $ran tests of $want"
    total_fail=$((total_fail + 1)); status=1
  fi
  echo "== $name: the tests took $((SECONDS - t0))s"
}

runners=$(( jobs < 2 ? 1 : (jobs > 4 ? 4 : jobs) ))
# (set each time: CMake keeps the last value in build/release's cache)
if [[ -n ${LUMEN_CUDA_ARCHS:-} ]]; then
  cuda_archs=(-DLUMEN_CUDA_ARCHS="$LUMEN_CUDA_ARCHS" -DLUMEN_CUDA_CHECK_ONLY=OFF)
elif nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda_archs=(-DLUMEN_CUDA_ARCHS="90-real;90-virtual;80-real" -DLUMEN_CUDA_CHECK_ONLY=OFF) # CMakeLists.txt's defaults
else
  cuda_archs=(-DLUMEN_CUDA_ARCHS=90-real -DLUMEN_CUDA_CHECK_ONLY=ON)
fi

mkdir -p build
run_suite release build/release "${cuda_archs[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_suite sanitizers build/asan -DLUMEN_SANITIZE=ON -DLUMEN_CUDA=OFF

# Adds the "# pass / # fail / # skipped" lines of a node --test log to the
# totals; a log without them (the run did not finish) counts one failure.
count_tap() { # name log exit-status
  local name=$1 log=$2 rc=$3 pass fail skip
  pass=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log" | tail -n 1)
  fail=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log" | tail -n 1)
  skip=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$log" | tail -n 1)
  if [[ -z $pass || -z $fail ]]; then
    echo "== $name: node --test did not finish (exit $rc)"
    total_fail=$((total_fail + 1))
  else
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail)); total_skip=$((total_skip + ${skip:-0}))
  fi
  [[ $rc == 0 ]] || status=1
}

# npm ci in DIR, then its node --test files against the Release binary.
node_step() { # name dir time-limit-seconds
  local name=$1 dir=$2 limit=$3
  echo "== $name: npm ci and node --test ($dir)"
  if ! (cd "$dir" && npm ci --no-audit --no-fund >"$root/build/$name.npm.log" 2>&1); then
    cat "build/$name.npm.log"
    echo "== $name: npm ci FAILED"
    total_fail=$((total_fail + 1)); status=1
    return
  fi
  local t0=$SECONDS
  (cd "$dir" && LUMEN_BIN="$root/build/release/lumen" timeout "$limit" node --test) 2>&1 | tee "build/$name.log"
  count_tap "$name" "build/$name.log" "${PIPESTATUS[0]}"
  echo "== $name: node --test took $((SECONDS - t0))s"
}

root=$PWD
# End-to-end: the Release server driven by the official openai npm SDK.
node_step e2e tests/e2e 600
# The chat page (GET /) in headless Chromium, driven by puppeteer-core.
node_step web tests/web 300
# lumen bench-serve: its statistics, workloads, client, and a paired run of
# two lumen configurations whose report opens in headless Chromium.
node_step bench tests/bench 300

# Agents: real coding-agent CLIs from npm (pi-coding-agent, qwen-code, opencode,
# Claude Code, Codex),
# one turn each against the Release server on the demo model, offline
# (tests/agents/README.md); about a minute on the 2-core VM.
echo "== agents: npm install and node --test (tests/agents)"
LUMEN_BIN="$PWD/build/release/lumen" timeout 900 bash tests/agents/run.sh 2>&1 | tee build/agents.log
count_tap agents build/agents.log "${PIPESTATUS[0]}"

echo "== the suite took $((SECONDS / 60)) min $((SECONDS % 60)) s"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
