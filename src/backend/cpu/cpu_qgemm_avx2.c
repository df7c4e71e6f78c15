/* cpu_qgemm_avx2.c - the int8 GEMM tile for AVX2 (vpmaddubsw + vpmaddwd).
 *
 * Compiled with -mavx2 (files named *_avx2.c, see CMakeLists.txt) and
 * entered only through lm_cpu_qkern_avx2. The same panels and sums as the
 * VNNI tile (cpu_qgemm_vnni.c), with AVX2's two-step integer dot: vpmaddubsw
 * multiplies the u8 codes by the s8 activation codes and adds neighbours
 * into signed 16-bit lanes (saturating), vpmaddwd by ones widens pairs of
 * those to int32. A lane of vpmaddubsw gains at most 2 * c * 127 for codes
 * up to c (lm_qblock_type.max_code), so for c <= 63 two steps add up in 16
 * bits before one widening (4 * 63 * 127 = 32004). Longer runs in 16 bits
 * measured slower on Zen 3 (Q4_K, 8 / 4 / 2 steps: 75 / 83 / 87 GMAC/s a
 * core; 1 step: 54). Codes up to 255 (Q8_0, IQ4_NL, IQ4_XS: stored + 128)
 * would saturate one step: the tile does not take them (qgemm_max_code),
 * their prefill widens to f32. A version that took them as w = u - 128
 * through vpsignb, widening every step, ran at 53 GMAC/s a core, and a
 * Q8_0 matmul no faster than the widening (~40 GMAC/s either way). The
 * integer sums and f32 steps are the VNNI tile's, so both tiles give the
 * same bits (test_cpu_qgemm).
 *
 * Tile: LM_QGEMM_AVX2_MR tokens x 16 rows (two ymm of 8 rows) at a time,
 * the panel's two 16-row halves one after the other (4 tokens x 16 rows
 * measured faster than 2 x 16, 4 x 8 or 6 x 8). */
#include "cpu_qblock.h"

#include <immintrin.h>
#include <string.h>

#define LM_QA_AI static inline __attribute__((always_inline))
#define LM_QA_MR LM_QGEMM_AVX2_MR
#define LM_QA_UNROLL _Pragma("GCC unroll 8")

LM_QA_AI __m256i lm_qa_x4(const int8_t *p) {
    int32_t x4;
    memcpy(&x4, p, 4);
    return _mm256_set1_epi32(x4);
}

/* ia[t][v] = integer dots of steps K0 .. K0+NK-1 (4 values each) of the
 * pass's rows 8v .. 8v+7 at pb (the block's codes, offset to the pass) with
 * token t's activation codes at xb + t * ldq. */
LM_QA_AI void lm_qa_dots(const int MT, const int K0, const int NK, const uint8_t *pb,
                         const int8_t *xb, size_t ldq, __m256i ia[LM_QA_MR][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    LM_QA_UNROLL
    for (int t = 0; t < MT; t++) ia[t][0] = ia[t][1] = _mm256_setzero_si256();
    /* steps k and k + 1 add up in 16 bits, then widen */
    LM_QA_UNROLL
    for (int k = K0; k < K0 + NK; k += 2) {
        __m256i w0 = _mm256_load_si256((const __m256i *)(pb + k * 128));
        __m256i w1 = _mm256_load_si256((const __m256i *)(pb + k * 128 + 32));
        __m256i u0 = _mm256_load_si256((const __m256i *)(pb + k * 128 + 128));
        __m256i u1 = _mm256_load_si256((const __m256i *)(pb + k * 128 + 160));
        LM_QA_UNROLL
        for (int t = 0; t < MT; t++) {
            __m256i xv = lm_qa_x4(xb + (size_t)t * ldq + 4 * k), xu = lm_qa_x4(xb + (size_t)t * ldq + 4 * k + 4);
            __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, xv), _mm256_maddubs_epi16(u0, xu));
            __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(w1, xv), _mm256_maddubs_epi16(u1, xu));
            ia[t][0] = _mm256_add_epi32(ia[t][0], _mm256_madd_epi16(s0, ones));
            ia[t][1] = _mm256_add_epi32(ia[t][1], _mm256_madd_epi16(s1, ones));
        }
    }
}

/* acc[t][v] += (sc * d) * ia - off * (d * sum q) for half H of block b,
 * rows 16P .. 16P+15 (F: which of the token's block factors holds d * sum
 * q). */
LM_QA_AI void lm_qa_scale(const int MT, const int H, const int F, const uint8_t *pb, int P,
                          const float *xf, int64_t ldf, int b, __m256i ia[LM_QA_MR][2], __m256 acc[LM_QA_MR][2]) {
    const float *sc = (const float *)(pb + LM_QP_CODES) + H * LM_QP_ROWS + 16 * P, *off = sc + 2 * LM_QP_ROWS;
    __m256 s0 = _mm256_load_ps(sc), s1 = _mm256_load_ps(sc + 8);
    __m256 o0 = _mm256_load_ps(off), o1 = _mm256_load_ps(off + 8);
    LM_QA_UNROLL
    for (int t = 0; t < MT; t++) {
        const float *f = xf + t * ldf + 4 * b;
        __m256 dx = _mm256_set1_ps(f[0]), sx = _mm256_set1_ps(f[F]);
        acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t][0]), _mm256_mul_ps(s0, dx), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t][1]), _mm256_mul_ps(s1, dx), acc[t][1]);
        acc[t][0] = _mm256_fnmadd_ps(o0, sx, acc[t][0]);
        acc[t][1] = _mm256_fnmadd_ps(o1, sx, acc[t][1]);
    }
}

