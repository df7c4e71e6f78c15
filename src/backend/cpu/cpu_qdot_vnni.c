/* cpu_qdot_vnni.c - the int8 GEMV for AVX-512 VNNI.
 *
 * The 32-value-block kernels are those of cpu_qdot_x86.h (vpdpbusd on ymm),
 * shared with the AVX2 build; compiled with -mavx512vnni -mavx512bw (see
 * CMakeLists.txt: files named *_vnni.c) and only entered when
 * lm_cpu_has_avx512_vnni() said yes. The K-quants (Q2_K to Q6_K), IQ4_XS,
 * and Q4_0 / IQ4_NL rows of whole 256-value groups take the 512-bit rows
 * below instead: the ymm rows spent most of their instructions per 32
 * values on unpacking codes and on moving one scale into place per block,
 * and Q2_K / Q3_K decoded at a third of Q4_K's bytes a second (bench_qdot),
 * below llama.cpp's decode.
 *
 * A zmm holds two consecutive 32-value blocks (a "chunk", 4 a 256-value
 * group), so one activation load and one vpdpbusd cover 64 values for each
 * token. The weight scales go in as floats: per group and token, a vector
 * of the 16 (or 8) scales times d and the activation's block factors is
 * formed once, and each chunk picks its lanes from it with one vpermps. The
 * codes go in unsigned (IQ4's levels + 128); the offsets (Q3_K's 4, Q6_K's
 * 32, Q4_0's 8, IQ4's 128) and the mins (Q2_K, Q4_K, Q5_K) come off per
 * group from the activation's 16-value sums, as in the ymm rows. A token's
 * result does not depend on how many tokens share the call (batched ==
 * solo); the integer dot of each 4 values is the scalar reference's, only
 * the order of the f32 additions differs. */
#define LM_QD_VNNI 1
#include "cpu_qdot_x86.h"
#include "cpu_qblock.h"

/* Lanes 0-7 of v into pairs: lane i of the result is lane i / 2. */
LM_QD_AI __m512 lm_qdz_dup(__m256 v) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v));
}

/* The scale lanes of chunk c: one of 16 per 16 values (quads 4c + i / 4),
 * or, with per32, one of 8 per 32 values (2c + i / 8). */
LM_QD_AI __m512 lm_qdz_pick(__m512 s, int c, bool per32) {
    const __m512i q = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i h = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(per32 ? _mm512_add_epi32(h, _mm512_set1_epi32(2 * c))
                                       : _mm512_add_epi32(q, _mm512_set1_epi32(4 * c)),
                                 s);
}

/* Bytes of the low half set to lo, of the high half to hi. */
LM_QD_AI __m512i lm_qdz_halves(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_set1_epi8((char)lo), _mm256_set1_epi8((char)hi), 1);
}

LM_QD_AI float lm_qdz_hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

