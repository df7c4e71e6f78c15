#!/usr/bin/env bash
# cpu_decode_ab.sh - CPU decode of GGUF files by lumen, a base lumen build
# and llama.cpp (node-llama-cpp, tools/llamacpp), alternating, in one run.
#
#   tools/cpu_decode_ab.sh FILE.gguf...
#
# For each round and file, in turn: `lumen bench -m F -t THREADS
# --prompt-len 64 --gen GEN --reps 2 --no-membw` with LUMEN (default
# build/release/lumen) and, when set, BASE (another build, e.g. a worktree
# of the commit before), then `node tools/llamacpp/bench.mjs F --threads
# THREADS` with the same lengths (PEER=0 leaves it out). One line per file
# and round: decode tok/s of each and the load average. THREADS (default 2),
# ROUNDS (default 2), GEN (default 64). Random Llama-3.2-1B-shaped files:
# tools/make_random_gguf.py, and `lumen quantize` of one for other types.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LUMEN=${LUMEN:-build/release/lumen} BASE=${BASE:-} PEER=${PEER:-1}
THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-2} GEN=${GEN:-64}
(($#)) || { sed -n '2,16p' "$0" >&2; exit 2; }
tok_s() { "$1" bench -m "$2" -t "$THREADS" --prompt-len 64 --gen "$GEN" --reps 2 --no-membw 2>/dev/null |
          tail -1 | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2; }
for r in $(seq 1 "$ROUNDS"); do
  for f in "$@"; do
    f=$(realpath "$f")
    line="round $r $(basename "$f") lumen $(tok_s "$LUMEN" "$f")"
    [[ -n $BASE ]] && line+=" base $(tok_s "$BASE" "$f")"
    if [[ $PEER == 1 ]]; then
      line+=" llama.cpp $( (cd tools/llamacpp && node bench.mjs "$f" --prompt-len 64 --gen "$GEN" \
        --threads "$THREADS" --reps 2 2>/dev/null) | grep -o '"decode_tokens_per_s":[0-9.]*' | cut -d: -f2)"
    fi
    echo "$line load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
