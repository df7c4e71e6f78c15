#!/usr/bin/env bash
# greedy_compare.sh REV_A [REV_B] - do two revisions generate the same greedy
# tokens? Builds each revision CPU-only (Release, -DLUMEN_CUDA=OFF), runs
# `lumen run` at temperature 0 on the bundled demo model and on every model
# fixture under ../shared/fixtures (HF folders in models/, the .gguf files in
# models/ and gguf/), with a few fixed prompts, in one thread and in the
# default thread count, writes one line per (model, prompt, threads) with the
# generated ids to a file per revision, and diffs the two files. Exits 1 and
# names the models whose lines differ; 0 when every line is byte-identical.
#
# REV_B defaults to the working tree as it is (uncommitted and untracked files
# included). A committed revision is checked out in a scratch git worktree,
# built, and the worktree removed again; its build directory is kept under
# $LUMEN_GREEDY_DIR (default ${TMPDIR:-/tmp}/lumen-greedy/<commit>/build) and
# reused by later runs, so comparing against the same base twice builds it
# once. The working tree is built in place into its own build directory there.
#
# Prompts: token ids below 100 (valid in every fixture's vocabulary: the
# fixtures' tokenizer has 1,024 ids, the Llama-2 GGUF 32,000, the demo 4,096)
# of 7, 40 and 530 tokens (the last crosses the runner's 512-token prefill
# chunk), and for the demo also a text prompt (-p). `lumen run --prompt-ids`
# prints only the generated ids on stdout (timing goes to stderr), so stdout is
# the line; with -p stdout is the generated text, written escaped (printf %q).
# A model that a revision cannot load gets the line "FAILED" (stderr kept in
# the log next to the output file), so a model that stops or starts loading
# shows as a difference too. Lines where one thread and the default threads
# disagree within a revision are reported as a note, not a failure.
#
# Environment: LUMEN_FIXTURES (fixtures dir), LUMEN_GREEDY_DIR (builds and
# outputs), LUMEN_GREEDY_JOBS (build parallelism, default 2), LUMEN_GREEDY_N
# (tokens to generate, default 32).
set -euo pipefail
export LC_ALL=C

usage() { echo "usage: $0 REV_A [REV_B]   (REV_B defaults to the working tree)" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 && $1 != -* ]] || usage

top=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
fixtures=${LUMEN_FIXTURES:-$top/../shared/fixtures}
work=${LUMEN_GREEDY_DIR:-${TMPDIR:-/tmp}/lumen-greedy}
jobs=${LUMEN_GREEDY_JOBS:-2}
n_gen=${LUMEN_GREEDY_N:-32}
mkdir -p "$work"

