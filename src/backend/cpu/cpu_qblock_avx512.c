/* cpu_qblock_avx512.c - the int8 GEMM's panel packing (cpu_qblock.h) for
 * the types of the common GGUF mixes, 16 rows at a time with AVX-512.
 *
 * Why: a 512-token prefill of a Q4_K_M model spent ~10 % of its time
 * unpacking panels one row and one block at a time (perf, VM). A block's
 * codes come out of a row's bytes 32 at a time (a few shifts and masks on
 * one load), and the panel wants dword k of 16 rows in one 64-byte line
 * ([k][row][4]): a 16 x 8 dword transpose (24 shuffles) a block. The block
 * headers (scales) of 16 rows are transposed the same way (16 x 4) and
 * turned into f32 with the portable packer's products, so the panel bytes
 * are the same (tests/test_cpu_qgemm.c compares them).
 *
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 here (IQ4_XS's levels by
 * a byte shuffle); other types go to the portable lm_qpanel_pack.
 * Every load stays inside its row's blocks; rows past nv are zero vectors
 * (zero codes, zero factors), as the portable packer writes them. */
#include "cpu_qblock.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define LM_QZ_AI static inline __attribute__((always_inline))

/* Rows r and r + 8 of a 16-row group: the 32 bytes at off of each (zero
 * for rows past n), row r in the low half. */
LM_QZ_AI __m512i lm_qz_pair(const uint8_t *base, size_t ldw, int n, int r, int64_t off) {
    __m256i lo = r < n ? _mm256_loadu_si256((const __m256i *)(base + (size_t)r * ldw + off)) : _mm256_setzero_si256();
    __m256i hi = r + 8 < n ? _mm256_loadu_si256((const __m256i *)(base + (size_t)(r + 8) * ldw + off))
                           : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* z[i]: row i's 8 dwords (low half) and row i + 8's (high half). Writes
 * dword k of rows 0..15 to dst + k * 128 (the panel's [k][row][4] lines). */
LM_QZ_AI void lm_qz_store_t16x8(const __m512i z[8], uint8_t *dst) {
    __m512i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) { /* rows 4i..4i+3: dwords 0/4, 1/5, 2/6, 3/7 of each 128-bit lane */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int k = 0; k < 4; k++) {
        _mm512_store_si512((void *)(dst + k * 128), _mm512_permutex2var_epi64(u[k], lo, u[4 + k]));
        _mm512_store_si512((void *)(dst + (k + 4) * 128), _mm512_permutex2var_epi64(u[k], hi, u[4 + k]));
    }
}

/* The 16 bytes at off of each of 16 rows (zero past n) as 4 vectors:
 * d[q] = dword q of rows 0..15. */
LM_QZ_AI void lm_qz_t16x4(const uint8_t *base, size_t ldw, int n, int64_t off, __m512i d[4]) {
    __m512i z[4];
    for (int i = 0; i < 4; i++) { /* rows i, i + 4, i + 8, i + 12 */
        __m128i x[4];
        for (int l = 0; l < 4; l++) {
            const int r = i + 4 * l;
            x[l] = r < n ? _mm_loadu_si128((const __m128i *)(base + (size_t)r * ldw + off)) : _mm_setzero_si128();
        }
        z[i] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(x[0]), x[1], 1), x[2], 2),
                                  x[3], 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    d[0] = _mm512_unpacklo_epi64(t0, t2), d[1] = _mm512_unpackhi_epi64(t0, t2);
    d[2] = _mm512_unpacklo_epi64(t1, t3), d[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The f16 in bits [sh, sh + 16) of each lane, as f32. */
LM_QZ_AI __m512 lm_qz_h(__m512i g, int sh) {
    __m512i h = _mm512_and_si512(_mm512_srli_epi32(g, (unsigned)sh), _mm512_set1_epi32(0xffff));
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
}

/* Byte n of the dwords d[0], d[1], ... (4 bytes each), as int32. */
LM_QZ_AI __m512i lm_qz_byte(const __m512i *d, int n) {
    return _mm512_and_si512(_mm512_srli_epi32(d[n / 4], (unsigned)(8 * (n % 4))), _mm512_set1_epi32(0xff));
}

/* Block pb, rows 16 * half ..: both halves' scale and offset (0 past n). */
LM_QZ_AI void lm_qz_factors(uint8_t *pb, int half, __mmask16 m, __m512 s0, __m512 s1, __m512 o0, __m512 o1) {
    float *sc = (float *)(pb + LM_QP_CODES) + 16 * half, *off = sc + 2 * LM_QP_ROWS;
    _mm512_store_ps(sc, _mm512_maskz_mov_ps(m, s0));
    _mm512_store_ps(sc + LM_QP_ROWS, _mm512_maskz_mov_ps(m, s1));
    _mm512_store_ps(off, _mm512_maskz_mov_ps(m, o0));
    _mm512_store_ps(off + LM_QP_ROWS, _mm512_maskz_mov_ps(m, o1));
}

#define LM_QZ_PB(i) (panel + (size_t)(i) * LM_QP_BLOCK_BYTES)

/* Blocks b0 .. b0 + nb - 1 of one 16-row group (the K-quants' runs walk
 * super-blocks: LM_QP_SUPER_RUN). Q4_K, and Q5_K (Q4_K's nibbles at 48,
 * the fifth bit j of qh at 16). */
static void lm_qz_q45_k(const uint8_t *base, size_t ldw, int n, __mmask16 m, int64_t b0, int nb, uint8_t *panel,
                        int half, bool five) {
    const __m512i lo4 = _mm512_set1_epi32(0x0f0f0f0f), c63 = _mm512_set1_epi32(63), c15 = _mm512_set1_epi32(15);
    const __m512i one = _mm512_set1_epi32(0x01010101);
    const int64_t sbb = five ? 176 : 144, qs0 = five ? 48 : 16;
    LM_QP_SUPER_RUN(sbb, {
        const int64_t sb = sbo;
        __m512i h[4]; /* d, dmin; the 12 scale bytes */
        lm_qz_t16x4(base, ldw, n, sb, h);
        const __m512 d = lm_qz_h(h[0], 0), dmin = lm_qz_h(h[0], 16);
        const __m512i *s = h + 1; /* lm_q4k_scale_min's bytes, 4 a dword */
        for (int j = j0; j < j0 + nj; j++) {
            __m512i z[8];
            for (int r = 0; r < 8; r++) {
                __m512i q = lm_qz_pair(base, ldw, n, r, sb + qs0 + 32 * (j / 2));
                z[r] = _mm512_and_si512(j % 2 ? _mm512_srli_epi32(q, 4) : q, lo4);
                if (five) {
                    __m512i hb = _mm512_and_si512(_mm512_srli_epi32(lm_qz_pair(base, ldw, n, r, sb + 16), (unsigned)j), one);
                    z[r] = _mm512_or_si512(z[r], _mm512_slli_epi32(hb, 4));
                }
            }
            uint8_t *pb = LM_QZ_PB(i + j - j0);
            lm_qz_store_t16x8(z, pb + 64 * half);
            __m512i sc, mn;
            if (j < 4) {
                sc = _mm512_and_si512(lm_qz_byte(s, j), c63);
                mn = _mm512_and_si512(lm_qz_byte(s, j + 4), c63);
            } else {
                sc = _mm512_or_si512(_mm512_and_si512(lm_qz_byte(s, j + 4), c15),
                                     _mm512_slli_epi32(_mm512_srli_epi32(lm_qz_byte(s, j - 4), 6), 4));
                mn = _mm512_or_si512(_mm512_srli_epi32(lm_qz_byte(s, j + 4), 4),
                                     _mm512_slli_epi32(_mm512_srli_epi32(lm_qz_byte(s, j), 6), 4));
            }
            __m512 sv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)), ov = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn));
            lm_qz_factors(pb, half, m, sv, sv, ov, ov);
        }
    })
}

