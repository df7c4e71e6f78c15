/* lm_runner.h - one sequence on one model: feed tokens, get logits.
 *
 * The smallest user of the batch interface: the CLI's run/bench/parity
 * commands use it. Prompts are fed in chunks of at most `chunk` tokens. */
#ifndef LM_RUNNER_H
#define LM_RUNNER_H

#include "../model/lm_model.h"
#include "lm_batch_builder.h"
#include "lm_kv_cache.h"
#include "lm_sampler.h"

typedef struct lm_runner {
    lm_model *model;     /* not owned */
    lm_kv_cache *kv;
    lm_kv_seq seq;
    int n_past;          /* tokens already in the cache */
    int ctx;             /* most tokens the sequence may hold */
    int chunk;           /* most tokens per forward */
    int32_t slot;        /* recurrent-state slot, -1 for attention-only models */
    lm_batch_builder *bb; /* one chunk's batch */
} lm_runner;

/* ctx <= 0: the model's max_position_embeddings. chunk <= 0: 512. An f32
 * KV cache (exact against references); _kv: in the formats kvt. */
int lm_runner_create(lm_runner **out, lm_model *m, int ctx, int chunk, lm_err *e);
int lm_runner_create_kv(lm_runner **out, lm_model *m, int ctx, int chunk, lm_kv_types kvt, lm_err *e);
void lm_runner_free(lm_runner *r);
/* Forgets the sequence (its blocks go back to the pool). */
void lm_runner_reset(lm_runner *r);
/* Appends n tokens. logits (host) receives [n][V] when all_logits, else the
 * last token's [V]; NULL for none. */
int lm_runner_eval(lm_runner *r, const int32_t *tokens, int n, bool all_logits, float *logits, lm_err *e);
/* Appends n tokens; *next = the greedy next token (lm_argmax of the last
 * token's logits, taken on the backend: on a GPU the logits never cross to
 * the host). */
int lm_runner_eval_greedy(lm_runner *r, const int32_t *tokens, int n, int32_t *next, lm_err *e);
/* Appends n tokens and picks the next one with s: a greedy sampler's pick
 * comes from lm_runner_eval_greedy, any other sampler draws from the last
 * token's logits, copied into logits (host [V], the caller's). */
int lm_runner_next(lm_runner *r, const int32_t *tokens, int n, lm_sampler *s, float *logits, int32_t *next,
                   lm_err *e);

#endif
