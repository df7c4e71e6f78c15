#!/usr/bin/env python3
"""fp8_model.py SRC DST - a Hugging Face FP8 checkpoint (e4m3 weights, one
f32 weight_scale_inv per 128x128 tile, embeddings and lm_head kept) from the
bf16 folder SRC, as Qwen3 / DeepSeek FP8 releases lay it out. For benchmarks
on the GPU machine (torch there); the tests write theirs with
tests/hf_quant_gen.c."""
import json
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

src, dst = sys.argv[1], sys.argv[2]
sd = load_file(f"{src}/model.safetensors")
out = {}
for name, w in sd.items():
    if w.dim() != 2 or not name.endswith(".weight") or "embed_tokens" in name or "lm_head" in name:
        out[name] = w
        continue
    rows, cols = w.shape
    assert rows % 128 == 0 and cols % 128 == 0, name
    t = w.to("cuda", torch.float32).reshape(rows // 128, 128, cols // 128, 128)
    scale = (t.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    out[name] = (t / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn).cpu()
    out[name + "_scale_inv"] = scale.cpu()
save_file(out, f"{dst}/model.safetensors")
cfg = json.load(open(f"{src}/config.json"))
cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                              "weight_block_size": [128, 128]}
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=2)
for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
    try:
        shutil.copy(f"{src}/{extra}", f"{dst}/{extra}")
    except FileNotFoundError:
        pass