/* The 64 codes of chunk c (blocks 2c, 2c+1) of one super-block, unsigned. */
LM_QD_AI void lm_qdz_codes(lm_dtype dt, const uint8_t *blk, __m512i u[4]) {
    if (dt == LM_Q2_K || dt == LM_Q3_K) {
        /* byte i of qs half h holds value i of blocks 4h..4h+3, two bits each */
        const __m512i m3 = _mm512_set1_epi8(3);
        __m512i q = _mm512_loadu_si512(blk + (dt == LM_Q2_K ? 16 : 32));
        __m512i a0 = _mm512_and_si512(q, m3), a1 = _mm512_and_si512(_mm512_srli_epi16(q, 2), m3);
        __m512i a2 = _mm512_and_si512(_mm512_srli_epi16(q, 4), m3), a3 = _mm512_and_si512(_mm512_srli_epi16(q, 6), m3);
        u[0] = _mm512_shuffle_i64x2(a0, a1, 0x44), u[1] = _mm512_shuffle_i64x2(a2, a3, 0x44);
        u[2] = _mm512_shuffle_i64x2(a0, a1, 0xee), u[3] = _mm512_shuffle_i64x2(a2, a3, 0xee);
        if (dt == LM_Q3_K) { /* hmask bit j of byte i: value i of block j gets + 4 */
            __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __mmask64 k = _mm512_test_epi8_mask(hm, lm_qdz_halves(1 << (2 * c), 1 << (2 * c + 1)));
                u[c] = _mm512_mask_add_epi8(u[c], k, u[c], _mm512_set1_epi8(4));
            }
        }
    } else if (dt == LM_Q4_K || dt == LM_Q5_K) {
        /* 32 bytes of nibbles a block pair: low ones block 2c, high ones 2c + 1 */
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        const int qs = dt == LM_Q4_K ? 16 : 48;
        __m512i z0 = _mm512_loadu_si512(blk + qs), z1 = _mm512_loadu_si512(blk + qs + 64);
        __m512i l0 = _mm512_and_si512(z0, m4), h0 = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);
        __m512i l1 = _mm512_and_si512(z1, m4), h1 = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);
        u[0] = _mm512_shuffle_i64x2(l0, h0, 0x44), u[1] = _mm512_shuffle_i64x2(l0, h0, 0xee);
        u[2] = _mm512_shuffle_i64x2(l1, h1, 0x44), u[3] = _mm512_shuffle_i64x2(l1, h1, 0xee);
        if (dt == LM_Q5_K) { /* bit 2c (2c + 1) of qh byte i: value i of block 2c (2c + 1) gets + 16 */
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __mmask64 k = _mm512_test_epi8_mask(qh, lm_qdz_halves(1 << (2 * c), 1 << (2 * c + 1)));
                u[c] = _mm512_mask_add_epi8(u[c], k, u[c], _mm512_set1_epi8(16));
            }
        }
    } else if (dt == LM_IQ4_XS || dt == LM_Q4_0 || dt == LM_IQ4_NL) {
        /* 16 bytes of nibbles a block (value i the low nibble of byte i,
         * 16 + i the high one), each 16 put in a 128-bit lane twice */
        const __m512i sh = _mm512_setr_epi64(0, 0, 0x0004000400040004ll, 0x0004000400040004ll, 0, 0,
                                             0x0004000400040004ll, 0x0004000400040004ll);
        const __m512i lv = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)lm_iq4nl_levels),
                                                               _mm_set1_epi8((char)0x80)));
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i z;
            if (dt == LM_IQ4_XS) {
                __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 8 + 32 * c)));
                z = _mm512_shuffle_i64x2(v, v, 0x50);
            } else {
                __m128i qa = _mm_loadu_si128((const __m128i *)(blk + 36 * c + 2));
                __m128i qb = _mm_loadu_si128((const __m128i *)(blk + 36 * c + 20));
                z = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(qa), 0xff00, qb);
            }
            u[c] = _mm512_and_si512(_mm512_srlv_epi16(z, sh), _mm512_set1_epi8(0x0f));
            if (dt != LM_Q4_0) u[c] = _mm512_shuffle_epi8(lv, u[c]); /* levels + 128 */
        }
    } else { /* Q6_K: low nibbles from ql, two high bits from qh */
        const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x30);
        const __m512i sl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i sr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512(blk + 64 * h);
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
            u[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m2));
            u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                           _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m2));
        }
    }
}

