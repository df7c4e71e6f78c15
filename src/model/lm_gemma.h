/* lm_gemma.h - the configuration of the gemma family beyond
 * lm_model_config (lm_model_config.gemma), shared by gemma.c (which reads
 * it from config.json and runs the model) and gguf_config_gemma.c (which
 * reads it from GGUF metadata). See gemma.c for what each field means to
 * the forward pass. */
#ifndef LM_GEMMA_H
#define LM_GEMMA_H

#include "lm_config.h"

typedef enum { GEMMA_ROPE_DEFAULT, GEMMA_ROPE_LINEAR, GEMMA_ROPE_PROPORTIONAL } gemma_rope_type;

typedef struct gemma_rope_cfg {
    gemma_rope_type type;
    double theta, factor, partial; /* partial: proportional only */
} gemma_rope_cfg;

typedef struct gemma_layer_cfg {
    int head_dim;   /* Dh of this layer */
    int n_kv_heads; /* Hkv of this layer */
    int d_ff;       /* F of this layer */
    int kv_layer;   /* KV cache layer it reads (its own index unless shared) */
    bool shared;    /* reads kv_layer's K/V, computes none */
    bool k_eq_v;    /* V is the K projection */
} gemma_layer_cfg;

struct lm_gemma_config {
    int version;           /* 3 or 4 */
    float attn_scale;      /* query_pre_attn_scalar^-0.5 (gemma3) or 1 (gemma4) */
    float final_softcap;   /* 0 = none */
    gemma_rope_cfg rope[2]; /* [0] full, [1] sliding */
    int ple_dim;           /* P, 0 = no per-layer inputs */
    int ple_vocab;         /* rows of the per-layer embedding */
    int n_kv_layers;
    gemma_layer_cfg layer[]; /* [n_layers] */
};

/* A gemma config for n_layers layers with every layer's head width, KV
 * heads and MLP width set from c (head_dim, n_kv_heads, d_ff), its own KV
 * layer, nothing shared; owned by c (lm_config_free). */
struct lm_gemma_config *lm_gemma_config_new(lm_model_config *c, int version);
/* Gemma4's shared KV: the last `shared` layers compute no K/V and read
 * the KV cache layer of the last earlier layer of their type (their MLP
 * doubled with double_wide); sets n_kv_layers. */
int lm_gemma_share_kv(lm_model_config *c, int shared, bool double_wide, const char *label, lm_err *e);
/* Every layer's head width even and at most 1024, its KV heads dividing
 * the attention heads; label names the source in the error. */
int lm_gemma_config_check(const lm_model_config *c, const char *label, lm_err *e);

#endif
