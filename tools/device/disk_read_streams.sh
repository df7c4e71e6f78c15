#!/usr/bin/env bash
# disk_read_streams.sh - how fast the GPU machine's disk reads with 1, 2, 4, 8
# and 16 streams at once (issue #31: can a restore of a 32k-token Llama-8B
# prefix, 4 GiB of bf16 KV, reach the 10 %-of-cold goal by reading in
# parallel?). Writes FILES files of MIB MiB under WORK, then for each stream
# count drops the page cache and reads them all with that many readers at a
# time: dd iflag=direct bs=4M (what the disk gives) and buffered cat (what
# the page cache path gives). Prints GB/s per case. As root.
#   bash tools/device/disk_read_streams.sh      (WORK=/tmp FILES=16 MIB=256)
set -uo pipefail
WORK=${WORK:-/tmp}/streams.$$
FILES=${FILES:-16} MIB=${MIB:-256}
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
df -h "$(dirname "$WORK")" | tail -n 1
for i in $(seq "$FILES"); do
  dd if=/dev/urandom of="$WORK/f$i" bs=1M count="$MIB" status=none
done
sync
total=$((FILES * MIB))
read_all() { # STREAMS MODE: every file read once, STREAMS readers at a time
  local s=$1 mode=$2
  echo 3 >/proc/sys/vm/drop_caches || { echo "cannot drop the page cache"; exit 1; }
  local t0 t1
  t0=$(date +%s.%N)
  ls "$WORK"/f* | xargs -P "$s" -I{} sh -c \
    "if [ $mode = direct ]; then dd if={} of=/dev/null bs=4M iflag=direct status=none; else cat {} >/dev/null; fi"
  t1=$(date +%s.%N)
  python3 -c "import sys; t=$t1-$t0; print(f'{sys.argv[1]:>8} x{int(sys.argv[2]):>2}: {$total/1024:.1f} GiB in {t:.2f} s = {$total*1048576/t/1e9:.2f} GB/s')" "$mode" "$s"
}
for round in 1 2; do
  for s in 1 2 4 8 16; do
    read_all "$s" direct
    read_all "$s" buffered
  done
done
