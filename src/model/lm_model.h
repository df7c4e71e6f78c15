/* lm_model.h - a loaded model and its forward pass over a batch.
 *
 * A forward step takes a batch: for each token its id, its position and the
 * sequence it belongs to; for each sequence its KV block table; and which
 * token rows need logits. One sequence decoding one token is just the
 * smallest batch; a prefill chunk or a speculative draft is a bigger one. */
#ifndef LM_MODEL_H
#define LM_MODEL_H

#include "../backend/lm_backend.h"
#include "../format/lm_source.h"
#include "lm_config.h"
#include "lm_pooling.h"

typedef struct lm_batch {
    int n_tokens;                        /* T */
    /* [T]; NULL: token t is row t of the previous forward's out_argmax, as
     * the backend kept it (greedy look-ahead: the host queues this forward
     * before those ids reach it; needs lm_model_look_ahead, and that forward
     * on this model to have had T argmax rows). */
    const int32_t *tokens;
    const int32_t *pos;                  /* [T] position within its sequence */
    const int32_t *seq;                  /* [T] index into block_tables */
    int n_seqs;                          /* S */
    const int32_t *const *block_tables;  /* [S] KV blocks covering positions 0..max pos */
    const int32_t *state_slot;           /* [S] recurrent-state slots; NULL if the model has none */
    /* [T] or NULL: a slot that also receives token t's sequence's state as
     * it is right after t (-1: none); see lm_attn_batch.state_out. Only
     * where lm_model_state_out says so. */
    const int32_t *state_out;
    int n_out;                           /* rows that need logits */
    const int32_t *out_rows;             /* [n_out] token indices in [0, T) */
    /* Optional greedy output: with out_argmax (host [n_out]) the backend
     * writes each output row's argmax there, and only rows r with
     * out_logits[r] != 0 (none when out_logits is NULL) have their logits
     * copied to the host; greedy decoding then moves n_out ids, not
     * n_out * V floats. Without it every row's logits are copied. */
    int32_t *out_argmax;
    const uint8_t *out_logits;
    /* With out_argmax (n_out > 0) on a look-ahead model: the forward may
     * return before the ids are in out_argmax; lm_model_wait_argmax, once per
     * such forward and in their order, waits for them. */
    bool argmax_later;
    /* With argmax_later on a model that offers lm_model_masked_look_ahead:
     * the forward issues no argmax; lm_model_argmax_masked issues it, with
     * each row's grammar mask, before the next forward (which may take its
     * tokens from those ids). The masks of a chain of greedy steps become
     * known only once the ids before them reach the host. */
    bool argmax_masked;
    /* Optional hidden states (embeddings): the final norm's output of token
     * rows hidden_rows[i] into hidden_out [n_hidden][D] (host), taken before
     * the logits and independent of them. */
    int n_hidden;
    const int32_t *hidden_rows;          /* [n_hidden] token indices in [0, T) */
    float *hidden_out;
} lm_batch;

struct lm_arch;

typedef struct lm_model {
    lm_model_config cfg;
    const struct lm_arch *arch;
    lm_backend *be;          /* not owned */
    lm_source *source;       /* a reference: the source owns the mapped files */
    const lm_weight_source *weights; /* the source's weight table */
    char *path;
    lm_tensor embed;         /* [V][D] */
    lm_tensor out_norm;      /* [D] f32 */
    lm_tensor lm_head;       /* [V][D] (the embedding when tied) */
    void *impl;              /* the architecture's own weights and scratch */
    size_t weight_bytes;     /* bytes of weights a decode step reads */
    int n_kv_layers;         /* KV cache layers (default n_layers; hybrids need fewer) */
    int64_t kv_width;        /* floats per token of the widest KV layer (default Hkv * Dh) */
    int64_t *kv_layer_width; /* [n_kv_layers] floats per token of each KV layer, owned; NULL: kv_width each */
    bool *kv_layer_sliding;  /* [n_kv_layers] which KV layers only attend to cfg.sliding_window positions and
                                may keep them in a ring (lm_kv_pool.ring_blocks), owned; NULL: none may */
    float *inv_freq;         /* [rot_dim / 2] host */
    int rot_dim;
    float rope_attn_factor;
    void **owned;            /* backend buffers this model allocated (f32 norm copies) */
    int n_owned;
    bool host_tokens;        /* the forward reads token ids on the host (Gemma 4's per-layer embeddings) */
    lm_tensor masked_lg;     /* an argmax_masked forward's logit rows, until lm_model_argmax_masked */
    int32_t *masked_ids;     /* ... and its out_argmax; NULL when none waits */
    lm_pooling pooling;      /* how hidden states become an embedding (lm_pooling.h) */
    const struct lm_load_progress *progress; /* told while binding (NULL: nobody asked) */
    size_t bound_bytes;      /* checkpoint bytes bound so far (progress) */
    size_t bound_total;      /* the checkpoint's bytes, once progress asked */
    int bound_tensors;
} lm_model;

