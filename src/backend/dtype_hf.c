/* dtype_hf.c - reference dequantisers of the block types that Hugging Face
 * FP8 and MLX affine checkpoints are repacked into (format/hf_quant.c).
 *
 * Design: the checkpoints keep their scales in separate tensors (FP8: one
 * per 128x128 tile or per tensor; MLX: a scale and a bias per group of a
 * row). At load they are folded into row-major blocks that carry their own
 * scales, so every backend sees one tensor of one type and matmul dispatches
 * on it like on a GGUF type. The arithmetic here is the checkpoint's own
 * (FP8: e4m3 * scale in f32; MLX: scale * q + bias in f32), so a repacked
 * tensor widens to exactly what the checkpoint's dequantisation gives.
 * Fields are read byte-wise: blocks are not aligned. */
#include <string.h>

#include "dtype_hf.h"

/* The e4m3fn code as f32: normal values (1 + m/8) * 2^(e-7), subnormals
 * m * 2^-9, and only S.1111.111 is NaN (the format has no infinities). */
float lm_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b >> 7) << 31;
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float f;
    if (e == 15 && m == 7) {
        uint32_t nan = sign | 0x7fc00000u;
        memcpy(&f, &nan, sizeof f);
        return f;
    }
    if (e == 0) {
        f = (float)m * 0x1p-9f; /* exact: m < 8 */
        return sign ? -f : f;
    }
    uint32_t u = sign | ((e + 120u) << 23) | (m << 20); /* rebias 7 -> 127 */
    memcpy(&f, &u, sizeof f);
    return f;
}

/* FP8_B128: {f32 scale; e4m3 q[128]}, x = scale * q. */
void lm_dequant_fp8_b128(const uint8_t *s, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, s += LM_FP8_BLOCK_BYTES, y += LM_FP8_BLOCK) {
        float d;
        memcpy(&d, s, sizeof d);
        for (int j = 0; j < LM_FP8_BLOCK; j++) y[j] = d * lm_e4m3_to_f32(s[4 + j]);
    }
}

/* A half (bf16 or f16, as the type says) stored little-endian at p. */
static float lm_aff_half(bool bf16, const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return bf16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

/* A4_* / A8_*: {half scale; half bias; codes}, x = scale * q + bias; 4-bit
 * codes put value j in the low and value j + 16 in the high nibble of
 * byte j (the order of GGUF's Q4_1, so int8 kernels can share its code). */
void lm_dequant_affine(lm_dtype t, const uint8_t *s, float *y, int64_t nb) {
    const bool bf16 = t == LM_A4_BF16 || t == LM_A8_BF16;
    const bool four = t == LM_A4_BF16 || t == LM_A4_F16;
    LM_ASSERT(four || t == LM_A8_BF16 || t == LM_A8_F16);
    const int bytes = lm_dtype_block_bytes(t);
    for (int64_t b = 0; b < nb; b++, s += bytes, y += LM_AFF_BLOCK) {
        float d = lm_aff_half(bf16, s), m = lm_aff_half(bf16, s + 2);
        const uint8_t *q = s + 4;
        if (four) {
            for (int j = 0; j < LM_AFF_BLOCK / 2; j++) {
                y[j] = d * (float)(q[j] & 0x0f) + m;
                y[j + LM_AFF_BLOCK / 2] = d * (float)(q[j] >> 4) + m;
            }
        } else {
            for (int j = 0; j < LM_AFF_BLOCK; j++) y[j] = d * (float)q[j] + m;
        }
    }
}
