#!/usr/bin/env bash
# gemv_ncu.sh - issue #34: where the bf16 decode GEMVs of a random
# Llama-3.1-8B spend their time, under ncu: time, DRAM bytes and rate,
# instructions, issue and L1 activity, occupancy and the main stall
# reasons of 8 consecutive lm_gemv_kernel launches (two layers: q/k/v,
# o, gate/up, down) a case. Cases (CASES): "B[@BIN]:ENV", batch B, BIN a
# binary of the carry (default lumen; lumen_base from LUMEN_DEVICE_BASE_BIN),
# ENV a comma-separated list of variables, e.g. "1: 8: 8:LUMEN_CUDA_GEMV_TC=1".
# Carry .device-carry from LUMEN_DEVICE_BINS=lumen
# LUMEN_DEVICE_FIXTURES=gguf/llama-g256/model.Q4_K_M.gguf tools/device/pack.sh.
set -uo pipefail
source tools/device/lib.sh
dev_unpack
G=/dev/shm/l8.bf16.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
dev_random_gguf $G bf16
st=smsp__average_warps_issue_stalled
m=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum
m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__throughput.avg.pct_of_peak_sustained_active
m=$m,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers
for s in long_scoreboard lg_throttle mio_throttle math_pipe_throttle wait short_scoreboard not_selected selected \
         barrier no_instruction dispatch_stall; do m=$m,${st}_${s}_per_issue_active.ratio; done
for c in ${CASES:-1: 4: 8: 8:LUMEN_CUDA_GEMV_TC=1}; do
  B=${c%%:*}; e=${c#*:}; bin=lumen
  [[ $B == *@* ]] && bin=${B#*@} && B=${B%@*}
  log "case batch $B $bin ${e:-default}"
  env ${e//,/ } LUMEN_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none -k regex:lm_gemv_kernel --launch-skip 400 \
    --launch-count 8 --metrics $m --csv "$C/bin/$bin" bench -m $G --device cuda --batch $B --prompt-len 32 --gen 8 --no-membw \
    --no-look-ahead 2>/dev/null > "$OUT/ncu_b$B$bin${e:+_env}.csv"
  python3 - "$OUT/ncu_b$B$bin${e:+_env}.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
s = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
if s is None: print("  no rows"); sys.exit()
h = rows[s]; gi, mi, vi, ii = h.index("Grid Size"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
ui = h.index("Metric Unit")
d = collections.defaultdict(dict)
for r in rows[s + 1:]:
    if len(r) == len(h): d[(r[ii], r[gi])][r[mi]] = (r[vi], r[ui])
def short(n):
    if "stalled_" in n: return n.split("stalled_")[1].split("_per_")[0]
    return {"gpu__time_duration.sum": "time", "dram__bytes_read.sum": "dram", "smsp__inst_executed.sum": "inst"}.get(n, n.split("__")[1][:18])
for (i, g), mm in sorted(d.items(), key=lambda x: int(x[0][0])):
    out = []
    for n, (v, u) in sorted(mm.items()):
        v = v.replace(",", "")
        if "stalled_" in n and float(v or 0) < 0.2: continue
        out.append("%s=%s%s" % (short(n), v, u if u in ("nsecond", "usecond", "byte", "Kbyte", "Mbyte") else ""))
    print("  grid %s %s" % (g, " ".join(out)))
PY
done
log done
