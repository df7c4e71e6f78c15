/* hf_quant.h - Hugging Face FP8 and MLX affine checkpoints, repacked at load.
 *
 * Such a checkpoint stores a quantised weight as several tensors: FP8 as
 * `X.weight` F8_E4M3 [out, in] with `X.weight_scale_inv` [ceil(out/B0),
 * ceil(in/B1)] (block scales, config.json quantization_config
 * {"quant_method": "fp8", "weight_block_size": [B0, B1]}) or `X.weight_scale`
 * (one scale, or one per row); MLX as `X.weight` U32 [out, in*bits/32] with
 * `X.scales` and `X.biases` [out, in/group] (config.json "quantization"
 * {"group_size", "bits", and per-module overrides}). Repacking folds each
 * into one lumen tensor `X.weight` [out, in] of a block type that carries its
 * own scales (FP8_B128, A4_BF16/F16, A8_BF16/F16; backend/dtype_hf.h), so
 * the binder and every backend see one tensor of one type. */
#ifndef LM_HF_QUANT_H
#define LM_HF_QUANT_H

#include "lm_weights.h"

/* Repacks every quantised weight of the opened folder dir into
 * ws->repacked. A checkpoint without quantised weights is left as it is.
 * Errors name the file and the tensor: "FILE: tensor \"NAME\" ...". */
int lm_hf_quant_repack(lm_weight_source *ws, const char *dir, lm_err *e);
/* Frees ws->repacked. */
void lm_hf_quant_free(lm_weight_source *ws);

#endif
