/* quant.c - lm_quant_row: the table of row quantisers, one entry per type
 * (see lm_quant.h); plain types are rounded (f16, bf16: to nearest even). */
#include "lm_quant.h"

#include <string.h>

#include "quant_types.h"

typedef void (*lm_quant_fn)(const float *x, uint8_t *y, int64_t nb, const float *w);

static const lm_quant_fn lm_quant_table[LM_DTYPE_COUNT] = {
    [LM_Q8_0] = lm_quant_q8_0, [LM_Q4_0] = lm_quant_q4_0,   [LM_Q4_K] = lm_quant_q4_k,
    [LM_Q5_K] = lm_quant_q5_k, [LM_Q6_K] = lm_quant_q6_k,   [LM_IQ4_XS] = lm_quant_iq4_xs,
    [LM_Q4_1] = lm_quant_q4_1, [LM_Q5_0] = lm_quant_q5_0,   [LM_Q5_1] = lm_quant_q5_1,
    [LM_IQ4_NL] = lm_quant_iq4_nl,
};

bool lm_quant_supported(lm_dtype t) {
    if (t == LM_F32 || t == LM_F16 || t == LM_BF16) return true;
    return (unsigned)t < LM_DTYPE_COUNT && lm_quant_table[t] != NULL;
}

void lm_quant_row(lm_dtype t, const float *x, void *dst, int64_t n, const float *w) {
    LM_ASSERT(lm_quant_supported(t) && n % lm_dtype_block(t) == 0);
    uint8_t *y = dst;
    switch (t) {
    case LM_F32: memcpy(y, x, (size_t)n * 4); return;
    case LM_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = lm_f32_to_f16(x[i]);
            y[2 * i] = (uint8_t)h, y[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return;
    case LM_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = lm_f32_to_bf16(x[i]);
            y[2 * i] = (uint8_t)h, y[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return;
    default: lm_quant_table[t](x, y, n / lm_dtype_block(t), w); return;
    }
}