static void lm_qz_q6_k(const uint8_t *base, size_t ldw, int n, __mmask16 m, int64_t b0, int nb, uint8_t *panel,
                       int half) {
    const __m512i lo4 = _mm512_set1_epi32(0x0f0f0f0f), lo2 = _mm512_set1_epi32(0x03030303);
    const __m512 c32 = _mm512_set1_ps(32.0f);
    LM_QP_SUPER_RUN(210, {
        const int64_t sb = sbo;
        __m512i s[4], e[4]; /* the 16 int8 scales; bytes 194..209 (d in the last two) */
        lm_qz_t16x4(base, ldw, n, sb + 192, s);
        lm_qz_t16x4(base, ldw, n, sb + 194, e);
        const __m512 d = lm_qz_h(e[3], 16);
        for (int j = j0; j < j0 + nj; j++) {
            const int kk = j % 4;
            const int64_t ql = sb + 64 * (j / 4) + 32 * (j % 2), qh = sb + 128 + 32 * (j / 4);
            __m512i z[8];
            for (int r = 0; r < 8; r++) {
                __m512i l = _mm512_and_si512(_mm512_srli_epi32(lm_qz_pair(base, ldw, n, r, ql), (unsigned)(4 * (kk / 2))), lo4);
                __m512i h = _mm512_and_si512(_mm512_srli_epi32(lm_qz_pair(base, ldw, n, r, qh), (unsigned)(2 * kk)), lo2);
                z[r] = _mm512_or_si512(l, _mm512_slli_epi32(h, 4));
            }
            uint8_t *pb = LM_QZ_PB(i + j - j0);
            lm_qz_store_t16x8(z, pb + 64 * half);
            /* int8 scales 2j and 2j + 1, sign-extended */
            const __m512i g = s[(2 * j) / 4];
            const unsigned sh = (unsigned)(8 * ((2 * j) % 4));
            __m512i s0 = _mm512_srai_epi32(_mm512_slli_epi32(g, 24 - sh), 24);
            __m512i s1 = _mm512_srai_epi32(_mm512_slli_epi32(g, 16 - sh), 24);
            __m512 f0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s0)), f1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s1));
            lm_qz_factors(pb, half, m, f0, f1, _mm512_mul_ps(c32, f0), _mm512_mul_ps(c32, f1));
        }
    })
}

