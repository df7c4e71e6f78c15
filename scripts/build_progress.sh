# build_progress.sh - sourced by the build scripts: runs a build with its
# whole output kept in a log, showing only its progress: one updating line on
# a terminal, else a line per 10 %, each with the seconds elapsed.
#   build_with_progress NAME LOG COMMAND...   (appends to LOG; COMMAND's status)
build_with_progress() {
  local name=$1 log=$2
  shift 2
  "$@" 2>&1 | tee -a "$log" | _build_progress_lines "$name"
  local rc=${PIPESTATUS[0]}
  return "$rc"
}

# Reads make's "[ 45%]" or ninja's "[12/200]" lines and reports them.
_build_progress_lines() {
  local name=$1 start=$SECONDS shown=-10 pct line tty=0
  [[ -t 1 ]] && tty=1
  while IFS= read -r line; do
    if [[ $line =~ ^\[\ *([0-9]+)%\] ]]; then
      pct=${BASH_REMATCH[1]}
    elif [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      pct=$((100 * BASH_REMATCH[1] / BASH_REMATCH[2]))
    else
      continue
    fi
    if ((tty)); then
      printf '\r== %s: building %3d%% (%ds)' "$name" "$pct" $((SECONDS - start))
    elif ((pct / 10 > shown / 10)); then
      printf '== %s: building %3d%% (%ds)\n' "$name" "$pct" $((SECONDS - start))
      shown=$pct
    fi
  done
  ((tty)) && printf '\n'
  printf '== %s: the build took %ds\n' "$name" $((SECONDS - start))
}
