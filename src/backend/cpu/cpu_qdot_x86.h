/* cpu_qdot_x86.h - the int8 GEMV kernels for AVX2 and AVX-512 VNNI.
 *
 * Included once by cpu_qdot_avx2.c and once by cpu_qdot_vnni.c, which are
 * compiled for their ISA and differ only in lm_qd_dot below: AVX2 multiplies
 * u8 x s8 into pairs of int16 (vpmaddubsw, no overflow for our codes: weights
 * are at most 128 in magnitude after the sign trick and activations at most
 * 127, so a pair stays <= 32512) and adds them into int32 (vpmaddwd); VNNI
 * does both in one vpdpbusd. Everything here is static.
 *
 * Shape: one weight row at a time against all nt (<= 4) tokens, one 32-value
 * block per step in a ymm register: the block is decoded once (nibbles or
 * 6-bit codes to bytes) and reused from the register for every token, so the
 * row is read from memory once. Signed weights use the sign trick:
 * |w| * (x * sign(w)) keeps the unsigned operand unsigned. Each token keeps
 * an f32 accumulator of 8 lanes; the block's integer dot is converted and
 * scaled by (weight scale * activation scale) with one FMA. Q4_K's (and
 * Q5_K's, Q2_K's) mins are applied per super-block in a second accumulator
 * from the activation's block sums; Q4_1/Q5_1's offsets m and the affine
 * types' biases (and A8's code offset of 128, taken out so its codes fit the
 * sign trick) per block in a scalar one. Types with a scale per 16 values
 * (Q6_K, Q3_K, Q2_K) take each quad sum's factor (scale * d * activation
 * scale) from a vector of 16 formed once a super-block and token, picked
 * by one vpermps a block. The same integers as the scalar reference (Q6_K's
 * unsigned codes <= 63 keep a vpmaddubsw pair <= 16002); only the order of
 * the f32 additions differs. The VNNI build takes most super-block types in
 * 512-bit rows instead (cpu_qdot_vnni.c, through lm_qdz_row). */
#include "cpu_kern.h"

#include <immintrin.h>
#include <string.h>

#define LM_QD_AI static inline __attribute__((always_inline))

LM_QD_AI float lm_qd_h(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* A bf16 at p as f32. */
LM_QD_AI float lm_qd_bf(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return lm_bf16_to_f32(h);
}

/* int32 lanes: lane i = sum of u[4i..4i+3] * s[4i..4i+3]. */
LM_QD_AI __m256i lm_qd_dot(__m256i u, __m256i s) {
#ifdef LM_QD_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* The 16 int8 scales of a super-block (Q6_K, Q3_K, Q2_K: one per 16
 * values) times d as floats: groups 0-7 in sc[0], 8-15 in sc[1]. */
LM_QD_AI void lm_qd_sc16(__m128i sc16, float d, __m256 sc[2]) {
    sc[0] = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc16)));
    sc[1] = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc16, 8))));
}

/* f = sc times one token's block factors dx (one per 32 values, so each
 * serves two groups): the factor of each group's integer dot. */
