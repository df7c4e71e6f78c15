/* cpu_qblock.c - per-type unpacking of quant blocks and the int8 GEMM panel.
 *
 * Each pack function states its type as w = sc * u - off per half block
 * (cpu_qblock.h) and writes a row's run of blocks straight into the panel;
 * the codes come from cpu_qdot_scalar.c's decoders, the scales from the
 * block headers as dtype.c reads them (a super-block's f16 factors once).
 * Portable: a panel is packed once per unit of up to 512 tokens, ~10-20 %
 * of the int8 GEMM's time there (bench_qgemm). */
#include "cpu_qblock.h"

#include <string.h>

static float lm_qb_h(const uint8_t *p) { return lm_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* Block pb of the panel, row r: its 32 codes in groups of 4 at [k][r], the
 * halves' scales and offsets. */
static inline void lm_qb_put(uint8_t *pb, int r, const uint8_t u[32], float s0, float s1, float o0, float o1) {
    for (int k = 0; k < 8; k++) memcpy(pb + (k * LM_QP_ROWS + r) * 4, u + 4 * k, 4);
    float *sc = (float *)(pb + LM_QP_CODES), *off = sc + 2 * LM_QP_ROWS;
    sc[r] = s0;
    sc[LM_QP_ROWS + r] = s1;
    off[r] = o0;
    off[LM_QP_ROWS + r] = o1;
}

#define LM_QB_PB(i) (panel + (size_t)(i) * LM_QP_BLOCK_BYTES)

/* The 32-value block types: w = d * u - off with off = k d (Q8_0 and IQ4_NL
 * 128: their codes are stored + 128; Q4_0 8; Q5_0 16) or -m (Q4_1, Q5_1:
 * w = d u + m, m the block's second f16). */
static inline __attribute__((always_inline)) void lm_qb_blocks32(lm_dtype t, const uint8_t *row, int64_t b0, int nb,
                                                                 uint8_t *panel, int r) {
    const int64_t bytes = lm_dtype_block_bytes(t);
    for (int i = 0; i < nb; i++) {
        const uint8_t *blk = row + (b0 + i) * bytes;
        const float d = lm_qb_h(blk);
        float off;
        uint8_t u[32];
        switch (t) {
        case LM_Q8_0: lm_qs_codes_q8_0(blk, u), off = 128.0f * d; break;
        case LM_Q4_0: lm_qs_codes_q4_0(blk, u), off = 8.0f * d; break;
        case LM_Q5_0: lm_qs_codes_q5(blk + 2, blk + 6, u), off = 16.0f * d; break;
        case LM_IQ4_NL: lm_qs_codes_iq4_nl(blk, u), off = 128.0f * d; break;
        case LM_Q4_1: lm_qs_codes_q4_0(blk + 2, u), off = -lm_qb_h(blk + 2); break; /* Q4_0's nibbles, 2 bytes on */
        default: LM_ASSERT(t == LM_Q5_1), lm_qs_codes_q5(blk + 4, blk + 8, u), off = -lm_qb_h(blk + 2); break;
        }
        lm_qb_put(LM_QB_PB(i), r, u, d, d, off, off);
    }
}

#define LM_QB_BLOCKS32(NAME, T)                                                                 \
    static void NAME(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {         \
        lm_qb_blocks32(T, row, b0, nb, panel, r);                                               \
    }
LM_QB_BLOCKS32(lm_qb_q8_0, LM_Q8_0)
LM_QB_BLOCKS32(lm_qb_q4_0, LM_Q4_0)
LM_QB_BLOCKS32(lm_qb_q4_1, LM_Q4_1)
LM_QB_BLOCKS32(lm_qb_q5_0, LM_Q5_0)
LM_QB_BLOCKS32(lm_qb_q5_1, LM_Q5_1)
LM_QB_BLOCKS32(lm_qb_iq4_nl, LM_IQ4_NL)

/* Q4_K / Q5_K (the same header; Q5_K a fifth bit a value): w = d * scale_j
 * * u - dmin * min_j. */
static inline __attribute__((always_inline)) void lm_qb_q45_k(const uint8_t *row, int64_t b0, int nb,
                                                              uint8_t *panel, int r, bool five) {
    LM_QP_SUPER_RUN(five ? 176 : 144, {
        const uint8_t *sb = row + sbo;
        const float d = lm_qb_h(sb), dmin = lm_qb_h(sb + 2);
        for (int j = j0; j < j0 + nj; j++) {
            int sc, mn;
            uint8_t u[32];
            lm_q4k_scale_min(j, sb + 4, &sc, &mn);
            if (five) lm_qs_codes_q5_k(sb, j, u);
            else lm_qs_codes_q4_k(sb, j, u);
            float s = d * (float)sc, o = dmin * (float)mn;
            lm_qb_put(LM_QB_PB(i + j - j0), r, u, s, s, o, o);
        }
    })
}

static void lm_qb_q4_k(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {
    lm_qb_q45_k(row, b0, nb, panel, r, false);
}

static void lm_qb_q5_k(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {
    lm_qb_q45_k(row, b0, nb, panel, r, true);
}

/* IQ4_XS: u = level + 128, w = d * (ls - 32) * (u - 128). */
static void lm_qb_iq4_xs(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {
    LM_QP_SUPER_RUN(136, {
        const uint8_t *sb = row + sbo;
        const float d = lm_qb_h(sb);
        for (int j = j0; j < j0 + nj; j++) {
            int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((sb[2 + j / 4] >> (2 * (j % 4))) & 3) << 4);
            float dl = d * (float)(ls - 32);
            uint8_t u[32];
            lm_qs_codes_iq4_xs(sb, j, u);
            lm_qb_put(LM_QB_PB(i + j - j0), r, u, dl, dl, 128.0f * dl, 128.0f * dl);
        }
    })
}

/* Q6_K: one int8 scale per 16 values, w = d * scale_h * (u - 32). */
static void lm_qb_q6_k(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {
    LM_QP_SUPER_RUN(210, {
        const uint8_t *sb = row + sbo;
        const float d = lm_qb_h(sb + 208);
        for (int j = j0; j < j0 + nj; j++) {
            const int8_t *s16 = (const int8_t *)(sb + 192) + 2 * j;
            float s0 = d * (float)s16[0], s1 = d * (float)s16[1];
            uint8_t u[32];
            lm_qs_codes_q6_k(sb, j, u);
            lm_qb_put(LM_QB_PB(i + j - j0), r, u, s0, s1, 32.0f * s0, 32.0f * s1);
        }
    })
}

/* Q2_K: per 16 values a 4-bit scale and min, w = d * sc * u - dmin * mn. */
static void lm_qb_q2_k(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {
    LM_QP_SUPER_RUN(84, {
        const uint8_t *sb = row + sbo;
        const float d = lm_qb_h(sb + 80), dmin = lm_qb_h(sb + 82);
        for (int j = j0; j < j0 + nj; j++) {
            const uint8_t *sc = sb + 2 * j;
            uint8_t u[32];
            lm_qs_codes_q23_k(sb + 16, NULL, j, u);
            lm_qb_put(LM_QB_PB(i + j - j0), r, u, d * (float)(sc[0] & 15), d * (float)(sc[1] & 15),
                      dmin * (float)(sc[0] >> 4), dmin * (float)(sc[1] >> 4));
        }
    })
}

/* Q3_K: codes q + 4, per 16 values a signed 6-bit scale: w = d * sc * (u - 4). */
static void lm_qb_q3_k(const uint8_t *row, int64_t b0, int nb, uint8_t *panel, int r) {
    LM_QP_SUPER_RUN(110, {
        const uint8_t *sb = row + sbo;
        const float d = lm_qb_h(sb + 108);
        for (int j = j0; j < j0 + nj; j++) {
            float s0 = d * (float)lm_qs_q3k_scale(sb + 96, 2 * j), s1 = d * (float)lm_qs_q3k_scale(sb + 96, 2 * j + 1);
            uint8_t u[32];
            lm_qs_codes_q23_k(sb + 32, sb, j, u);
            lm_qb_put(LM_QB_PB(i + j - j0), r, u, s0, s1, 4.0f * s0, 4.0f * s1);
        }
    })
}

const lm_qblock_type lm_qblock_types[LM_DTYPE_COUNT] = {
    [LM_Q8_0] = { lm_qb_q8_0, false, 255 },     [LM_Q4_0] = { lm_qb_q4_0, false, 15 },
    [LM_Q4_1] = { lm_qb_q4_1, false, 15 },      [LM_Q5_0] = { lm_qb_q5_0, false, 31 },
    [LM_Q5_1] = { lm_qb_q5_1, false, 31 },      [LM_IQ4_NL] = { lm_qb_iq4_nl, false, 255 },
    [LM_Q4_K] = { lm_qb_q4_k, false, 15 },      [LM_Q5_K] = { lm_qb_q5_k, false, 31 },
    [LM_IQ4_XS] = { lm_qb_iq4_xs, false, 255 }, [LM_Q6_K] = { lm_qb_q6_k, true, 63 },
    [LM_Q2_K] = { lm_qb_q2_k, true, 3 },        [LM_Q3_K] = { lm_qb_q3_k, true, 7 },
};

/* Each row's run of blocks straight into the panel; missing rows stay zero. */
void lm_qpanel_pack(lm_dtype t, const void *w, size_t ldw, int nv, int64_t b0, int nb, uint8_t *panel) {
    lm_qblock_pack_fn pack = lm_qblock_types[t].pack;
    LM_ASSERT(pack && nv >= 1 && nv <= LM_QP_ROWS);
    for (int r = 0; r < nv; r++) pack((const uint8_t *)w + (size_t)r * ldw, b0, nb, panel, r);
    static const uint8_t zero[32];
    for (int b = 0; b < nb; b++)
        for (int r = nv; r < LM_QP_ROWS; r++) lm_qb_put(LM_QB_PB(b), r, zero, 0.0f, 0.0f, 0.0f, 0.0f);
}
