#!/usr/bin/env python3
"""Recomputes the greedy part of a demo reference.safetensors with an explicit
attention mask (the first export let generate() treat <|endoftext|> tokens
inside prompt 2 as padding). Used once; train.py's export now does this itself.
usage: fix_reference.py MODEL_DIR REFERENCE_IN OUT_FILE"""
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

model_dir, ref_in, out = sys.argv[1:4]
ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
t = load_file(ref_in)
i = 0
while f"prompt{i}.ids" in t:
    x = t[f"prompt{i}.ids"].long()[None]
    with torch.no_grad():
        g = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    step = torch.stack([l[0].float() for l in g.logits])
    d = (step - t[f"prompt{i}.greedy_logits"]).abs().max().item()
    print(f"prompt{i}: greedy logits changed by {d:.3g}")
    t[f"prompt{i}.greedy_ids"] = g.sequences[0, x.shape[1]:].to(torch.int32).contiguous()
    t[f"prompt{i}.greedy_logits"] = step.contiguous()
    i += 1
save_file(t, out)
