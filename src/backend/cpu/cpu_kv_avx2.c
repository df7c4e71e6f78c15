/* cpu_kv_avx2.c - quantised KV rows widened to f32 with AVX2 (the AVX2
 * table's kv_to_f32; the AVX-512 table has the same with 16 values a
 * vector), for the attention's key and value tiles.
 *
 * The reference (kv_type.c's lm_kv_decode) takes one value at a time; a
 * decode step over a long context spent a third of its time there (q8,
 * 8k tokens). Here a scale group of 32 at once: the f16 scale widened by
 * F16C (exact), the codes sign- or zero-extended to int32 and converted
 * (exact), then one multiply, the very product the reference rounds, so
 * the result is bit-identical to it. Q4 and Q4R rows share the layout
 * (Q4R is decoded as stored: still rotated). */
#include <immintrin.h>

#include "cpu_kern.h"

/* 8 int32 codes times d into y. */
static inline __attribute__((always_inline)) void lm_kv_store8(float *y, __m256i c, __m256 d) {
    _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(c), d));
}

/* The scale of the group holding value i. */
static inline __attribute__((always_inline)) __m256 lm_kv_scale(const uint8_t *row, int64_t codes_bytes, int64_t i) {
    uint16_t h;
    __builtin_memcpy(&h, row + codes_bytes + 2 * (i / LM_KV_GROUP), 2);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

void lm_cpu_kv_q8_to_f32_avx2(const void *rowp, int64_t c0, int64_t n, int64_t w, float *y) {
    const uint8_t *row = rowp;
    const int64_t cb = (int64_t)lm_kv_codes_bytes(LM_KV_Q8, w);
    for (int64_t i = c0; i < c0 + n; i += LM_KV_GROUP, y += LM_KV_GROUP) {
        const __m256 d = lm_kv_scale(row, cb, i);
        for (int k = 0; k < LM_KV_GROUP; k += 8)
            lm_kv_store8(y + k, _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i + k))), d);
    }
}

void lm_cpu_kv_q4_to_f32_avx2(const void *rowp, int64_t c0, int64_t n, int64_t w, float *y) {
    const uint8_t *row = rowp;
    const int64_t cb = (int64_t)lm_kv_codes_bytes(LM_KV_Q4, w);
    const __m128i low = _mm_set1_epi8(15);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int64_t i = c0; i < c0 + n; i += LM_KV_GROUP, y += LM_KV_GROUP) {
        const __m256 d = lm_kv_scale(row, cb, i);
        /* value 2j in byte j's low nibble, 2j + 1 in its high one */
        const __m128i b = _mm_loadu_si128((const __m128i *)(row + i / 2));
        const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
        const __m128i v0 = _mm_unpacklo_epi8(lo, hi), v1 = _mm_unpackhi_epi8(lo, hi); /* values 0-15, 16-31 */
        lm_kv_store8(y, _mm256_sub_epi32(_mm256_cvtepu8_epi32(v0), eight), d);
        lm_kv_store8(y + 8, _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v0, 8)), eight), d);
        lm_kv_store8(y + 16, _mm256_sub_epi32(_mm256_cvtepu8_epi32(v1), eight), d);
        lm_kv_store8(y + 24, _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(v1, 8)), eight), d);
    }
}
