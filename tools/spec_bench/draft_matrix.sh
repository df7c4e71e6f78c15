#!/usr/bin/env bash
# draft_matrix.sh - issue #30's draft-model rows of docs/benchmarks.md on the
# CPU: `lumen bench --spec draft:PATH` with early-exit drafts of the demo
# (its first 4 and 6 of 8 layers, tools/spec_bench/truncate_model.py),
# adaptive and at a fixed depth, beside lookup and the MTP head in the same
# session, on the three workloads (tools/spec_bench/workloads.py), batch 1
# and 4. One JSON line per run to OUT_FILE with "label" and the load average.
#
#   tools/spec_bench/draft_matrix.sh BUILD_DIR PROMPT_DIR OUT_FILE [THREADS] [REPS]
set -uo pipefail
B=$1 W=$2 out=$3 t=${4:-2} reps=${5:-5}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for n in 4 6; do python3 tools/spec_bench/truncate_model.py models/demo "$tmp/demo$n" $n >/dev/null || exit 1; done
: > "$out"
source "$(dirname "${BASH_SOURCE[0]}")/run.sh"
for w in code chat edit; do
    for b in 1 4; do
        run "lookup $w b$b" --spec lookup --prompts "$W/$w.jsonl" --batch $b
        run "mtp $w b$b" --spec mtp --prompts "$W/$w.jsonl" --batch $b
        for n in 4 6; do run "draft$n $w b$b" --spec "draft:$tmp/demo$n" --prompts "$W/$w.jsonl" --batch $b; done
    done
    run "draft6 fixed2 $w b1" --spec "draft:$tmp/demo6" --spec-draft 2 --spec-fixed --prompts "$W/$w.jsonl" --batch 1
done
