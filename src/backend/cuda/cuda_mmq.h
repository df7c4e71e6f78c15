/* cuda_mmq.h - products of more than LM_GEMV_MAX_T tokens over GGUF
 * block-quantised weights on int8 tensor cores (cuda_mmq.cu). */
#ifndef LM_CUDA_MMQ_H
#define LM_CUDA_MMQ_H

#include "cuda_internal.h"

/* Whether lm_mmq takes T tokens of x [T][I] by w [.][I] of type wt: int8
 * activations (not the exact mode), rows of whole 256-value units, x rows
 * 16-byte aligned, w readable by the block loads, and not turned off
 * (LUMEN_CUDA_MMQ=0), and few tokens (LM_MMQ_MAX_T; LUMEN_CUDA_MMQ_MAX_T=n). */
bool lm_mmq_takes(const lm_cuda *c, int64_t T, const float *x, const void *w, lm_dtype wt, int64_t I);
/* y [T][O] = x W^T (+ bias) with x rounded to int8 per 32 values (as the
 * GEMV's int8 mode) and the block codes multiplied as stored. */
void lm_mmq(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias, int64_t O,
            int64_t I);

#endif
