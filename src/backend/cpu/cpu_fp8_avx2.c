/* cpu_fp8_avx2.c - FP8_B128 rows widened to f32 with AVX2 (both x86 tables).
 *
 * Design: the reference (dtype_hf.c) decodes one e4m3 byte at a time with
 * branches; here 16 at once through f16. The 7 magnitude bits of an e4m3
 * code shifted left by 7 are an f16 (4 exponent bits into f16's 5, the 3
 * mantissa bits on top of its 10) worth the code's value times 2^-8, for
 * normals and subnormals alike; the sign moves to bit 15 and S.1111.111 gets
 * an f16 NaN. F16C widens that exactly, and multiplying by the block scale
 * times 2^8 gives the very product the reference rounds (both power-of-two
 * factors are exact), so the result is bit-identical to lm_dequant_row and
 * the exact path stays exact. The GEMM packer widens rows through this.
 * The GEMV decodes in registers instead: per row, each 128-value block is
 * dotted with the tokens' activations unscaled, then scaled once (the same
 * sum in another order; not bit-identical to widening first). */
#include <immintrin.h>
#include <string.h>

#include "../dtype_hf.h"
#include "cpu_kern.h"

/* 16 e4m3 codes at p as f32 times 2^-8, in lo (codes 0-7) and hi (8-15). */
static inline __attribute__((always_inline)) void lm_fp8_decode16(const uint8_t *p, __m256 *lo, __m256 *hi) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7f)), 7);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f << 7)),
                                         _mm256_set1_epi16(0x7e00)); /* exponent 31: NaN */
    const __m256i h = _mm256_or_si256(_mm256_or_si256(mag, sign), nan);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

void lm_cpu_fp8_to_f32_avx2(const void *src, float *dst, int64_t n) {
    LM_ASSERT(n % LM_FP8_BLOCK == 0);
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / LM_FP8_BLOCK; b++, s += LM_FP8_BLOCK_BYTES, dst += LM_FP8_BLOCK) {
        float d;
        memcpy(&d, s, sizeof d);
        const __m256 vd = _mm256_set1_ps(d * 256.0f);
        for (int i = 0; i < LM_FP8_BLOCK; i += 16) {
            __m256 lo, hi;
            lm_fp8_decode16(s + 4 + i, &lo, &hi);
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(vd, lo));
            _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(vd, hi));
        }
    }
}

/* One FP8_B128 row w of n values against NT tokens (x, ldx apart): out[t]. */
static inline __attribute__((always_inline)) void lm_fp8_row(const int NT, const uint8_t *w, const float *x, int64_t ldx, int64_t n,
                              float *out) {
    __m256 acc[LM_GEMV_MAX_TOKENS];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / LM_FP8_BLOCK; b++, w += LM_FP8_BLOCK_BYTES) {
        _mm_prefetch((const char *)w + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)w + 1024 + 64, _MM_HINT_T0);
        float d;
        memcpy(&d, w, sizeof d);
        __m256 blk[LM_GEMV_MAX_TOKENS];
        for (int t = 0; t < NT; t++) blk[t] = _mm256_setzero_ps();
        const float *xb = x + b * LM_FP8_BLOCK;
        for (int i = 0; i < LM_FP8_BLOCK; i += 16) {
            __m256 lo, hi;
            lm_fp8_decode16(w + 4 + i, &lo, &hi);
            for (int t = 0; t < NT; t++) {
                blk[t] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xb + t * ldx + i), blk[t]);
                blk[t] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xb + t * ldx + i + 8), blk[t]);
            }
        }
        const __m256 vd = _mm256_set1_ps(d * 256.0f);
        for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(blk[t], vd, acc[t]);
    }
    for (int t = 0; t < NT; t++) {
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
        out[t] = _mm_cvtss_f32(s4);
    }
}

void lm_cpu_fp8_gemv_avx2(const void *w, size_t ldw, int nr, const float *x, int64_t ldx, int nt, int64_t n,
                          const float *bias, float *y, int64_t ldy) {
    LM_ASSERT(nt >= 1 && nt <= LM_GEMV_MAX_TOKENS && n % LM_FP8_BLOCK == 0);
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
        float out[LM_GEMV_MAX_TOKENS];
        switch (nt) { /* constant token counts: accumulators in registers */
        case 1: lm_fp8_row(1, wr, x, ldx, n, out); break;
        case 2: lm_fp8_row(2, wr, x, ldx, n, out); break;
        case 3: lm_fp8_row(3, wr, x, ldx, n, out); break;
        default: lm_fp8_row(4, wr, x, ldx, n, out); break;
        }
        for (int t = 0; t < nt; t++) y[t * ldy + r] = out[t] + (bias ? bias[r] : 0.0f);
    }
}
