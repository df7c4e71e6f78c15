#!/usr/bin/env bash
# run.sh [MB] - tokenizer encode speed, lumen vs Hugging Face tokenizers
# (Rust core via @anush008/tokenizers@0.6.0), single-threaded, same corpus,
# same machine, for each fixture tokenizer: the corpus as one text, then
# paragraph by paragraph (HF: one encodeBatch call on one thread). Needs `npm ci` in this folder
# and a built lumen (LUMEN_BIN, default build-tok/lumen, else build/lumen).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
fixtures=${LUMEN_FIXTURES:-$root/../shared/fixtures}
bin=${LUMEN_BIN:-}
if [ -z "$bin" ]; then
  for b in "$root/build-tok/lumen" "$root/build/lumen"; do [ -x "$b" ] && bin=$b && break; done
fi
[ -x "$bin" ] || { echo "run.sh: build lumen first (or set LUMEN_BIN)" >&2; exit 1; }
[ -d "$here/node_modules" ] || (cd "$here" && npm ci --no-audit --no-fund >/dev/null)
corpus=$(mktemp /tmp/tokbench-corpus.XXXXXX)
trap 'rm -f "$corpus"' EXIT
node "$here/gen_corpus.js" "$corpus" "${1:-4}"
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false UV_THREADPOOL_SIZE=1
for mode in whole paragraphs; do
flag=(); [ $mode = paragraphs ] && flag=(--paragraphs)
echo "mode: $mode"
printf '%-9s %12s %12s %8s %14s %14s %8s  %s\n' tokenizer lumen_tok/s hf_tok/s ratio lumen_tok/cpu_s hf_tok/cpu_s ratio same_ids
for t in qwen3 llama3 mistral gemma3; do
  dir=$fixtures/tokenizers/$t
  l=$("$bin" tokenize -m "$dir" --bench "$corpus" --reps 3 "${flag[@]}")
  h=$(node "$here/bench.js" "$dir/tokenizer.json" "$corpus" 3 "${flag[@]}")
  python3 - "$t" "$l" "$h" <<'PY'
import json, sys
t, l, h = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
same = l["tokens"] == h["tokens"] and l["ids_fnv1a"] == h["ids_fnv1a"]
print(f'{t:9s} {l["tokens_per_s"]:12.0f} {h["tokens_per_s"]:12.0f} {l["tokens_per_s"] / h["tokens_per_s"]:7.2f}x'
      f' {l["tokens_per_cpu_s"]:14.0f} {h["tokens_per_cpu_s"]:14.0f} {l["tokens_per_cpu_s"] / h["tokens_per_cpu_s"]:7.2f}x'
      f'  {"yes" if same else "NO"}   ({l["tokens"]} tokens, {l["bytes"]} bytes)')
PY
done
done
