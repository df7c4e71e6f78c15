/* cpu_qgemm_vnni.c - the int8 GEMM tile for AVX-512 VNNI (vpdpbusd on zmm).
 *
 * Compiled with -mavx512vnni (files named *_vnni.c, see CMakeLists.txt) and
 * entered only through lm_cpu_qkern_vnni, which the backend picks when
 * lm_cpu_has_avx512_vnni() said yes.
 *
 * Tile: LM_QGEMM_VNNI_MR tokens x 32 weight rows (two zmm of 16 rows). Per
 * 32-value block, eight steps each load 4 codes of every row (two 64-byte
 * panel loads, cpu_qblock.h) and broadcast 4 activation codes per token;
 * vpdpbusd adds the four u8 x s8 products of each row into its int32 lane.
 * The block's integer sums (or each half's, for types with two scales) are
 * then turned into f32 once: acc += (sc * d) * idot - off * (d * sum q), so
 * a weight block read from L1 serves MR tokens and every product is exact
 * in integers up to the per-block scaling. The codes are at most 255 and the
 * activations at most 127 in magnitude: a lane gains at most 4 * 255 * 127
 * per step, far from int32 overflow over 8 steps. */
#include "cpu_qblock.h"

#include <immintrin.h>
#include <string.h>

#define LM_QG_AI static inline __attribute__((always_inline))
#define LM_QG_MR LM_QGEMM_VNNI_MR
/* The token loops must unroll for the accumulators to live in registers. */
#define LM_QG_UNROLL _Pragma("GCC unroll 8")

/* ia[t][v] = integer dots of codes K0 .. K0+NK-1 (groups of 4 values) of
 * the block at pb with token t's activation codes at xb + t * ldq. */
LM_QG_AI void lm_qg_dots(const int MT, const int K0, const int NK, const uint8_t *pb, const int8_t *xb,
                         size_t ldq, __m512i ia[LM_QG_MR][2]) {
    LM_QG_UNROLL
    for (int t = 0; t < MT; t++) ia[t][0] = ia[t][1] = _mm512_setzero_si512();
    LM_QG_UNROLL
    for (int k = K0; k < K0 + NK; k++) {
        __m512i w0 = _mm512_load_si512((const void *)(pb + k * 128));
        __m512i w1 = _mm512_load_si512((const void *)(pb + k * 128 + 64));
        LM_QG_UNROLL
        for (int t = 0; t < MT; t++) {
            int32_t x4;
            memcpy(&x4, xb + (size_t)t * ldq + 4 * k, 4);
            __m512i xv = _mm512_set1_epi32(x4);
            ia[t][0] = _mm512_dpbusd_epi32(ia[t][0], w0, xv);
            ia[t][1] = _mm512_dpbusd_epi32(ia[t][1], w1, xv);
        }
    }
}

/* acc[t][v] += (sc * d) * ia - off * (d * sum q) for half H of block b
 * (F: which of the token's block factors holds d * sum q). */
LM_QG_AI void lm_qg_scale(const int MT, const int H, const int F, const uint8_t *pb, const float *xf,
                          int64_t ldf, int b, __m512i ia[LM_QG_MR][2], __m512 acc[LM_QG_MR][2]) {
    const float *sc = (const float *)(pb + LM_QP_CODES) + H * LM_QP_ROWS, *off = sc + 2 * LM_QP_ROWS;
    __m512 s0 = _mm512_load_ps(sc), s1 = _mm512_load_ps(sc + 16);
    __m512 o0 = _mm512_load_ps(off), o1 = _mm512_load_ps(off + 16);
    LM_QG_UNROLL
    for (int t = 0; t < MT; t++) {
        const float *f = xf + t * ldf + 4 * b;
        __m512 dx = _mm512_set1_ps(f[0]), sx = _mm512_set1_ps(f[F]);
        acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][0]), _mm512_mul_ps(s0, dx), acc[t][0]);
        acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1]), _mm512_mul_ps(s1, dx), acc[t][1]);
        acc[t][0] = _mm512_fnmadd_ps(o0, sx, acc[t][0]);
        acc[t][1] = _mm512_fnmadd_ps(o1, sx, acc[t][1]);
    }
}

