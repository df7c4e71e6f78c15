/* lm_arch.h - how an architecture plugs into the model layer.
 *
 * Each architecture is one file (llama.c, ...) exporting an lm_arch: the HF
 * model_type strings it serves, a hook to read its own config fields, a
 * binder that finds and checks its weights, and its forward pass. Adding an
 * architecture is one new file plus one line in arch.c's registry. The
 * binding helpers below check presence, dtype and shape of every tensor and
 * report expected vs actual naming the file. */
#ifndef LM_ARCH_H
#define LM_ARCH_H

#include <jansson.h>

#include "lm_model.h"

/* A model's draft of its own next tokens, for speculative decoding (the
 * contract is in engine/lm_spec.h): a head that, from the model's final
 * hidden state at position t and the token at t + 1, guesses the token at
 * t + 2 (the MTP head Qwen3.5 checkpoints carry, lm_qwen35.h). Optional:
 * NULL for architectures without one. */
typedef struct lm_draft {
    /* KV layers (each of the model's kv_width) the head keeps in a pool of
     * its own; 0 when this model has no head (a checkpoint without it). */
    int (*kv_layers)(const lm_model *m);
    /* One forward of the head over b: b->tokens[i] is the token after
     * position b->pos[i], hidden [T][D] (host) the model's final hidden
     * state there (lm_batch.hidden_out of a forward, or an earlier call's
     * hidden_out when chaining guesses); K/V of every token go to kv (the
     * head's pool, same block tables as the model's). For the out rows:
     * the guess into b->out_argmax, the head's own final hidden state into
     * hidden_out [n_out][D] (host). Not concurrently with a forward. */
    int (*forward)(lm_model *m, lm_kv_pool *kv, const lm_batch *b, const float *hidden, float *hidden_out,
                   lm_err *e);
} lm_draft;

typedef struct lm_arch {
    const char *name;
    const char *const *model_types; /* NULL-terminated HF model_type values */
    /* Fills fields a config may leave out with the model's documented
     * defaults before anything is read (may be NULL). Multimodal checkpoints
     * ship text_configs that rely on them (Gemma 3's omits vocab_size, the
     * head counts and the activation). */
    void (*config_defaults)(const char *model_type, json_t *root);
    /* Reads architecture-specific fields after the common ones (may be NULL). */
    int (*parse_config)(lm_model_config *c, json_t *root, const char *label, lm_err *e);
    /* Binds the weights (m->weights is open, m->cfg filled); sets m->impl. */
    int (*bind)(lm_model *m, lm_err *e);
    int (*forward)(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e);
    void (*free)(lm_model *m); /* frees m->impl and what forward allocated */
    /* Recurrent state per sequence (NULL: none); see lm_model_state_spec. */
    int (*state_spec)(const lm_model *m, int64_t *floats, int max);
    /* Its state is only conv1d_state's and gated_delta's, so a backend that
     * writes them per position can honour lm_batch.state_out. */
    bool state_per_pos;
    /* Speculative decoding's draft from the model itself (NULL: none). */
    const lm_draft *draft;
} lm_arch;

/* The architecture serving model_type, or NULL. */
const lm_arch *lm_arch_find(const char *model_type);
/* "llama, mistral, ..." into buf, for error messages. */
void lm_arch_supported(char *buf, size_t n);

/* ---- binding helpers ---- */

typedef struct lm_binder {
    lm_model *m;
    lm_err *e;
    int failed; /* after the first failure every call is a no-op */
} lm_binder;

/* A [rows][cols] matrix used in place in its stored type. Adds its bytes to
 * m->weight_bytes (what a decode step reads) unless it is gathered, not
 * multiplied (embedding tables: pass counted = false). */
void lm_bind_matrix(lm_binder *b, lm_tensor *dst, const char *name, int64_t rows, int64_t cols, bool required,
                    bool counted);
/* Matrices the model multiplies by the same input (q, k, v; gate, up) go to
 * the backend together (lm_backend_upload_weights), which may place them
 * back to back for one product. lm_bind_matrix_group binds n such matrices
 * of `cols` columns as lm_bind_matrix(required, counted) would. */
#define LM_BIND_GROUP_MAX 4
void lm_bind_matrix_group(lm_binder *b, int n, lm_tensor *const *dst, const char *const *names, const int64_t *rows,
                          int64_t cols);
/* For matrices a model re-lays out in host memory first: finds `name`
 * (checked as lm_bind_matrix does) and counts its bytes, NULL after a
 * failure; lm_bind_upload_group then uploads the n laid-out parts (dst
 * shaped, data at host[i]) together, `what` naming them in an error. */
const lm_file_tensor *lm_bind_find_matrix(lm_binder *b, const char *name, int64_t rows, int64_t cols);
void lm_bind_upload_group(lm_binder *b, int n, lm_tensor *const *dst, const void *const *host, const char *what);
/* A tensor of n elements (any shape with that element count) converted to an
 * f32 backend copy [rows][n / rows], plus `offset` added to every element. */
void lm_bind_f32(lm_binder *b, lm_tensor *dst, const char *name, int64_t rows, int64_t n, bool required,
                 float offset);
/* Convenience: a vector of n elements as f32 [1][n]. */
static inline void lm_bind_vector(lm_binder *b, lm_tensor *dst, const char *name, int64_t n, bool required) {
    lm_bind_f32(b, dst, name, 1, n, required, 0.0f);
}
/* printf-style tensor name into buf (one layer index). */
const char *lm_bind_name(char *buf, size_t n, const char *pattern, int layer);
/* Whether a tensor exists (for optional, shape-detected parts). */
bool lm_bind_has(const lm_binder *b, const char *name);

#endif
