#!/usr/bin/env bash
# kv_quality.sh - what each KV cache format costs in quality (issue #29):
#   1. KL(f32 cache || format) and top-1 agreement of next-token predictions
#      over held-out text, windows of each --ctx, by `lumen eval --kv-type T
#      --reference SAME_MODEL` (the reference always runs an f32 cache);
#   2. a needle in a haystack: NEEDLES assignments `name = "value"` (random
#      names and 6-character values) placed at spread depths of a held-out
#      code context of about HAY tokens, then the context ends with
#      `assert name == "`; the greedy continuation (`lumen run`, 8 tokens)
#      retrieves the needle when it contains the value. Per format: how
#      many of the needles came back, and how many the f32 cache got (the
#      demo model retrieves none even with f32: this part is for a real model).
# Held-out text: the demo's own rule (tools/train_demo/train.py is_heldout:
# sha1 of the path relative to /usr/lib, mod 50 == 0) applied to this
# machine's /usr/lib/python3.*, files of 200 B to 200 kB in path order.
# Usage: tools/kv_quality.sh [LUMEN [MODEL]] with CTXS, HAY, NEEDLES (0:
# no needle table), FORMATS, CHARS (held-out characters scored, default
# 60000: about 17k tokens of the demo's) and ROPE (options for both eval and
# run, e.g. "--rope-scaling yarn --rope-scale 8" to go past the demo's 4,096
# positions) in the environment. Prints Markdown tables.
set -euo pipefail
L=${1:-build/release/lumen}
M=${2:-models/demo}
CTXS=${CTXS:-"1024 4096"}
HAY=${HAY:-3000}
NEEDLES=${NEEDLES:-12}
FORMATS=${FORMATS:-"bf16 q8 q4 q4r K8V4r"}
CHARS=${CHARS:-60000}
read -r -a ROPE <<<"${ROPE:-}"
T=${TMPDIR:-/tmp}/kv_quality.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
python3 - "$T" "$CHARS" <<'EOF'
import glob, hashlib, os, sys
out, chars = sys.argv[1], int(sys.argv[2])
texts = []
for root in sorted(glob.glob("/usr/lib/python3.*")):
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        raw = open(path, "rb").read()
        rel = os.path.relpath(path, os.path.dirname(root))
        if 200 <= len(raw) <= 200_000 and int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50 == 0:
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                pass
text = "\n".join(texts)
open(os.path.join(out, "heldout.txt"), "w").write(text)  # the haystacks' source
open(os.path.join(out, "scored.txt"), "w").write(text[:chars])
EOF
echo "| format | ctx | KL mean | KL p99 | top-1 | ppl (f32: ref) |"
echo "|---|---|---|---|---|---|"
for ctx in $CTXS; do
  for kv in $FORMATS; do
    j=$("$L" eval -m "$M" --reference "$M" --text "$T/scored.txt" --ctx "$ctx" --kv-type "$kv" "${ROPE[@]}" 2>/dev/null)
    python3 -c "
import json,sys; r=json.loads(sys.argv[1])
print('| %s | %d | %.2e | %.2e | %.4f | %.3f (%.3f) |' % (sys.argv[2], r['ctx'], r['kl_mean'], r['kl_p99'], r['top1'], r['ppl'], r['ref_ppl']))" "$j" "$kv"
  done
done
[[ $NEEDLES -gt 0 ]] || exit 0
# the needles: one haystack per needle (depth i / NEEDLES), same for every format
python3 - "$T" "$HAY" "$NEEDLES" <<'EOF'
import os, random, sys
out, hay, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
text = open(os.path.join(out, "heldout.txt")).read()
rng = random.Random(29)
lines = text.split("\n")
# about 3.5 characters a token in this code
want = int(hay * 3.5)
start = rng.randrange(0, max(1, len(text) - want - 1))
body = text[start:start + want].split("\n")[1:-1]
for i in range(n):
    name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) + "_token"
    value = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
    at = int(len(body) * i / n)
    doc = body[:at] + ['%s = "%s"' % (name, value)] + body[at:] + ["", 'assert %s == "' % name]
    open(os.path.join(out, "needle%d.txt" % i), "w").write("\n".join(doc))
    open(os.path.join(out, "needle%d.want" % i), "w").write(value)
EOF
echo
echo "| format | needles retrieved (of $NEEDLES, ~$HAY-token context) |"
echo "|---|---|"
for kv in f32 $FORMATS; do
  got=0
  for ((i = 0; i < NEEDLES; i++)); do
    out=$("$L" run -m "$M" --kv-type "$kv" --temp 0 -n 8 "${ROPE[@]}" -p "$(cat "$T/needle$i.txt")" 2>/dev/null || true)
    [[ $out == *"$(cat "$T/needle$i.want")"* ]] && got=$((got + 1))
  done
  echo "| $kv | $got |"
done
