/* cpu_qdot_scalar.c - int8 activation rows (q8x) and the portable int8 GEMV.
 *
 * Design: lm_q8x_quantize rounds one activation row to int8 blocks of 32
 * (layout in cpu_kern.h); every ISA shares it, so all tables see the same
 * integers. The kernels here are the reference for the AVX2 and VNNI ones:
 * per 32-value block an exact integer dot of weight codes and activation
 * codes, then one f32 multiply-add by the product of the scales. The AVX
 * files compute the same integers and differ only in the order of the f32
 * additions. Weight codes are read as in dtype.c (the layouts are described
 * there); offsets (Q4_0's 8, Q5_0's 16, Q6_K's 32, Q3_K's 4) are removed in
 * integers with the activation's 16-value sums, the mins of Q4_K/Q5_K/Q2_K,
 * the offsets m of Q4_1/Q5_1 and the affine types' biases (A4_* / A8_*,
 * repacked MLX weights) in f32 with the same sums. */
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

/* An affine block's scale or bias: bf16 or f16 as the type says. */
static float lm_qs_half(lm_dtype dt, const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return dt == LM_A4_BF16 || dt == LM_A8_BF16 ? lm_bf16_to_f32(h) : lm_f16_to_f32(h);
}

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

/* IQ4_NL: nibbles placed as Q4_0's, as levels + 128 (unsigned like the rest). */
void lm_qs_codes_iq4_nl(const uint8_t *restrict blk, uint8_t *restrict u) {
    for (int i = 0; i < 16; i++) {
        u[i] = (uint8_t)(lm_iq4nl_levels[blk[2 + i] & 0x0f] + 128);
        u[i + 16] = (uint8_t)(lm_iq4nl_levels[blk[2 + i] >> 4] + 128);
    }
}

