#!/usr/bin/env bash
# What was run on the GPU machine (one H200) to train the demo model, in two
# device calls (each at most 10 minutes):
#   call 1: bash tools/train_demo/run_device.sh smoke-and-train
#   call 2: bash tools/train_demo/run_device.sh finish   (carrying .device/snapshot.pt)
set -euo pipefail
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
case "${1:-}" in
smoke-and-train)
  # a one-minute run of every phase on a sliver of the data catches mistakes cheaply
  python3 train.py --work /tmp/smoke --out /tmp/smoke-out --corpus-bytes 3000000 --minutes 0.3 \
    --max-gpu-minutes 0.25 --samples 2 --batch 8 2>&1 | tail -n 25
  python3 train.py --phase train --work /root/demo-work --minutes 6.8
  ;;
finish)
  init=""
  [[ -f ../../.device/snapshot.pt ]] && init=../../.device/snapshot.pt
  python3 train.py --phase all --work /root/demo-work --minutes 6 --init "$init"
  ;;
*) echo "usage: $0 smoke-and-train|finish" >&2; exit 2 ;;
esac
# A re-export from committed weights (used once, after the MTP reference was
# found computed without a causal mask): carry .device/prev with the weights,
# config, tokenizer and training_report.json of the earlier export.
#   mkdir -p /root/w/tokenizer && cp .device/prev/tokenizer* .device/prev/chat_template.jinja /root/w/tokenizer/
#   python3 tools/train_demo/train.py --phase export --work /root/w --from-export .device/prev
