"""PyTorch + transformers as the GPU peer for `lumen bench`: the same shapes
with random bf16 weights, generate() on one H200, decode tokens/s.

  python3 tools/device/torch_peer.py --shape llama-3.1-8b --batch 1 8 32 128
  python3 tools/device/torch_peer.py --shape qwen3.5-27b --batch 1

Llama uses a static cache (transformers then compiles the decode step, as its
docs recommend for speed); the Qwen3.5 hybrid uses its default cache (its
recurrent state has no static-cache form). Decode speed = new tokens over the
time of generate() minus the time of a 1-token generate() of the same prompt
(which is the prefill), best of --reps. One JSON line per batch size."""
import argparse
import json
import time

import torch
import transformers

SHAPES = {
    "llama-3.1-8b": dict(
        model_type="llama",
        kw=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0,
                max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen3.5-27b": dict(
        model_type="qwen3_5_text",
        kw=dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                num_key_value_heads=4, head_dim=256, vocab_size=248320, linear_num_key_heads=16,
                linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=8192,
                rms_norm_eps=1e-6, tie_word_embeddings=False)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    cfg = transformers.AutoConfig.for_model(s["model_type"], **s["kw"])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    static = a.shape.startswith("llama")
    kw = dict(do_sample=False, min_new_tokens=a.gen, max_new_tokens=a.gen, pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"
    n_params = sum(p.numel() for p in model.parameters())
    for B in a.batch:
        ids = torch.randint(0, cfg.vocab_size, (B, a.prompt_len), device="cuda")
        mask = torch.ones_like(ids)

        def gen(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, **{**kw, "min_new_tokens": n, "max_new_tokens": n})
            torch.cuda.synchronize()
            return time.perf_counter() - t0, out.shape[1] - a.prompt_len

        t_warm = time.perf_counter()
        gen(a.gen)  # warm-up: compiles (static cache) and allocates
        warm_s = time.perf_counter() - t_warm
        best = 1e30
        for _ in range(a.reps):
            t_full, n = gen(a.gen)
            t_one, _ = gen(1)
            best = min(best, (t_full - t_one) / max(n - 1, 1))
        print(json.dumps(dict(peer="transformers " + transformers.__version__ + " torch " + torch.__version__,
                              shape=a.shape, params=n_params, batch=B, static_cache=static,
                              decode_tok_s=round(B / best, 2), step_ms=round(best * 1e3, 3),
                              warmup_s=round(warm_s, 1))), flush=True)


if __name__ == "__main__":
    main()
