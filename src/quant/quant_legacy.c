/* quant_legacy.c - Q8_0 and Q4_0: 32 values, one f16 scale, symmetric
 * integer levels (-127..127; -8..7 stored as q + 8). The scale search runs
 * in f32; the levels are then assigned again for the scale as f16 stores it,
 * so what is written is the best fit for the scale a reader will see. */
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

void lm_quant_q4_0(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[16];
    lm_qlevels L = uniform_levels(v, -8, 7);
    uint8_t q[QK];
    for (int64_t b = 0; b < nb; b++, x += QK, y += 18, w = w ? w + QK : NULL) {
        lm_quant_put_f16(y, fit_block(&L, x, w, q)); /* q = level + 8 already */
        for (int j = 0; j < QK / 2; j++) y[2 + j] = (uint8_t)(q[j] | (q[j + QK / 2] << 4));
    }
}