LM_QG_AI void lm_qg_tile(const int MT, const bool HALVES, const uint8_t *panel, int nb, const int8_t *xq,
                         size_t ldq, const float *xf, int64_t ldf, int nv, float *y, int64_t ldy,
                         const float *bias, bool first) {
    __m512 acc[LM_QG_MR][2];
    __m512i ia[LM_QG_MR][2];
    LM_QG_UNROLL
    for (int t = 0; t < MT; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *pb = panel + (size_t)b * LM_QP_BLOCK_BYTES;
        if (HALVES) {
            lm_qg_dots(MT, 0, 4, pb, xq + b * 32, ldq, ia);
            lm_qg_scale(MT, 0, 1, pb, xf, ldf, b, ia, acc);
            lm_qg_dots(MT, 4, 4, pb, xq + b * 32, ldq, ia);
            lm_qg_scale(MT, 1, 2, pb, xf, ldf, b, ia, acc);
        } else {
            lm_qg_dots(MT, 0, 8, pb, xq + b * 32, ldq, ia);
            lm_qg_scale(MT, 0, 3, pb, xf, ldf, b, ia, acc);
        }
    }
    for (int v = 0; v < 2; v++) {
        int n = nv - 16 * v;
        if (n <= 0) break;
        __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        __m512 b0 = first && bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
        LM_QG_UNROLL
        for (int t = 0; t < MT; t++) {
            float *yp = y + t * ldy + 16 * v;
            __m512 base = first ? b0 : _mm512_maskz_loadu_ps(m, yp);
            _mm512_mask_storeu_ps(yp, m, _mm512_add_ps(base, acc[t][v]));
        }
    }
}

/* lm_q8x_quantize with AVX-512, bit for bit: the same f32 products x * (127
 * / amax), rounded to nearest even by vcvtps2dq as the portable code's
 * 1.5 * 2^23 trick does, clamped the same way. */
void lm_q8x_quantize_avx512(const float *x, int64_t n, void *dst) {
    int8_t *q = dst;
    float *d = (float *)(q + n);
    int16_t *s = (int16_t *)(q + n + n / 8);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t b = 0; b < n / LM_Q8X_BLOCK; b++) {
        __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        d[b] = amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
        q0 = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
        q1 = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
        _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
        s[2 * b] = (int16_t)_mm512_reduce_add_epi32(q0);
        s[2 * b + 1] = (int16_t)_mm512_reduce_add_epi32(q1);
    }
}

/* One instance per token count and scale layout, so that the loops over
 * tokens and halves unroll. */
void lm_qgemm_vnni(const uint8_t *panel, int nb, const lm_qblock_type *qt, const int8_t *xq, size_t ldq,
                   const float *xf, int64_t ldf, int mt, int nv, float *y, int64_t ldy,
                   const float *bias, bool first) {
    const bool halves = qt->halves;
    LM_ASSERT(mt >= 1 && mt <= LM_QG_MR && nv >= 1 && nv <= LM_QP_ROWS);
#define LM_QG_CASE(MT)                                                                            \
    case MT:                                                                                      \
        if (halves) lm_qg_tile(MT, true, panel, nb, xq, ldq, xf, ldf, nv, y, ldy, bias, first);  \
        else lm_qg_tile(MT, false, panel, nb, xq, ldq, xf, ldf, nv, y, ldy, bias, first);        \
        break;
    switch (mt) {
        LM_QG_CASE(1)
        LM_QG_CASE(2)
        LM_QG_CASE(3)
        LM_QG_CASE(4)
    }
#undef LM_QG_CASE
}
