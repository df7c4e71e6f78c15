/* cpu_fp8_avx2.c - FP8_B128 rows widened to f32 with AVX2 (both x86 tables).
 *
 * Design: the reference (dtype_hf.c) decodes one e4m3 byte at a time with
 * branches; here 8 codes at once, without f32 subnormals on the way (they
 * would cost microcode assists): a normal code's 7 magnitude bits shifted
 * to bits 20..26 of an f32, plus 120 in the exponent, are its value; a
 * subnormal's (exponent 0) is its mantissa times 2^-9, converted from the
 * integer; S.1111.111 becomes NaN. Each value is then multiplied by the
 * block's scale, one rounding as in the reference, so the result is
 * bit-identical to lm_dequant_row and the exact path stays exact. The GEMV
 * widens rows through this into scratch, the GEMM packer likewise, so FP8
 * weights run at f32 speed plus one cheap decode per value. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../dtype_hf.h"
#include "cpu_kern.h"

/* 8 e4m3 codes (the low 8 bytes of b8) as f32. */
static inline __m256 lm_fp8_decode8(__m128i b8) {
    const __m256i b = _mm256_cvtepu8_epi32(b8);
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f)); /* mag = m when e = 0 */
    const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
    const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
    __m256 v = _mm256_blendv_ps(normal, sub, is_sub);
    v = _mm256_blendv_ps(v, _mm256_set1_ps(NAN), is_nan);
    return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

void lm_cpu_fp8_to_f32_avx2(const void *src, float *dst, int64_t n) {
    LM_ASSERT(n % LM_FP8_BLOCK == 0);
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / LM_FP8_BLOCK; b++, s += LM_FP8_BLOCK_BYTES, dst += LM_FP8_BLOCK) {
        float d;
        memcpy(&d, s, sizeof d);
        const __m256 vd = _mm256_set1_ps(d);
        for (int i = 0; i < LM_FP8_BLOCK; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(vd, lm_fp8_decode8(_mm_loadl_epi64((const __m128i *)(s + 4 + i)))));
    }
}