LM_QD_AI void lm_qd_f16(const __m256 sc[2], __m256 dx, __m256 f[2]) {
    f[0] = _mm256_mul_ps(sc[0], _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
    f[1] = _mm256_mul_ps(sc[1], _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
}

/* The factors of block j's 8 quad sums (lm_qd_dot): 4 of group 2j, 4 of 2j + 1. */
LM_QD_AI __m256 lm_qd_fpick(const __m256 f[2], int j) {
    const int g = 2 * (j % 4);
    return _mm256_permutevar8x32_ps(f[j / 4], _mm256_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1));
}

/* Software prefetch distance in bytes. The rows a thread owns are contiguous
 * in memory, so running past the end of a row fetches the next one. */
#ifndef LM_QD_PF
#define LM_QD_PF 2048
#endif

/* Prefetches the lines of [p, p + n) + LM_QD_PF that start a new line. */
LM_QD_AI void lm_qd_prefetch(const uint8_t *p, int n) {
    uintptr_t a = (uintptr_t)p + LM_QD_PF, e = a + (uintptr_t)n;
    for (a &= ~(uintptr_t)63; a < e; a += 64) _mm_prefetch((const char *)a, _MM_HINT_T0);
}

LM_QD_AI float lm_qd_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Codes of 32 values from 16 bytes of nibbles: low nibbles first. */
LM_QD_AI __m256i lm_qd_nib32(const uint8_t *p) {
    __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* Q5_0 / Q5_1's fifth bits: byte i = 16 when bit i of the 32-bit qh is set.
 * Byte i of the 32-bit word is spread over bytes 8i..8i+7, then each tests
 * its own bit. */
LM_QD_AI __m256i lm_qd_bit5(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                            3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

/* Q3_K's 16 scales, minus 32, as int8 (layout in dtype.c): low nibbles from
 * bytes 0-7 (low nibbles for scales 0-7, high for 8-15), top two bits from
 * the bit pairs of bytes 8-11. */
LM_QD_AI __m128i lm_qd_q3k_scales(const uint8_t *p) {
    uint32_t a0, a1, a2;
    memcpy(&a0, p, 4);
    memcpy(&a1, p + 4, 4);
    memcpy(&a2, p + 8, 4);
    const uint32_t lo = 0x0f0f0f0fu, hi = 0x30303030u;
    uint32_t s0 = (a0 & lo) | ((a2 << 4) & hi), s1 = (a1 & lo) | ((a2 << 2) & hi);
    uint32_t s2 = ((a0 >> 4) & lo) | (a2 & hi), s3 = ((a1 >> 4) & lo) | ((a2 >> 2) & hi);
    return _mm_sub_epi8(_mm_set_epi32((int)s3, (int)s2, (int)s1, (int)s0), _mm_set1_epi8(32));
}

/* Q4_K / Q5_K's 6-bit scales (bytes 0-7) and mins (8-15) of blocks 0-7:
 * those of blocks 0-3 in the low 6 bits of the dwords a and bm at bytes 4
 * and 8, those of 4-7 in the nibbles of c (byte 12) with their top bits in
 * the spare 2 bits of a and bm. In vector registers: the scalar form cost
 * more than the dot products of a super-block at one token. */
LM_QD_AI __m128i lm_qd_q4k_scales(const uint8_t *blk) {
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + 4)); /* a, bm, c */
    __m128i top = _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30));
    __m128i cn = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, 0xaa), _mm_setr_epi32(0, 4, 0, 4)),
                               _mm_set1_epi8(0x0f));
    return _mm_unpacklo_epi32(_mm_and_si128(v, _mm_set1_epi8(0x3f)), _mm_or_si128(cn, top));
}

/* IQ4_XS's 8 scales minus 32 as int32: nibbles of scales_l in block order,
 * 2 bits each of scales_h on top. */
LM_QD_AI __m256i lm_qd_iq4xs_scales(const uint8_t *blk) {
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, blk + 2, 2);
    memcpy(&sl, blk + 4, 4);
    const __m256i shift4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i shift2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), shift4), _mm256_set1_epi32(0x0f));
    __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), shift2), _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

typedef struct lm_qd_x {
    const int8_t *q;
    const float *d;
    const int16_t *s;
} lm_qd_x;

#ifdef LM_QD_VNNI
/* The 512-bit rows of cpu_qdot_vnni.c: false for a type they do not take. */
LM_QD_AI bool lm_qdz_row(lm_dtype dt, const int NT, const uint8_t *wr, const lm_qd_x *x, int64_t n, float *out);
#endif

