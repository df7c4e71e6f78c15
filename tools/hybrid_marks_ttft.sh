#!/usr/bin/env bash
# hybrid_marks_ttft.sh - what a hybrid model recomputes when a chat's last
# message changes (issue #31's fine-grained reuse), with TTFT, against the
# same prompts cold, all in one run.
#
#   tools/hybrid_marks_ttft.sh [--bin build/rel/lumen] [--model models/demo] [--words 1500] [--restart]
#
# Chat A: a system prompt, two turns and a last user message of --words
# words. Then B: A with its last message changed half-way; C: A with its
# last message replaced (a departure at the message boundary). With
# --restart the server is restarted on the same --cache-dir before B and
# before C (page cache left as it is), so they come from the disk tier.
# Last, a server without a cache answers B and C cold. Printed per request
# from the server's trace: prompt tokens, shared with the closest earlier
# prompt, cached (from disk), TTFT; and whether B's and C's answers equal
# the cold ones.
set -euo pipefail
bin=build/rel/lumen model=models/demo words=1500 restart=0 port=18979
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --words) words=$2; shift 2 ;;
    --restart) restart=1; shift ;;
    --port) port=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT
python3 - "$work" "$words" <<'PY'
import json, random, sys
work, n = sys.argv[1], int(sys.argv[2])
r = random.Random(7)
vocab = "build log error header linker module symbol flag test runner update library network compiler warning note cause line file path".split()
words = lambda k: " ".join(r.choice(vocab) for _ in range(k))
system = "You are a terse build engineer. " + words(300)
last = words(n)
half = len(last) // 2
variants = {"a": last, "b": last[:half] + " CHANGED HERE " + last[half:], "c": "Never mind: " + words(n // 4)}
turns = [{"role": "system", "content": system}, {"role": "user", "content": words(80)},
         {"role": "assistant", "content": words(60)}]
for k, v in variants.items():
    msgs = turns + [{"role": "user", "content": v}]
    json.dump({"messages": msgs, "max_tokens": 8, "temperature": 0}, open(f"{work}/{k}.json", "w"))
PY
start() { # extra args
  "$bin" serve -m "$model" --port "$port" --trace "$work/trace.jsonl" --quiet "$@" 2>>"$work/server.log" &
  pid=$!
  for _ in $(seq 1 200); do curl -sf "localhost:$port/health" >/dev/null && return; sleep 0.1; done
  echo "server did not start" >&2; cat "$work/server.log" >&2; exit 1
}
stop() { kill -TERM $pid; wait $pid || true; pid=; }
ask() { # label file -> answer in $work/label.out
  curl -sf "localhost:$port/v1/chat/completions" -H 'content-type: application/json' -d @"$2" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' >"$work/$1.out"
  python3 - "$1" "$work/trace.jsonl" <<'PY'
import json, sys
t = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print(f"{sys.argv[1]:<8} prompt {t['n_prompt']:6d}  shared {t['cache']['n_shared']:6d}  cached {t['n_cached']:6d}"
      f"  (disk {t.get('n_cached_disk', 0):6d})  recomputed {t['n_prompt'] - t['n_cached']:6d}  ttft {t['ms']['ttft']:8.1f} ms")
PY
}
cache=(--cache-ram 256M --cache-dir "$work/cache")
start "${cache[@]}"
ask A "$work/a.json"
[ $restart = 1 ] && { stop; start "${cache[@]}"; }
ask B "$work/b.json"
[ $restart = 1 ] && { stop; start "${cache[@]}"; }
ask C "$work/c.json"
stop
start --cache-ram 0
ask B-cold "$work/b.json"
ask C-cold "$work/c.json"
stop
for k in B C; do
  if cmp -s "$work/$k.out" "$work/$k-cold.out"; then echo "$k: same answer as cold"; else echo "$k: DIFFERENT answer from cold"; fi
done
