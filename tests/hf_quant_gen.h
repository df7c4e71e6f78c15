/* hf_quant_gen.h - writes Hugging Face FP8 and MLX-quantised checkpoints
 * (and their dequantised twins) from a bf16 model folder, for the tests of
 * format/hf_quant.c.
 *
 * Design: the writer is independent of the code under test. It encodes e4m3
 * from its own table of the 127 positive values, packs MLX words as MLX
 * does (value i of a row at bits [bits*(i%k), ...) of little-endian word
 * i/k), and computes each twin value with the checkpoint's own formula in
 * f32 (FP8: value * scale_inv; MLX: scale * q + bias). A bug shared by the
 * repacker and this writer would have to be made twice. */
#ifndef LM_HF_QUANT_GEN_H
#define LM_HF_QUANT_GEN_H

#include <stddef.h>
#include <stdint.h>

typedef enum hqg_scheme {
    HQG_FP8_BLOCK,  /* e4m3 + f32 weight_scale_inv per 128x128 tile; embeddings, lm_head bf16 */
    HQG_FP8_TENSOR, /* e4m3 + one bf16 weight_scale (shape []) per tensor */
    HQG_MLX4_G64,   /* 4-bit, groups of 64, bf16 scales and biases, every matrix
                     * (embeddings too); model.layers.1.mlp.down_proj overridden to
                     * 8 bits, groups of 32 */
    HQG_MLX8_G32,   /* 8-bit, groups of 32, f16 scales and biases, every matrix */
    HQG_MLX4_SWITCH, /* a MoE as mlx-lm writes it: each layer's experts stacked as
                      * mlp.switch_mlp.{gate,up,down}_proj [E][rows][cols] and
                      * quantised as stacks, 4-bit groups of 32 with bf16 halves;
                      * the routers (mlp.gate) 8-bit, as mlx-lm's qwen3_moe picks */
    HQG_MLX3_G64,   /* 3-bit, groups of 64, bf16 halves, every matrix (mlx-bun's width) */
    HQG_MLX6_G64,   /* 6-bit, groups of 64, f16 halves, every matrix */
    HQG_MLX2_G32,   /* 2-bit, groups of 32, bf16 halves, every matrix */
    HQG_MLX5_G32,   /* 5-bit, groups of 32, bf16 halves, every matrix */
} hqg_scheme;

/* One tensor for hqg_write_safetensors. */
typedef struct hqg_tensor {
    char name[160];
    const char *dtype; /* safetensors dtype name */
    int n_dims;
    int64_t shape[3];
    const void *data;
    size_t nbytes;
} hqg_tensor;

/* Writes n tensors (sorted by name here) as a safetensors file; 0 on success. */
int hqg_write_safetensors(const char *path, hqg_tensor *t, int n);

/* Quantises the bf16 folder src (config.json, model.safetensors) with scheme
 * into out (config.json with the scheme's quantization entries, a
 * model.safetensors, and reference.safetensors linked from src when it has
 * one) and writes twin (may be NULL): the same model with every weight as
 * F32, quantised ones dequantised. 0 on success, else -1 with why. */
int hqg_convert(const char *src, hqg_scheme scheme, const char *out, const char *twin, char *why, size_t why_n);

/* The nearest e4m3fn code to x (ties to the even code, saturating at 448)
 * and its value, from the writer's own table. */
uint8_t hqg_e4m3_encode(float x);
float hqg_e4m3_value(uint8_t code);

#endif