LM_QD_AI void lm_qd_row(lm_dtype dt, const int NT, const uint8_t *wr, const lm_qd_x *x, int64_t n,
                        float *out) {
#ifdef LM_QD_VNNI
    if (lm_qdz_row(dt, NT, wr, x, n, out)) return;
#endif
    /* The super-block types sum each super-block into fresh registers (two
     * chains, even and odd blocks) and add that to acc once: the loop then
     * carries one addition, not eight FMAs, so one core's out-of-order
     * window overlaps super-blocks instead of waiting on the FMA latency. */
    __m256 acc[LM_GEMV_MAX_TOKENS], accm[LM_GEMV_MAX_TOKENS];
    float accs[LM_GEMV_MAX_TOKENS] = { 0 }; /* f32 offsets times the activation sums: Q4_1 / Q5_1's m, the affine biases */
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    const int64_t nb = n / 32;
    if (dt == LM_A4_BF16 || dt == LM_A4_F16 || dt == LM_A8_BF16 || dt == LM_A8_F16) {
        const bool four = dt == LM_A4_BF16 || dt == LM_A4_F16, bf = dt == LM_A4_BF16 || dt == LM_A8_BF16;
        const int bb = four ? 20 : 36;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + b * bb;
            lm_qd_prefetch(blk, bb);
            float dw = bf ? lm_qd_bf(blk) : lm_qd_h(blk), mw = bf ? lm_qd_bf(blk + 2) : lm_qd_h(blk + 2);
            /* A4: codes 0..15 as they are; A8: code - 128, signed, and the 128 back with the bias */
            __m256i w = four ? lm_qd_nib32(blk + 4)
                             : _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 4)), _mm256_set1_epi8((char)0x80));
            __m256i aw = four ? w : _mm256_sign_epi8(w, w);
            float off = four ? mw : mw + 128.0f * dw;
            for (int t = 0; t < NT; t++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + b * 32));
                __m256i p = lm_qd_dot(aw, four ? xv : _mm256_sign_epi8(xv, w));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x[t].d[b]), acc[t]);
                accs[t] += off * x[t].d[b] * (float)(x[t].s[2 * b] + x[t].s[2 * b + 1]);
            }
        }
    } else if (dt == LM_Q8_0 || dt == LM_Q4_0 || dt == LM_IQ4_NL || dt == LM_Q5_0 || dt == LM_Q4_1 || dt == LM_Q5_1) {
        /* 32-value blocks: signed codes go through the sign trick, the
         * unsigned ones of Q4_1 / Q5_1 (x = d q + m) straight in */
        const int bb = lm_dtype_block_bytes(dt);
        const bool has_m = dt == LM_Q4_1 || dt == LM_Q5_1;
        const __m256i lv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lm_iq4nl_levels));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + b * bb;
            if (b % 2 == 0) lm_qd_prefetch(blk, 2 * bb);
            __m256i w;
            switch (dt) {
            case LM_Q8_0: w = _mm256_loadu_si256((const __m256i *)(blk + 2)); break;
            case LM_Q4_0: w = _mm256_sub_epi8(lm_qd_nib32(blk + 2), _mm256_set1_epi8(8)); break;
            case LM_IQ4_NL: w = _mm256_shuffle_epi8(lv, lm_qd_nib32(blk + 2)); break;
            case LM_Q5_0:
                w = _mm256_sub_epi8(_mm256_or_si256(lm_qd_nib32(blk + 6), lm_qd_bit5(blk + 2)), _mm256_set1_epi8(16));
                break;
            case LM_Q4_1: w = lm_qd_nib32(blk + 4); break;
            default: w = _mm256_or_si256(lm_qd_nib32(blk + 8), lm_qd_bit5(blk + 4)); break; /* Q5_1 */
            }
            __m256i aw = has_m ? w : _mm256_sign_epi8(w, w);
            float dw = lm_qd_h(blk), mw = has_m ? lm_qd_h(blk + 2) : 0.0f;
            for (int t = 0; t < NT; t++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + b * 32));
                __m256i p = lm_qd_dot(aw, has_m ? xv : _mm256_sign_epi8(xv, w));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x[t].d[b]), acc[t]);
                if (has_m) accs[t] += mw * x[t].d[b] * (float)(x[t].s[2 * b] + x[t].s[2 * b + 1]);
            }
        }
    } else if (dt == LM_Q2_K || dt == LM_Q3_K) {
        /* 2-bit codes, Q3_K with a third bit from hmask (u = q + 4, 0..7);
         * one scale per 16 values applied in f32 as for Q6_K; Q2_K's
         * mins and Q3_K's offsets (4 x its scale) per super-block from the
         * activation's 16-value sums, so the codes stay unsigned (no
         * vpsignb on the codes and on every token's activations) */
        const int bb = dt == LM_Q2_K ? 84 : 110, qs_off = dt == LM_Q2_K ? 16 : 32;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = wr + sb * bb;
            lm_qd_prefetch(blk, bb);
            __m128i sc16;
            float dsb;
            if (dt == LM_Q2_K) {
                __m128i raw = _mm_loadu_si128((const __m128i *)blk);
                sc16 = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
                __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f)));
                __m256 dmin = _mm256_set1_ps(lm_qd_h(blk + 82));
                dsb = lm_qd_h(blk + 80);
                for (int t = 0; t < NT; t++) {
                    __m256i s16 = _mm256_loadu_si256((const __m256i *)(x[t].s + sb * 16));
                    __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, m16)); /* per 32-value block */
                    accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, _mm256_loadu_ps(x[t].d + sb * 8)), mins, accm[t]);
                }
            } else {
                sc16 = lm_qd_q3k_scales(blk + 96);
                dsb = lm_qd_h(blk + 108);
                __m256i off16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc16), 2); /* 4 x scale, signed */
                __m256 dv = _mm256_set1_ps(dsb);
                for (int t = 0; t < NT; t++) {
                    __m256i s16 = _mm256_loadu_si256((const __m256i *)(x[t].s + sb * 16));
                    __m256 offs = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, off16)); /* per 32-value block */
                    accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(x[t].d + sb * 8)), offs, accm[t]);
                }
            }
            __m256 sc[2], f[LM_GEMV_MAX_TOKENS][2];
            lm_qd_sc16(sc16, dsb, sc);
            for (int t = 0; t < NT; t++) lm_qd_f16(sc, _mm256_loadu_ps(x[t].d + sb * 8), f[t]);
            __m256i hm = dt == LM_Q3_K ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
            __m256 se[LM_GEMV_MAX_TOKENS], so[LM_GEMV_MAX_TOKENS];
            for (int t = 0; t < NT; t++) se[t] = so[t] = _mm256_setzero_ps();
            for (int h = 0; h < 2; h++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(blk + qs_off + 32 * h));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const int j = 4 * h + k;
                    __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), _mm256_set1_epi8(3));
                    if (dt == LM_Q3_K) /* hmask bit j is bit 2 of u */
                        u = _mm256_or_si256(u, _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hm, j), 2),
                                                                _mm256_set1_epi8(4)));
                    for (int t = 0; t < NT; t++) {
                        __m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + (sb * 8 + j) * 32));
                        __m256 p = _mm256_cvtepi32_ps(lm_qd_dot(u, xv));
                        if (k & 1) so[t] = _mm256_fmadd_ps(p, lm_qd_fpick(f[t], j), so[t]);
                        else se[t] = _mm256_fmadd_ps(p, lm_qd_fpick(f[t], j), se[t]);
                    }
                }
            }
            for (int t = 0; t < NT; t++) acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(se[t], so[t]));
        }
    } else if (dt == LM_Q4_K || dt == LM_Q5_K) { /* Q5_K: Q4_K + a fifth bit from qh */
        const int bb = dt == LM_Q4_K ? 144 : 176, qs_off = dt == LM_Q4_K ? 16 : 48;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = wr + sb * bb;
            lm_qd_prefetch(blk, bb);
            __m256i qh = dt == LM_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
            __m128i scb = lm_qd_q4k_scales(blk), mnb = _mm_srli_si128(scb, 8);
            __m256 ds = _mm256_mul_ps(_mm256_set1_ps(lm_qd_h(blk)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scb)));
            __m256 minv = _mm256_mul_ps(_mm256_set1_ps(lm_qd_h(blk + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mnb)));
            float sdx[LM_GEMV_MAX_TOKENS][8] __attribute__((aligned(32)));
            for (int t = 0; t < NT; t++) {
                __m256 dx = _mm256_loadu_ps(x[t].d + sb * 8);
                _mm256_store_ps(sdx[t], _mm256_mul_ps(ds, dx));
                /* mins: sum_j min_j * d_j * (sum of the block's q) */
                __m256i s16 = _mm256_loadu_si256((const __m256i *)(x[t].s + sb * 16));
                __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
                accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(minv, dx), sums, accm[t]);
            }
            __m256 se[LM_GEMV_MAX_TOKENS], so[LM_GEMV_MAX_TOKENS];
            for (int t = 0; t < NT; t++) se[t] = so[t] = _mm256_setzero_ps();
            for (int g = 0; g < 4; g++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + qs_off + 32 * g));
                __m256i lo = _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
                if (dt == LM_Q5_K) { /* bits 2g and 2g+1 of qh, moved to bit 4 */
                    const __m256i one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
                }
                for (int t = 0; t < NT; t++) {
                    const int8_t *xb = x[t].q + (sb * 8 + 2 * g) * 32;
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)xb);
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb + 32));
                    __m256 p0 = _mm256_cvtepi32_ps(lm_qd_dot(lo, x0));
                    __m256 p1 = _mm256_cvtepi32_ps(lm_qd_dot(hi, x1));
                    se[t] = _mm256_fmadd_ps(p0, _mm256_broadcast_ss(&sdx[t][2 * g]), se[t]);
                    so[t] = _mm256_fmadd_ps(p1, _mm256_broadcast_ss(&sdx[t][2 * g + 1]), so[t]);
                }
            }
            for (int t = 0; t < NT; t++) acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(se[t], so[t]));
        }
    } else if (dt == LM_IQ4_XS) {
        const __m256i lv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lm_iq4nl_levels));
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = wr + sb * 136;
            lm_qd_prefetch(blk, 136);
            __m256 ds = _mm256_mul_ps(_mm256_set1_ps(lm_qd_h(blk)), _mm256_cvtepi32_ps(lm_qd_iq4xs_scales(blk)));
            float sdx[LM_GEMV_MAX_TOKENS][8] __attribute__((aligned(32)));
            for (int t = 0; t < NT; t++) _mm256_store_ps(sdx[t], _mm256_mul_ps(ds, _mm256_loadu_ps(x[t].d + sb * 8)));
            __m256 se[LM_GEMV_MAX_TOKENS], so[LM_GEMV_MAX_TOKENS];
            for (int t = 0; t < NT; t++) se[t] = so[t] = _mm256_setzero_ps();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m256i w = _mm256_shuffle_epi8(lv, lm_qd_nib32(blk + 8 + 16 * j));
                __m256i aw = _mm256_sign_epi8(w, w);
                for (int t = 0; t < NT; t++) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + (sb * 8 + j) * 32));
                    __m256 p = _mm256_cvtepi32_ps(lm_qd_dot(aw, _mm256_sign_epi8(xv, w)));
                    if (j & 1) so[t] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&sdx[t][j]), so[t]);
                    else se[t] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&sdx[t][j]), se[t]);
                }
            }
            for (int t = 0; t < NT; t++) acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(se[t], so[t]));
        }
    } else { /* LM_Q6_K: w = sc (q - 32), q = 0..63 */
        /* The codes go in unsigned (no sign trick); the -32 comes off once
         * a super-block from the activation's 16-value sums, as Q4_K's mins */
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = wr + sb * 210;
            lm_qd_prefetch(blk, 210);
            __m128i sc16 = _mm_loadu_si128((const __m128i *)(blk + 192));
            __m256i sc16w = _mm256_cvtepi8_epi16(sc16);
            __m256 d = _mm256_set1_ps(lm_qd_h(blk + 208)), sc[2], f[LM_GEMV_MAX_TOKENS][2];
            lm_qd_sc16(sc16, lm_qd_h(blk + 208), sc);
            for (int t = 0; t < NT; t++) {
                __m256 dx = _mm256_mul_ps(d, _mm256_loadu_ps(x[t].d + sb * 8));
                lm_qd_f16(sc, _mm256_loadu_ps(x[t].d + sb * 8), f[t]);
                __m256i s16 = _mm256_loadu_si256((const __m256i *)(x[t].s + sb * 16));
                __m256 off = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, sc16w)); /* per 32-value block */
                accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(32.0f)), off, accm[t]);
            }
            __m256 se[LM_GEMV_MAX_TOKENS], so[LM_GEMV_MAX_TOKENS];
            for (int t = 0; t < NT; t++) se[t] = so[t] = _mm256_setzero_ps();
            for (int h = 0; h < 2; h++) {
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
                __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
                const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30);
                __m256i w4[4];
                w4[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
                w4[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
                w4[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2));
                w4[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    int j = 4 * h + k;
                    for (int t = 0; t < NT; t++) {
                        __m256i xv = _mm256_loadu_si256((const __m256i *)(x[t].q + (sb * 8 + j) * 32));
                        __m256 p = _mm256_cvtepi32_ps(lm_qd_dot(w4[k], xv));
                        if (k & 1) so[t] = _mm256_fmadd_ps(p, lm_qd_fpick(f[t], j), so[t]);
                        else se[t] = _mm256_fmadd_ps(p, lm_qd_fpick(f[t], j), se[t]);
                    }
                }
            }
            for (int t = 0; t < NT; t++) acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(se[t], so[t]));
        }
    }
    for (int t = 0; t < NT; t++) out[t] = lm_qd_hsum(acc[t]) - lm_qd_hsum(accm[t]) + accs[t];
}

