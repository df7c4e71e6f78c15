# run.sh - sourced by the spec_bench matrices: run LABEL ARGS... appends one
# `lumen bench -m models/demo --spec ...` JSON line to $out, with "label"
# and the machine's load average added. Needs B (build dir), t (threads),
# reps and out set by the caller.
run() {
    local label=$1; shift
    local load; load=$(cut -d' ' -f1 /proc/loadavg)
    "$B/lumen" bench -m models/demo -t "$t" --gen 128 --reps "$reps" "$@" 2>/dev/null | tail -n 1 |
        sed "s/^{/{\"label\":\"$label\",\"load\":$load,/" >> "$out"
}
