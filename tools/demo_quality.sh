#!/usr/bin/env bash
# demo_quality.sh LUMEN DIR TEXT - issue #26's quality table for the demo model.
# DIR holds model.bf16.gguf (llama.cpp's converter on models/demo), llama.cpp's
# quantisations model.<TYPE>.gguf and llama-perplexity's logs ppl.<TYPE>.log
# (`llama-perplexity -c 512 --kl-divergence-base/--kl-divergence` against the bf16
# file on TEXT). For each type: lumen's own quantisation of the bf16 file
# (`lumen quantize`) and llama.cpp's file, both scored by `lumen eval` against the
# bf16 file (windows of 512, every position), beside llama-perplexity's figures for
# llama.cpp's file (windows of 512, second half of each). Prints a markdown table.
set -euo pipefail
L=$1 D=$2 T=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
score() { "$L" eval -m "$1" --reference "$D/model.bf16.gguf" --text "$T" --ctx 512 2>/dev/null |
  python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2e | %+.2f %% | %.1f %%" % (j["kl_mean"], 100*(j["ppl"]/j["ref_ppl"]-1), 100*j["top1"]))' ||
  echo "failed | | "; }
echo "| type | MB (lumen / llama.cpp) | lumen's file: KL mean, ppl change, top-1 | llama.cpp's file, lumen eval: KL mean, ppl change, top-1 | llama.cpp's file, llama-perplexity: KL mean, ppl change, same top |"
echo "|---|---|---|---|---|"
base=$(grep 'Final estimate' "$D/ppl.bf16.log" | sed 's/.*PPL = \([0-9.]*\).*/\1/')
for t in Q8_0 Q6_K Q5_K_M Q5_K_S Q5_1 Q5_0 Q4_K_M Q4_K_S Q4_1 Q4_0 IQ4_XS IQ4_NL Q3_K_L Q3_K_M Q3_K_S Q2_K; do
  [[ -f $D/model.$t.gguf ]] || continue
  mine="not written"; ms="-"
  if "$L" quantize "$D/model.bf16.gguf" "$tmp/m.gguf" --type "$t" >/dev/null 2>"$tmp/err"; then
    mine=$(score "$tmp/m.gguf"); ms=$(python3 -c "print('%.2f' % ($(stat -c %s "$tmp/m.gguf")/1e6))")
  else mine="not supported: $(head -c 80 "$tmp/err" | tr '\n|' '  ')"; fi
  theirs=$(score "$D/model.$t.gguf")
  f=$D/ppl.$t.log
  lp=$(python3 -c "print('%s | %+.2f %% | %s %%' % ('$(grep 'Mean    KLD' "$f" | awk '{print $3}')', 100*($(grep 'Mean PPL(Q) ' "$f" | awk '{print $4}')/$base-1), '$(grep '^Same top p' "$f" | awk '{print $4}')'))")
  echo "| $t | $ms / $(python3 -c "print('%.2f' % ($(stat -c %s "$D/model.$t.gguf")/1e6))") | $mine | $theirs | $lp |"
done
