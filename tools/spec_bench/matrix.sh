#!/usr/bin/env bash
# matrix.sh - the speculative-decoding benchmark matrix of docs/benchmarks.md
# (issue #30) on the CPU: `lumen bench --spec` for each proposer, workload
# and batch size, the per-position rollback against copy-and-replay
# (--spec-replay) in the same round, and bench_spec_rollback.
#
#   tools/spec_bench/matrix.sh BUILD_DIR PROMPT_DIR OUT_FILE [THREADS] [REPS]
#
# PROMPT_DIR holds code.jsonl, chat.jsonl and edit.jsonl
# (tools/spec_bench/workloads.py). One JSON line per run goes to OUT_FILE,
# with "label" and the machine's load average added; the rollback timings to
# OUT_FILE.rollback.
set -uo pipefail
B=$1 W=$2 out=$3 t=${4:-2} reps=${5:-5}
: > "$out"
"$B/bench_spec_rollback" models/demo "$t" 600 > "$out.rollback"
source "$(dirname "${BASH_SOURCE[0]}")/run.sh"
for w in code chat edit; do
    for mode in mtp lookup auto; do
        run "$mode $w b1" --spec $mode --prompts "$W/$w.jsonl" --batch 1
    done
    run "mtp $w b1 replay" --spec mtp --spec-replay --prompts "$W/$w.jsonl" --batch 1
done
run "mtp2 fixed code b1" --spec mtp --spec-draft 2 --spec-fixed --prompts "$W/code.jsonl" --batch 1
run "mtp2 fixed code b1 replay" --spec mtp --spec-draft 2 --spec-fixed --spec-replay --prompts "$W/code.jsonl" --batch 1
run "lookup6 fixed edit b1" --spec lookup --spec-draft 6 --spec-fixed --prompts "$W/edit.jsonl" --batch 1
run "lookup6 fixed edit b1 replay" --spec lookup --spec-draft 6 --spec-fixed --spec-replay --prompts "$W/edit.jsonl" --batch 1
for mode in mtp lookup auto; do
    run "$mode code b8" --spec $mode --prompts "$W/code.jsonl" --batch 8
    run "$mode edit b8" --spec $mode --prompts "$W/edit.jsonl" --batch 8
done
