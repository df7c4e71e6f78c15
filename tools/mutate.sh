#!/usr/bin/env bash
# mutate.sh - does the test suite notice when a feature breaks?
#
#   tools/mutate.sh [--all] [--list FILE] [--scratch DIR] [--jobs N] [--timeout S] [--check] [ID...]
#
# For each mutation of tools/mutations.txt (or those named by ID), in a
# scratch copy of this checkout: apply the one edit, build the CPU-only test
# binary, run the tests the entry names (or the whole suite with --all), put
# the file back. A mutation is CAUGHT when the tests fail (any non-zero exit,
# a crash or a time-out), MISSED when they pass or only skip. The last line
# is "mutate: N caught, N missed, N errors of N mutations"; the exit status
# is 0 only when every mutation was caught.
#
# Design.
# - The scratch copy (default ${TMPDIR:-/tmp}/lumen-mutate-$UID) is synced
#   with rsync and keeps its build folder between runs, so each mutation
#   costs one file's compile and the links, not a full build. The checkout
#   itself is never edited.
# - make rebuilds from timestamps, so a restored file gets a fresh mtime and
#   the sync never copies mtimes: an old one would leave the mutated object
#   in the build.
# - Before any mutation the same tests run unmutated: a mutation "caught" by
#   a test that fails anyway proves nothing, so a failing baseline stops the
#   run.
# - An edit whose search string is not in the file exactly once is an ERROR
#   (the list has gone stale: the code moved), never silently skipped.
# - The tests find the fixtures through LUMEN_FIXTURES, set to this
#   checkout's ../shared/fixtures when unset (the copy has no ../shared).
#
# List format (tools/mutations.txt): entries separated by blank lines, one
# "key: value" per line, '#' starts a comment line. Keys: id, file (relative
# to the repository root), find (exact text, one line, must occur exactly
# once), replace (its replacement, one line; may be empty), tests (test-name
# filters, space separated: each is run as `lumen_tests FILTER`), desc.
# --check only verifies that every selected entry applies (no build).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
list=$root/tools/mutations.txt
scratch=${TMPDIR:-/tmp}/lumen-mutate-$(id -u)
jobs=$(nproc 2>/dev/null || echo 2)
[[ $jobs -gt 2 ]] && jobs=2
timeout_s=600
all=0
check=0
ids=()

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --all) all=1 ;;
    --check) check=1 ;;
    --list) list=$2; shift ;;
    --scratch) scratch=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --timeout) timeout_s=$2; shift ;;
    -h|--help) usage ;;
    -*) echo "mutate: unknown option $1" >&2; usage ;;
    *) ids+=("$1") ;;
  esac
  shift
done
[[ -f $list ]] || { echo "mutate: no list $list" >&2; exit 2; }
export LC_ALL=C

# ---- the list ----
m_id=() m_file=() m_find=() m_repl=() m_tests=() m_desc=()
parse_list() {
  local line key val cur=-1
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line == \#* ]] && continue
    if [[ -z ${line//[[:space:]]/} ]]; then cur=-1; continue; fi
    key=${line%%:*}
    if [[ $key == "$line" ]]; then echo "mutate: $list: not 'key: value': $line" >&2; exit 2; fi
    val=${line#*:}
    val=${val# }
    if [[ $cur -lt 0 ]]; then
      cur=${#m_id[@]}
      m_id[cur]='' m_file[cur]='' m_find[cur]='' m_repl[cur]='' m_tests[cur]='' m_desc[cur]=''
    fi
    case $key in
      id) m_id[cur]=$val ;;
      file) m_file[cur]=$val ;;
      find) m_find[cur]=$val ;;
      replace) m_repl[cur]=$val ;;
      tests) m_tests[cur]=$val ;;
      desc) m_desc[cur]=$val ;;
      *) echo "mutate: $list: unknown key '$key'" >&2; exit 2 ;;
    esac
  done <"$list"
  local i
  for i in "${!m_id[@]}"; do
    if [[ -z ${m_id[i]} || -z ${m_file[i]} || -z ${m_find[i]} || -z ${m_tests[i]} ]]; then
      echo "mutate: $list: entry $((i + 1)) ('${m_id[i]}') lacks id, file, find or tests" >&2
      exit 2
    fi
  done
}
parse_list

