/* lm_dtype.h - storage types of tensors and conversions between them.
 *
 * A weight is a row-major matrix [rows][cols] in one of these types; quantised
 * types store each row as whole blocks (cols must be a multiple of the block
 * width). The block layouts of the GGUF types (Q8_0 ... IQ4_XS, Q4_1 ... Q3_K)
 * are those of the GGUF file format (ggml's block structs), so GGUF data is
 * used in place. FP8_B128 and the affine A4_* / A8_* types are lumen's own
 * row-major repacking of Hugging Face FP8 and MLX checkpoints
 * (format/hf_quant.c), so a block holds its own scales. */
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
    LM_Q4_1, /* 32 values: f16 d, f16 m, 16 B nibbles, d*q+m          (20 bytes) */
    LM_Q5_0, /* 32 values: f16 d, 4 B high bits, 16 B nibbles, q-16  (22 bytes) */
    LM_Q5_1, /* 32 values: f16 d, f16 m, 4 B high bits, 16 B nibbles (24 bytes) */
    LM_IQ4_NL, /* 32 values: f16 d, 16 B nibbles indexing 16 levels  (18 bytes) */
    LM_Q2_K, /* 256 values: 16 B scales/mins, 64 B qs, f16 d, f16 dmin (84 bytes) */
    LM_Q3_K, /* 256 values: 32 B hmask, 64 B qs, 12 B scales, f16 d  (110 bytes) */
    LM_FP8_B128, /* 128 values: f32 scale + 128 x e4m3fn, x = scale * e4m3 (132 bytes) */
    LM_A4_BF16,  /* 32 values: bf16 scale s, bf16 bias b, 16 B nibbles,
                  * value j low / j+16 high nibble of byte j, x = s*q + b   (20 bytes) */
    LM_A4_F16,   /* A4_BF16 with f16 scale and bias                          (20 bytes) */
    LM_A8_BF16,  /* 32 values: bf16 scale s, bf16 bias b, 32 x uint8 q, x = s*q + b (36 bytes) */
    LM_A8_F16,   /* A8_BF16 with f16 scale and bias                          (36 bytes) */
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

/* One e4m3fn byte (FP8: 4 exponent bits, bias 7, 3 mantissa bits, no
 * infinities, S.1111.111 is NaN, largest finite 448) as f32, exactly. */
float lm_e4m3_to_f32(uint8_t b);

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
