/* lm_moe.h - the sparse mixture-of-experts block, shared by architectures
 * (qwen3_moe; qwen3_next adds its shared expert around it).
 *
 *   logits = Wrouter h            [T][E]
 *   out    = moe(h, logits)       top-k softmax routing + SiLU-gated experts
 *
 * Experts come from a checkpoint in either layout:
 *  - per expert (HF Hub Qwen3-MoE, Qwen3-Next; transformers 5 saves this):
 *    model.layers.L.mlp.experts.N.{gate,up,down}_proj.weight, [F][D] / [D][F];
 *  - fused (transformers 5 in memory, some conversions):
 *    model.layers.L.mlp.experts.gate_up_proj [E][2F][D] (gate rows first)
 *    and model.layers.L.mlp.experts.down_proj [E][D][F];
 *  - stacked (llama.cpp's GGUF): blk.L.ffn_{gate,up}_exps [E][F][D] and
 *    blk.L.ffn_down_exps [E][D][F]; mlx-lm's checkpoints (mlx-community)
 *    the same as model.layers.L.mlp.switch_mlp.{gate,up,down}_proj.weight,
 *    MLX-quantised as stacks; newer llama.cpp files may fuse the
 *    first two as blk.L.ffn_gate_up_exps [E][2F][D] (gate rows first),
 *    bound as the fused layout.
 * A fused tensor is bound once and each expert's matrices are row views into
 * it, so the backend op sees the same per-expert arrays either way. */
#ifndef LM_MOE_H
#define LM_MOE_H

#include "lm_arch.h"

typedef struct lm_moe_layer {
    lm_tensor router;             /* [E][D] */
    lm_tensor *gate, *up, *down;  /* [E] -> [F][D], [F][D], [D][F] (host arrays of handles) */
} lm_moe_layer;

/* Name patterns: router, the fused pair and the stacked three take the layer (%d); per-expert
 * patterns take layer and expert (%d, %d). */
typedef struct lm_moe_names {
    const char *router;
    const char *gate, *up, *down;     /* per expert */
    const char *gate_up, *down_fused; /* fused */
    /* stacked per matrix (GGUF ffn_{gate,up,down}_exps: [E][F][D], [E][F][D],
     * [E][D][F]); NULL in layouts without them */
    const char *gate_exps, *up_exps, *down_exps;
} lm_moe_names;

extern const lm_moe_names lm_moe_hf_names, lm_moe_gguf_names;

/* Binds layer `layer`'s router and experts (cfg n_experts, moe_d_ff). Adds to
 * m->weight_bytes what one decoded token reads: the router, and top_k / E of
 * the experts' bytes (only the chosen experts' weights are read), so the
 * bench roofline is honest for sparse models. */
void lm_moe_bind(lm_binder *b, lm_moe_layer *L, const lm_moe_names *n, int layer);
void lm_moe_layer_free(lm_moe_layer *L);

/* out[T][D] = the sparse block on h[T][D]; logits is caller scratch with at
 * least T rows of E. */
void lm_moe_forward(lm_model *m, const lm_moe_layer *L, lm_tensor *out, const lm_tensor *h,
                    const lm_tensor *logits);
/* x += the sparse block on h, then norm (may be NULL) of the new x; ws
 * [T][D] is workspace (lm_op_moe_add). */
void lm_moe_forward_add(lm_model *m, const lm_moe_layer *L, lm_tensor *x, const lm_tensor *h,
                        const lm_tensor *logits, lm_tensor *ws, const lm_norm_out *norm);

#endif
