/* dtype_hf.h - block constants and reference dequantisers of the types
 * Hugging Face FP8 and MLX affine checkpoints are repacked into (used by
 * dtype.c's lm_dequant_row and by format/hf_quant.c, which writes them). */
#ifndef LM_DTYPE_HF_H
#define LM_DTYPE_HF_H

#include "lm_dtype.h"

#define LM_FP8_BLOCK 128                      /* values per FP8_B128 block */
#define LM_FP8_BLOCK_BYTES (4 + LM_FP8_BLOCK) /* f32 scale + e4m3 codes */
#define LM_AFF_BLOCK 32                       /* values per A4_* / A8_* block */

/* nb blocks of FP8_B128 at s to f32. */
void lm_dequant_fp8_b128(const uint8_t *s, float *y, int64_t nb);
/* nb blocks of affine type t (A4_BF16, A4_F16, A8_BF16, A8_F16) to f32. */
void lm_dequant_affine(lm_dtype t, const uint8_t *s, float *y, int64_t nb);

#endif
