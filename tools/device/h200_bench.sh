#!/usr/bin/env bash
# The H200 benchmarks of issue #8, run by tools/device/gpu_run.sh bench SET
# (binaries from .device-carry). SET: kernels | quant | diag | ncu | ablate | ablate-qwen27 | prefill | prefill-qwen27 | ncu-att | ab | ab-qwen27 | ab-long | ab-long-qwen27 | gemv-tc | small-batch | b128 | b128-ab | b128-ab-qwen9 | ab-delta-qwen9 | b1-copy | final8 | final8b | b128-qwen9 | ab-q27 | ab-qk | gap | moe | moe-final | moe-groups | ncu-moe | qwen9 | llama | qwen27 | lumen-final | final7 | final |
# moe128 | moe-b1 | moe-s20 | moe-s20b | moe-s20c | moe-s20d | final-s20 | final-s20b | final9 | s21-final | final-s22b | final-s22 | lookahead | ncu-moe1 | ncu-route | peer-llama | peer-qwen27. Random bf16 models are written to /dev/shm (RAM), not the disk.
set -uo pipefail
C=$PWD/.device-carry
L=$C/bin/lumen
shm_need_gb=${SHM_GB:-100}
df -h /dev/shm | tail -n 1
if (( $(df --output=size -BG /dev/shm | tail -n 1 | tr -dc 0-9) < shm_need_gb )); then
  mount -o remount,size=${shm_need_gb}G /dev/shm && df -h /dev/shm | tail -n 1