scratch_src=""
cleanup() {
    if [[ -n $scratch_src && -d $scratch_src ]]; then
        git -C "$top" worktree remove --force "$scratch_src" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# configure_and_build SRC BUILD LOG: a CPU-only Release build of the lumen binary.
configure_and_build() {
    local src=$1 build=$2 log=$3
    if [[ ! -f $build/CMakeCache.txt ]]; then
        cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLUMEN_CUDA=OFF >"$log" 2>&1 ||
            { tail -n 30 "$log" >&2; echo "greedy_compare: configuring $src failed (log: $log)" >&2; return 1; }
    fi
    cmake --build "$build" --target lumen -j "$jobs" >>"$log" 2>&1 ||
        { tail -n 30 "$log" >&2; echo "greedy_compare: building $src failed (log: $log)" >&2; return 1; }
}

# build_rev REV: builds REV ("" = the working tree); sets $bin and $label.
build_rev() {
    local rev=$1
    if [[ -z $rev ]]; then
        local key
        key=$(printf '%s' "$top" | cksum | cut -d' ' -f1)
        local build=$work/tree-$key
        label="working tree ($top)"
        echo "greedy_compare: building the working tree in $build" >&2
        mkdir -p "$build"
        configure_and_build "$top" "$build" "$build.log"
        bin=$build/lumen
        return
    fi
    local sha
    sha=$(git -C "$top" rev-parse --verify --quiet "$rev^{commit}") ||
        { echo "greedy_compare: $rev is not a commit" >&2; exit 2; }
    label="$rev ($(git -C "$top" rev-parse --short "$sha"))"
    local dir=$work/$sha
    bin=$dir/build/lumen
    if [[ -x $bin && -f $dir/build/.greedy-built ]]; then
        echo "greedy_compare: reusing the build of $label in $dir/build" >&2
        return
    fi
    echo "greedy_compare: building $label in $dir" >&2
    mkdir -p "$dir"
    scratch_src=$dir/src
    if [[ ! -d $scratch_src ]]; then
        git -C "$top" worktree add --detach --force "$scratch_src" "$sha" >/dev/null 2>&1 ||
            { echo "greedy_compare: git worktree add $scratch_src $sha failed" >&2; exit 1; }
    fi
    configure_and_build "$scratch_src" "$dir/build" "$dir/build.log"
    touch "$dir/build/.greedy-built"
    git -C "$top" worktree remove --force "$scratch_src"
    scratch_src=""
}

# ids COUNT SEED: COUNT comma-separated ids in [3, 100) from a fixed LCG.
ids() {
    local n=$1 x=$2 out="" i
    for ((i = 0; i < n; i++)); do
        x=$(((x * 1103515245 + 12345) % 2147483648))
        out+="${out:+,}$((3 + (x / 65536) % 97))"
    done
    printf '%s' "$out"
}

models=("$top/models/demo")
if [[ -d $fixtures ]]; then
    shopt -s nullglob
    for d in "$fixtures"/models/*/; do [[ -f $d/config.json ]] && models+=("${d%/}"); done
    for f in "$fixtures"/models/*.gguf "$fixtures"/gguf/*/*.gguf; do models+=("$f"); done
    shopt -u nullglob
else
    echo "greedy_compare: WARNING: $fixtures is absent: comparing the demo model only" >&2
fi

prompts=("ids7=$(ids 7 1)" "ids40=$(ids 40 2)" "ids530=$(ids 530 3)")
demo_text='def fib(n):'

# generate BIN OUT: every (model, prompt, threads) line into OUT, stderr of failures into OUT.log.
generate() {
    local bin=$1 out=$2 log=$2.log
    : >"$out"
    : >"$log"
    local temp=()
    # temperature 0 is the default of `lumen run`; say so explicitly where the option exists
    if "$bin" run --help 2>/dev/null | grep -q -- '--temp'; then temp=(--temp 0); fi
    local m name p pname pids t targs res rc line
    for m in "${models[@]}"; do
        if [[ $m == "$top/models/demo" ]]; then name=demo; else name=${m#"$fixtures"/}; fi
        local runs=()
        for p in "${prompts[@]}"; do runs+=("${p%%=*}|--prompt-ids|${p#*=}"); done
        [[ $name == demo ]] && runs+=("text|-p|$demo_text")
        for r in "${runs[@]}"; do
            IFS='|' read -r pname popt pval <<<"$r"
            for t in 1 default; do
                targs=()
                [[ $t == 1 ]] && targs=(--threads 1)
                rc=0
                res=$(timeout 600 "$bin" run -m "$m" "$popt" "$pval" -n "$n_gen" "${temp[@]}" "${targs[@]}" 2>"$out.err") || rc=$?
                if ((rc != 0)); then
                    line=FAILED
                    { echo "== $name $pname threads=$t: exit $rc"; cat "$out.err"; } >>"$log"
                elif [[ $popt == -p ]]; then
                    line=$(printf '%q' "$res")
                else
                    line=$res
                fi
                printf '%s\t%s\tthreads=%s\t%s\n' "$name" "$pname" "$t" "$line" >>"$out"
            done
        done
    done
    rm -f "$out.err"
}

rev_a=$1
rev_b=${2:-}
build_rev "$rev_a"; bin_a=$bin; label_a=$label
build_rev "$rev_b"; bin_b=$bin; label_b=$label

stamp=$(date +%Y%m%d-%H%M%S)
out_a=$work/greedy-$stamp-a.txt
out_b=$work/greedy-$stamp-b.txt
echo "greedy_compare: generating with $label_a" >&2
generate "$bin_a" "$out_a"
echo "greedy_compare: generating with $label_b" >&2
generate "$bin_b" "$out_b"

n_lines=$(wc -l <"$out_a")
n_models=${#models[@]}
n_failed=$(grep -c $'\tFAILED$' "$out_a" || true)
echo "A: $label_a -> $out_a"
echo "B: $label_b -> $out_b"
echo "$n_models models, $n_lines lines each ($n_failed lines FAILED in A: see $out_a.log)"
# not a failure, but worth knowing: the CPU backend promises results independent of the thread count
for side in A B; do
    f=$out_a; [[ $side == B ]] && f=$out_b
    odd=$(paste <(grep $'\tthreads=1\t' "$f") <(grep $'\tthreads=default\t' "$f") |
        awk -F'\t' '$4 != $8 { print $1 "/" $2 }' | tr '\n' ' ')
    [[ -z $odd ]] || echo "note: in $side, 1 thread and the default threads differ for: $odd"
done
if cmp -s "$out_a" "$out_b"; then
    echo "greedy_compare: identical"
    exit 0
fi
# both files list the same (model, prompt, threads) lines in the same order
pairs=$(paste "$out_a" "$out_b" | awk -F'\t' '$4 != $8')
echo "$(printf '%s\n' "$pairs" | wc -l) lines differ; the first ones (cut at 150 characters):"
printf '%s\n' "$pairs" | head -n 8 | awk -F'\t' '{
    printf "  %s %s %s\n    A: %s\n    B: %s\n", $1, $2, $3, substr($4, 1, 150), substr($8, 1, 150) }'
differing=$(printf '%s\n' "$pairs" | cut -f1 | sort -u | tr '\n' ' ')
echo "greedy_compare: DIFFERENT for: $differing"
exit 1
