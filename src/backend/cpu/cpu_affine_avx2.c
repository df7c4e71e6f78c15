/* cpu_affine_avx2.c - A4_* / A8_* rows widened to f32 with AVX2 (both x86
 * tables), for the GEMM packer and embedding rows.
 *
 * Design: the same arithmetic as the reference (dtype_hf.c): scale * q is
 * exact in f32 (a half's 11 significant bits times an 8-bit code), so the
 * one rounding is that of + bias, and the widened rows are bit-identical to
 * lm_dequant_row; prefill stays on the exact path. Only the decoding of
 * the codes is vectorised (decode runs on the int8 path, cpu_qdot_x86.h). */
#include <immintrin.h>
#include <string.h>

#include "../dtype_hf.h"
#include "cpu_kern.h"

#define LM_AFF_AI static inline __attribute__((always_inline))

/* A block's scale or bias (bf16 or f16) as f32. */
LM_AFF_AI float lm_aff_half(bool bf16, const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return bf16 ? lm_bf16_to_f32(h) : _cvtsh_ss(h);
}

/* 8 unsigned byte codes (the low 8 bytes of q) times d plus m. */
LM_AFF_AI __m256 lm_aff_8(__m128i q, __m256 d, __m256 m) {
    return _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q))), m);
}

LM_AFF_AI void lm_aff_to_f32(bool four, bool bf16, const uint8_t *s, float *dst, int64_t n) {
    LM_ASSERT(n % LM_AFF_BLOCK == 0);
    const int bb = four ? 4 + LM_AFF_BLOCK / 2 : 4 + LM_AFF_BLOCK;
    for (int64_t b = 0; b < n / LM_AFF_BLOCK; b++, s += bb, dst += LM_AFF_BLOCK) {
        const __m256 d = _mm256_set1_ps(lm_aff_half(bf16, s)), m = _mm256_set1_ps(lm_aff_half(bf16, s + 2));
        __m128i q[4];
        if (four) { /* values 0-15 in the low nibbles, 16-31 in the high ones */
            __m128i raw = _mm_loadu_si128((const __m128i *)(s + 4)), mask = _mm_set1_epi8(0x0f);
            __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            q[0] = lo, q[1] = _mm_srli_si128(lo, 8), q[2] = hi, q[3] = _mm_srli_si128(hi, 8);
        } else {
            for (int k = 0; k < 4; k++) q[k] = _mm_loadl_epi64((const __m128i *)(s + 4 + 8 * k));
        }
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, lm_aff_8(q[k], d, m));
    }
}

void lm_cpu_a4_bf16_to_f32_avx2(const void *s, float *d, int64_t n) { lm_aff_to_f32(true, true, s, d, n); }
void lm_cpu_a4_f16_to_f32_avx2(const void *s, float *d, int64_t n) { lm_aff_to_f32(true, false, s, d, n); }
void lm_cpu_a8_bf16_to_f32_avx2(const void *s, float *d, int64_t n) { lm_aff_to_f32(false, true, s, d, n); }
void lm_cpu_a8_f16_to_f32_avx2(const void *s, float *d, int64_t n) { lm_aff_to_f32(false, false, s, d, n); }
