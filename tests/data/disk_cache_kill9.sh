#!/usr/bin/env bash
# disk_cache_kill9.sh BIN MODEL WORKDIR ROUNDS - test_disk_cache_kill9's
# server side: one clean run records a prompt's greedy answer (its blocks
# go to WORKDIR/cache); then ROUNDS times a server starts on the same cache,
# gets a new prompt and is killed with SIGKILL a random moment later, while
# its writer is busy; last, a server starts once more and must answer the
# first prompt exactly, from the cache, with no temp file left.
# Prints "ok CACHED TEMPS_BEFORE" or "fail: why".
set -u
bin=$1 model=$2 work=$3 rounds=$4
cache=$work/cache
start() {
  : >"$work/log"
  "$bin" serve -m "$model" --port 0 --cache-dir "$cache" --cache-ram 64M --quiet 2>"$work/log" &
  pid=$!
  for _ in $(seq 1 400); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/log" | head -n 1)
    [ -n "$url" ] && return 0
    sleep 0.05
  done
  echo "fail: the server did not start: $(cat "$work/log")"
  exit 0
}
body() { # seed -> a completion request of 500 words (about 1,500 tokens)
  python3 -c "import json,random;r=random.Random($1);print(json.dumps({'prompt':' '.join('w%d'%r.randrange(500) for _ in range(500)),'max_tokens':8,'temperature':0}))"
}
ask() { curl -s --max-time 60 "$url/v1/completions" -H 'content-type: application/json' -d "$(body "$1")"; }
field() { python3 -c "import json,sys;d=json.load(sys.stdin);print(d$1)"; }

start
ref=$(ask 1 | field "['choices'][0]['text']")
kill -TERM $pid; wait $pid
for i in $(seq 1 "$rounds"); do
  start
  ask $((i + 1)) >/dev/null &
  asker=$!
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -KILL $pid
  wait $pid 2>/dev/null
  wait $asker 2>/dev/null
done
temps=$(ls "$cache" | grep -c '^tmp-')
start
out=$(ask 1)
kill -TERM $pid; wait $pid
text=$(echo "$out" | field "['choices'][0]['text']")
cached=$(echo "$out" | field "['usage']['prompt_tokens_details']['cached_tokens']")
left=$(ls "$cache" | grep -c '^tmp-')
[ "$text" = "$ref" ] || { echo "fail: answer after the kills differs: '$text' vs '$ref'"; exit 0; }
[ "$left" = 0 ] || { echo "fail: $left temp files left after a start"; exit 0; }
echo "ok $cached $temps"
