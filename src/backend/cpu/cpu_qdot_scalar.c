/* cpu_qdot_scalar.c - int8 activation rows (q8x) and the portable int8 GEMV.
 *
 * Design: lm_q8x_quantize rounds one activation row to int8 blocks of 32
 * (layout in cpu_kern.h); every ISA shares it, so all tables see the same
 * integers. The kernels here are the reference for the AVX2 and VNNI ones:
 * per 32-value block an exact integer dot of weight codes and activation
 * codes, then one f32 multiply-add by the product of the scales. The AVX
 * files compute the same integers and differ only in the order of the f32
 * additions. Weight codes are read as in dtype.c (the layouts are described
 * there); offsets (Q4_0's 8, Q6_K's 32) are removed in integers with the
 * activation's 16-value sums, the Q4_K mins in f32 with the same sums. */
#include "cpu_qblock.h"

#include <string.h>

size_t lm_q8x_row_bytes(int64_t n) {
    LM_ASSERT(n >= 0 && n % LM_Q8X_BLOCK == 0);
    size_t b = (size_t)n + (size_t)n / 8 + (size_t)n / 8; /* q, d (4 B per 32), s (2 B per 16) */
    return (b + 63) & ~(size_t)63;
}

/* Round to nearest, ties to even, for |v| <= 127.5: adding 1.5 * 2^23 pushes
 * the fraction out of the f32 mantissa (no -ffast-math in this project). */
static inline int lm_q8x_round(float v) { return (int)((v + 12582912.0f) - 12582912.0f); }

void lm_q8x_quantize(const float *x, int64_t n, void *dst) {
    int8_t *q = dst;
    float *d = (float *)(q + n);
    int16_t *s = (int16_t *)(q + n + n / 8);
    for (int64_t b = 0; b < n / LM_Q8X_BLOCK; b++) {
        const float *xb = x + b * LM_Q8X_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < LM_Q8X_BLOCK; i++) {
            float a = xb[i] < 0 ? -xb[i] : xb[i];
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = db;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < LM_Q8X_BLOCK; i++) {
            int v = lm_q8x_round(xb[i] * id);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[b * LM_Q8X_BLOCK + i] = (int8_t)v;
            if (i < 16) s0 += v;
            else s1 += v;
        }
        s[2 * b] = (int16_t)s0;
        s[2 * b + 1] = (int16_t)s1;
    }
}

static float lm_qs_h(const uint8_t *p) { return lm_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static int lm_qs_idot(const uint8_t *u, const int8_t *x, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += (int)u[i] * x[i];
    return s;
}

/* Unsigned weight codes of one 32-value block, and what to subtract. */
void lm_qs_codes_q8_0(const uint8_t *restrict blk, uint8_t *restrict u) {
    for (int i = 0; i < 32; i++) u[i] = (uint8_t)((int8_t)blk[2 + i] + 128);
}

void lm_qs_codes_q4_0(const uint8_t *restrict blk, uint8_t *restrict u) {
    for (int i = 0; i < 16; i++) {
        u[i] = blk[2 + i] & 0x0f;
        u[i + 16] = blk[2 + i] >> 4;
    }
}

/* Q4_K block j (0..7) of a super-block: nibbles of qs[32 * (j / 2) ..]. */
void lm_qs_codes_q4_k(const uint8_t *restrict sb, int j, uint8_t *restrict u) {
    const uint8_t *qs = sb + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2); /* branch-free, so that the loop vectorises */
    for (int i = 0; i < 32; i++) u[i] = (uint8_t)((qs[i] >> shift) & 0x0f);
}

/* Q5_K block j: Q4_K's nibble plus bit j of qh[l] as the fifth bit. */
void lm_qs_codes_q5_k(const uint8_t *restrict sb, int j, uint8_t *restrict u) {
    const uint8_t *qs = sb + 48 + 32 * (j / 2), *qh = sb + 16;
    const int shift = 4 * (j % 2);
    for (int i = 0; i < 32; i++) u[i] = (uint8_t)(((qs[i] >> shift) & 0x0f) | (((qh[i] >> j) & 1) << 4));
}

/* IQ4_XS block j: levels + 128, so that they are unsigned like the rest. */
void lm_qs_codes_iq4_xs(const uint8_t *restrict sb, int j, uint8_t *restrict u) {
    const uint8_t *qs = sb + 8 + 16 * j;
    for (int i = 0; i < 16; i++) {
        u[i] = (uint8_t)(lm_iq4nl_levels[qs[i] & 0x0f] + 128);
        u[i + 16] = (uint8_t)(lm_iq4nl_levels[qs[i] >> 4] + 128);
    }
}

/* Q6_K block j (0..7): half h = j / 4, k = j % 4 picks the nibble of
 * ql[k % 2 * 32 + l] (low for k < 2) and bits 2k, 2k+1 of qh[l]. */
void lm_qs_codes_q6_k(const uint8_t *restrict sb, int j, uint8_t *restrict u) {
    const uint8_t *ql = sb + 64 * (j / 4) + 32 * (j % 2), *qh = sb + 128 + 32 * (j / 4);
    int k = j % 4;
    for (int i = 0; i < 32; i++)
        u[i] = (uint8_t)(((ql[i] >> (4 * (k / 2))) & 0x0f) | (((qh[i] >> (2 * k)) & 3) << 4));
}

