#!/usr/bin/env bash
# benchserve_h200.sh - issue #33's H200 run in one call (~4 minutes): two
# lumen servers on the GPU with one model (MODEL, default the demo), prefix cache on and off
# (`--cache-ram 0`), driven by `lumen bench-serve` with 32 concurrent users
# of the shared-prefix workload in paired AB/BA blocks; the results JSON,
# the HTML report and the markdown tables come back in $OUT.
# The GPU image has no node: carry .device-carry holding bin/lumen.xz (a
# CUDA build, stripped), lib.tar.xz (lib/: its shared libraries outside
# glibc and CUDA) and node.xz (this machine's /usr/bin/node); all of it and
# the checkout must fit 64 MiB, which the fat CUDA binary, node and the
# demo model together do not: MODEL=.device-carry/model (a fixture) then.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mkdir -p /tmp/nodebin
xz -dc "$C/node.xz" > /tmp/nodebin/node && chmod +x /tmp/nodebin/node
[[ -f $C/bin/lumen.xz ]] && xz -d "$C/bin/lumen.xz" && chmod +x "$C/bin/lumen"
[[ -f $C/lib.tar.xz ]] && tar -C "$C" -xJf "$C/lib.tar.xz"
M=${MODEL:-models/demo}
export PATH=/tmp/nodebin:$PATH
dev_libs
export LUMEN_BENCHSERVE=$root/tools/benchserve/benchserve.mjs
L=$C/bin/lumen
node --version; nvidia-smi --query-gpu=name --format=csv,noheader
PAR=${PAR:-32}
"$L" serve -m "$M" --device cuda --port 8081 --parallel "$PAR" > "$OUT/on.log" 2>&1 &
on=$!
"$L" serve -m "$M" --device cuda --port 8082 --parallel "$PAR" --cache-ram 0 > "$OUT/off.log" 2>&1 &
off=$!
for p in 8081 8082; do
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$p/health" > /dev/null && break; sleep 1; done
done
head -n 2 "$OUT/on.log"
log "bench-serve, shared prefix, concurrency $PAR"
"$L" bench-serve --url http://127.0.0.1:8081,http://127.0.0.1:8082 --name cache-on,cache-off --workload shared-prefix \
  --requests "${REQ:-64}" --prefix-len 800 --input-len 16 --output-len 32 --concurrency "$PAR" --blocks 5 --seed 1 \
  --out "$OUT/33-h200-shared-prefix.json" 2>&1 | tail -n 25
"$L" report "$OUT/33-h200-shared-prefix.json" --html "$OUT/33-h200-shared-prefix.html"
"$L" report "$OUT/33-h200-shared-prefix.json" --markdown > "$OUT/33-h200-shared-prefix.md"
cat "$OUT/33-h200-shared-prefix.md"
kill $on $off; wait
log done
