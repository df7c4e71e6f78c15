#!/usr/bin/env bash
# quant_quality.sh - quality of lumen's quantiser against llama.cpp's, as a
# markdown table.
#
#   tools/quant_quality.sh [LUMEN] [TEXT] [MODEL_DIR...]
#
# For each MODEL_DIR (default: the llama-g256 and qwen3-g256 fixtures under
# ../shared/fixtures/gguf) and each type whose model.<TYPE>.gguf llama.cpp
# wrote there, `lumen quantize` writes its own file from model.bf16.gguf
# with the same mix; `lumen eval` then scores both files against the bf16
# one on TEXT (default /usr/lib/python3.11/shlex.py, ~4.4k tokens of the
# fixtures' tokenizer) in windows of 512: KL(bf16 || file) mean and p99,
# perplexity change and top-1 agreement, lumen's file first, llama.cpp's
# second. A model lumen cannot load is a row saying so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lumen=${1:-$root/build/release/lumen}
text=${2:-/usr/lib/python3.11/shlex.py}
shift $(( $# > 2 ? 2 : $# )) || true
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=("$root/../shared/fixtures/gguf/llama-g256" "$root/../shared/fixtures/gguf/qwen3-g256")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# eval FILE REF -> "kl_mean kl_p99 dppl top1" or "FAILED why"
score() {
  local out
  if ! out=$("$lumen" eval -m "$1" --reference "$2" --text "$text" --ctx 512 2>"$tmp/err"); then
    echo "FAILED $(head -c 120 "$tmp/err" | tr '\n' ' ')"
    return
  fi
  python3 -c 'import json,sys; j=json.loads(sys.argv[1]);
print("%.2e %.2e %+.3f%% %.1f%%" % (j["kl_mean"], j["kl_p99"], 100*(j["ppl"]/j["ref_ppl"]-1), 100*j["top1"]))' "$out"
}

echo "| model | type | MiB (lumen / llama.cpp) | KL mean (lumen / llama.cpp) | KL p99 | ppl change | top-1 agreement |"
echo "|---|---|---|---|---|---|---|"
for dir in "${dirs[@]}"; do
  name=$(basename "$dir")
  for type in Q8_0 Q6_K Q5_K_M Q4_K_M IQ4_XS Q4_0; do
    theirs=$dir/model.$type.gguf
    [ -f "$theirs" ] || continue
    ours=$tmp/$name.$type.gguf
    "$lumen" quantize "$dir/model.bf16.gguf" "$ours" --type "$type" >/dev/null
    read -r -a a <<<"$(score "$ours" "$dir/model.bf16.gguf")"
    read -r -a b <<<"$(score "$theirs" "$dir/model.bf16.gguf")"
    if [ "${a[0]}" = FAILED ]; then
      echo "| $name | $type | | lumen cannot run it: ${a[*]:1} | | | |"
      continue
    fi
    mib() { python3 -c "import os,sys; print('%.2f' % (os.path.getsize(sys.argv[1]) / 1048576))" "$1"; }
    echo "| $name | $type | $(mib "$ours") / $(mib "$theirs") | ${a[0]} / ${b[0]} | ${a[1]} / ${b[1]} | ${a[2]} / ${b[2]} | ${a[3]} / ${b[3]} |"
  done
done
