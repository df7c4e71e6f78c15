/* quant_types.h - one row quantiser per block type (internal to src/quant):
 * nb blocks of x (weights w, NULL for uniform) into y, in the GGUF layout
 * that backend/dtype.c's dequantisers read. */
#ifndef LM_QUANT_TYPES_H
#define LM_QUANT_TYPES_H

#include <stdint.h>

void lm_quant_q8_0(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q4_0(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q4_1(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q5_0(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q5_1(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_iq4_nl(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q4_k(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q5_k(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_q6_k(const float *x, uint8_t *y, int64_t nb, const float *w);
void lm_quant_iq4_xs(const float *x, uint8_t *y, int64_t nb, const float *w);

/* Little-endian f16 store, shared by the packers. */
void lm_quant_put_f16(uint8_t *p, float v);

#endif