/* IQ4_XS: block j's 32 codes are levels + 128 of the 16 bytes at 8 + 16 j
 * (low nibbles first), ls = 4 low bits (bytes 4-7) | 2 high bits (bytes
 * 2-3) << 4, w = d * (ls - 32) * (u - 128). */
static void lm_qz_iq4_xs(const uint8_t *base, size_t ldw, int n, __mmask16 m, int64_t b0, int nb, uint8_t *panel,
                         int half) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    /* lanes 0 / 2 (rows r / r + 8) the low nibbles, 1 / 3 the high */
    const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    __m128i lv = _mm_loadu_si128((const __m128i *)lm_iq4nl_levels);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(lv, _mm_set1_epi8((char)0x80)));
    const __m512 c128 = _mm512_set1_ps(128.0f);
    LM_QP_SUPER_RUN(136, {
        const int64_t sb = sbo;
        __m512i h[4];
        lm_qz_t16x4(base, ldw, n, sb, h);
        const __m512 d = lm_qz_h(h[0], 0);
        for (int j = j0; j < j0 + nj; j++) {
            __m512i z[8];
            for (int r = 0; r < 8; r++) {
                __m128i a = r < n ? _mm_loadu_si128((const __m128i *)(base + (size_t)r * ldw + sb + 8 + 16 * j))
                                  : _mm_setzero_si128();
                __m128i c = r + 8 < n ? _mm_loadu_si128((const __m128i *)(base + (size_t)(r + 8) * ldw + sb + 8 + 16 * j))
                                      : _mm_setzero_si128();
                __m512i q = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(a), a, 1),
                                                                  c, 2), c, 3);
                __m512i nib = _mm512_and_si512(_mm512_srlv_epi64(q, shift), lo4);
                __mmask64 rows = (r < n ? 0x00000000ffffffffull : 0) | (r + 8 < n ? 0xffffffff00000000ull : 0);
                z[r] = _mm512_maskz_shuffle_epi8(rows, lut, nib);
            }
            uint8_t *pb = LM_QZ_PB(i + j - j0);
            lm_qz_store_t16x8(z, pb + 64 * half);
            __m512i lo = _mm512_and_si512(_mm512_srli_epi32(h[1], (unsigned)(4 * j)), _mm512_set1_epi32(15));
            __m512i hi = _mm512_and_si512(_mm512_srli_epi32(h[0], (unsigned)(16 + 2 * j)), _mm512_set1_epi32(3));
            __m512i ls = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
            __m512 dl = _mm512_mul_ps(d, _mm512_cvtepi32_ps(ls)), o = _mm512_mul_ps(c128, dl);
            lm_qz_factors(pb, half, m, dl, dl, o, o);
        }
    })
}

/* Q2_K and Q3_K block j: 2-bit codes (q >> 2 (j % 4)) & 3 of the 32 bytes
 * at qs + 32 (j / 4), Q3_K with bit j of hmask as bit 2 (u = q + 4). Q2_K:
 * per 16 values a 4-bit scale and min (byte 2j + h of the header), w = d
 * sc u - dmin mn; Q3_K: signed 6-bit scales, w = d sc (u - 4). */
