#!/usr/bin/env bash
# disk_cache_faults.sh BIN MODEL WORKDIR CASE - test_disk_cache_engine's
# server side of the disk tier's fault tests. Each case makes one I/O path
# fail under a real server, then checks that the server still starts,
# answers exactly what a server without a disk tier answers, and says what
# it discarded, in its log and in /metrics:
#   write, fsync, rename  every write fails at that call (ENOSPC, EIO, EIO,
#                         injected through LUMEN_DISK_FAULTS): nothing is
#                         kept, no temp file is left, a restart starts clean
#   read                  the second read at a restart fails (EIO: the
#                         second pack's): that entry is dropped, the rest
#                         of the prefix recomputed
#   scan                  a header read while the index is rebuilt fails:
#                         that pack is deleted
#   notdir                --cache-dir names a regular file: the server
#                         starts on its RAM cache, lumen_disk_cache_enabled 0
#   unreadable            the same for a directory of mode 000 (as root,
#                         which ignores permissions: skipped, say why)
#   tmpfs                 a real 384 KiB tmpfs fills up (needs mount;
#                         skipped, saying why, where it is refused)
# Prints "ok DETAIL", "skip: why" or "fail: why".
set -u
bin=$1 model=$2 work=$3 case=$4
mkdir -p "$work"
pid=
start() { # cache-dir-or-empty [faults]
  : >"$work/log"
  local args=()
  [ -n "$1" ] && args=(--cache-dir "$1")
  LUMEN_DISK_FAULTS=${2:-} "$bin" serve -m "$model" --port 0 --cache-ram 64M --quiet "${args[@]}" 2>"$work/log" &
  pid=$!
  for _ in $(seq 1 400); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/log" | head -n 1)
    [ -n "$url" ] && return 0
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  echo "fail: the server did not start: $(cat "$work/log")"
  exit 0
}
stop() { kill -TERM $pid; wait $pid; pid=; }
cleanup() {
  [ -n "$pid" ] && kill -KILL $pid 2>/dev/null
  [ -d "$work/unreadable" ] && chmod 755 "$work/unreadable"
  mountpoint -q "$work/small" 2>/dev/null && umount "$work/small"
}
trap cleanup EXIT
body() { # seed -> a completion request of 200 words (about 770 tokens)
  python3 -c "import json,random;r=random.Random($1);print(json.dumps({'prompt':' '.join('w%d'%r.randrange(500) for _ in range(200)),'max_tokens':8,'temperature':0}))"
}
ask() { curl -s --max-time 60 "$url/v1/completions" -H 'content-type: application/json' -d "$(body "$1")"; }
field() { python3 -c "import json,sys;d=json.load(sys.stdin);print(d$1)"; }
text() { ask "$1" | field "['choices'][0]['text']"; }
metric() { # name-with-labels -> value (empty when absent)
  curl -s "$url/metrics" | awk -v k="$1" '$1 == k { print $2 }'
}
fail() { echo "fail: $*"; exit 0; }
discarded() { metric "lumen_disk_cache_discarded_total{reason=\"$1\"}"; }
logged() { grep -q -- "$1" "$work/log" || fail "the log does not say '$1': $(cat "$work/log")"; }

# every case compares with a server that has no disk tier
start ""
ref=$(text 1)
[ -n "$ref" ] || fail "no reference answer"
stop
cache=$work/cache

case $case in
write | fsync | rename)
  err=EIO msg="Input/output error"
  [ "$case" = write ] && err=ENOSPC msg="No space left on device"
  start "$cache" "$case:$err"
  [ "$(text 1)" = "$ref" ] || fail "$case fault: the answer differs"
  [ "$(text 1)" = "$ref" ] || fail "$case fault: the repeat's answer differs"
  n=$(discarded write_error)
  [ "${n:-0}" -ge 1 ] || fail "$case fault: write_error is '$n'"
  [ "$(metric lumen_disk_cache_writes_total)" = 0 ] || fail "$case fault: entries counted as written"
  logged "failed: $msg"
  stop
  left=$(ls "$cache" | grep -c -E '^tmp-|\.pk$')
  [ "$left" = 0 ] || fail "$case fault: $left files left in the cache: $(ls "$cache")"
  start "$cache"
  out=$(ask 1)
  [ "$(echo "$out" | field "['choices'][0]['text']")" = "$ref" ] || fail "after the $case faults: the answer differs"
  [ "$(echo "$out" | field "['usage']['prompt_tokens_details']['cached_tokens']")" = 0 ] ||
    fail "after the $case faults: something was served from the cache"
  stop
  echo "ok $n write errors"
  ;;
