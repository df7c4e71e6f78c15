#!/usr/bin/env bash
# test_agents.sh - real coding-agent CLIs from npm (tests/agents: pi-coding-agent,
# qwen-code, opencode, ...) each completing a turn against `lumen serve` on the
# demo model, offline. Apart from scripts/test.sh because it takes longer than
# the rest of the suite can spare (about 100 s on the 2-core VM: npm install
# 4-33 s, the runs 70-80 s). Builds the Release lumen unless LUMEN_BIN names
# one, and ends with "N passed, N failed, N skipped" like scripts/test.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
mkdir -p build
if [[ -z ${LUMEN_BIN:-} ]]; then
  echo "== agents: build lumen (build/release)"
  if ! cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >build/release.agents.log 2>&1 ||
     ! cmake --build build/release -j"$(nproc)" --target lumen >>build/release.agents.log 2>&1; then
    cat build/release.agents.log
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
  fi
  export LUMEN_BIN=$PWD/build/release/lumen
fi

timeout 900 bash tests/agents/run.sh 2>&1 | tee build/agents.log
rc=${PIPESTATUS[0]}
pass=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' build/agents.log | tail -n 1)
fail=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' build/agents.log | tail -n 1)
skip=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' build/agents.log | tail -n 1)
if [[ -z $pass || -z $fail ]]; then
  echo "== agents: node --test did not finish (exit $rc)"
  pass=0 fail=1 skip=0
fi
echo "$pass passed, $fail failed, ${skip:-0} skipped"
[[ $rc == 0 && $fail == 0 ]]