/* y (+)= the tile's rows r0 .. r0+7 for MT tokens; n of them exist. */
LM_QA_AI void lm_qa_store(const int MT, __m256 acc[LM_QA_MR][2], int v, int r0, int n, float *y, int64_t ldy,
                          const float *bias, bool first) {
    if (n >= 8) {
        __m256 b0 = first && bias ? _mm256_loadu_ps(bias + r0) : _mm256_setzero_ps();
        LM_QA_UNROLL
        for (int t = 0; t < MT; t++) {
            float *yp = y + t * ldy + r0;
            _mm256_storeu_ps(yp, _mm256_add_ps(first ? b0 : _mm256_loadu_ps(yp), acc[t][v]));
        }
        return;
    }
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 b0 = first && bias ? _mm256_maskload_ps(bias + r0, m) : _mm256_setzero_ps();
    LM_QA_UNROLL
    for (int t = 0; t < MT; t++) {
        float *yp = y + t * ldy + r0;
        _mm256_maskstore_ps(yp, m, _mm256_add_ps(first ? b0 : _mm256_maskload_ps(yp, m), acc[t][v]));
    }
}

LM_QA_AI void lm_qa_tile(const int MT, const bool HALVES, const uint8_t *panel, int nb,
                         const int8_t *xq, size_t ldq, const float *xf, int64_t ldf, int nv, float *y, int64_t ldy,
                         const float *bias, bool first) {
    for (int p = 0; p < 2 && 16 * p < nv; p++) {
        __m256 acc[LM_QA_MR][2];
        __m256i ia[LM_QA_MR][2];
        LM_QA_UNROLL
        for (int t = 0; t < MT; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *pb = panel + (size_t)b * LM_QP_BLOCK_BYTES;
            if (HALVES) {
                lm_qa_dots(MT, 0, 4, pb + 64 * p, xq + b * 32, ldq, ia);
                lm_qa_scale(MT, 0, 1, pb, p, xf, ldf, b, ia, acc);
                lm_qa_dots(MT, 4, 4, pb + 64 * p, xq + b * 32, ldq, ia);
                lm_qa_scale(MT, 1, 2, pb, p, xf, ldf, b, ia, acc);
            } else {
                lm_qa_dots(MT, 0, 8, pb + 64 * p, xq + b * 32, ldq, ia);
                lm_qa_scale(MT, 0, 3, pb, p, xf, ldf, b, ia, acc);
            }
        }
        for (int v = 0; v < 2 && 16 * p + 8 * v < nv; v++)
            lm_qa_store(MT, acc, v, 16 * p + 8 * v, nv - 16 * p - 8 * v, y, ldy, bias, first);
    }
}

/* One instance per token count and scale layout, so that the loops unroll. */
void lm_qgemm_avx2(const uint8_t *panel, int nb, const lm_qblock_type *qt, const int8_t *xq, size_t ldq,
                   const float *xf, int64_t ldf, int mt, int nv, float *y, int64_t ldy,
                   const float *bias, bool first) {
    LM_ASSERT(mt >= 1 && mt <= LM_QA_MR && nv >= 1 && nv <= LM_QP_ROWS && qt->max_code <= LM_QGEMM_AVX2_MAX_CODE);
#define LM_QA_CASE(MT)                                                                       \
    case MT:                                                                                 \
        if (qt->halves) lm_qa_tile(MT, true, panel, nb, xq, ldq, xf, ldf, nv, y, ldy, bias, first); \
        else lm_qa_tile(MT, false, panel, nb, xq, ldq, xf, ldf, nv, y, ldy, bias, first);           \
        break;
    switch (mt) {
        LM_QA_CASE(1)
        LM_QA_CASE(2)
        LM_QA_CASE(3)
        LM_QA_CASE(4)
    }
#undef LM_QA_CASE
}

LM_QA_AI int lm_qa_hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* lm_q8x_quantize with AVX2, bit for bit: the same f32 products x * (127
 * / amax), rounded to nearest even by vcvtps2dq as the portable code's
 * 1.5 * 2^23 trick does, clamped the same way. The portable loop was ~10 %
 * of an AVX2 prefill's matmul time. */
void lm_q8x_quantize_avx2(const float *x, int64_t n, void *dst) {
    int8_t *q = dst;
    float *d = (float *)(q + n);
    int16_t *s = (int16_t *)(q + n + n / 8);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / LM_Q8X_BLOCK; b++) {
        __m256 xv[4];
        for (int k = 0; k < 4; k++) xv[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
        __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, xv[0]), _mm256_andnot_ps(sign, xv[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, xv[2]), _mm256_andnot_ps(sign, xv[3])));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        d[b] = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i qi[4];
        for (int k = 0; k < 4; k++)
            qi[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(xv[k], id)), lo), hi);
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), _mm256_permutevar8x32_epi32(p, order));
        s[2 * b] = (int16_t)lm_qa_hsum(_mm256_add_epi32(qi[0], qi[1]));
        s[2 * b + 1] = (int16_t)lm_qa_hsum(_mm256_add_epi32(qi[2], qi[3]));
    }
}