read | scan)
  start "$cache"
  text 1 >/dev/null
  stop
  packs=$(ls "$cache" | grep -c -E '\.pk$')
  [ "$packs" -ge 2 ] || fail "only $packs packs written"
  if [ "$case" = read ]; then
    start "$cache" "read:EIO:1:1"
  else
    start "$cache" "scan:EIO:0:1"
    logged "cannot be read: Input/output error; deleted"
    [ "$(ls "$cache" | grep -c -E '\.pk$')" = $((packs - 1)) ] || fail "scan fault: the pack was not deleted"
  fi
  out=$(ask 1)
  [ "$(echo "$out" | field "['choices'][0]['text']")" = "$ref" ] || fail "$case fault: the answer differs"
  cached=$(echo "$out" | field "['usage']['prompt_tokens_details']['cached_tokens']")
  [ "$case" = scan ] || logged "Input/output error; dropped, the prefix is computed again"
  [ "$(discarded read_error)" = 1 ] || fail "$case fault: read_error is '$(discarded read_error)'"
  stop
  start "$cache"
  [ "$(text 1)" = "$ref" ] || fail "after the $case fault: the answer differs"
  stop
  echo "ok $cached cached with the fault"
  ;;
notdir | unreadable)
  dir=$work/notdir
  if [ "$case" = notdir ]; then
    echo "a file, not a directory" >"$dir"
  else
    if [ "$(id -u)" = 0 ]; then
      echo "skip: runs as root, which ignores a directory's permissions (the notdir and scan cases cover a cache that cannot be opened or read)"
      exit 0
    fi
    dir=$work/unreadable
    mkdir -p "$dir"
    chmod 000 "$dir"
  fi
  start "$dir"
  logged "disk cache off: "
  [ "$(metric lumen_disk_cache_enabled)" = 0 ] || fail "$case: lumen_disk_cache_enabled is '$(metric lumen_disk_cache_enabled)'"
  [ "$(text 1)" = "$ref" ] || fail "$case: the answer differs"
  out=$(ask 1)
  [ "$(echo "$out" | field "['usage']['prompt_tokens_details']['cached_tokens']")" -gt 0 ] ||
    fail "$case: the RAM cache does not serve either"
  stop
  echo "ok"
  ;;
tmpfs)
  small=$work/small
  mkdir -p "$small"
  if ! why=$(mount -t tmpfs -o size=384k tmpfs "$small" 2>&1); then
    echo "skip: cannot mount a tmpfs here: ${why:-refused}"
    exit 0
  fi
  refs=("$ref")
  start ""
  for s in 2 3 4; do refs+=("$(text $s)"); done
  stop
  start "$small/cache"
  for s in 1 2 3 4; do
    [ "$(text $s)" = "${refs[$((s - 1))]}" ] || fail "tmpfs: prompt $s: the answer differs"
  done
  n=$(discarded write_error)
  [ "${n:-0}" -ge 1 ] || fail "tmpfs: the disk never filled (write_error '$n', $(df -k "$small" | tail -n 1))"
  logged "No space left on device"
  stop
  start "$small/cache"
  for s in 4 1; do
    [ "$(text $s)" = "${refs[$((s - 1))]}" ] || fail "tmpfs, after a restart: prompt $s: the answer differs"
  done
  stop
  echo "ok $n write errors"
  ;;
*) fail "unknown case $case" ;;
esac
