/* lm_config.h - the architecture description of a model, read from a Hugging
 * Face config.json (+ generation_config.json) or from GGUF metadata.
 *
 * Architecture differences are data: the fields every family shares come
 * first; flags and fields that only some families use follow, read by each
 * architecture's parse_config hook (one llama-family forward pass serves
 * llama, mistral, qwen2 and qwen3 through them). */
#ifndef LM_CONFIG_H
#define LM_CONFIG_H

#include "../base/lm_base.h"

#define LM_MAX_EOS 8

typedef enum lm_rope_type {
    LM_ROPE_DEFAULT = 0,
    LM_ROPE_LINEAR,
    LM_ROPE_LLAMA3,
    LM_ROPE_YARN,
} lm_rope_type;

typedef struct lm_rope_config {
    lm_rope_type type;
    double theta;
    double factor;              /* linear / llama3 / yarn */
    double low_freq_factor;     /* llama3 */
    double high_freq_factor;    /* llama3 */
    double orig_max_pos;        /* llama3 / yarn: original_max_position_embeddings */
    double beta_fast, beta_slow;/* yarn */
    double attn_factor;         /* yarn: explicit attention_factor, 0 = derive */
    double partial_factor;      /* fraction of head_dim that rotates (1 = all) */
    bool interleaved;           /* GGUF llama stores Q/K permuted for pairwise rope */
    bool freq_factors;          /* GGUF: divide each frequency by rope_freqs.weight's (Llama 3 scaling) */
} lm_rope_config;

typedef enum lm_act { LM_ACT_SILU = 0, LM_ACT_GELU_TANH, LM_ACT_GELU } lm_act;

typedef struct lm_model_config {
    char model_type[32];   /* "llama", "mistral", "qwen2", "qwen3" */
    int vocab;             /* V */
    int d_model;           /* D */
    int n_layers;
    int n_heads;           /* H */
    int n_kv_heads;        /* Hkv */
    int head_dim;          /* Dh */
    int d_ff;              /* F */
    int max_pos;           /* max_position_embeddings / context_length */
    float norm_eps;
    lm_act act;            /* feed-forward activation */
    lm_rope_config rope;
    bool tie_embeddings;
    bool qkv_bias;         /* bias on q/k/v projections */
    bool o_bias;           /* bias on the attention output projection */
    bool mlp_bias;
    bool qk_norm;          /* per-head RMSNorm of q and k before rope (qwen3) */
    /* ---- gemma3 / gemma4 (gemma.c): per-layer head widths, rope per layer
     * type, soft-capping, per-layer inputs, shared KV; one allocation, owned ---- */
    struct lm_gemma_config *gemma;
    /* ---- Qwen3.5 / Qwen3-Next hybrids (qwen35.c, lm_qwen35.h): Gated
     * DeltaNet geometry, layer pattern, MoE and MTP sizes; one allocation, owned ---- */
    struct lm_hybrid_config *hybrid;
    /* ---- read by lm_config_parse_sliding (shared by several families) ---- */
    int sliding_window;    /* tokens, for layers marked sliding; 0 = none */
    bool *layer_sliding;   /* [n_layers] */
    /* ---- mixture of experts (qwen3_moe, qwen3_next), read by lm_config_parse_moe (moe.c) ---- */
    int n_experts;              /* E: num_experts (or num_local_experts); 0 = dense model */
    int n_experts_per_tok;      /* k: num_experts_per_tok */
    int moe_d_ff;               /* moe_intermediate_size: each routed expert's F */
    bool norm_topk_prob;        /* renormalise the k routing weights to sum to 1 */
    int decoder_sparse_step;    /* layer l is sparse when (l + 1) % step == 0 ... */
    bool *layer_moe;            /* [n_layers] ... and l is not in mlp_only_layers; NULL if dense */
    int shared_expert_d_ff;     /* shared_expert_intermediate_size; 0 = no shared expert */
    /* ---- end of mixture of experts ---- */
    int n_eos;
    int eos_ids[LM_MAX_EOS];
    int bos_id;            /* -1 if none */
} lm_model_config;

/* Reads DIR/config.json and, if present, DIR/generation_config.json. */
int lm_config_load_hf(lm_model_config *c, const char *dir, lm_err *e);
/* Parses config JSON text; label names the source in errors. */
int lm_config_parse_hf(lm_model_config *c, const char *json_text, const char *label, lm_err *e);
void lm_config_free(lm_model_config *c);

/* Common JSON field readers (false when absent or of another type). */
#include <jansson.h>
bool lm_json_int(json_t *o, const char *key, int *out);
bool lm_json_num(json_t *o, const char *key, double *out);
bool lm_json_bool(json_t *o, const char *key, bool dflt);
/* layer_types / sliding_window / use_sliding_window -> layer_sliding. */
int lm_config_parse_sliding(lm_model_config *c, json_t *root, const char *label, lm_err *e);

/* num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob
 * (absent: norm_topk_default, which differs per family in transformers),
 * decoder_sparse_step, mlp_only_layers, shared_expert_intermediate_size ->
 * the MoE fields above, checked (moe.c). */
int lm_config_parse_moe(lm_model_config *c, json_t *root, const char *label, bool norm_topk_default,
                        lm_err *e);

/* Fills inv_freq[rot_dim/2] for the configured rope scaling and returns the
 * attention factor that scales cos/sin (1 except for yarn). */
float lm_rope_inv_freq(const lm_rope_config *r, int rot_dim, float *inv_freq);

/* RoPE scaling asked for on the command line (--rope-scaling, --rope-scale,
 * --rope-freq-base, --yarn-orig-ctx, --yarn-beta-fast, --yarn-beta-slow), over
 * what config.json or the GGUF says. A zero field keeps the model's value. */
typedef enum lm_rope_scaling_set {
    LM_ROPE_SET_KEEP = 0, /* the model's own scaling type */
    LM_ROPE_SET_NONE,
    LM_ROPE_SET_LINEAR,
    LM_ROPE_SET_YARN,
} lm_rope_scaling_set;

typedef struct lm_rope_override {
    int scaling;          /* lm_rope_scaling_set */
    double factor;        /* --rope-scale: context multiplier (linear: positions / factor) */
    double freq_base;     /* --rope-freq-base: rope_theta */
    int yarn_orig_ctx;    /* --yarn-orig-ctx: original_max_position_embeddings */
    double beta_fast, beta_slow; /* --yarn-beta-fast / --yarn-beta-slow */
} lm_rope_override;

/* Applies o to c->rope (rope_override.c): the type chosen, else the
 * model's; the factor given, else the model's for that type (a type the
 * model does not have needs --rope-scale); YaRN's original context given,
 * else the model's original or max_position_embeddings. A linear or YaRN
 * scaling by factor F raises max_pos to F x the original context (YaRN's
 * original, linear's max_position_embeddings) when that is more. -1 with e
 * naming the options for a contradiction (--rope-scaling none with
 * --rope-scale, --yarn-* without YaRN, --rope-scale on a model without
 * scaling and no --rope-scaling) or a model whose rope cannot take it
 * (gemma's per-layer-type ropes; a GGUF's Llama 3 frequency factors). */
int lm_rope_override_apply(lm_model_config *c, const lm_rope_override *o, lm_err *e);

#endif