/* Q5_0 / Q5_1: the nibbles at qs plus bit i of the 32-bit qh at qh. */
void lm_qs_codes_q5(const uint8_t *restrict qh, const uint8_t *restrict qs, uint8_t *restrict u) {
    uint32_t h = (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
    for (int i = 0; i < 16; i++) {
        u[i] = (uint8_t)((qs[i] & 0x0f) | (((h >> i) & 1u) << 4));
        u[i + 16] = (uint8_t)((qs[i] >> 4) | (((h >> (i + 16)) & 1u) << 4));
    }
}

/* Q2_K / Q3_K block j (0..7): 2-bit codes (qs[32 (j / 4) + l] >> 2 (j % 4)) & 3;
 * Q3_K (hmask != NULL) adds bit j of hmask[l] as bit 2, so that its q + 4
 * (0..7) is the code. */
void lm_qs_codes_q23_k(const uint8_t *restrict qs, const uint8_t *restrict hmask, int j, uint8_t *restrict u) {
    qs += 32 * (j / 4);
    for (int i = 0; i < 32; i++)
        u[i] = (uint8_t)(((qs[i] >> (2 * (j % 4))) & 3) | (hmask ? ((hmask[i] >> j) & 1) << 2 : 0));
}

/* Q3_K's scale i (0..15) with its -32, from the 12 packed bytes (dtype.c). */
int lm_qs_q3k_scale(const uint8_t *sc, int i) {
    return (((sc[i % 8] >> (4 * (i / 8))) & 0x0f) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
}

/* Block b (32 values) of weight row wr dotted with activation codes qb (sums
 * s0, s1 over its two halves), in units of the activation scale. */
static float lm_qs_block(lm_dtype dt, const uint8_t *wr, int64_t b, const int8_t *qb, int s0, int s1) {
    uint8_t u[32];
    const int sum = s0 + s1, j = (int)(b % 8);
    switch (dt) {
    case LM_Q8_0:
    case LM_Q4_0:
    case LM_IQ4_NL: {
        const uint8_t *blk = wr + b * lm_dtype_block_bytes(dt);
        int off = dt == LM_Q4_0 ? 8 : 128;
        if (dt == LM_Q8_0) lm_qs_codes_q8_0(blk, u);
        else if (dt == LM_Q4_0) lm_qs_codes_q4_0(blk, u);
        else lm_qs_codes_iq4_nl(blk, u);
        return lm_qs_h(blk) * (float)(lm_qs_idot(u, qb, 32) - off * sum);
    }
    case LM_Q5_0: {
        const uint8_t *blk = wr + b * 22;
        lm_qs_codes_q5(blk + 2, blk + 6, u);
        return lm_qs_h(blk) * (float)(lm_qs_idot(u, qb, 32) - 16 * sum);
    }
    case LM_Q4_1:
    case LM_Q5_1: { /* x = d q + m: the m part is m times the activation sum */
        const uint8_t *blk = wr + b * lm_dtype_block_bytes(dt);
        if (dt == LM_Q4_1) lm_qs_codes_q4_0(blk + 2, u); /* Q4_0's nibbles, 2 bytes later */
        else lm_qs_codes_q5(blk + 4, blk + 8, u);
        return lm_qs_h(blk) * (float)lm_qs_idot(u, qb, 32) + lm_qs_h(blk + 2) * (float)sum;
    }
    case LM_A4_BF16:
    case LM_A4_F16:
    case LM_A8_BF16:
    case LM_A8_F16: { /* x = s q + b, q unsigned: Q4_1's form with half-float s, b */
        const bool four = dt == LM_A4_BF16 || dt == LM_A4_F16;
        const uint8_t *blk = wr + b * (four ? 20 : 36);
        if (four) lm_qs_codes_q4_0(blk + 2, u); /* the same nibble order, 2 bytes later */
        else memcpy(u, blk + 4, 32);
        return lm_qs_half(dt, blk) * (float)lm_qs_idot(u, qb, 32) + lm_qs_half(dt, blk + 2) * (float)sum;
    }
    case LM_Q4_K:
    case LM_Q5_K: { /* same scales and mins */
        const uint8_t *sb = wr + (b / 8) * lm_dtype_block_bytes(dt), *scb = sb + 4;
        int sc, mn;
        if (j < 4) {
            sc = scb[j] & 63;
            mn = scb[j + 4] & 63;
        } else {
            sc = (scb[j + 4] & 0x0f) | ((scb[j - 4] >> 6) << 4);
            mn = (scb[j + 4] >> 4) | ((scb[j] >> 6) << 4);
        }
        if (dt == LM_Q4_K) lm_qs_codes_q4_k(sb, j, u);
        else lm_qs_codes_q5_k(sb, j, u);
        return lm_qs_h(sb) * (float)(sc * lm_qs_idot(u, qb, 32)) - lm_qs_h(sb + 2) * (float)(mn * sum);
    }
    case LM_IQ4_XS: {
        const uint8_t *sb = wr + (b / 8) * 136;
        int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sb[2 + j / 4] >> (2 * (j % 4))) & 3) << 4);
        lm_qs_codes_iq4_xs(sb, j, u);
        return lm_qs_h(sb) * (float)((ls - 32) * (lm_qs_idot(u, qb, 32) - 128 * sum));
    }
    case LM_Q6_K: { /* one int8 scale per 16 values */
        const uint8_t *sb = wr + (b / 8) * 210;
        const int8_t *sc = (const int8_t *)(sb + 192) + 2 * j;
        lm_qs_codes_q6_k(sb, j, u);
        int i0 = lm_qs_idot(u, qb, 16) - 32 * s0, i1 = lm_qs_idot(u + 16, qb + 16, 16) - 32 * s1;
        return lm_qs_h(sb + 208) * (float)(sc[0] * i0 + sc[1] * i1);
    }
    case LM_Q2_K: { /* per 16 values a 4-bit scale (low nibble) and min (high) */
        const uint8_t *sb = wr + (b / 8) * 84, *sc = sb + 2 * j;
        lm_qs_codes_q23_k(sb + 16, NULL, j, u);
        int dot = (sc[0] & 15) * lm_qs_idot(u, qb, 16) + (sc[1] & 15) * lm_qs_idot(u + 16, qb + 16, 16);
        return lm_qs_h(sb + 80) * (float)dot - lm_qs_h(sb + 82) * (float)((sc[0] >> 4) * s0 + (sc[1] >> 4) * s1);
    }
    case LM_Q3_K: { /* codes q + 4; per 16 values a signed 6-bit scale */
        const uint8_t *sb = wr + (b / 8) * 110;
        lm_qs_codes_q23_k(sb + 32, sb, j, u);
        int i0 = lm_qs_idot(u, qb, 16) - 4 * s0, i1 = lm_qs_idot(u + 16, qb + 16, 16) - 4 * s1;
        return lm_qs_h(sb + 108) * (float)(lm_qs_q3k_scale(sb + 96, 2 * j) * i0 + lm_qs_q3k_scale(sb + 96, 2 * j + 1) * i1);
    }
    default: LM_ASSERT(!"no int8 kernel for this dtype"); return 0.0f;
    }
}

