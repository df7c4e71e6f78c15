/* lm_dtype.h - storage types of tensors and conversions between them.
 *
 * A weight is a row-major matrix [rows][cols] in one of these types; quantised
 * types store each row as whole blocks (cols must be a multiple of the block
 * width). The block layouts of Q8_0, Q4_0, Q4_K, Q5_K, Q6_K and IQ4_XS are those of the GGUF
 * file format, so GGUF data is used in place. */
#ifndef LM_DTYPE_H
#define LM_DTYPE_H

#include "../base/lm_base.h"

typedef enum lm_dtype {
    LM_F32 = 0,
    LM_F16,
    LM_BF16,
    LM_Q8_0, /* 32 values: f16 scale + 32 x int8                     (34 bytes) */
    LM_Q4_0, /* 32 values: f16 scale + 16 bytes of nibbles, q-8      (18 bytes) */
    LM_Q4_K, /* 256 values: f16 d, f16 dmin, 12 B scales, 128 B qs   (144 bytes) */
    LM_Q6_K, /* 256 values: 128 B ql, 64 B qh, 16 x int8 scales, f16 (210 bytes) */
    LM_Q5_K, /* 256 values: f16 d, f16 dmin, 12 B scales, 32 B qh, 128 B qs (176 bytes) */
    LM_IQ4_XS, /* 256 values: f16 d, u16 scales_h, 4 B scales_l, 128 B qs (136 bytes) */
    LM_I32,
    LM_DTYPE_COUNT
} lm_dtype;

const char *lm_dtype_name(lm_dtype t);
/* Values per block (1 for plain types) and bytes per block. */
int lm_dtype_block(lm_dtype t);
int lm_dtype_block_bytes(lm_dtype t);
/* Bytes of n values; n must be a multiple of the block width (asserted). */
size_t lm_dtype_row_bytes(lm_dtype t, int64_t n);
bool lm_dtype_is_quant(lm_dtype t);

/* IQ4_NL / IQ4_XS code -> level. */
extern const int8_t lm_iq4nl_levels[16];

/* Converts n values of type t at src to f32 (n a multiple of the block). */
void lm_dequant_row(lm_dtype t, const void *src, float *dst, int64_t n);
/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the
 * super-block's 12 scale bytes sc. */
void lm_q4k_scale_min(int j, const uint8_t *sc, int *scale, int *min);

/* Scalar conversions (round-to-nearest-even for f32 -> bf16/f16). */
static inline float lm_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
static inline uint16_t lm_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    uint32_t r = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + r) >> 16);
}
float lm_f16_to_f32(uint16_t h);
uint16_t lm_f32_to_f16(float f);

#endif