fi
model() { # model DIR SHAPE [make_random_model options]
  [[ -f $1/model.safetensors ]] || { /usr/bin/time -f "make_random_model %e s" "$C/bin/make_random_model" "$1" --shape "$2" "${@:3}" --threads 16 || exit 1; }
}
bench_model() { # bench_model DIR [bf16]: batch-1 decode, prefill at 4k (also with bf16 activations), batched decode
  local d=$1
  "$L" bench -m "$d" --device cuda --prompt-len 128 --gen 128 --reps 3
  [[ ${2:-} == bf16 ]] && LUMEN_CUDA_GEMM=bf16 "$L" bench -m "$d" --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw
  "$L" bench -m "$d" --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw
  for B in 8 32 128; do "$L" bench -m "$d" --device cuda --batch $B --prompt-len 32 --gen 64; done
}
moe_ab() { # moe_ab "B...": the Qwen3-30B-A3B shape's decode at each batch B, lumen_base and lumen alternating
  rm -rf /dev/shm/l8 /dev/shm/q27 /dev/shm/q9; model /dev/shm/m30 qwen3-30b-a3b
  for B in $1; do for b in lumen_base lumen; do
    echo -n "$b batch $B "; "$C/bin/$b" bench -m /dev/shm/m30 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw 2>/dev/null
  done; done
}
for set in "$@"; do
  echo "== $set"
  case $set in
  kernels) "$C/bin/bench_cuda_gemv" ;;
  quant) # issue #26: a random Llama-3.1-8B Q4_K_M GGUF (pack with LUMEN_DEVICE_FIXTURES=gguf/llama-g256/model.Q4_K_M.gguf):
    # batch-1 decode (roofline ~850 tok/s), 4k prefill (exact split and bf16 activations), batched decode
    q=/dev/shm/l8.Q4_K_M.gguf
    [[ -f $q ]] || python3 tools/make_random_gguf.py "$C/fixtures/gguf/llama-g256/model.Q4_K_M.gguf" $q q4km 8b || exit 1
    "$L" bench -m $q --device cuda --prompt-len 128 --gen 128 --reps 3
    "$L" bench -m $q --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m $q --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw
    for B in 8 32 128; do "$L" bench -m $q --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw; done ;;
  diag) # where a Llama-8B decode step goes: host issue vs device time, then every op timed alone
    model /dev/shm/l8 llama-3.1-8b
    for B in 1 8 32; do # graphs and programmatic dependent launch on, then each off
      "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 128 --gen 64
      LUMEN_CUDA_PDL=0 "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 128 --gen 64 --no-membw
      LUMEN_CUDA_GRAPHS=0 "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 128 --gen 64 --no-membw
    done ;;
  fused) # Llama-8B: batch-1 decode with the fused kernels and without (LUMEN_CUDA_FUSED=0); batch 128 also with bf16 activations
    model /dev/shm/l8 llama-3.1-8b
    "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128
    LUMEN_CUDA_FUSED=0 "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw
    "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 32 --gen 128 --reps 3 --no-membw
    "$L" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw ;;
  fused-qwen27) # the same at batch 1 for the Qwen3.5-27B shape
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64
    LUMEN_CUDA_FUSED=0 "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 --no-membw ;;
  ab) # batch-1 decode of this build against bin/lumen_base (pack.sh LUMEN_DEVICE_BASE_BIN), alternating
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do
      for b in lumen_base lumen; do
        echo -n "$b "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw
      done
    done ;;
  ab-long) # decode of this build against bin/lumen_base, alternating: batch 1 at a 16k context, batch 1 short, batch 8 at 4k
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do
      for b in lumen_base lumen; do
        echo -n "$b ctx16k b1 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 16384 --chunk 4096 --gen 64 --no-membw
        echo -n "$b ctx32 b1 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw
        echo -n "$b ctx4k b8 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 8 --prompt-len 4096 --chunk 4096 --gen 64 --no-membw
      done
    done ;;
  ab-long-qwen27) # the same on the Qwen3.5-27B shape: batch 1 at a 16k context and short
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2; do
      for b in lumen_base lumen; do
        echo -n "$b ctx16k b1 "; "$C/bin/$b" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 16384 --chunk 4096 --gen 32 --no-membw
        echo -n "$b ctx32 b1 "; "$C/bin/$b" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 --no-membw
      done
    done ;;
  ab-qwen27) # the same on the Qwen3.5-27B shape
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2; do
      for b in lumen_base lumen; do
        echo -n "$b "; "$C/bin/$b" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 --no-membw
      done
    done ;;
  ablate | ablate-qwen27) # batch-1 decode with each kind of kernel left out (LUMEN_CUDA_SKIP): what each costs in the step
    if [[ $set == ablate ]]; then d=/dev/shm/l8 g=64; model $d llama-3.1-8b
      kinds="none attention rope_kv norm gemv_n gemv_glu gemv_add gemv_down norm_tail none"
    else rm -rf /dev/shm/l8; d=/dev/shm/q27 g=32; model $d qwen3.5-27b
      kinds="none conv gates delta_rule gnorm conv,gates,delta_rule,gnorm attention norm gemv_n gemv_glu gemv_add gemv_down norm_tail none"; fi
    for k in $kinds; do
      echo -n "skip $k "; LUMEN_CUDA_SKIP=${k/none/} "$L" bench -m $d --device cuda --batch 1 --prompt-len 32 --gen $g --no-membw 2>/dev/null
    done ;;
  gemv-tc) # decode GEMVs of 5-8 tokens on tensor cores (LUMEN_CUDA_GEMV_TC=1) against CUDA cores, alternating
    model /dev/shm/l8 llama-3.1-8b
    for B in 4 5 6 8; do
      for tc in 0 1; do
        echo -n "gemv_tc=$tc batch $B "; LUMEN_CUDA_GEMV_TC=$tc "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw
      done
    done
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for tc in 0 1; do
      echo -n "gemv_tc=$tc batch 8 "; LUMEN_CUDA_GEMV_TC=$tc "$L" bench -m /dev/shm/q27 --device cuda --batch 8 --prompt-len 32 --gen 32 --no-membw
    done ;;
  small-batch) # batch 2 and 8 decode (the GEMV path above one token) on both shapes
    model /dev/shm/l8 llama-3.1-8b
    for B in 2 8; do "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw; done
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    "$L" bench -m /dev/shm/q27 --device cuda --batch 8 --prompt-len 32 --gen 32 --no-membw ;;
  ncu-qwen27) # kernel time of Qwen3.5-27B decode steps, by kernel
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    LUMEN_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --launch-skip 4000 --launch-count 1000 "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 16 \
      --gen 12 --no-membw > "${OUT:-/tmp}/ncu_q27.csv" 2>/dev/null
    python3 tools/device/ncu_agg.py "${OUT:-/tmp}/ncu_q27.csv" 30 ;;
  gap) # batch 1: the host pass and the graph's device time of a step (LUMEN_CUDA_GRAPH_STATS) against its wall time, Llama-8B and Qwen3.5-27B
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do LUMEN_CUDA_GRAPH_STATS=1 "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw; done
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2; do LUMEN_CUDA_GRAPH_STATS=1 "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 --no-membw; done ;;
  moe) # the Qwen3-30B-A3B shape (128 experts, 8 a token): decode of lumen_base and lumen alternating at batch 8 / 32 / 64 / 1, then batch 128 of lumen
    moe_ab "8 32 64 1"
    "$L" bench -m /dev/shm/m30 --device cuda --batch 128 --prompt-len 32 --gen 16 --no-membw ;;
  moe-final) # the Qwen3-30B-A3B shape: lumen_base and lumen alternating at batch 1 and 8, then lumen at 32 and 64
    moe_ab "1 8"
    for B in 32 64; do echo -n "lumen batch $B "; "$L" bench -m /dev/shm/m30 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw; done ;;
  moe-groups) # the Qwen3-30B-A3B shape at batch 32 and 64 (experts grouped on the device): lumen_base and lumen alternating
    moe_ab "32 64" ;;
  ncu-moe|ncu-moe1) # kernel times of Qwen3-30B-A3B decode steps at batch 1 and 8 (ncu-moe1: batch 1 only; ncu, graphs off)
    rm -rf /dev/shm/l8 /dev/shm/q27 /dev/shm/q9; model /dev/shm/m30 qwen3-30b-a3b
    for B in 1 $([[ $set == ncu-moe ]] && echo 8); do
      LUMEN_CUDA_GRAPHS=0 timeout 250 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        --launch-skip $((B == 1 ? 3000 : 9000)) --launch-count 1300 "$L" bench -m /dev/shm/m30 --device cuda --batch $B \
        --prompt-len 16 --gen 8 --no-membw > "${OUT:-/tmp}/ncu_moe$B.csv" 2>/dev/null
      echo "batch $B"; python3 tools/device/ncu_agg.py "${OUT:-/tmp}/ncu_moe$B.csv" 16
    done ;;
  ab-q27) # batch-1 decode of the Qwen3.5-27B shape, lumen_base and lumen alternating; the delta rule alone under ncu
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for b in lumen_base lumen; do
      # the csv's last three fields: "gpu__time_duration.sum","ns","10,144" (a thousands comma)
      echo -n "ncu $b (ns) "; LUMEN_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none -k regex:delta_rule --metrics gpu__time_duration.sum \
        --csv --launch-skip 200 --launch-count 5 "$C/bin/$b" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 16 \
        --gen 8 --no-membw 2>/dev/null | grep -o '"gpu__time_duration.sum","[a-z]*","[0-9.,]*"' | awk -F'","' '{print $3}' |
        tr -d '",' | tr '\n' ' '; echo
    done
    for r in 1 2 3; do for b in lumen_base lumen; do
      echo -n "$b "; "$C/bin/$b" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 32 --no-membw 2>/dev/null
    done; done ;;
  ab-qk) # batch-1 decode, lumen_base and lumen alternating: the Qwen3-8B shape (q/k norms on every layer), then Qwen3.5-27B
    rm -rf /dev/shm/l8 /dev/shm/q9; model /dev/shm/q3 qwen3-8b
    for b in lumen_base lumen lumen_base lumen; do
      echo -n "$b "; "$C/bin/$b" bench -m /dev/shm/q3 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>/dev/null
    done
    rm -rf /dev/shm/q3; model /dev/shm/q27 qwen3.5-27b
    for b in lumen_base lumen lumen_base lumen; do
      echo -n "$b "; "$C/bin/$b" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 32 --no-membw 2>/dev/null
    done ;;
  ncu) # kernel time of one Llama-8B decode step (graphs off: ncu times kernels alone either way)
    model /dev/shm/l8 llama-3.1-8b
    LUMEN_CUDA_GRAPHS=0 timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --launch-skip 1400 --launch-count 355 "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 16 \
      --gen 2 --no-membw > "${OUT:-/tmp}/ncu.csv" 2>/dev/null
    python3 tools/device/ncu_agg.py "${OUT:-/tmp}/ncu.csv" ;;
  lumen-final) # the sixth pass's figures (docs/history/08-cuda-pass06.md), results as they come in $OUT/final.jsonl
    f=${OUT:-/tmp}/final.jsonl
    model /dev/shm/l8 llama-3.1-8b
    "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 32 --gen 128 --reps 3 | tee -a "$f"
    for B in 1 8 32 128; do "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 | tee -a "$f"; done
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw | tee -a "$f"
    LUMEN_CUDA_FUSED=0 "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 64 --no-membw | tee -a "$f"
    "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw | tee -a "$f"
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw | tee -a "$f"
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    "$L" bench -m /dev/shm/q27 --device cuda --prompt-len 32 --gen 64 --reps 2 | tee -a "$f"
    LUMEN_CUDA_FUSED=0 "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 32 --no-membw | tee -a "$f"
    for B in 1 8 32 128; do "$L" bench -m /dev/shm/q27 --device cuda --batch $B --prompt-len 32 --gen 32 | tee -a "$f"; done
    "$L" bench -m /dev/shm/q27 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 1 --no-membw | tee -a "$f" ;;
  final7) # the seventh pass's figures, results in $OUT/final.jsonl: batch 1 against the copy, batch 8 / 32 / 128 (f32-exact; 128 also bf16), 4k prefill, both shapes
    f=${OUT:-/tmp}/final.jsonl
    model /dev/shm/l8 llama-3.1-8b
    "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 32 --gen 128 --reps 3 | tee -a "$f"
    for B in 1 8 32 128; do "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw | tee -a "$f"; done
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw | tee -a "$f"
    "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw | tee -a "$f"
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw | tee -a "$f"
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    "$L" bench -m /dev/shm/q27 --device cuda --prompt-len 32 --gen 64 --reps 2 | tee -a "$f"
    for B in 1 8 32 128; do "$L" bench -m /dev/shm/q27 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw | tee -a "$f"; done
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/q27 --device cuda --batch 128 --prompt-len 32 --gen 32 --no-membw | tee -a "$f"
    "$L" bench -m /dev/shm/q27 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 1 --no-membw | tee -a "$f" ;;
  prefill | prefill-qwen27) # 4k prefill, tiled attention on tensor cores and on CUDA cores (LUMEN_CUDA_ATT_TC=0), f32-exact and bf16 GEMM, alternating
    if [[ $set == prefill ]]; then d=/dev/shm/l8 n=2; model $d llama-3.1-8b; else rm -rf /dev/shm/l8; d=/dev/shm/q27 n=1; model $d qwen3.5-27b; fi
    for i in $(seq $n); do
      for tc in 1 0; do
        for gm in split bf16; do
          echo -n "att_tc=$tc gemm=$gm "
          LUMEN_CUDA_ATT_TC=$tc LUMEN_CUDA_GEMM=$gm "$L" bench -m $d --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw
        done
      done
    done
    if [[ $set == prefill ]]; then # 16k in 4k chunks: later chunks read the cached keys
      for tc in 1 0; do
        echo -n "16k att_tc=$tc gemm=bf16 "
        LUMEN_CUDA_ATT_TC=$tc LUMEN_CUDA_GEMM=bf16 "$L" bench -m $d --device cuda --prompt-len 16384 --chunk 4096 --gen 4 --reps 1 --no-membw
      done
    fi ;;
  ncu-att) # the tensor-core attention of a 4k Llama-8B prefill under ncu (throughput, warp stalls, occupancy); op shares (LUMEN_PROFILE)
    model /dev/shm/l8 llama-3.1-8b
    LUMEN_PROFILE=1 LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 4096 --chunk 4096 --gen 1 --reps 1 --no-membw 2>&1 | tail -n 30
    LUMEN_CUDA_GEMM=bf16 timeout 200 ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section Occupancy -k regex:att_tc_kernel --launch-skip 20 --launch-count 1 "$L" bench -m /dev/shm/l8 --device cuda \
      --prompt-len 4096 --chunk 4096 --gen 1 --reps 1 --no-membw > "${OUT:-/tmp}/ncu_att.txt" 2>&1
    grep -E "Duration|Throughput|Stall|Pipe|Issue|Occupancy|Registers|Warp Cycles|Executed Ipc" "${OUT:-/tmp}/ncu_att.txt" | head -n 40 ;;
  b128 | b128-qwen9) # where a batch-128 decode step goes: each kind of kernel left out (LUMEN_CUDA_SKIP), f32-exact and bf16 products
    if [[ $set == b128 ]]; then d=/dev/shm/l8; model $d llama-3.1-8b; kinds="none gemm gemm_split attention norm rope_kv"
    else rm -rf /dev/shm/l8; d=/dev/shm/q9; model $d qwen3.5-9b; kinds="none gemm gemm_split conv gates delta_rule gnorm attention norm"; fi
    for gm in split bf16; do
      for k in $kinds; do
        echo -n "gemm=$gm skip $k "; LUMEN_CUDA_GEMM=$gm LUMEN_CUDA_SKIP=${k/none/} "$L" bench -m $d --device cuda --batch 128 --prompt-len 32 --gen 32 --no-membw 2>/dev/null
      done
      kinds="none gemm gemm_split"
    done
    LUMEN_PROFILE=1 LUMEN_CUDA_GEMM=bf16 "$L" bench -m $d --device cuda --batch 128 --prompt-len 32 --gen 16 --no-membw 2>&1 | tail -n 28 ;;
  b128-ab) # batch-128 decode of this build against bin/lumen_base, alternating, f32-exact and bf16 products; then the kernel times of two steps (ncu, bf16; NCU_BINS="lumen_base lumen" for both)
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do for gm in split bf16; do for b in lumen_base lumen; do
      echo -n "$b gemm=$gm "; LUMEN_CUDA_GEMM=$gm "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 32 --gen 32 --no-membw
    done; done; done
    for b in ${NCU_BINS:-lumen}; do # 128 one-token prefills (~40k launches), then steps of ~600
      LUMEN_CUDA_GEMM=bf16 LUMEN_CUDA_GRAPHS=0 timeout 250 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        --launch-skip 45000 --launch-count 1200 "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 1 \
        --gen 200 --no-membw > "${OUT:-/tmp}/ncu_$b.csv" 2>/dev/null
      echo "ncu $b"; python3 tools/device/ncu_agg.py "${OUT:-/tmp}/ncu_$b.csv" 24
    done ;;
  b128-ab-qwen9) # the same A/B on the Qwen3.5-9B shape at batch 128, and at batch 1
    rm -rf /dev/shm/l8; model /dev/shm/q9 qwen3.5-9b
    for gm in split bf16; do for b in lumen_base lumen; do
      echo -n "$b gemm=$gm "; LUMEN_CUDA_GEMM=$gm "$C/bin/$b" bench -m /dev/shm/q9 --device cuda --batch 128 --prompt-len 32 --gen 32 --no-membw
    done; done
    for b in lumen_base lumen lumen_base lumen; do
      echo -n "$b batch 1 "; "$C/bin/$b" bench -m /dev/shm/q9 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw
    done ;;
  ab-delta-qwen9) # Qwen3.5-9B decode of this build against bin/lumen_base at batch 128 (twice), 32 and 1, alternating
    rm -rf /dev/shm/l8; model /dev/shm/q9 qwen3.5-9b
    for B in 128 32 128 1; do for b in lumen_base lumen; do
      echo -n "$b batch $B "; "$C/bin/$b" bench -m /dev/shm/q9 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw
    done; done ;;
  b1-copy) # batch-1 decode as the engine runs it (greedy ids on the GPU) with the copy measured in the same process, three shapes
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128; done
    rm -rf /dev/shm/l8; model /dev/shm/q9 qwen3.5-9b
    "$L" bench -m /dev/shm/q9 --device cuda --batch 1 --prompt-len 32 --gen 128
    rm -rf /dev/shm/q9; model /dev/shm/q27 qwen3.5-27b
    "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 ;;
  final8) # the eighth pass's figures: b1-copy's batch-1 runs (27B twice), then batched decode of both hybrid shapes
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128; done
    rm -rf /dev/shm/l8; model /dev/shm/q9 qwen3.5-9b
    "$L" bench -m /dev/shm/q9 --device cuda --batch 1 --prompt-len 32 --gen 128
    for B in 8 32 128; do "$L" bench -m /dev/shm/q9 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw; done
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/q9 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw
    rm -rf /dev/shm/q9; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2; do "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64; done
    for B in 32 128; do "$L" bench -m /dev/shm/q27 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw; done ;;
  final8b) # more batch-1 runs of the Qwen3.5-27B shape with the copy, and the 4k prefill of both hybrid shapes
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2 3; do "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64; done
    "$L" bench -m /dev/shm/q27 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 1 --no-membw
    rm -rf /dev/shm/q27; model /dev/shm/q9 qwen3.5-9b
    "$L" bench -m /dev/shm/q9 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw ;;
  qwen9) # the Qwen3.5-9B shape (llama.cpp's hybrid figures are for it): batch 1 against the copy roofline, batch 8 / 32 / 128, 4k prefill
    rm -rf /dev/shm/l8; model /dev/shm/q9 qwen3.5-9b
    "$L" bench -m /dev/shm/q9 --device cuda --prompt-len 32 --gen 128 --reps 3
    for B in 1 8 32 128; do "$L" bench -m /dev/shm/q9 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw; done
    LUMEN_CUDA_GEMM=bf16 "$L" bench -m /dev/shm/q9 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw
    "$L" bench -m /dev/shm/q9 --device cuda --prompt-len 4096 --chunk 4096 --gen 4 --reps 2 --no-membw ;;
  final9) # more batch-1 runs with the copy in the same process: Llama-8B once, Qwen3.5-27B three times (b1-copy has the rest)
    model /dev/shm/l8 llama-3.1-8b
    "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128
    rm -rf /dev/shm/l8 /dev/shm/m30; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2 3; do "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64; done ;;
  moe-b1) # the Qwen3-30B-A3B shape at batch 1 and 8: lumen_base and lumen alternating
    moe_ab "1 8" ;;
  ncu-route) # the MoE routing kernel under ncu at batch 1 (warp stalls, scheduler, occupancy): the Qwen3-30B-A3B shape cut to 4 layers (same routing, quick to write)
    model /dev/shm/m30x4 qwen3-30b-a3b --layers 4
    LUMEN_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none -k regex:moe_route_kernel --launch-skip 20 --launch-count 1 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
      "$L" bench -m /dev/shm/m30x4 --device cuda --batch 1 --prompt-len 16 --gen 8 --no-membw 2>/dev/null | tail -n 80 ;;
  moe-s20) # the Qwen3-30B-A3B shape at batch 1, 8 and 32: lumen_base, lumen, and lumen with LUMEN_CUDA_GEMV_PER=2 alternating
    rm -rf /dev/shm/l8 /dev/shm/q27 /dev/shm/q9; model /dev/shm/m30 qwen3-30b-a3b
    for B in 1 8 32; do for v in base new per2; do
      b=lumen; e=""; [[ $v == base ]] && b=lumen_base; [[ $v == per2 ]] && e="LUMEN_CUDA_GEMV_PER=2"
      echo -n "$v batch $B "; env $e "$C/bin/$b" bench -m /dev/shm/m30 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw 2>/dev/null
    done; done ;;
  moe-s20b) # the Qwen3-30B-A3B shape at batch 1, 8 and 32: lumen_base, and lumen with LUMEN_CUDA_GEMV_PER=2, 3, 4 alternating; Llama-8B batch 1 base / lumen
    rm -rf /dev/shm/l8 /dev/shm/q27 /dev/shm/q9; model /dev/shm/m30 qwen3-30b-a3b
    for B in 1 8 32; do for v in base 2 3 4; do
      b=lumen; [[ $v == base ]] && b=lumen_base
      echo -n "$v batch $B "; LUMEN_CUDA_GEMV_PER=$v "$C/bin/$b" bench -m /dev/shm/m30 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw 2>/dev/null
    done; done
    rm -rf /dev/shm/m30; model /dev/shm/l8 llama-3.1-8b
    for i in 1 2; do for b in lumen_base lumen; do
      echo -n "$b llama batch 1 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>/dev/null
    done; done ;;
  moe-s20c) # the Qwen3-30B-A3B shape at batch 1, 8, 32 and 1 again (lumen_base and lumen alternating), then Llama-8B batch 1 the same way
    moe_ab "1 8 32 1"
    rm -rf /dev/shm/m30; model /dev/shm/l8 llama-3.1-8b
    for b in lumen_base lumen lumen_base lumen; do
      echo -n "$b llama batch 1 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>/dev/null
    done ;;
  moe-s20d) # the Qwen3-30B-A3B shape at batch 1, 8, 32, 128 and 1 again: lumen_base and lumen alternating
    moe_ab "1 8 32 128 1" ;;
  final-s20) # Llama-8B batch 1 (lumen_base and lumen alternating, twice), then the Qwen3-30B-A3B shape at batch 1 and 8 the same way
    rm -rf /dev/shm/m30 /dev/shm/q27 /dev/shm/q9; model /dev/shm/l8 llama-3.1-8b
    for b in lumen_base lumen lumen_base lumen; do
      echo -n "$b llama batch 1 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>/dev/null
    done
    moe_ab "1 8" ;;
  final-s20b) # Llama-8B batch 1 (lumen_base and lumen alternating, twice), then the Qwen3-30B-A3B shape at batch 1 once each
    rm -rf /dev/shm/m30 /dev/shm/q27 /dev/shm/q9; model /dev/shm/l8 llama-3.1-8b
    for b in lumen_base lumen lumen_base lumen; do
      echo -n "$b llama batch 1 "; "$C/bin/$b" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 --no-membw 2>/dev/null
    done
    moe_ab "1" ;;
  lookahead) # batch-1 decode with the greedy look-ahead (each step queued before the last one's ids reach the host; the default) and without (--no-look-ahead), alternating: Llama-8B and Qwen3.5-27B with the copy, Qwen3.5-9B, batch 8 and 32 of Llama-8B
    model /dev/shm/l8 llama-3.1-8b
    for r in 1 2 3; do for f in --no-look-ahead ""; do
      "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 $f 2>/dev/null
    done; done
    for B in 8 32; do for f in --no-look-ahead ""; do
      "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw $f 2>/dev/null
    done; done
    rm -rf /dev/shm/l8; model /dev/shm/q9 qwen3.5-9b
    for f in --no-look-ahead ""; do
      "$L" bench -m /dev/shm/q9 --device cuda --batch 1 --prompt-len 32 --gen 128 $f 2>/dev/null
    done
    rm -rf /dev/shm/q9; model /dev/shm/q27 qwen3.5-27b
    for r in 1 2; do for f in --no-look-ahead ""; do
      "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 $f 2>/dev/null
    done; done ;;
  final-s22) # batch 1 with the copy as the engine runs it (greedy look-ahead on): Llama-8B three times, Qwen3.5-27B twice; then the Qwen3-30B-A3B shape at batch 1
    model /dev/shm/l8 llama-3.1-8b
    for i in 1 2 3; do "$L" bench -m /dev/shm/l8 --device cuda --batch 1 --prompt-len 32 --gen 128 2>/dev/null; done
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for i in 1 2; do "$L" bench -m /dev/shm/q27 --device cuda --batch 1 --prompt-len 32 --gen 64 2>/dev/null; done
    rm -rf /dev/shm/q27; model /dev/shm/m30 qwen3-30b-a3b
    "$L" bench -m /dev/shm/m30 --device cuda --batch 1 --prompt-len 32 --gen 64 2>/dev/null ;;
  final-s22b) # final-s22 on another machine, then batched decode with the look-ahead: Llama-8B batch 128, Qwen3.5-27B batch 8 / 32 / 128
    bash "$0" final-s22
    rm -rf /dev/shm/m30; model /dev/shm/l8 llama-3.1-8b
    "$L" bench -m /dev/shm/l8 --device cuda --batch 128 --prompt-len 32 --gen 64 --no-membw 2>/dev/null
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for B in 8 32 128; do "$L" bench -m /dev/shm/q27 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw 2>/dev/null; done ;;
  s21-final) # batched decode at the current code: Llama-8B batch 8 / 32 / 128, Qwen3.5-27B batch 8 / 32 / 128, the Qwen3-30B-A3B shape batch 1 / 8 / 32 / 128
    rm -rf /dev/shm/m30 /dev/shm/q27 /dev/shm/q9; model /dev/shm/l8 llama-3.1-8b
    for B in 8 32 128; do echo -n "llama batch $B "; "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw 2>/dev/null; done
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    for B in 8 32 128; do echo -n "qwen27 batch $B "; "$L" bench -m /dev/shm/q27 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw 2>/dev/null; done
    rm -rf /dev/shm/q27; model /dev/shm/m30 qwen3-30b-a3b
    for B in 1 8 32 128; do echo -n "moe batch $B "; "$L" bench -m /dev/shm/m30 --device cuda --batch $B --prompt-len 32 --gen 32 --no-membw 2>/dev/null; done ;;
  moe128) # the Qwen3-30B-A3B shape at batch 128 (grouped on the device up to 128 tokens) and 96: lumen_base and lumen alternating
    moe_ab "128 96" ;;
  llama) model /dev/shm/l8 llama-3.1-8b; bench_model /dev/shm/l8 bf16 ;;
  qwen27) rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b; bench_model /dev/shm/q27 ;;
  final) # lumen and the transformers peer on the same machine in one run
    model /dev/shm/l8 llama-3.1-8b
    "$L" bench -m /dev/shm/l8 --device cuda --prompt-len 32 --gen 128 --reps 3
    for B in 8 32 128; do "$L" bench -m /dev/shm/l8 --device cuda --batch $B --prompt-len 32 --gen 64 --no-membw; done
    timeout 300 python3 tools/device/torch_peer.py --shape llama-3.1-8b --batch 1 8 32 128 --reps 1
    rm -rf /dev/shm/l8; model /dev/shm/q27 qwen3.5-27b
    "$L" bench -m /dev/shm/q27 --device cuda --prompt-len 32 --gen 64 --reps 2
    timeout 200 python3 tools/device/torch_peer.py --shape qwen3.5-27b --batch 1 --gen 16 --reps 1 ;;
  peer-llama) timeout 400 python3 tools/device/torch_peer.py --shape llama-3.1-8b --batch 1 8 32 128 ;;
  peer-qwen27) timeout 300 python3 tools/device/torch_peer.py --shape qwen3.5-27b --batch 1 --gen 32 ;;
  *) echo "unknown set $set" >&2 ;;
  esac
done
