#!/usr/bin/env bash
# disk_cache_kill9.sh - kill -9 the server at random moments while its disk
# tier writes, many times over, and check every restart (issue #31).
#
#   tools/disk_cache_kill9.sh [--bin BIN] [--model DIR] [--iterations N]
#                             [--work DIR] [--cache-disk SIZE]
#
# The suite's test (tests/data/disk_cache_kill9.sh, 8 rounds) stays short;
# this runs hundreds. One clean server records a prompt's greedy answer.
# Then each iteration starts a server on the same --cache-dir, which must
# start (deleting the temp files of the write the last kill cut short),
# answer that prompt exactly (from the disk: cached_tokens says how much),
# take a new prompt of ~1,500 tokens and be killed with SIGKILL 0-0.99 s
# later, while its writer is busy. --cache-disk is small (64M) so that
# eviction runs under the kills too. Prints one line per failure and a
# summary: iterations, failures, temp files and corrupt entries found at
# starts, and the cached tokens of the checks (min / mean / max).
# Exit status 0 when no iteration failed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/release/lumen model=$root/models/demo n=300 work= disk=64M
while [ $# -gt 0 ]; do
  case $1 in
  --bin) bin=$2; shift ;;
  --model) model=$2; shift ;;
  --iterations) n=$2; shift ;;
  --work) work=$2; shift ;;
  --cache-disk) disk=$2; shift ;;
  *) echo "usage: $0 [--bin BIN] [--model DIR] [--iterations N] [--work DIR] [--cache-disk SIZE]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$work" ] || work=$(mktemp -d)
cache=$work/cache
mkdir -p "$work"
pid=
start() {
  : >"$work/log"
  "$bin" serve -m "$model" --port 0 --cache-dir "$cache" --cache-disk "$disk" --cache-ram 64M --quiet 2>"$work/log" &
  pid=$!
  for _ in $(seq 1 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/log" | head -n 1)
    [ -n "$url" ] && return 0
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  return 1
}
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null' EXIT
body() { python3 -c "import json,random;r=random.Random($1);print(json.dumps({'prompt':' '.join('w%d'%r.randrange(500) for _ in range($2)),'max_tokens':8,'temperature':0}))"; }
ask() { curl -s --max-time 120 "$url/v1/completions" -H 'content-type: application/json' -d "$(body "$1" "$2")"; }
field() { python3 -c "import json,sys;d=json.load(sys.stdin);print(d$1)" 2>/dev/null; }

start || { echo "the first server did not start: $(cat "$work/log")"; exit 1; }
ref=$(ask 1 300 | field "['choices'][0]['text']")
kill -TERM $pid; wait $pid; pid=
[ -n "$ref" ] || { echo "no reference answer"; exit 1; }
fails=0 temps=0 corrupt=0 cmin=999999 csum=0 cmax=0 t0=$(date +%s)
for i in $(seq 1 "$n"); do
  if ! start; then
    echo "iteration $i: the server did not start: $(tail -n 3 "$work/log")"
    fails=$((fails + 1)); continue
  fi
  line=$(grep 'disk cache .*interrupted writes' "$work/log")
  t=$(echo "$line" | sed -n 's/.* \([0-9]*\) interrupted writes.*/\1/p')
  c=$(echo "$line" | sed -n 's/.* \([0-9]*\) corrupt,.*/\1/p')
  temps=$((temps + ${t:-0})) corrupt=$((corrupt + ${c:-0}))
  left=$(ls "$cache" | grep -c '^tmp-')
  out=$(ask 1 300)
  text=$(echo "$out" | field "['choices'][0]['text']")
  cached=$(echo "$out" | field "['usage']['prompt_tokens_details']['cached_tokens']")
  if [ "$text" != "$ref" ] || [ "$left" != 0 ]; then
    echo "iteration $i: answer '$text' (want '$ref'), $left temp files left after the start"
    fails=$((fails + 1))
  fi
  cached=${cached:-0}
  csum=$((csum + cached))
  [ "$cached" -lt "$cmin" ] && cmin=$cached
  [ "$cached" -gt "$cmax" ] && cmax=$cached
  ask $((i + 1)) 500 >/dev/null &
  asker=$!
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -KILL $pid
  wait $pid 2>/dev/null
  wait $asker 2>/dev/null
  pid=
done
echo "disk_cache_kill9: $n iterations in $(($(date +%s) - t0)) s, $fails failed; at the starts: $temps temp files" \
  "of interrupted writes deleted, $corrupt corrupt entries; the check prompt's cached tokens" \
  "min $cmin / mean $((csum / n)) / max $cmax; $(ls "$cache" | grep -c -E '\.pk$') packs left"
[ "$fails" = 0 ]
