/* quant_kquant.c - the K-quants: 256-value super-blocks whose sub-block
 * scales (and mins) are themselves quantised against one f16 super-scale.
 *
 * Q4_K / Q5_K: 8 sub-blocks of 32, x ~ d*ls*q - dmin*lm, q in 0..15 / 0..31,
 * ls and lm 6 bits. Q6_K: 16 sub-blocks of 16, x ~ d*ls*(q - 32), q 6 bits,
 * ls a signed byte. Each sub-block is fitted on its own (quant_fit.c), the
 * fitted scales are quantised against the largest, and then the levels are
 * assigned again for the scales as stored. */
#include <math.h>
#include <string.h>

#include "../backend/lm_dtype.h"
#include "quant_fit.h"
#include "quant_types.h"

#define QKK 256

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The 6-bit value nearest v / unit (0 when unit is 0). */
static int six_bits(float v, float unit) { return unit > 0 ? clampi((int)nearbyintf(v / unit), 0, 63) : 0; }

/* Fits a Q4_K / Q5_K super-block: 6-bit scales ls[8], mins lm[8], levels q[256];
 * returns the stored d and dmin. */
static void fit_kq(int nmax, const float *x, const float *w, float *d, float *dmin, int *ls, int *lm, uint8_t *q) {
    float s[8], m[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        lm_qfit_asym(nmax, x + 32 * j, w ? w + 32 * j : NULL, 32, false, &s[j], &m[j], q + 32 * j);
        smax = fmaxf(smax, s[j]), mmax = fmaxf(mmax, m[j]);
    }
    *d = lm_f16_to_f32(lm_f32_to_f16(smax / 63));
    *dmin = lm_f16_to_f32(lm_f32_to_f16(mmax / 63));
    for (int j = 0; j < 8; j++) {
        ls[j] = six_bits(s[j], *d);
        lm[j] = six_bits(m[j], *dmin);
        lm_qfit_assign_asym(nmax, x + 32 * j, 32, *d * (float)ls[j], *dmin * (float)lm[j], q + 32 * j);
    }
}

/* The 12 bytes of 6-bit scales and mins (the inverse of dtype.c's unpacking). */
static void pack_scales(const int *ls, const int *lm, uint8_t *sc) {
    for (int j = 0; j < 4; j++) {
        sc[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((ls[j + 4] & 15) | ((lm[j + 4] & 15) << 4));
    }
}

void lm_quant_q4_k(const float *x, uint8_t *y, int64_t nb, const float *w) {
    uint8_t q[QKK];
    int ls[8], lm[8];
    for (int64_t b = 0; b < nb; b++, x += QKK, y += 144, w = w ? w + QKK : NULL) {
        float d, dmin;
        fit_kq(15, x, w, &d, &dmin, ls, lm, q);
        lm_quant_put_f16(y, d);
        lm_quant_put_f16(y + 2, dmin);
        pack_scales(ls, lm, y + 4);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) y[16 + 32 * g + l] = (uint8_t)(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
        }
    }
}

void lm_quant_q5_k(const float *x, uint8_t *y, int64_t nb, const float *w) {
    uint8_t q[QKK];
    int ls[8], lm[8];
    for (int64_t b = 0; b < nb; b++, x += QKK, y += 176, w = w ? w + QKK : NULL) {
        float d, dmin;
        fit_kq(31, x, w, &d, &dmin, ls, lm, q);
        lm_quant_put_f16(y, d);
        lm_quant_put_f16(y + 2, dmin);
        pack_scales(ls, lm, y + 4);
        uint8_t *qh = y + 16, *qs = y + 48;
        memset(qh, 0, 32);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * g + l], hi = q[64 * g + 32 + l];
                qs[32 * g + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
                qh[l] |= (uint8_t)(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
            }
        }
    }
}

void lm_quant_q6_k(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)(i - 32);
    const lm_qlevels L = { v, 64, true };
    uint8_t q[QKK];
    for (int64_t b = 0; b < nb; b++, x += QKK, y += 210, w = w ? w + QKK : NULL) {
        float s[16], amax = 0;
        for (int j = 0; j < 16; j++) {
            s[j] = lm_qfit_sym(&L, x + 16 * j, w ? w + 16 * j : NULL, 16, q + 16 * j);
            amax = fmaxf(amax, fabsf(s[j]));
        }
        float d = lm_f16_to_f32(lm_f32_to_f16(amax / 127));
        int8_t *sc = (int8_t *)(y + 192);
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)(d > 0 ? clampi((int)nearbyintf(s[j] / d), -128, 127) : 0);
            lm_qfit_assign_sym(&L, x + 16 * j, 16, d * (float)sc[j], q + 16 * j);
        }
        lm_quant_put_f16(y + 208, d);
        uint8_t *ql = y, *qh = y + 128;
        for (int h = 0; h < 2; h++) {
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q0 = qq[l], q1 = qq[l + 32], q2 = qq[l + 64], q3 = qq[l + 96];
                ql[64 * h + l] = (uint8_t)((q0 & 15) | ((q2 & 15) << 4));
                ql[64 * h + l + 32] = (uint8_t)((q1 & 15) | ((q3 & 15) << 4));
                qh[32 * h + l] = (uint8_t)((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
            }
        }
    }
}
