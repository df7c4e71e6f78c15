#!/usr/bin/env bash
# att_long_h200.sh - where batch-1 decode goes at long contexts on one H200
# (issue #29): a random Llama-3.1-8B Q4_K_M GGUF (tools/make_random_gguf.py),
# decode tok/s at CTXS (64 4096 32768 131000) per KV format (KVS: bf16 q8
# q4r), the same with the attention left out (LUMEN_CUDA_SKIP=attention,
# timing only), and the decode attention kernel alone under ncu (time, DRAM
# bytes; NCU_METRICS, NCU_VARIANTS) at NCU_CTX. VARIANTS="lumen lumen:LUMEN_CUDA_ATT_DEC_TC=0" alternates
# builds (bin/NAME) and settings (NAME:VAR=V,VAR2=V2). TESTS=1 first runs the
# attention and KV-format GPU tests (lumen_tests, against the CPU) and the
# engine's per-format exactness tests with models on the GPU. ~5 min.
# Carry .device-carry from
#   LUMEN_DEVICE_BINS="lumen lumen_tests" LUMEN_DEVICE_FIXTURES="gguf/llama-g256 llama qwen3" tools/device/pack.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dev_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [[ ${TESTS:-0} != 0 ]]; then
  for f in cuda_kv_formats cuda_attention; do
    log "GPU tests: $f"
    timeout 240 "$C/bin/lumen_tests" $f 2>&1 | tee "$OUT/test_$f.log" | grep -E "^(ok|FAIL|skip)|check failed|passed" | head -30
  done
fi
if [[ ${TESTS:-0} == 1 ]]; then # TESTS=2: the op tests only
  log "engine tests per KV format, models on the GPU"
  LUMEN_TEST_DEVICE=cuda timeout 240 "$C/bin/lumen_tests" _kv_ 2>&1 | tee "$OUT/engine_kv.log" | grep -E "^(FAIL|skip)|check failed|passed" | head -30
fi
q=/dev/shm/l8.Q4_K_M.gguf
dev_random_gguf $q q4km
pick() { tail -n 1 | grep -oE "\"$1\":[0-9.]*" | cut -d: -f2; }
dec() { # dec VARIANT KV CTX [ENV...] (VARIANT: NAME or NAME:VAR=V,VAR2=V2)
  local b=${1%%:*} e=; [[ $1 == *:* ]] && e=${1#*:}
  env ${e//,/ } "${@:4}" "$C/bin/$b" bench -m $q --device cuda --kv-type "$2" --batch 1 --prompt-len "$3" --gen ${GEN:-48} \
    --no-prefill --no-membw 2>"$OUT/bench.err" | pick decode_tok_s
}
for r in $(seq ${ROUNDS:-1}); do
  for ctx in ${CTXS:-64 4096 32768 131000}; do
    for kv in ${KVS:-bf16 q8 q4r}; do
      first=1
      for b in ${VARIANTS:-lumen}; do # the step without attention: once, with the first variant
        na=; [[ $first == 1 ]] && na="; no attention $(dec $b $kv $ctx LUMEN_CUDA_SKIP=attention)"
        log "r$r $b ctx $ctx $kv: $(dec $b $kv $ctx) tok/s$na"
        first=0
      done
    done
  done
done
if [[ ${NCU:-1} == 1 ]]; then
  for kv in ${KVS:-bf16 q8 q4r}; do
    for b in ${NCU_VARIANTS:-${VARIANTS:-lumen}}; do
      e=; [[ $b == *:* ]] && e=${b#*:}
      env ${e//,/ } LUMEN_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none -k regex:att_ --launch-skip 40 --launch-count 6 \
        --metrics ${NCU_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active} \
        --csv "$C/bin/${b%%:*}" bench -m $q --device cuda --kv-type $kv --batch 1 --prompt-len ${NCU_CTX:-32768} --gen 4 --no-prefill \
        --no-membw --no-look-ahead 2>/dev/null > "$OUT/ncu.csv"
      log "ncu $b $kv ctx ${NCU_CTX:-32768}:"
      python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
s = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if s is None: print("  no rows"); sys.exit()
h = rows[s]; ki, mi, vi, ii = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
d = collections.defaultdict(dict)
for r in rows[s + 1:]:
    if len(r) == len(h): d[(r[ii], r[ki][:40])][r[mi]] = r[vi]
for (i, k), m in sorted(d.items(), key=lambda x: int(x[0][0])):
    name = lambda n: n.split("stalled_")[1].split("_per_")[0] if "stalled_" in n else n.split("__")[1][:22]
    shown = sorted((x for x in m.items() if "stalled_" not in x[0] or float(x[1].replace(",", "") or 0) >= 0.3))
    print("  %s %s" % (k, " ".join("%s=%s" % (name(n), v) for n, v in shown)))
PY
    done
  done
fi
log done