static void lm_qz_q23_k(const uint8_t *base, size_t ldw, int n, __mmask16 m, int64_t b0, int nb, uint8_t *panel,
                        int half, bool three) {
    const __m512i lo2 = _mm512_set1_epi32(0x03030303), one = _mm512_set1_epi32(0x01010101);
    const __m512i c15 = _mm512_set1_epi32(15), c3 = _mm512_set1_epi32(3);
    const int64_t sbb = three ? 110 : 84, qs0 = three ? 32 : 16;
    LM_QP_SUPER_RUN(sbb, {
        const int64_t sb = sbo;
        /* Q3_K: bytes 94..109 (the 12 scale bytes at 2..13, d in the last
         * two); Q2_K: the 16 scale bytes, and 68..83 (d, dmin in the last four) */
        __m512i h[4], e[4];
        lm_qz_t16x4(base, ldw, n, three ? sb + 94 : sb, h);
        if (!three) lm_qz_t16x4(base, ldw, n, sb + 68, e);
        const __m512 d = three ? lm_qz_h(h[3], 16) : lm_qz_h(e[3], 0), dmin = three ? d : lm_qz_h(e[3], 16);
        for (int j = j0; j < j0 + nj; j++) {
            __m512i z[8];
            for (int r = 0; r < 8; r++) {
                __m512i q = lm_qz_pair(base, ldw, n, r, sb + qs0 + 32 * (j / 4));
                z[r] = _mm512_and_si512(_mm512_srli_epi32(q, (unsigned)(2 * (j % 4))), lo2);
                if (three) {
                    __m512i hb = _mm512_and_si512(_mm512_srli_epi32(lm_qz_pair(base, ldw, n, r, sb), (unsigned)j), one);
                    z[r] = _mm512_or_si512(z[r], _mm512_slli_epi32(hb, 2));
                }
            }
            uint8_t *pb = LM_QZ_PB(i + j - j0);
            lm_qz_store_t16x8(z, pb + 64 * half);
            __m512 f[2], o[2];
            for (int hh = 0; hh < 2; hh++) {
                const int s = 2 * j + hh;
                if (three) { /* lm_qs_q3k_scale */
                    __m512i lo = _mm512_and_si512(_mm512_srli_epi32(lm_qz_byte(h, 2 + s % 8), (unsigned)(4 * (s / 8))), c15);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi32(lm_qz_byte(h, 2 + 8 + s % 4), (unsigned)(2 * (s / 4))), c3);
                    __m512i sc = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
                    f[hh] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
                    o[hh] = _mm512_mul_ps(_mm512_set1_ps(4.0f), f[hh]);
                } else {
                    __m512i sm = lm_qz_byte(h, s);
                    f[hh] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sm, c15)));
                    o[hh] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4)));
                }
            }
            lm_qz_factors(pb, half, m, f[0], f[1], o[0], o[1]);
        }
    })
}

static void lm_qz_q8_0(const uint8_t *base, size_t ldw, int n, __mmask16 m, int64_t b0, int nb, uint8_t *panel,
                       int half) {
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    const __m512 c128 = _mm512_set1_ps(128.0f);
    for (int i = 0; i < nb; i++) {
        const int64_t blk = (b0 + i) * 34;
        __m512i z[8];
        for (int r = 0; r < 8; r++) { /* u = q + 128: the sign bit flipped; rows past n stay 0 */
            __mmask16 rm = (__mmask16)((r < n ? 0x00ffu : 0u) | (r + 8 < n ? 0xff00u : 0u));
            z[r] = _mm512_maskz_xor_epi32(rm, lm_qz_pair(base, ldw, n, r, blk + 2), flip);
        }
        uint8_t *pb = LM_QZ_PB(i);
        lm_qz_store_t16x8(z, pb + 64 * half);
        __m512i h[4];
        lm_qz_t16x4(base, ldw, n, blk, h);
        const __m512 d = lm_qz_h(h[0], 0), o = _mm512_mul_ps(c128, d);
        lm_qz_factors(pb, half, m, d, d, o, o);
    }
}

void lm_qpanel_pack_avx512(lm_dtype t, const void *w, size_t ldw, int nv, int64_t b0, int nb, uint8_t *panel) {
    if (t != LM_Q4_K && t != LM_Q5_K && t != LM_Q6_K && t != LM_Q8_0 && t != LM_IQ4_XS && t != LM_Q2_K && t != LM_Q3_K) {
        lm_qpanel_pack(t, w, ldw, nv, b0, nb, panel);
        return;
    }
    LM_ASSERT(nv >= 1 && nv <= LM_QP_ROWS);
    for (int half = 0; half < 2; half++) {
        const int n = nv - 16 * half;
        const __mmask16 m = n >= 16 ? (__mmask16)0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
        const uint8_t *base = n > 0 ? (const uint8_t *)w + (size_t)(16 * half) * ldw : (const uint8_t *)w;
        if (t == LM_Q4_K || t == LM_Q5_K) lm_qz_q45_k(base, ldw, n, m, b0, nb, panel, half, t == LM_Q5_K);
        else if (t == LM_Q6_K) lm_qz_q6_k(base, ldw, n, m, b0, nb, panel, half);
        else if (t == LM_IQ4_XS) lm_qz_iq4_xs(base, ldw, n, m, b0, nb, panel, half);
        else if (t == LM_Q2_K || t == LM_Q3_K) lm_qz_q23_k(base, ldw, n, m, b0, nb, panel, half, t == LM_Q3_K);
        else lm_qz_q8_0(base, ldw, n, m, b0, nb, panel, half);
    }
}
