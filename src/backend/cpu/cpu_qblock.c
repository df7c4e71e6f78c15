/* cpu_qblock.c - per-type unpacking of quant blocks and the int8 GEMM panel.
 *
 * Each unpack function states its type as w = sc * u - off per half block
 * (cpu_qblock.h); the codes come from cpu_qdot_scalar.c's decoders, the
 * scales from the block headers as dtype.c reads them. Everything here is
 * portable: a panel is packed once per tile of up to 512 tokens, so its cost
 * is small against the integer dot products it feeds. */
#include "cpu_qblock.h"

#include <string.h>

static float lm_qb_h(const uint8_t *p) { return lm_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static void lm_qb_same(float sc[2], float off[2], float s, float o) {
    sc[0] = sc[1] = s;
    off[0] = off[1] = o;
}

/* Q8_0: u = q + 128, so w = d * u - 128 d. */
static void lm_qb_q8_0(const uint8_t *row, int64_t b, uint8_t u[32], float sc[2], float off[2]) {
    const uint8_t *blk = row + b * 34;
    float d = lm_qb_h(blk);
    lm_qs_codes_q8_0(blk, u);
    lm_qb_same(sc, off, d, 128.0f * d);
}

/* Q4_0: w = d * (u - 8). */
static void lm_qb_q4_0(const uint8_t *row, int64_t b, uint8_t u[32], float sc[2], float off[2]) {
    const uint8_t *blk = row + b * 18;
    float d = lm_qb_h(blk);
    lm_qs_codes_q4_0(blk, u);
    lm_qb_same(sc, off, d, 8.0f * d);
}

/* Q4_K / Q5_K: w = d * scale_j * u - dmin * min_j. */
static void lm_qb_k_scales(const uint8_t *sb, int j, float sc[2], float off[2]) {
    int s, m;
    lm_q4k_scale_min(j, sb + 4, &s, &m);
    lm_qb_same(sc, off, lm_qb_h(sb) * (float)s, lm_qb_h(sb + 2) * (float)m);
}

static void lm_qb_q4_k(const uint8_t *row, int64_t b, uint8_t u[32], float sc[2], float off[2]) {
    const uint8_t *sb = row + (b / 8) * 144;
    lm_qs_codes_q4_k(sb, (int)(b % 8), u);
    lm_qb_k_scales(sb, (int)(b % 8), sc, off);
}

static void lm_qb_q5_k(const uint8_t *row, int64_t b, uint8_t u[32], float sc[2], float off[2]) {
    const uint8_t *sb = row + (b / 8) * 176;
    lm_qs_codes_q5_k(sb, (int)(b % 8), u);
    lm_qb_k_scales(sb, (int)(b % 8), sc, off);
}

/* IQ4_XS: u = level + 128, w = d * (ls - 32) * (u - 128). */
static void lm_qb_iq4_xs(const uint8_t *row, int64_t b, uint8_t u[32], float sc[2], float off[2]) {
    const uint8_t *sb = row + (b / 8) * 136;
    int j = (int)(b % 8);
    int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sb[2 + j / 4] >> (2 * (j % 4))) & 3) << 4);
    float dl = lm_qb_h(sb) * (float)(ls - 32);
    lm_qs_codes_iq4_xs(sb, j, u);
    lm_qb_same(sc, off, dl, 128.0f * dl);
}

/* Q6_K: one int8 scale per 16 values, w = d * scale_h * (u - 32). */
static void lm_qb_q6_k(const uint8_t *row, int64_t b, uint8_t u[32], float sc[2], float off[2]) {
    const uint8_t *sb = row + (b / 8) * 210;
    int j = (int)(b % 8);
    const int8_t *s16 = (const int8_t *)(sb + 192) + 2 * j;
    float d = lm_qb_h(sb + 208);
    lm_qs_codes_q6_k(sb, j, u);
    for (int h = 0; h < 2; h++) {
        sc[h] = d * (float)s16[h];
        off[h] = 32.0f * sc[h];
    }
}

const lm_qblock_type lm_qblock_types[LM_DTYPE_COUNT] = {
    [LM_Q8_0] = { lm_qb_q8_0, false }, [LM_Q4_0] = { lm_qb_q4_0, false },
    [LM_Q4_K] = { lm_qb_q4_k, false }, [LM_Q5_K] = { lm_qb_q5_k, false },
    [LM_IQ4_XS] = { lm_qb_iq4_xs, false }, [LM_Q6_K] = { lm_qb_q6_k, true },
};

/* Unpacks each row's blocks and scatters the codes in groups of 4 to the
 * [k][row][4] order the kernel loads; missing rows stay zero. */
void lm_qpanel_pack(lm_dtype t, const void *w, size_t ldw, int nv, int64_t b0, int nb, uint8_t *panel) {
    lm_qblock_unpack_fn unpack = lm_qblock_types[t].unpack;
    LM_ASSERT(unpack && nv >= 1 && nv <= LM_QP_ROWS);
    for (int b = 0; b < nb; b++) {
        uint8_t *pb = panel + (size_t)b * LM_QP_BLOCK_BYTES;
        float *sc = (float *)(pb + LM_QP_CODES), *off = sc + 2 * LM_QP_ROWS;
        for (int r = 0; r < nv; r++) {
            uint8_t u[32];
            float s2[2], o2[2];
            unpack((const uint8_t *)w + (size_t)r * ldw, b0 + b, u, s2, o2);
            for (int k = 0; k < 8; k++) memcpy(pb + (k * LM_QP_ROWS + r) * 4, u + 4 * k, 4);
            sc[r] = s2[0];
            sc[LM_QP_ROWS + r] = s2[1];
            off[r] = o2[0];
            off[LM_QP_ROWS + r] = o2[1];
        }
        for (int r = nv; r < LM_QP_ROWS; r++) {
            for (int k = 0; k < 8; k++) memset(pb + (k * LM_QP_ROWS + r) * 4, 0, 4);
            sc[r] = sc[LM_QP_ROWS + r] = off[r] = off[LM_QP_ROWS + r] = 0.0f;
        }
    }
}