LM_QD_AI void lm_qd_gemv(lm_dtype dt, const void *w, size_t ldw, int nr, const void *xq, size_t ldq,
                         int nt, int64_t n, const float *bias, float *y, int64_t ldy) {
    lm_qd_x x[LM_GEMV_MAX_TOKENS];
    for (int t = 0; t < nt; t++) {
        const void *row = (const char *)xq + (size_t)t * ldq;
        x[t] = (lm_qd_x){ row, lm_q8x_d(row, n), lm_q8x_s(row, n) };
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
        float out[LM_GEMV_MAX_TOKENS];
        switch (nt) {
        case 1: lm_qd_row(dt, 1, wr, x, n, out); break;
        case 2: lm_qd_row(dt, 2, wr, x, n, out); break;
        case 3: lm_qd_row(dt, 3, wr, x, n, out); break;
        default: lm_qd_row(dt, 4, wr, x, n, out); break;
        }
        for (int t = 0; t < nt; t++) y[t * ldy + r] = out[t] + (bias ? bias[r] : 0.0f);
    }
}

#define LM_QD_FN(name, dt)                                                                        \
    static void name(const void *w, size_t ldw, int nr, const void *xq, size_t ldq, int nt,       \
                     int64_t n, const float *bias, float *y, int64_t ldy) {                       \
        lm_qd_gemv(dt, w, ldw, nr, xq, ldq, nt, n, bias, y, ldy);                                 \
    }
