#!/usr/bin/env bash
# disk_cache_ttft.sh - time to first token of a long prompt served from the
# disk tier after a restart, against cold prefill and a RAM hit, all in the
# same run (docs/benchmarks.md).
#
#   tools/disk_cache_ttft.sh [--bin build/release/lumen] [--model models/demo] [--tokens 4000] [--no-cold2]
#                            [--drop-caches] [--dd-mib 1024] [--work DIR] [--cache-disk 4G]
#                            [--serve-args "ARGS"]
#
# Run 1 (empty --cache-dir): prompt A cold, then A again (RAM hit). The
# server is stopped (SIGTERM) and started again on the same directory.
# Run 2: A (disk hit: nothing in RAM), then a fresh prompt B (cold again,
# in the restarted process; --no-cold2 leaves it out when a cold prefill
# takes minutes: run 1's cold is the peer in the same run). Each request is /v1/completions with token ids
# and max_tokens 1; TTFT is the server's trace span (arrival to first
# token), n_cached and n_cached_disk come from the same trace line. A
# model whose max_position_embeddings is below --tokens + 16 is served as a
# copy (links to its files) with that raised, as tools/cachebench does: the
# tokens are random anyway; this measures time.
#
# --drop-caches drops the page cache (/proc/sys/vm/drop_caches, as root)
# before the restart, so that the disk hit reads the disk, not memory; the
# restore rate (bytes of the entries read over the trace's disk-read time)
# is printed beside the disk's sequential read rate measured in the same
# run: dd of a --dd-mib file in the cache's filesystem, read with
# iflag=direct (0 leaves it out). --work puts the cache on another disk.
# --cache-disk sizes the disk tier (a 32k prompt of an 8B model takes 4 GiB
# in bf16); --serve-args are more `lumen serve` options (--kv-type bf16).
set -euo pipefail
bin=build/release/lumen model=models/demo tokens=4000 port=18977 cold2=1 drop=0 dd_mib=1024 base= disk=4G serve_args=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --no-cold2) cold2=0; shift ;;
    --drop-caches) drop=1; shift ;;
    --dd-mib) dd_mib=$2; shift 2 ;;
    --work) base=$2; shift 2 ;;
    --cache-disk) disk=$2; shift 2 ;;
    --serve-args) serve_args=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d ${base:+-p "$base"})
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
prompt() { python3 -c "import json,random;r=random.Random($1);print(json.dumps({'prompt':[r.randrange(3,4000) for _ in range($tokens)],'max_tokens':1,'temperature':0}))"; }
ctx=$((tokens + 16))
if python3 - "$model/config.json" "$ctx" "$work/model" <<'EOF'
import json, os, sys
cfg = json.load(open(sys.argv[1])); text = cfg.get('text_config', cfg)
if text.get('max_position_embeddings', 0) >= int(sys.argv[2]): sys.exit(1)
text['max_position_embeddings'] = int(sys.argv[2])
src = os.path.dirname(os.path.abspath(sys.argv[1])); os.mkdir(sys.argv[3])
for f in os.listdir(src):
    if f != 'config.json': os.symlink(os.path.join(src, f), os.path.join(sys.argv[3], f))
json.dump(cfg, open(os.path.join(sys.argv[3], 'config.json'), 'w'))
EOF
then model=$work/model; echo "serving a copy of the model with max_position_embeddings $ctx"; fi
prompt 1 >"$work/a.json"
prompt 2 >"$work/b.json"

start() {
  # shellcheck disable=SC2086 # serve_args: several options
  "$bin" serve -m "$model" --port "$port" --cache-dir "$work/cache" --cache-disk "$disk" --trace "$work/trace.jsonl" \
    --quiet $serve_args 2>>"$work/server.log" &
  pid=$!
  for _ in $(seq 1 1200); do
    curl -sf "localhost:$port/health" >/dev/null && return
    kill -0 $pid 2>/dev/null || break # it exited: say why now
    sleep 0.1
  done
  echo "server did not start" >&2; cat "$work/server.log" >&2; exit 1
}
ask() { # label file
  curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' -d @"$2" >/dev/null
  python3 - "$1" "$work/trace.jsonl" "$work/cache" <<'EOF'
import json, os, sys
t = json.loads(open(sys.argv[2]).read().splitlines()[-1])
disk, read_ms = t.get('n_cached_disk', 0), t['ms'].get('cache_disk_read', 0)
line = (f"{sys.argv[1]:<22} ttft {t['ms']['ttft']:9.1f} ms  prompt {t['n_prompt']}  cached {t['n_cached']}"
        f"  from disk {disk}  disk reads {read_ms:.1f} ms")
if disk and read_ms > 0:
    # what a disk hit reads: its KV blocks and (a hybrid) one state checkpoint;
    # an entry's size from a one-entry file (format 1) or a pack's table (2)
    import struct
    sizes = {}
    for f in os.listdir(sys.argv[3]):
        p = os.path.join(sys.argv[3], f)
        if f.endswith(('.kv', '.st')): sizes[f[-2:]] = os.path.getsize(p)
        if f.endswith('.pk'):
            b = open(p, 'rb').read(1 << 20)
            for j in range(struct.unpack_from('<I', b, 8)[0]):
                if 48 + 48 * (j + 1) > len(b): break
                nbytes, kind = struct.unpack_from('<Q', b, 48 + 48 * j + 24)[0], struct.unpack_from('<I', b, 48 + 48 * j + 40)[0]
                sizes['kv' if kind == 1 else 'st'] = 48 + nbytes
    b = (disk + 15) // 16 * sizes.get('kv', 0) + sizes.get('st', 0)
    line += f"  restore {b / 2**20:.1f} MiB at {b / 2**20 / (read_ms / 1e3):.0f} MiB/s"
print(line)
EOF
}
seqread() { # the disk's sequential read rate, in the cache's filesystem
  [ "$dd_mib" -gt 0 ] || return 0
  dd if=/dev/urandom of="$work/dd.bin" bs=1M count="$dd_mib" status=none
  sync
  echo "disk sequential read ($dd_mib MiB, dd iflag=direct bs=4M): $(dd if="$work/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -n 1)"
  rm -f "$work/dd.bin"
}
start
ask "cold (run 1)" "$work/a.json"
ask "RAM hit (run 1)" "$work/a.json"
kill -TERM $pid; wait $pid || true
seqread
if [ "$drop" = 1 ]; then
  sync
  if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then echo "page cache dropped before the restart"
  else echo "could not drop the page cache: the disk hit may read memory"; fi
fi
start
ask "disk hit after restart" "$work/a.json"
[ "$cold2" = 1 ] && ask "cold (run 2)" "$work/b.json"
curl -sf "localhost:$port/metrics" | grep -E '^lumen_(prefix_cache_tier_hit_tokens_total|disk_cache_(entries|bytes|reads_total))'
grep "disk cache" "$work/server.log" | tail -1