static void lm_qs_gemv(lm_dtype dt, const void *w, size_t ldw, int nr, const void *xq, size_t ldq,
                       int nt, int64_t n, const float *bias, float *y, int64_t ldy) {
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
        for (int t = 0; t < nt; t++) {
            const void *row = (const char *)xq + (size_t)t * ldq;
            const int8_t *q = row;
            const float *dx = lm_q8x_d(row, n);
            const int16_t *sx = lm_q8x_s(row, n);
            float acc = 0.0f;
            for (int64_t b = 0; b < n / 32; b++) acc += dx[b] * lm_qs_block(dt, wr, b, q + b * 32, sx[2 * b], sx[2 * b + 1]);
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
LM_QS_FN(lm_qs_gemv_q4_1, LM_Q4_1)
LM_QS_FN(lm_qs_gemv_q5_0, LM_Q5_0)
LM_QS_FN(lm_qs_gemv_q5_1, LM_Q5_1)
LM_QS_FN(lm_qs_gemv_iq4_nl, LM_IQ4_NL)
LM_QS_FN(lm_qs_gemv_q2_k, LM_Q2_K)
LM_QS_FN(lm_qs_gemv_q3_k, LM_Q3_K)
LM_QS_FN(lm_qs_gemv_a4_bf16, LM_A4_BF16)
LM_QS_FN(lm_qs_gemv_a4_f16, LM_A4_F16)
LM_QS_FN(lm_qs_gemv_a8_bf16, LM_A8_BF16)
LM_QS_FN(lm_qs_gemv_a8_f16, LM_A8_F16)

const lm_cpu_qkern lm_cpu_qkern_scalar = {
    .name = "scalar",
    .qgemv = { [LM_Q8_0] = lm_qs_gemv_q8_0, [LM_Q4_0] = lm_qs_gemv_q4_0, [LM_Q4_K] = lm_qs_gemv_q4_k,
               [LM_Q6_K] = lm_qs_gemv_q6_k, [LM_Q5_K] = lm_qs_gemv_q5_k,
               [LM_IQ4_XS] = lm_qs_gemv_iq4_xs, [LM_Q4_1] = lm_qs_gemv_q4_1, [LM_Q5_0] = lm_qs_gemv_q5_0,
               [LM_Q5_1] = lm_qs_gemv_q5_1, [LM_IQ4_NL] = lm_qs_gemv_iq4_nl, [LM_Q2_K] = lm_qs_gemv_q2_k,
               [LM_Q3_K] = lm_qs_gemv_q3_k, [LM_A4_BF16] = lm_qs_gemv_a4_bf16,
               [LM_A4_F16] = lm_qs_gemv_a4_f16, [LM_A8_BF16] = lm_qs_gemv_a8_bf16, [LM_A8_F16] = lm_qs_gemv_a8_f16 },
};

const lm_cpu_qkern *lm_cpu_qkern_for(lm_cpu_isa isa) {
    if (isa == LM_ISA_AVX512 && lm_cpu_has_avx512_vnni()) return &lm_cpu_qkern_vnni;
    if (isa >= LM_ISA_AVX2) return &lm_cpu_qkern_avx2;
    return &lm_cpu_qkern_scalar;
}