/* Who wants to hear how a load goes (a terminal's progress line): bytes
 * told after each weight is bound (a GPU copies it then) out of the
 * checkpoint's total; stage names the phases after the load ("warming up")
 * and NULL means ready. Either function may be NULL. */
typedef struct lm_load_progress {
    void (*bytes)(void *user, size_t done, size_t total, int tensors);
    void (*stage)(void *user, const char *what);
    void *user;
} lm_load_progress;

/* Loads the model of an opened source (a Hugging Face folder or a GGUF
 * file) onto backend be. The model takes its own reference on src (its
 * weights point into the source's mapped files), so the caller may drop its
 * own as soon as this returns. A backend with its own memory (a GPU)
 * refuses a model whose tensors do not pass lm_model_fits, with the numbers. */
int lm_model_load_from(lm_model **out, lm_source *src, lm_backend *be, lm_err *e);
/* What a load may be told besides the source: who hears how the binding
 * goes (NULL: nobody) and RoPE scaling over the model's own (the command
 * line's --rope-* options; zeroes keep the model's). */
typedef struct lm_model_load_opts {
    const lm_load_progress *progress;
    lm_rope_override rope;
} lm_model_load_opts;
/* lm_model_load_from with o (NULL: as lm_model_load_from). */
int lm_model_load_with(lm_model **out, lm_source *src, lm_backend *be, const lm_model_load_opts *o, lm_err *e);
/* lm_model_load_from on a source opened from path and released after. */
int lm_model_load(lm_model **out, const char *path, lm_backend *be, lm_err *e);

/* The bytes of every tensor of the model in src, as lm_model_load_from
 * opens it (the GGUF file, or the folder's model.safetensors or its
 * index's shards: not other files beside them), without loading it; the
 * weight table stays open in src for the load. */
int lm_model_tensor_bytes(lm_source *src, size_t *bytes, lm_err *e);
/* The same for the model at path. */
int lm_model_file_tensor_bytes(const char *path, size_t *bytes, lm_err *e);
/* Whether tensors of `need` bytes fit a device with `free_b` bytes free
 * (95 %: the rest for the KV cache and activations, which the engine sizes
 * to what is left). */
bool lm_model_fits(size_t need, size_t free_b);
void lm_model_free(lm_model *m);

/* Runs the batch; writes logits [n_out][V] (host memory) for the requested rows.
 * One forward at a time per model: activations live in the model's scratch.
 * Keys and values of every token are written to kv at their positions. */
int lm_model_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e);
/* Whether forwards may take their tokens from the previous forward's
 * argmax on the backend (lm_batch.tokens NULL) and return before their
 * argmax arrives (argmax_later): the backend offers it and the model never
 * needs the ids on the host. */
bool lm_model_look_ahead(const lm_model *m);
/* Waits for the oldest argmax_later forward's ids (in its out_argmax). */
void lm_model_wait_argmax(lm_model *m);
/* Whether forwards may also defer their argmax to lm_model_argmax_masked
 * (lm_batch.argmax_masked). */
bool lm_model_masked_look_ahead(const lm_model *m);
/* Issues the argmax of the last forward (an argmax_masked one): row r with
 * masked[r] != 0 takes the largest logit among the ids its mask allows
 * (masks + r * ceil(V / 32) words, lm_argmax_masked), the others plain
 * greedy; the ids arrive as an argmax_later forward's (lm_model_wait_argmax).
 * masks and masked are copied before it returns; masked NULL: no row is
 * masked. */
void lm_model_argmax_masked(lm_model *m, const uint32_t *masks, const uint8_t *masked);
/* The checks lm_model_forward makes before running a batch (token ids,
 * positions, sequences, logit rows, state slots), for other entry points. */
int lm_model_check_batch(const lm_model *m, const lm_kv_pool *kv, const lm_batch *b, lm_err *e);

/* Whether batches may carry state_out: the architecture's whole state is
 * what the recurrent ops keep, and the backend writes it per position. */
bool lm_model_state_out(const lm_model *m);

/* The model's own draft head for speculative decoding (lm_arch.h's
 * lm_draft), NULL when it has none. */
const struct lm_draft *lm_model_draft(const lm_model *m);

/* Recurrent state per sequence: writes up to max sizes (floats per slot of
 * each state tensor) and returns how many there are (0 for attention-only). */
int lm_model_state_spec(const lm_model *m, int64_t *floats, int max);

/* For listings: the parameters in the model's files (repacked tensors
 * counted as stored) and the name of the storage type most weight bytes use
 * ("bf16", "q4_k" ...). Reads no tensor data. */
void lm_model_describe(const lm_model *m, int64_t *n_params, const char **dtype);

/* KV bytes per token for this model (all KV layers, K and V, f32). */
size_t lm_model_kv_bytes_per_token(const lm_model *m);
/* Bytes of weights read per decoded token (all matrices + embedding row). */
size_t lm_model_weight_bytes(const lm_model *m);

#endif
