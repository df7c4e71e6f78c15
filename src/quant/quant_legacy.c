/* quant_legacy.c - the 32-value types: one f16 scale and symmetric levels
 * (Q8_0 -127..127; Q4_0 -8..7 and Q5_0 -16..15 stored as q + 8 / q + 16;
 * IQ4_NL the 16 non-uniform levels), or a scale and an f16 minimum (Q4_1,
 * Q5_1: x = d q + m, q in 0..15 / 0..31). The fit runs in f32; the levels
 * are then assigned again for the scale (and minimum) as f16 stores them,
 * so what is written is the best fit for the values a reader will see. */
#include <string.h>

#include "../backend/lm_dtype.h"
#include "quant_fit.h"
#include "quant_types.h"

#define QK 32

void lm_quant_put_f16(uint8_t *p, float v) {
    uint16_t h = lm_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* The uniform levels lo..hi. */
static lm_qlevels uniform_levels(float *v, int lo, int hi) {
    for (int i = lo; i <= hi; i++) v[i - lo] = (float)i;
    return (lm_qlevels){ v, hi - lo + 1, true };
}

/* Fits one 32-value block and returns its stored scale with levels in q. */
static float fit_block(const lm_qlevels *L, const float *x, const float *w, uint8_t *q) {
    float d = lm_f16_to_f32(lm_f32_to_f16(lm_qfit_sym(L, x, w, QK, q)));
    lm_qfit_assign_sym(L, x, QK, d, q);
    return d;
}

void lm_quant_q8_0(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[255];
    lm_qlevels L = uniform_levels(v, -127, 127);
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 34, w = w ? w + QK : NULL) {
        lm_quant_put_f16(y, fit_block(&L, x, w, q));
        for (int j = 0; j < QK; j++) y[2 + j] = (uint8_t)(int8_t)(q[j] - 127);
    }
}

/* The 16 nibbles of a block: value j low, value j + 16 high (all 32-value types). */
static void pack_nibbles(const uint8_t *q, uint8_t *qs) {
    for (int j = 0; j < QK / 2; j++) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + QK / 2] & 15) << 4));
}

/* The fifth bits of 32 codes as the little-endian u32 qh of Q5_0 / Q5_1. */
static void pack_high_bits(const uint8_t *q, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < QK; j++) h |= (uint32_t)(q[j] >> 4) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

/* Fits an x = d q + m block (q in 0..nmax): d and m as f16 stores them, q for them. */
static void fit_affine(int nmax, const float *x, const float *w, float *d, float *m, uint8_t *q) {
    float s, off;
    lm_qfit_asym(nmax, x, w, QK, true, &s, &off, q);
    *d = lm_f16_to_f32(lm_f32_to_f16(s));
    *m = lm_f16_to_f32(lm_f32_to_f16(-off));
    lm_qfit_assign_asym(nmax, x, QK, *d, -*m, q);
}

void lm_quant_q4_1(const float *x, uint8_t *y, int64_t nb, const float *w) {
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 20, w = w ? w + QK : NULL) {
        float d, m;
        fit_affine(15, x, w, &d, &m, q);
        lm_quant_put_f16(y, d);
        lm_quant_put_f16(y + 2, m);
        pack_nibbles(q, y + 4);
    }
}

void lm_quant_q5_0(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[32];
    lm_qlevels L = uniform_levels(v, -16, 15);
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 22, w = w ? w + QK : NULL) {
        lm_quant_put_f16(y, fit_block(&L, x, w, q)); /* q = level + 16 already */
        pack_high_bits(q, y + 2);
        pack_nibbles(q, y + 6);
    }
}

void lm_quant_q5_1(const float *x, uint8_t *y, int64_t nb, const float *w) {
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 24, w = w ? w + QK : NULL) {
        float d, m;
        fit_affine(31, x, w, &d, &m, q);
        lm_quant_put_f16(y, d);
        lm_quant_put_f16(y + 2, m);
        pack_high_bits(q, y + 4);
        pack_nibbles(q, y + 8);
    }
}

void lm_quant_iq4_nl(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)lm_iq4nl_levels[i];
    const lm_qlevels L = { v, 16, false };
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 18, w = w ? w + QK : NULL) {
        lm_quant_put_f16(y, fit_block(&L, x, w, q));
        pack_nibbles(q, y + 2);
    }
}

void lm_quant_q4_0(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[16];
    lm_qlevels L = uniform_levels(v, -8, 7);
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 18, w = w ? w + QK : NULL) {
        lm_quant_put_f16(y, fit_block(&L, x, w, q)); /* q = level + 8 already */
        pack_nibbles(q, y + 2);
    }
}
