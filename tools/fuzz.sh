#!/usr/bin/env bash
# fuzz.sh [SECONDS] - build every libFuzzer harness and run each for SECONDS
# (default 60). Exits non-zero if a harness fails to build or finds a crash,
# leak, timeout or sanitizer report.
#
# Design: harnesses are whatever fuzz/fuzz_*.c exist (fuzz/fuzz_NAME.c ->
# build-fuzz/fuzz_NAME), so a new parser's harness is picked up without
# editing this script. Each harness starts from a seed corpus made on the fly
# in a temp dir: real files of its format from ../shared/fixtures when that
# folder is present (the tiny models' model.safetensors, the GGUF fixture),
# plus a few hand-made small files for formats we know, since small seeds
# let the fuzzer reach deep into the header parser quickly. The temp dir goes
# away at exit; crash inputs are kept under build-fuzz/fuzz-artifacts so a
# finding can be replayed with `build-fuzz/fuzz_NAME CRASHFILE`.
#
# Environment: LUMEN_FIXTURES (fixtures dir), FUZZ_JOBS (build parallelism),
# FUZZ_ARGS (extra libFuzzer flags, e.g. "-max_len=65536").
set -euo pipefail
export LC_ALL=C

secs=${1:-60}
case $secs in '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build="build-fuzz"
fixtures=${LUMEN_FIXTURES:-$root/../shared/fixtures}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}

