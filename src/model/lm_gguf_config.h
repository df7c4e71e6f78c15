/* lm_gguf_config.h - model configuration from GGUF metadata.
 *
 * llama.cpp's converter writes a model's config as "<arch>.*" keys
 * (general.architecture names the arch) and some facts only as the presence
 * of tensors (biases, q/k norms, which layers are recurrent or sparse).
 * gguf_config.c reads what every architecture shares and dispatches to a
 * reader per GGUF architecture for the rest; the helpers below are what
 * those readers use. */
#ifndef LM_GGUF_CONFIG_H
#define LM_GGUF_CONFIG_H

#include "../format/gguf.h"
#include "lm_config.h"

int lm_config_from_gguf(lm_model_config *c, const lm_gguf *g, lm_err *e);

/* ---- for the per-architecture readers ---- */

typedef struct lm_gguf_keys {
    const lm_gguf *g;
    const char *path; /* the file, for messages */
    const char *arch; /* general.architecture: the key prefix */
} lm_gguf_keys;

/* "<arch>.<key>" as an integer / float; false when absent. */
bool lm_gguf_arch_int(const lm_gguf_keys *k, const char *key, int64_t *out);
bool lm_gguf_arch_float(const lm_gguf_keys *k, const char *key, double *out);
/* The same, required and in [lo, INT32_MAX]; -1 with "PATH: missing
 * metadata \"<arch>.<key>\"" (or out of range) otherwise. */
int lm_gguf_arch_need(const lm_gguf_keys *k, const char *key, int *out, int lo, lm_err *e);
/* Whether tensor "blk.<layer>.<suffix>" exists. */
bool lm_gguf_has_layer_tensor(const lm_gguf_keys *k, int layer, const char *suffix);

/* Per-architecture readers (after the common fields): the hybrids
 * (qwen35, qwen3next) in gguf_config_hybrid.c. */
int lm_gguf_config_hybrid(lm_model_config *c, const lm_gguf_keys *k, lm_err *e);
/* Gemma 3 and Gemma 4 (gguf_config_gemma.c). */
int lm_gguf_config_gemma3(lm_model_config *c, const lm_gguf_keys *k, lm_err *e);
int lm_gguf_config_gemma4(lm_model_config *c, const lm_gguf_keys *k, lm_err *e);
/* The sparse layers of qwen3moe / qwen3next (expert_* keys, ffn_gate_inp). */
int lm_gguf_config_moe(lm_model_config *c, const lm_gguf_keys *k, lm_err *e);

#endif
