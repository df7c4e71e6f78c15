/* lm_config.h - the architecture description of a model, read from a Hugging
 * Face config.json (+ generation_config.json) or from GGUF metadata.
 *
 * Architecture differences are data: one llama-family forward pass serves
 * llama, mistral, qwen2 and qwen3 through the flags below. */
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
} lm_rope_config;

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
    lm_rope_config rope;
    bool tie_embeddings;
    bool qkv_bias;         /* bias on q/k/v projections */
    bool o_bias;           /* bias on the attention output projection */
    bool mlp_bias;
    bool qk_norm;          /* per-head RMSNorm of q and k before rope (qwen3) */
    int sliding_window;    /* tokens, for layers marked sliding; 0 = none */
    bool *layer_sliding;   /* [n_layers] */
    int n_eos;
    int eos_ids[LM_MAX_EOS];
    int bos_id;            /* -1 if none */
} lm_model_config;

/* Reads DIR/config.json and, if present, DIR/generation_config.json. */
int lm_config_load_hf(lm_model_config *c, const char *dir, lm_err *e);
/* Parses config JSON text; label names the source in errors. */
int lm_config_parse_hf(lm_model_config *c, const char *json_text, const char *label, lm_err *e);
void lm_config_free(lm_model_config *c);

/* Fills inv_freq[rot_dim/2] for the configured rope scaling and returns the
 * attention factor that scales cos/sin (1 except for yarn). */
float lm_rope_inv_freq(const lm_rope_config *r, int rot_dim, float *inv_freq);

#endif
