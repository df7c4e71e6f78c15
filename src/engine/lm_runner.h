/* lm_runner.h - one sequence on one model: feed tokens, get logits.
 *
 * The smallest user of the batch interface: the CLI's run/bench/parity
 * commands use it. Prompts are fed in chunks of at most `chunk` tokens. */
#ifndef LM_RUNNER_H
#define LM_RUNNER_H

#include "../model/lm_model.h"
#include "lm_kv_cache.h"

typedef struct lm_runner {
    lm_model *model;     /* not owned */
    lm_kv_cache *kv;
    lm_kv_seq seq;
    int n_past;          /* tokens already in the cache */
    int ctx;             /* most tokens the sequence may hold */
    int chunk;           /* most tokens per forward */
    int32_t slot;        /* recurrent-state slot, -1 for attention-only models */
    int32_t *pos, *seq_ids, *rows; /* [chunk] batch scratch */
} lm_runner;

/* ctx <= 0: the model's max_position_embeddings. chunk <= 0: 512. */
int lm_runner_create(lm_runner **out, lm_model *m, int ctx, int chunk, lm_err *e);
void lm_runner_free(lm_runner *r);
/* Forgets the sequence (its blocks go back to the pool). */
void lm_runner_reset(lm_runner *r);
/* Appends n tokens. logits (host) receives [n][V] when all_logits, else the
 * last token's [V]; NULL for none. */
int lm_runner_eval(lm_runner *r, const int32_t *tokens, int n, bool all_logits, float *logits, lm_err *e);

#endif