sel=()
if [[ ${#ids[@]} -eq 0 ]]; then
  sel=("${!m_id[@]}")
else
  for want in "${ids[@]}"; do
    found=0
    for i in "${!m_id[@]}"; do
      if [[ ${m_id[i]} == "$want" ]]; then sel+=("$i"); found=1; fi
    done
    [[ $found == 1 ]] || { echo "mutate: no mutation '$want' in $list" >&2; exit 2; }
  done
fi

# ---- one edit ----
# Prints how often $2 occurs in file $1.
count_in() {
  local content rest
  content=$(cat "$1"; printf x)
  content=${content%x}
  rest=${content//"$2"/}
  echo $(( (${#content} - ${#rest}) / ${#2} ))
}
# Replaces the one occurrence of $2 in file $1 by $3.
apply_edit() {
  local content
  content=$(cat "$1"; printf x)
  content=${content%x}
  printf '%s' "${content/"$2"/"$3"}" >"$1"
}

# ---- --check: do the entries still apply? ----
if [[ $check == 1 ]]; then
  bad=0
  for i in "${sel[@]}"; do
    f=$root/${m_file[i]}
    if [[ ! -f $f ]]; then echo "STALE  ${m_id[i]}: ${m_file[i]} does not exist"; bad=$((bad + 1)); continue; fi
    n=$(count_in "$f" "${m_find[i]}")
    if [[ $n != 1 ]]; then echo "STALE  ${m_id[i]}: the search string occurs $n times in ${m_file[i]}"; bad=$((bad + 1))
    else echo "ok     ${m_id[i]}"; fi
  done
  echo "mutate --check: $bad of ${#sel[@]} entries stale"
  [[ $bad == 0 ]]
  exit
fi

# ---- the scratch copy ----
tree=$scratch/tree build=$scratch/build logs=$scratch/logs
mkdir -p "$tree" "$build" "$logs" || exit 1
if [[ -z ${LUMEN_FIXTURES:-} && -f $root/../shared/fixtures/README.md ]]; then
  export LUMEN_FIXTURES=$(cd "$root/../shared/fixtures" && pwd)
fi
echo "mutate: syncing $root -> $tree"
if command -v rsync >/dev/null; then
  # by content, and without copying mtimes: a file that changes gets a fresh
  # one (so make rebuilds it); one restored after a mutation keeps its own
  # (newer than the mutated object); -t would put the old time back on it
  # and leave the mutated object in the build
  rsync -rlpD --checksum --delete --exclude /build --exclude /.git --exclude node_modules "$root/" "$tree/" || exit 1
else
  rm -rf "$tree" && mkdir -p "$tree" && (cd "$root" && tar --exclude ./build --exclude ./.git --exclude node_modules -cf - .) |
    (cd "$tree" && tar -mxf -) || exit 1
fi

# the end-to-end tests need node and the SDK installed in the checkout
e2e_modules=
if command -v node >/dev/null && [[ -d $root/tests/e2e/node_modules/openai ]]; then
  e2e_modules=$root/tests/e2e/node_modules
fi

build_tests() { # log-file
  { cmake -S "$tree" -B "$build" -DLUMEN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$build" -j"$jobs" --target lumen_tests; } >"$1" 2>&1
}

# Runs the tests for entry $1 (or the whole suite); appends to log $2.
# Returns 0 when they pass, 1 when they fail, 3 when nothing ran but skips.
run_tests() {
  local filters=() f rc out status=0
  if [[ $all == 1 ]]; then filters=(""); else read -r -a filters <<<"${m_tests[$1]}"; fi
  [[ $all == 1 && -n $e2e_modules ]] && filters+=(e2e)
  for f in "${filters[@]}"; do
    if [[ $f == e2e || $f == e2e:* ]]; then
      # the end-to-end tests (node + the openai SDK), optionally one test by name
      echo "== node --test ${f#e2e}" >>"$2"
      if [[ -z $e2e_modules ]]; then
        echo "== no node or no $root/tests/e2e/node_modules (npm ci there): not run" >>"$2"
        [[ $status == 0 ]] && status=3
        continue
      fi
      ln -sfn "$e2e_modules" "$tree/tests/e2e/node_modules"
      local pat=()
      [[ $f == e2e:* ]] && pat=(--test-name-pattern "${f#e2e:}")
      (cd "$tree/tests/e2e" && LUMEN_BIN="$build/lumen" timeout "$timeout_s" node --test "${pat[@]}") >>"$2" 2>&1
      rc=$?
      if [[ $rc != 0 ]]; then status=1
      elif ! grep -q '^# pass [1-9]' <(tail -n 12 "$2"); then [[ $status == 0 ]] && status=3; fi
      continue
    fi
    echo "== lumen_tests ${f:-(all)}" >>"$2"
    (cd "$tree" && timeout "$timeout_s" "$build/lumen_tests" $f) >>"$2" 2>&1
    rc=$?
    out=$(tail -n 1 "$2")
    if [[ $rc != 0 ]]; then
      [[ $rc == 124 ]] && echo "== timed out after ${timeout_s}s" >>"$2"
      status=1
    elif [[ $out =~ ^0\ passed ]]; then
      [[ $status == 0 ]] && status=3
    fi
  done
  return $status
}

t_start=$(date +%s)
echo "mutate: baseline build ($build)"
if ! build_tests "$logs/baseline.build.log"; then
  tail -n 30 "$logs/baseline.build.log"
  echo "mutate: the unmutated tree does not build"
  exit 1
fi
# the baseline: every selected filter passes unmutated
declare -A seen=()
: >"$logs/baseline.log"
base_fail=0
for i in "${sel[@]}"; do
  key=$([[ $all == 1 ]] && echo all || echo "${m_tests[i]}")
  [[ -n ${seen[$key]:-} ]] && continue
  seen[$key]=1
  run_tests "$i" "$logs/baseline.log"
  rc=$?
  if [[ $rc == 1 ]]; then echo "mutate: baseline FAILS for tests '$key'"; base_fail=1
  elif [[ $rc == 3 ]]; then echo "mutate: baseline only skips for tests '$key'"; base_fail=1; fi
  [[ $all == 1 ]] && break
done
if [[ $base_fail == 1 ]]; then
  echo "mutate: fix the baseline first ($logs/baseline.log)"
  exit 1
fi
echo "mutate: baseline passes ($(( $(date +%s) - t_start )) s)"

caught=0 missed=0 errors=0
report=()
for i in "${sel[@]}"; do
  id=${m_id[i]} rel=${m_file[i]}
  f=$tree/$rel log=$logs/$id.log
  t0=$(date +%s)
  : >"$log"
  if [[ ! -f $f ]]; then
    line="ERROR  $id: $rel does not exist"
    errors=$((errors + 1)); report+=("$line"); echo "$line"; continue
  fi
  n=$(count_in "$f" "${m_find[i]}")
  if [[ $n != 1 ]]; then
    line="ERROR  $id: the search string occurs $n times in $rel (want exactly 1)"
    errors=$((errors + 1)); report+=("$line"); echo "$line"; continue
  fi
  cp "$f" "$scratch/orig"
  apply_edit "$f" "${m_find[i]}" "${m_repl[i]}"
  if ! build_tests "$log.build"; then
    line="ERROR  $id: the mutated tree does not build ($log.build)"
    errors=$((errors + 1))
  else
    run_tests "$i" "$log"
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    if [[ $rc == 1 ]]; then
      failed=$( { grep -E '^FAIL ' "$log" | sed 's/^FAIL //; s/ (.*//'
                  grep -E '^    not ok [0-9]+ - ' "$log" | sed 's/^    not ok [0-9]* - /e2e: /'; } | tr '\n' ' ')
      line="CAUGHT $id (${secs}s): ${failed:-the test binary failed}"
      caught=$((caught + 1))
    elif [[ $rc == 3 ]]; then
      line="MISSED $id (${secs}s): the tests only skipped"
      missed=$((missed + 1))
    else
      line="MISSED $id (${secs}s): '${m_tests[i]}' passed with the mutation"
      missed=$((missed + 1))
    fi
  fi
  # put it back with a fresh mtime, so that the next build recompiles it
  cat "$scratch/orig" >"$f"
  touch "$f"
  report+=("$line")
  echo "$line"
done

echo
echo "mutate: report ($list, $([[ $all == 1 ]] && echo 'whole suite' || echo 'filtered tests'), $(( $(date +%s) - t_start )) s)"
for line in "${report[@]}"; do echo "  $line"; done
echo "mutate: $caught caught, $missed missed, $errors errors of ${#sel[@]} mutations"
[[ $missed == 0 && $errors == 0 ]]