LM_QD_AI bool lm_qdz_row(lm_dtype dt, const int NT, const uint8_t *wr, const lm_qd_x *x, int64_t n, float *out) {
    const bool blocks32 = dt == LM_Q4_0 || dt == LM_IQ4_NL; /* taken 8 blocks at a time */
    if (dt != LM_Q2_K && dt != LM_Q3_K && dt != LM_Q4_K && dt != LM_Q5_K && dt != LM_Q6_K && dt != LM_IQ4_XS &&
        !blocks32)
        return false;
    if (n % 256) return false; /* only 32-value blocks can end a row mid-way */
    const int bb = lm_dtype_block_bytes(dt) * (blocks32 ? 8 : 1);
    const bool per32 = dt != LM_Q2_K && dt != LM_Q3_K && dt != LM_Q6_K; /* one scale per 32 values, not 16 */
    const bool mins = dt == LM_Q2_K || dt == LM_Q4_K || dt == LM_Q5_K; /* value = scale * code - min */
    /* else value = scale * (code - off) */
    const float off = dt == LM_Q3_K ? 4.0f : dt == LM_Q6_K ? 32.0f : dt == LM_Q4_0 ? 8.0f : mins ? 1.0f : 128.0f;
    __m512 acc[LM_GEMV_MAX_TOKENS], accm[LM_GEMV_MAX_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < n / 256; sb++) {
        const uint8_t *blk = wr + sb * bb;
        lm_qd_prefetch(blk, bb);
        /* sc: the weight scales as floats times d (16 lanes, or 8 with
         * per32); mn: the mins times dmin (Q2_K 16, Q4_K / Q5_K 8) */
        __m512 sc, mn = _mm512_setzero_ps();
        if (dt == LM_Q2_K) {
            __m128i raw = _mm_loadu_si128((const __m128i *)blk);
            __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
            sc = _mm512_mul_ps(_mm512_set1_ps(lm_qd_h(blk + 80)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)));
            mn = _mm512_mul_ps(_mm512_set1_ps(lm_qd_h(blk + 82)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)));
        } else if (dt == LM_Q3_K) {
            sc = _mm512_mul_ps(_mm512_set1_ps(lm_qd_h(blk + 108)),
                               _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lm_qd_q3k_scales(blk + 96))));
        } else if (dt == LM_Q6_K) {
            __m128i s8 = _mm_loadu_si128((const __m128i *)(blk + 192));
            sc = _mm512_mul_ps(_mm512_set1_ps(lm_qd_h(blk + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)));
        } else if (dt == LM_IQ4_XS) {
            __m256 ds = _mm256_mul_ps(_mm256_set1_ps(lm_qd_h(blk)), _mm256_cvtepi32_ps(lm_qd_iq4xs_scales(blk)));
            sc = _mm512_zextps256_ps512(ds);
        } else if (blocks32) { /* each block's f16 d */
            uint16_t d[8];
            for (int j = 0; j < 8; j++) memcpy(&d[j], blk + 18 * j, 2);
            sc = _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d)));
        } else { /* Q4_K / Q5_K: d and dmin times 8 scales, then 8 mins */
            uint32_t dd;
            memcpy(&dd, blk, 4);
            __m512 d2 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                              _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd))));
            __m512 sm = _mm512_mul_ps(d2, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lm_qd_q4k_scales(blk))));
            sc = sm; /* lanes 8-15 (mins) meet zero activation factors there */
            mn = _mm512_shuffle_f32x4(sm, sm, 0xee);
        }
        __m512i u[4];
        lm_qdz_codes(dt, blk, u);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256 dx = _mm256_loadu_ps(x[t].d + sb * 8);
            /* 16 sums of 16 activation codes, or 8 of 32 */
            __m256i s16 = _mm256_loadu_si256((const __m256i *)(x[t].s + sb * 16));
            __m512 dxs, sums;
            if (per32) {
                dxs = _mm512_zextps256_ps512(dx);
                sums = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1))));
            } else {
                dxs = lm_qdz_dup(dx);
                sums = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(s16));
            }
            __m512 f = _mm512_mul_ps(sc, dxs); /* per scale: its factor on the integer dots */
            /* offsets and mins; lanes 8-15 of the per32 vectors are 0 x 0 */
            accm[t] = _mm512_fmadd_ps(mins ? _mm512_mul_ps(mn, dxs) : f, sums, accm[t]);
            const int8_t *xq = x[t].q + sb * 256;
            __m512 e = _mm512_setzero_ps(), o = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i xv = _mm512_loadu_si512(xq + 64 * c);
                __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[c], xv));
                if (c & 1) o = _mm512_fmadd_ps(p, lm_qdz_pick(f, c, per32), o);
                else e = _mm512_fmadd_ps(p, lm_qdz_pick(f, c, per32), e);
            }
            acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(e, o));
        }
    }
    for (int t = 0; t < NT; t++) out[t] = lm_qdz_hsum(acc[t]) - off * lm_qdz_hsum(accm[t]);
    return true;
}

const lm_cpu_qkern lm_cpu_qkern_vnni = { .name = "avx512-vnni", LM_QD_TABLE,
                                        .qgemm = lm_qgemm_vnni, .qgemm_mr = LM_QGEMM_VNNI_MR, .qgemm_max_code = 255,
                                        .qpanel_pack = lm_qpanel_pack_avx512,
                                        .q8x_quantize = lm_q8x_quantize_avx512 };
