#!/usr/bin/env bash
# run.sh - the agent CLIs end to end: installs each agent folder's pinned npm
# packages (tests/agents/*/package-lock.json), then runs every
# tests/agents/*/*.test.mjs with `node --test` and prints node's TAP summary
# ("# pass N", "# fail N", "# skipped N").
#
# Offline: where the machine allows it (root, unshare, ip), the tests run in a
# network namespace of their own with only loopback up, so lumen, the proxy
# and the agents talk over 127.0.0.1 and nothing else is reachable; otherwise
# they run as they are and say so ("network isolated: false").
#
# LUMEN_BIN: the lumen binary (default build/release/lumen).
# Why `npm install --no-save` and not `npm ci`: npm records in a lock file
# only the platform packages it installs here (opencode's and qwen-code's
# optional per-platform binaries), and `npm ci` then refuses the lock as out
# of sync. `npm install` with the lock installs exactly the locked versions
# and, with --no-save, writes nothing back.
set -uo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
export LUMEN_BIN=${LUMEN_BIN:-$root/build/release/lumen}
logs=${AGENTS_LOG_DIR:-$root/build/agents}
mkdir -p "$logs"

t0=$EPOCHREALTIME
pids=() names=()
for pkg in */package.json; do
  d=${pkg%/package.json}
  (cd "$d" && npm install --no-save --no-audit --no-fund >"$logs/$d.npm.log" 2>&1) &
  pids+=($!) names+=("$d")
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    cat "$logs/${names[$i]}.npm.log"
    echo "== agents: npm install FAILED in tests/agents/${names[$i]}"
    failed=1
  fi
done
t1=$EPOCHREALTIME
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
echo "== agents: npm install $(secs "$t0" "$t1") s (${names[*]})"
((failed)) && exit 1

# Three test files at once: an agent spends most of a turn starting up, and
# each lumen runs one thread. AGENTS_NETNS=0 skips the network namespace.
if [[ ${AGENTS_NETNS:-1} == 1 ]] && command -v ip >/dev/null && unshare -n true 2>/dev/null; then
  unshare -n sh -c 'ip link set lo up && exec node --test --test-concurrency=3'
else
  node --test --test-concurrency=3
fi
rc=$?
t2=$EPOCHREALTIME
echo "== agents: node --test $(secs "$t1" "$t2") s"
exit $rc