LM_QD_FN(lm_qd_gemv_q8_0, LM_Q8_0)
LM_QD_FN(lm_qd_gemv_q4_0, LM_Q4_0)
LM_QD_FN(lm_qd_gemv_q4_k, LM_Q4_K)
LM_QD_FN(lm_qd_gemv_q6_k, LM_Q6_K)
LM_QD_FN(lm_qd_gemv_q5_k, LM_Q5_K)
LM_QD_FN(lm_qd_gemv_iq4_xs, LM_IQ4_XS)
LM_QD_FN(lm_qd_gemv_q4_1, LM_Q4_1)
LM_QD_FN(lm_qd_gemv_q5_0, LM_Q5_0)
LM_QD_FN(lm_qd_gemv_q5_1, LM_Q5_1)
LM_QD_FN(lm_qd_gemv_iq4_nl, LM_IQ4_NL)
LM_QD_FN(lm_qd_gemv_q2_k, LM_Q2_K)
LM_QD_FN(lm_qd_gemv_q3_k, LM_Q3_K)
LM_QD_FN(lm_qd_gemv_a4_bf16, LM_A4_BF16)
LM_QD_FN(lm_qd_gemv_a4_f16, LM_A4_F16)
LM_QD_FN(lm_qd_gemv_a8_bf16, LM_A8_BF16)
LM_QD_FN(lm_qd_gemv_a8_f16, LM_A8_F16)

#define LM_QD_TABLE                                                                               \
    .qgemv = { [LM_Q8_0] = lm_qd_gemv_q8_0, [LM_Q4_0] = lm_qd_gemv_q4_0,                         \
               [LM_Q4_K] = lm_qd_gemv_q4_k, [LM_Q6_K] = lm_qd_gemv_q6_k,                           \
               [LM_Q5_K] = lm_qd_gemv_q5_k, [LM_IQ4_XS] = lm_qd_gemv_iq4_xs,                       \
               [LM_Q4_1] = lm_qd_gemv_q4_1, [LM_Q5_0] = lm_qd_gemv_q5_0,                           \
               [LM_Q5_1] = lm_qd_gemv_q5_1, [LM_IQ4_NL] = lm_qd_gemv_iq4_nl,                       \
               [LM_Q2_K] = lm_qd_gemv_q2_k, [LM_Q3_K] = lm_qd_gemv_q3_k,                           \
               [LM_A4_BF16] = lm_qd_gemv_a4_bf16, [LM_A4_F16] = lm_qd_gemv_a4_f16,                  \
               [LM_A8_BF16] = lm_qd_gemv_a8_bf16, [LM_A8_F16] = lm_qd_gemv_a8_f16 }
