/* lm_batch_builder.h - the one way to fill an lm_batch.
 *
 * A builder owns a batch's arrays, sized once at creation, and fills them
 * sequence by sequence: lm_batch_add_seq names a sequence's block table and
 * state slot, lm_batch_add_tokens appends its tokens at consecutive
 * positions, lm_batch_add_out asks for a row's output. The engine's step and
 * look-ahead, its warm-up, lm_runner and `lumen bench` all build their
 * batches here, so a new kind of batch (a speculative draft's rows, ...) has
 * one place to go and nothing allocates per step.
 *
 * Once lm_batch_forward returns, the arrays are free again: the forward has
 * taken what it needs from them, even one that returns before its argmax
 * (argmax_later), so the next batch may be built while it runs. */
#ifndef LM_BATCH_BUILDER_H
#define LM_BATCH_BUILDER_H

#include "../model/lm_model.h"

typedef struct lm_batch_builder lm_batch_builder;

/* Room for max_tokens tokens over max_seqs sequences and max_out output rows.
 * stateful: the model has recurrent state (lm_kv_pool.n_state > 0), so the
 * batch names each sequence's slot; otherwise slots are ignored. */
lm_batch_builder *lm_batch_builder_create(int max_tokens, int max_seqs, int max_out, bool stateful);
void lm_batch_builder_free(lm_batch_builder *bb);

/* Empties the batch and forgets its output options. */
void lm_batch_reset(lm_batch_builder *bb);
/* A new sequence: its KV block table (covering every position it will be
 * given) and state slot. Returns its index in the batch. */
int lm_batch_add_seq(lm_batch_builder *bb, const int32_t *block_table, int32_t state_slot);
/* Appends n tokens of sequence s at positions pos0 .. pos0 + n - 1 (ids
 * copied; NULL: token 0, for forwards whose output nobody reads). Returns
 * the row of the last. */
int lm_batch_add_tokens(lm_batch_builder *bb, int s, const int32_t *ids, int pos0, int n);
/* Appends one token of sequence s at pos whose id is the argmax the previous
 * forward left on the backend for the row this token takes (greedy
 * look-ahead; needs lm_model_look_ahead). A batch holds only such tokens or
 * none. Returns its row. */
int lm_batch_add_from_argmax(lm_batch_builder *bb, int s, int pos);
/* Asks for the output (logits or argmax) of token row `row`; returns the
 * output index, the order of lm_batch.out_rows. */
int lm_batch_add_out(lm_batch_builder *bb, int row);
/* Asks for token row `row`'s sequence's recurrent state right after it to
 * be written to state slot `slot` too (lm_batch.state_out; only where
 * lm_model_state_out allows). */
void lm_batch_set_state_out(lm_batch_builder *bb, int row, int32_t slot);
/* Asks for the hidden state after the final norm of token row `row`
 * (embeddings); returns its index among the batch's hidden rows, where
 * lm_batch_set_hidden's buffer receives it. */
int lm_batch_add_hidden(lm_batch_builder *bb, int row);
/* Where the hidden rows land: host [n_hidden][D]. */
void lm_batch_set_hidden(lm_batch_builder *bb, float *out);
int lm_batch_n_hidden(const lm_batch_builder *bb);
/* Greedy outputs (lm_batch.out_argmax): each output's argmax into ids (host
 * [n_out]); only outputs i with want_logits[i] != 0 (none when NULL) copy
 * their logits to the host. later: the forward may return before the ids
 * are there (lm_model_wait_argmax). */
void lm_batch_set_argmax(lm_batch_builder *bb, int32_t *ids, const uint8_t *want_logits, bool later);
/* After lm_batch_set_argmax(..., later): the argmax waits for the rows'
 * grammar masks (lm_batch.argmax_masked, lm_model_argmax_masked). */
void lm_batch_defer_argmax(lm_batch_builder *bb);

/* The token fed at output o's row. */
int32_t lm_batch_out_token(const lm_batch_builder *bb, int o);
/* Tokens in the batch so far; output rows asked for. */
int lm_batch_n_tokens(const lm_batch_builder *bb);
int lm_batch_n_out(const lm_batch_builder *bb);

/* lm_model_forward of the batch; logits (host) receives [n_out][V] for the
 * outputs asked for (see lm_batch.out_argmax for which), NULL for none. */
int lm_batch_forward(lm_batch_builder *bb, lm_model *m, lm_kv_pool *kv, float *logits, lm_err *e);
/* The model's draft head d (lm_arch.h) over the batch: hidden [T][D] its
 * input rows, hidden_out [n_out][D] its out rows' own (host). */
struct lm_draft;
int lm_batch_forward_draft(lm_batch_builder *bb, lm_model *m, const struct lm_draft *d, lm_kv_pool *kv,
                           const float *hidden, float *hidden_out, lm_err *e);

#endif