shopt -s nullglob
srcs=(fuzz/fuzz_*.c)
if [ ${#srcs[@]} -eq 0 ]; then
    echo "fuzz.sh: no fuzz/fuzz_*.c harnesses" >&2
    exit 1
fi
names=()
for s in "${srcs[@]}"; do
    n=${s#fuzz/}
    names+=("${n%.c}")
done

mkdir -p "$build"
CC=clang cmake -S . -B "$build" -DLUMEN_FUZZ=ON -DLUMEN_CUDA=OFF >"$build/configure.log" 2>&1 || {
    tail -n 30 "$build/configure.log" >&2
    echo "fuzz.sh: cmake configure failed (log: $build/configure.log)" >&2
    exit 1
}

# Build harness by harness, so one broken harness is named and the rest still run.
failed=()
built=()
for n in "${names[@]}"; do
    if cmake --build "$build" -j "$jobs" --target "$n" >"$build/$n.build.log" 2>&1; then
        built+=("$n")
    else
        tail -n 30 "$build/$n.build.log" >&2
        echo "fuzz.sh: $n: build failed (log: $build/$n.build.log)" >&2
        failed+=("$n (build)")
    fi
done

tmp=$(mktemp -d /tmp/lumen-fuzz.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
artifacts=$root/$build/fuzz-artifacts
mkdir -p "$artifacts"

# Writes a safetensors file: $1 path, $2 JSON header, $3 data as a printf
# format (e.g. '\x01\x02').
# The formats are built from data on purpose, hence SC2059.
# shellcheck disable=SC2059
st_seed() {
    local n=${#2}
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' \
        $((n & 255)) $(((n >> 8) & 255)) $(((n >> 16) & 255)) $(((n >> 24) & 255)))" >"$1"
    printf '%s' "$2" >>"$1"
    printf "$3" >>"$1"
}

# Seeds and an optional libFuzzer dictionary for format $1 into dir $2.
make_seeds() {
    local kind=$1 dir=$2 f i=0
    mkdir -p "$dir"
    case $kind in
    safetensors)
        if [ -d "$fixtures/models" ]; then
            for f in "$fixtures"/models/*/model.safetensors; do
                cat "$f" >"$dir/fixture-$i.safetensors"
                i=$((i + 1))
            done
        fi
        st_seed "$dir/small-1" '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}' \
            '\x00\x00\xc0\x3f\x00\x00\x10\xc0\x80\x3f\x00\x40'
        st_seed "$dir/small-2" '{"ids":{"dtype":"I32","shape":[],"data_offsets":[0,4]},"h":{"dtype":"F16","shape":[0,7],"data_offsets":[4,4]},"d":{"dtype":"F64","shape":[1],"data_offsets":[4,12]}}' \
            '\x39\x30\x00\x00\x00\x00\x00\x00\x00\x00\x08\x40'
        st_seed "$dir/small-3" '{"u":{"dtype":"U8","shape":[1,1,1,1,1,1,1,3],"data_offsets":[0,3]},"e":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[3,4]}}   ' \
            '\x01\x02\x03\x04'
        st_seed "$dir/small-4" '{}' ''
        {
            for w in '\"dtype\"' '\"shape\"' '\"data_offsets\"' '\"__metadata__\"' '\"format\"' \
                '\"F32\"' '\"F16\"' '\"BF16\"' '\"I32\"' '\"F64\"' '\"I64\"' '\"I16\"' '\"I8\"' \
                '\"U8\"' '\"BOOL\"' '\"F8_E4M3\"' '\"F8_E5M2\"' '\"U16\"' '\"U32\"' '\"U64\"' \
                '[0,0]' '[]' '{}' '9223372036854775807' '18446744073709551616' '4294967296' \
                '-1' '1e3' '\\u0000' '\\n' '\\u001b'; do
                printf '"%s"\n' "$w"
            done
        } >"$dir.dict"
        ;;
    template)
        # real chat templates: the fixtures' and the bundled model's
        for f in "$fixtures"/templates/*/*.jinja* "$fixtures"/models/*/chat_template.jinja \
            "$root"/models/*/chat_template.jinja; do
            [ -f "$f" ] && cat "$f" >"$dir/tpl-$i.jinja" && i=$((i + 1))
        done
        ;;
    tokenizer_json)
        for f in "$fixtures"/tokenizers/tiny-bpe/tokenizer.json "$root"/models/demo/tokenizer.json; do
            [ -f "$f" ] && cat "$f" >"$dir/tok-$i.json" && i=$((i + 1))
        done
        # the section form (fuzz_tokenizer_json.c): byte 0 picks the built-in
        # document and the section, the rest is a real tokenizer's section
        if command -v python3 >/dev/null; then
            python3 - "$dir" "$fixtures"/tokenizers/*/tokenizer.json "$root"/models/demo/tokenizer.json <<'PY'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
names = ["normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens", "model"]
k = 0
for path in files:
    try:
        doc = json.load(open(path, encoding="utf-8"))
    except (OSError, ValueError):
        continue
    for where, name in enumerate(names):
        v = doc.get(name)
        if v is None or name == "model":
            continue
        for which in range(3):
            with open(f"{out}/sec-{k}", "wb") as f:
                f.write(bytes([which | where << 2]) + json.dumps(v, ensure_ascii=False).encode())
            k += 1
    m = doc.get("model", {})
    small = dict(m, vocab=dict(list(m.get("vocab", {}).items())[:64]) if isinstance(m.get("vocab"), dict) else m.get("vocab"),
                 merges=(m.get("merges") or [])[:32])
    with open(f"{out}/sec-{k}", "wb") as f:  # a small model section
        f.write(bytes([5 << 2]) + json.dumps(small, ensure_ascii=False).encode())
    k += 1
PY
        else
            echo "fuzz.sh: no python3: tokenizer_json gets whole-file seeds only" >&2
        fi
        ;;
    tokenizer_gguf)
        # the vocabulary form (fuzz_tokenizer_gguf.c): byte 0 flags, then
        # tokens and (gpt2) merges, one per line
        printf '\x00a\nb\nab\n\xc4\xa0\nc\na b\n\xc4\xa0 a\n' >"$dir/gpt2-small"
        printf '\x08h\ne\nhe\nl\no\nll\nhell\nh e\nl l\nhe ll\n' >"$dir/gpt2-qwen2"
        printf '\x07<unk>\n<s>\n</s>\n\xe2\x96\x81\na\n\xe2\x96\x81a\nb\n<0x41>\n' >"$dir/spm-small"
        printf '\x17<unk>\n<s>\n</s>\n\xe2\x96\x81\nx\ny\n\xe2\x96\x81xy\n' >"$dir/spm-bos"
        if command -v python3 >/dev/null && [ -f "$fixtures/tokenizers/tiny-bpe/tokenizer.json" ]; then
            python3 - "$dir/gpt2-tiny-bpe" "$fixtures/tokenizers/tiny-bpe/tokenizer.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[2], encoding="utf-8"))["model"]
toks = [t for t, _ in sorted(m["vocab"].items(), key=lambda kv: kv[1])][:300]
merges = [x if isinstance(x, str) else " ".join(x) for x in m.get("merges", [])][:300]
lines = toks + merges
lines = lines[: 2 * len(toks)] if len(merges) >= len(toks) else toks + merges + [""] * (len(toks) - len(merges) - 1)
open(sys.argv[1], "wb").write(b"\x00" + "\n".join(lines).encode())
PY
        fi
        ;;
    tokenizer_encode | tokenizer_decode)
        # texts: the tokenizer fixtures' stress strings, one seed per case file
        # (the first byte picks the tokenizer; any bytes are valid input)
        for f in "$fixtures"/tokenizers/*/cases.jsonl; do
            [ -f "$f" ] && head -c 65536 "$f" >"$dir/cases-$i.txt" && i=$((i + 1))
        done
        ;;
    qblocks)
        # any bytes are blocks (fuzz_qblocks.c): the fuzzer starts from nothing
        ;;
    responses)
        # Responses API bodies: every input item kind, tools, options, chaining
        printf '%s' '{"model":"demo","instructions":"A","input":"hi","max_output_tokens":9,"store":true}' >"$dir/plain.json"
        printf '%s' '{"input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"B"}]},{"role":"user","content":"u"},{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"r"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"o"}]}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"web_search"}],"tool_choice":{"type":"function","name":"f"},"reasoning":{"effort":"none","summary":"auto"},"text":{"format":{"type":"text"}},"stream":true,"include":["reasoning.encrypted_content"]}' >"$dir/items.json"
        printf '%s' '{"previous_response_id":"resp_fuzz","input":[{"type":"function_call_output","call_id":"c","output":"x"}],"temperature":0.5,"top_p":0.9}' >"$dir/chain.json"
        ;;
    *)
        # Any fixture of that extension small enough to mutate quickly.
        if [ -d "$fixtures" ]; then
            while IFS= read -r f; do
                cat "$f" >"$dir/fixture-$i.$kind"
                i=$((i + 1))
            done < <(find "$fixtures" -type f -name "*.$kind" -size -4M | sort)
        fi
        ;;
    esac
}

