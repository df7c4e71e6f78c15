#!/usr/bin/env bash
# record_pi_session.sh - records the agent session the `agent` workload
# ships (sessions/pi-demo.json): pi-coding-agent (tests/agents/pi, pinned)
# in three print-mode turns of one session (-p, then -c -p twice) against
# `lumen serve` on the demo model, through `lumen bench-serve record`.
#
# The demo model is too small to choose tools itself, so the server runs with
# --debug-tool-call read={"path":"notes.txt"}: each turn that ends with the
# user's message is answered with that call, pi really runs its read tool,
# and the answer after the tool result is the model's own. Everything else
# (system prompt, tool definitions, history) is pi's.
#
#   bash tools/benchserve/record_pi_session.sh [OUT.json]
#
# Needs build/release/lumen (or LUMEN_BIN) and `npm install` in tests/agents/pi.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${LUMEN_BIN:-$root/build/release/lumen}
pi=$root/tests/agents/pi/node_modules/.bin/pi
out=${1:-$root/tools/benchserve/sessions/pi-demo.json}
[[ -x $pi ]] || { echo "pi not installed: (cd tests/agents/pi && npm install --no-save)"; exit 1; }
tmp=$(mktemp -d)
trap 'kill $srv $rec 2>/dev/null || true; rm -rf "$tmp"' EXIT

"$bin" serve -m "$root/models/demo" --alias demo --port 0 --threads 1 \
  --debug-tool-call 'read={"path":"notes.txt"}' 2>"$tmp/lumen.log" &
srv=$!
for _ in $(seq 100); do grep -q 'http://127.0.0.1:' "$tmp/lumen.log" && break; sleep 0.2; done
upstream=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/lumen.log" | head -1)
port=$((20000 + RANDOM % 20000))
"$bin" bench-serve record --listen "$port" --upstream "$upstream" --out "$tmp/rec" --quiet &
rec=$!
sleep 1

mkdir -p "$tmp/home/.pi/agent" "$tmp/work"
cat >"$tmp/home/.pi/agent/models.json" <<JSON
{ "providers": { "lumen": { "baseUrl": "http://127.0.0.1:$port/v1", "api": "openai-completions", "apiKey": "unused",
  "compat": { "supportsDeveloperRole": false, "supportsReasoningEffort": false },
  "models": [{ "id": "demo", "contextWindow": 4096, "maxTokens": 256 }] } } }
JSON
echo '{ "compaction": { "enabled": false } }' >"$tmp/home/.pi/agent/settings.json"
printf 'def add(a, b):\n    return a + b\n\nTODO: a function that multiplies two numbers.\n' >"$tmp/work/notes.txt"

turn() { (cd "$tmp/work" && HOME=$tmp/home PI_CODING_AGENT_DIR=$tmp/home/.pi/agent PI_OFFLINE=1 PI_TELEMETRY=0 \
  timeout 120 "$pi" --provider lumen --model demo --offline --session-dir "$tmp/sessions" "$@" </dev/null); }
turn -p 'Read notes.txt and tell me what it contains.'
turn -c -p 'Now read it again and write the multiply function it asks for.'
turn -c -p 'Check notes.txt once more: is anything else left to do?'

mkdir -p "$(dirname "$out")"
node -e '
const s = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
s.how_made = "pi-coding-agent (tests/agents/pi) in three print-mode turns of one session against lumen serve on models/demo with --debug-tool-call read={\"path\":\"notes.txt\"}, recorded by lumen bench-serve record (tools/benchserve/record_pi_session.sh)";
require("fs").writeFileSync(process.argv[2], JSON.stringify(s, null, 1) + "\n");
' "$tmp/rec/session.json" "$out"
echo "wrote $out: $(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).turns.length)' "$out") turns"