static void lm_qs_gemv(lm_dtype dt, const void *w, size_t ldw, int nr, const void *xq, size_t ldq,
                       int nt, int64_t n, const float *bias, float *y, int64_t ldy) {
    uint8_t u[32];
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
        for (int t = 0; t < nt; t++) {
            const void *row = (const char *)xq + (size_t)t * ldq;
            const int8_t *q = row;
            const float *dx = lm_q8x_d(row, n);
            const int16_t *sx = lm_q8x_s(row, n);
            float acc = 0.0f;
            for (int64_t b = 0; b < n / 32; b++) {
                const int8_t *qb = q + b * 32;
                int sum = sx[2 * b] + sx[2 * b + 1];
                if (dt == LM_Q8_0 || dt == LM_Q4_0) {
                    const uint8_t *blk = wr + b * (dt == LM_Q8_0 ? 34 : 18);
                    if (dt == LM_Q8_0) lm_qs_codes_q8_0(blk, u);
                    else lm_qs_codes_q4_0(blk, u);
                    int idot = lm_qs_idot(u, qb, 32) - (dt == LM_Q8_0 ? 128 : 8) * sum;
                    acc += lm_qs_h(blk) * dx[b] * (float)idot;
                } else if (dt == LM_Q4_K || dt == LM_Q5_K) { /* same scales and mins */
                    const uint8_t *sb = wr + (b / 8) * (dt == LM_Q4_K ? 144 : 176);
                    int j = (int)(b % 8), sc, mn;
                    const uint8_t *scb = sb + 4;
                    if (j < 4) {
                        sc = scb[j] & 63;
                        mn = scb[j + 4] & 63;
                    } else {
                        sc = (scb[j + 4] & 0x0f) | ((scb[j - 4] >> 6) << 4);
                        mn = (scb[j + 4] >> 4) | ((scb[j] >> 6) << 4);
                    }
                    if (dt == LM_Q4_K) lm_qs_codes_q4_k(sb, j, u);
                    else lm_qs_codes_q5_k(sb, j, u);
                    int idot = lm_qs_idot(u, qb, 32);
                    acc += dx[b] * (lm_qs_h(sb) * (float)(sc * idot) - lm_qs_h(sb + 2) * (float)(mn * sum));
                } else if (dt == LM_IQ4_XS) {
                    const uint8_t *sb = wr + (b / 8) * 136;
                    int j = (int)(b % 8);
                    int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sb[2 + j / 4] >> (2 * (j % 4))) & 3) << 4);
                    lm_qs_codes_iq4_xs(sb, j, u);
                    int idot = lm_qs_idot(u, qb, 32) - 128 * sum;
                    acc += lm_qs_h(sb) * dx[b] * (float)((ls - 32) * idot);
                } else { /* LM_Q6_K: one int8 scale per 16 values */
                    const uint8_t *sb = wr + (b / 8) * 210;
                    int j = (int)(b % 8);
                    const int8_t *sc = (const int8_t *)(sb + 192) + 2 * j;
                    lm_qs_codes_q6_k(sb, j, u);
                    int i0 = lm_qs_idot(u, qb, 16) - 32 * sx[2 * b];
                    int i1 = lm_qs_idot(u + 16, qb + 16, 16) - 32 * sx[2 * b + 1];
                    acc += lm_qs_h(sb + 208) * dx[b] * (float)(sc[0] * i0 + sc[1] * i1);
                }
            }
            y[t * ldy + r] = acc + (bias ? bias[r] : 0.0f);
        }
    }
}

#define LM_QS_FN(name, dt)                                                                        \
    static void name(const void *w, size_t ldw, int nr, const void *xq, size_t ldq, int nt,       \
                     int64_t n, const float *bias, float *y, int64_t ldy) {                       \
        lm_qs_gemv(dt, w, ldw, nr, xq, ldq, nt, n, bias, y, ldy);                                 \
    }
LM_QS_FN(lm_qs_gemv_q8_0, LM_Q8_0)
LM_QS_FN(lm_qs_gemv_q4_0, LM_Q4_0)
LM_QS_FN(lm_qs_gemv_q4_k, LM_Q4_K)
LM_QS_FN(lm_qs_gemv_q6_k, LM_Q6_K)
LM_QS_FN(lm_qs_gemv_q5_k, LM_Q5_K)
LM_QS_FN(lm_qs_gemv_iq4_xs, LM_IQ4_XS)

const lm_cpu_qkern lm_cpu_qkern_scalar = {
    .name = "scalar",
    .qgemv = { [LM_Q8_0] = lm_qs_gemv_q8_0, [LM_Q4_0] = lm_qs_gemv_q4_0, [LM_Q4_K] = lm_qs_gemv_q4_k,
               [LM_Q6_K] = lm_qs_gemv_q6_k, [LM_Q5_K] = lm_qs_gemv_q5_k,
               [LM_IQ4_XS] = lm_qs_gemv_iq4_xs },
};

const lm_cpu_qkern *lm_cpu_qkern_for(lm_cpu_isa isa) {
    if (isa == LM_ISA_AVX512 && lm_cpu_has_avx512_vnni()) return &lm_cpu_qkern_vnni;
    if (isa >= LM_ISA_AVX2) return &lm_cpu_qkern_avx2;
    return &lm_cpu_qkern_scalar;
}