if [ ! -d "$fixtures" ]; then
    echo "fuzz.sh: $fixtures absent: fuzzing without fixture seeds" >&2
fi

# One libFuzzer run: $1 harness, $2 seconds, $3 log, then extra flags.
# Returns libFuzzer's exit status (0: no finding).
run_phase() {
    local n=$1 t=$2 log=$3 rc=0
    shift 3
    # The outer timeout is a backstop for a harness that hangs outside
    # libFuzzer's own per-input -timeout.
    # shellcheck disable=SC2086
    timeout $((t + 300)) "$build/$n" -max_total_time="$t" -timeout=20 \
        -artifact_prefix="$artifacts/$n-" -print_final_stats=1 "$@" ${FUZZ_ARGS:-} \
        "$corpus" >"$log" 2>&1 || rc=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+[[:space:]]+DONE)' "$log" |
        sed "s/^/  /" || true
    if [ $rc -ne 0 ]; then
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written|internal error' "$log" |
            head -n 20 >&2 || true
        echo "fuzz.sh: $n: FAILED (exit $rc); inputs in $artifacts, log $log" >&2
    fi
    return $rc
}

for n in "${built[@]}"; do
    kind=${n#fuzz_}
    corpus=$tmp/$kind
    make_seeds "$kind" "$corpus"
    dict=()
    [ -f "$corpus.dict" ] && dict=(-dict="$corpus.dict")
    echo "fuzz.sh: $n: ${secs}s from $(find "$corpus" -type f | wc -l) seeds"
    # Two phases sharing one corpus. Whole fixture files (hundreds of KB)
    # keep the fuzzer on the paths a valid file takes, but each run costs a
    # copy of the whole input: about 1k runs/s. Capping inputs at 4 KB
    # (libFuzzer truncates the loaded seeds) runs about 50x faster and finds
    # more header-parsing edges. So half the time goes to each.
    small=$((secs / 2))
    whole=$((secs - small))
    echo "  whole inputs, ${whole}s (log: $build/$n.log)"
    if ! run_phase "$n" "$whole" "$build/$n.log" "${dict[@]}"; then
        failed+=("$n")
        continue
    fi
    if [ $small -gt 0 ]; then
        echo "  inputs up to 4 KB, ${small}s (log: $build/$n.small.log)"
        run_phase "$n" "$small" "$build/$n.small.log" -max_len=4096 "${dict[@]}" ||
            failed+=("$n")
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: failures: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: ${#built[@]} harness(es) ran ${secs}s each, no findings"
