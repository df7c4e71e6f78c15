/* lm_quant.h - f32 rows into the GGUF block types (the inverse of
 * lm_dequant_row in backend/lm_dtype.h).
 *
 * Each type's quantiser searches its block's scales (and mins) for the
 * smallest weighted squared error the format can express; weights (an
 * importance per column, e.g. from an imatrix) may be NULL for uniform.
 * A type plugs in with one entry in quant.c's table. */
#ifndef LM_QUANT_H
#define LM_QUANT_H

#include "../backend/lm_dtype.h"

/* Whether lm_quant_row can produce type t (plain F32/F16/BF16 included). */
bool lm_quant_supported(lm_dtype t);
/* Quantises n values (a multiple of t's block) of x into dst
 * (lm_dtype_row_bytes(t, n) bytes); w: n column weights or NULL. */
void lm_quant_row(lm_dtype t, const float *x, void *dst, int64_t n, const float *w);

/* A tensor of rows to convert from one type to another. */
typedef struct lm_qrows {
    lm_dtype from, to;
    int64_t rows, cols;
    const uint8_t *(*src_row)(void *ctx, int64_t r); /* row r of the source */
    void *ctx;
    uint8_t *dst;                                    /* rows * lm_dtype_row_bytes(to, cols) */
} lm_qrows;

/* Converts every row (dequantise to f32, quantise; rows of one type are
 * copied) on up to `threads` threads (<= 0: every core). */
void lm_quant_rows(const lm_qrows *q, int threads);

#endif
