/* lm_quant_mix.h - which type each tensor of a model gets under a named
 * quantisation mix (Q4_K_M, Q5_K_S, Q8_0 ...), following llama.cpp's
 * llama-quantize rules so files match what people download: norms, biases
 * and other 1-D tensors stay as they are; output.weight (or a tied
 * token_embd) gets Q6_K; attn_v / ffn_down get more bits in the first and
 * last eighth and every third layer between (the _M mixes); rows that are
 * not a multiple of the block fall back to a 32-value type, or F16.
 *
 * A mix state walks the tensors in file order (the counters of attn_v and
 * ffn_down tensors are part of the rule). */
#ifndef LM_QUANT_MIX_H
#define LM_QUANT_MIX_H

#include "../backend/lm_dtype.h"

typedef enum lm_mix_id {
    LM_MIX_F32, LM_MIX_F16, LM_MIX_BF16, LM_MIX_Q8_0, LM_MIX_Q4_0, LM_MIX_Q4_K_S, LM_MIX_Q4_K_M,
    LM_MIX_Q5_K_S, LM_MIX_Q5_K_M, LM_MIX_Q6_K, LM_MIX_IQ4_XS, LM_MIX_COUNT
} lm_mix_id;

typedef struct lm_quant_mix {
    lm_mix_id id;
    const char *name;   /* "Q4_K_M" */
    int ftype;          /* general.file_type (llama_ftype) */
    lm_dtype base;      /* the type most tensors get */
} lm_quant_mix;

/* The mix of that name (case-insensitive), or NULL. */
const lm_quant_mix *lm_quant_mix_find(const char *name);
/* Every mix name, separated by '|', for help and errors. */
const char *lm_quant_mix_names(void);

/* What the rules need to know about the model, and the walk's counters. */
typedef struct lm_mix_state {
    const lm_quant_mix *mix;
    int n_layer;        /* block_count */
    int n_gqa;          /* heads / kv heads (0: unknown) */
    int n_expert;       /* 0 or 1: dense */
    bool tied;          /* no output.weight: token_embd is the output head */
    int n_attn_v, i_attn_v, i_ffn_down;
} lm_mix_state;

/* Counts the attn_v-like tensors and sees whether output.weight exists,
 * from the model's tensor names; call before the walk. */
void lm_mix_prepare(lm_mix_state *st, const char *const *names, int n);
/* The type for the next tensor of the walk: name, shape (outermost first),
 * its source type. A tensor the mix leaves alone gets src. */
lm_dtype lm_mix_tensor_type(lm_mix_state *st, const char *name, int n_dims, const int64_t *shape, lm_dtype src);

#endif
