#!/usr/bin/env bash
# disk_cache_agent.sh - the agent-replay workload across a server restart
# (issue #31, docs/benchmarks.md): the same recorded agent sessions
# (tools/benchserve/sessions, `lumen bench-serve --workload agent`) are
# replayed three times against one --cache-dir:
#   cold      a fresh server, an empty cache: each turn hits only the
#             turns before it
#   RAM       the same sessions again in the same process
#   restart   the server stopped (SIGTERM) and started again on the same
#             directory (--drop-caches first drops the page cache, as
#             root): the prefixes come back from disk
# and prints, per replay, the sum and median of the turns' TTFT and the
# prompt tokens served from the cache, from RAM and from disk (the
# server's trace).
#
#   tools/disk_cache_agent.sh [--bin build/release/lumen] [--model models/demo]
#                             [--sessions N] [--output-len N] [--seed S] [--drop-caches]
set -euo pipefail
bin=build/release/lumen model=models/demo n=4 out_len=16 seed=7 drop=0 port=18978
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --sessions) n=$2; shift 2 ;;
    --output-len) out_len=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --drop-caches) drop=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT
start() {
  "$bin" serve -m "$model" --port "$port" --cache-dir "$work/cache" --trace "$work/trace.jsonl" --quiet \
    2>>"$work/server.log" &
  pid=$!
  for _ in $(seq 1 200); do curl -sf "localhost:$port/health" >/dev/null && return; sleep 0.1; done
  echo "server did not start" >&2; cat "$work/server.log" >&2; exit 1
}
replay() { # label
  local from
  from=$(wc -l <"$work/trace.jsonl" 2>/dev/null || echo 0)
  "$bin" bench-serve --url "http://127.0.0.1:$port" --workload agent --requests "$n" --blocks 1 --warmup 0 \
    --output-len "$out_len" --seed "$seed" --quiet --out "$work/$1.json" >/dev/null
  python3 - "$1" "$work/trace.jsonl" "$from" <<'EOF'
import json, statistics, sys
t = [json.loads(l) for l in open(sys.argv[2]).read().splitlines()[int(sys.argv[3]):]]
t = [x for x in t if 'n_prompt' in x]
ttft = [x['ms']['ttft'] for x in t]
prompt, cached = sum(x['n_prompt'] for x in t), sum(x['n_cached'] for x in t)
disk = sum(x.get('n_cached_disk', 0) for x in t)
print(f"{sys.argv[1]:<8} {len(t)} turns  TTFT sum {sum(ttft):8.1f} ms  median {statistics.median(ttft):7.1f} ms  "
      f"prompt {prompt}  cached {cached} ({100 * cached / prompt:.1f} %; from RAM {cached - disk}, from disk {disk})")
EOF
}
start
replay cold
replay RAM
kill -TERM $pid; wait $pid || true; pid=
if [ "$drop" = 1 ]; then
  sync
  if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then echo "page cache dropped before the restart"
  else echo "could not drop the page cache"; fi
fi
start
replay restart
kill -TERM $pid; wait $pid || true; pid=
grep "disk cache" "$work/server.log" | tail -n 1
