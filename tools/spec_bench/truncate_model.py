#!/usr/bin/env python3
"""truncate_model.py - a draft model for `--spec draft:PATH` benchmarks made
from a Hugging Face folder's first N layers (an early-exit draft: the same
embeddings, final norm and output head, the rest of the stack left out; no
MTP head). Standard library only: safetensors is an 8-byte header length,
a JSON header and the raw tensors.

Usage: python3 tools/spec_bench/truncate_model.py SRC_DIR OUT_DIR N
"""
import json
import os
import re
import shutil
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    if not 0 < n < text["num_hidden_layers"]:
        sys.exit("N must be between 1 and %d" % (text["num_hidden_layers"] - 1))
    text["num_hidden_layers"] = n
    if "layer_types" in text:
        text["layer_types"] = text["layer_types"][:n]
    text.pop("mtp_num_hidden_layers", None)
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        hlen = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(hlen))
        data = f.read()
    keep = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        m = re.search(r"\.layers\.(\d+)\.", name)
        if name.startswith("mtp.") or (m and int(m.group(1)) >= n):
            continue
        keep[name] = t
    blobs, off, new = [], 0, {}
    for name in sorted(keep):
        t = keep[name]
        b = data[t["data_offsets"][0]:t["data_offsets"][1]]
        new[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hdr = json.dumps(new, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for side in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(src, side)):
            shutil.copy(os.path.join(src, side), out)
    print("%s: %d of the layers, %d tensors, %.1f MB" % (out, n, len(new), off / 1e6))


if __name__ == "__main__":
    main()
