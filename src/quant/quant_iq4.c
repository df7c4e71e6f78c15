/* quant_iq4.c - IQ4_XS: 256-value super-blocks of 8 sub-blocks of 32, each
 * value one of 16 non-uniform levels (lm_iq4nl_levels) times the sub-block
 * scale d * (ls - 32), ls 6 bits. Sub-block scales are fitted (signed: the
 * levels are not symmetric, so the sign matters) and quantised against the
 * largest, which maps to ls - 32 = -32, the end with one more step. */
#include <math.h>
#include <string.h>

#include "../backend/lm_dtype.h"
#include "quant_fit.h"
#include "quant_types.h"

#define QKK 256

void lm_quant_iq4_xs(const float *x, uint8_t *y, int64_t nb, const float *w) {
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)lm_iq4nl_levels[i];
    const lm_qlevels L = { v, 16, false };
    uint8_t q[QKK];
    for (int64_t b = 0; b < nb; b++, x += QKK, y += 136, w = w ? w + QKK : NULL) {
        float s[8], smax = 0;
        for (int j = 0; j < 8; j++) {
            s[j] = lm_qfit_sym(&L, x + 32 * j, w ? w + 32 * j : NULL, 32, q + 32 * j);
            if (fabsf(s[j]) > fabsf(smax)) smax = s[j];
        }
        float d = lm_f16_to_f32(lm_f32_to_f16(-smax / 32));
        unsigned sh = 0;
        memset(y + 4, 0, 4);
        for (int j = 0; j < 8; j++) {
            int l = d != 0 ? (int)nearbyintf(s[j] / d) : 0;
            l = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
            lm_qfit_assign_sym(&L, x + 32 * j, 32, d * (float)(l - 32), q + 32 * j);
            y[4 + j / 2] |= (uint8_t)((l & 15) << (4 * (j % 2)));
            sh |= (unsigned)(l >> 4) << (2 * j);
            for (int k = 0; k < 16; k++) y[8 + 16 * j + k] = (uint8_t)(q[32 * j + k] | (q[32 * j + 16 + k] << 4));
        }
        lm_quant_put_f16(y, d);
        y[2] = (uint8_t)sh;
        y[3] = (uint8_t)(sh >> 8);
    }
}
