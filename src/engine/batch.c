/* batch.c - fills an lm_batch (see lm_batch_builder.h).
 *
 * The builder keeps the batch itself and points it at arrays allocated at
 * creation; the add functions only write entries and bump counts, asserting
 * the capacity the creator promised (overrunning it is a bug of the caller,
 * not bad input). */
#include "lm_batch_builder.h"

#include "../model/lm_arch.h"

#include <stdlib.h>

struct lm_batch_builder {
    int max_tokens, max_seqs, max_out;
    bool stateful;
    bool from_argmax;         /* the batch's tokens are the backend's argmax */
    int32_t *tokens, *pos, *seq; /* [max_tokens] */
    const int32_t **tables;   /* [max_seqs] */
    int32_t *slots;           /* [max_seqs] */
    int32_t *rows;            /* [max_out] */
    int32_t *hidden_rows;     /* [max_tokens] */
    int32_t *state_out;       /* [max_tokens] -1 but where lm_batch_set_state_out said */
    lm_batch b;               /* counts live in b.n_tokens, b.n_seqs, b.n_out */
};

lm_batch_builder *lm_batch_builder_create(int max_tokens, int max_seqs, int max_out, bool stateful) {
    LM_ASSERT(max_tokens > 0 && max_seqs > 0 && max_out >= 0);
    lm_batch_builder *bb = lm_xcalloc(1, sizeof *bb);
    bb->max_tokens = max_tokens, bb->max_seqs = max_seqs, bb->max_out = max_out;
    bb->stateful = stateful;
    bb->tokens = lm_xmalloc((size_t)max_tokens * sizeof(int32_t));
    bb->pos = lm_xmalloc((size_t)max_tokens * sizeof(int32_t));
    bb->seq = lm_xmalloc((size_t)max_tokens * sizeof(int32_t));
    bb->tables = lm_xcalloc((size_t)max_seqs, sizeof *bb->tables);
    bb->slots = lm_xcalloc((size_t)max_seqs, sizeof(int32_t));
    bb->rows = lm_xmalloc((size_t)LM_MAX(max_out, 1) * sizeof(int32_t));
    bb->hidden_rows = lm_xmalloc((size_t)max_tokens * sizeof(int32_t));
    bb->state_out = lm_xmalloc((size_t)max_tokens * sizeof(int32_t));
    lm_batch_reset(bb);
    return bb;
}

void lm_batch_builder_free(lm_batch_builder *bb) {
    if (!bb) return;
    free(bb->tokens), free(bb->pos), free(bb->seq);
    free(bb->tables), free(bb->slots), free(bb->rows), free(bb->hidden_rows), free(bb->state_out);
    free(bb);
}

void lm_batch_reset(lm_batch_builder *bb) {
    bb->from_argmax = false;
    bb->b = (lm_batch){ .tokens = bb->tokens, .pos = bb->pos, .seq = bb->seq, .block_tables = bb->tables,
                        .state_slot = bb->stateful ? bb->slots : NULL, .out_rows = bb->rows,
                        .hidden_rows = bb->hidden_rows };
}

int lm_batch_add_seq(lm_batch_builder *bb, const int32_t *block_table, int32_t state_slot) {
    LM_ASSERT(bb->b.n_seqs < bb->max_seqs);
    int s = bb->b.n_seqs++;
    bb->tables[s] = block_table;
    bb->slots[s] = state_slot;
    return s;
}

/* One token slot of sequence s at pos; its id is the caller's to write. */
static int add_token(lm_batch_builder *bb, int s, int pos) {
    LM_ASSERT(bb->b.n_tokens < bb->max_tokens && s >= 0 && s < bb->b.n_seqs);
    int t = bb->b.n_tokens++;
    bb->pos[t] = pos;
    bb->seq[t] = s;
    bb->state_out[t] = -1;
    return t;
}

int lm_batch_add_tokens(lm_batch_builder *bb, int s, const int32_t *ids, int pos0, int n) {
    LM_ASSERT(!bb->from_argmax && n > 0);
    int t = -1;
    for (int i = 0; i < n; i++) {
        t = add_token(bb, s, pos0 + i);
        bb->tokens[t] = ids ? ids[i] : 0;
    }
    return t;
}

int lm_batch_add_from_argmax(lm_batch_builder *bb, int s, int pos) {
    LM_ASSERT(bb->from_argmax || bb->b.n_tokens == 0);
    bb->from_argmax = true;
    bb->b.tokens = NULL;
    return add_token(bb, s, pos);
}

int lm_batch_add_out(lm_batch_builder *bb, int row) {
    LM_ASSERT(bb->b.n_out < bb->max_out && row >= 0 && row < bb->b.n_tokens);
    bb->rows[bb->b.n_out] = row;
    return bb->b.n_out++;
}

int lm_batch_add_hidden(lm_batch_builder *bb, int row) {
    LM_ASSERT(bb->b.n_hidden < bb->max_tokens && row >= 0 && row < bb->b.n_tokens);
    bb->hidden_rows[bb->b.n_hidden] = row;
    return bb->b.n_hidden++;
}

void lm_batch_set_state_out(lm_batch_builder *bb, int row, int32_t slot) {
    LM_ASSERT(bb->stateful && row >= 0 && row < bb->b.n_tokens && slot >= 0);
    bb->state_out[row] = slot;
    bb->b.state_out = bb->state_out;
}

void lm_batch_set_hidden(lm_batch_builder *bb, float *out) { bb->b.hidden_out = out; }

int lm_batch_n_hidden(const lm_batch_builder *bb) { return bb->b.n_hidden; }

void lm_batch_set_argmax(lm_batch_builder *bb, int32_t *ids, const uint8_t *want_logits, bool later) {
    bb->b.out_argmax = ids;
    bb->b.out_logits = want_logits;
    bb->b.argmax_later = later;
    bb->b.argmax_masked = false;
}

void lm_batch_defer_argmax(lm_batch_builder *bb) {
    LM_ASSERT(bb->b.argmax_later);
    bb->b.argmax_masked = true;
}

int lm_batch_n_tokens(const lm_batch_builder *bb) { return bb->b.n_tokens; }

int lm_batch_n_out(const lm_batch_builder *bb) { return bb->b.n_out; }

int32_t lm_batch_out_token(const lm_batch_builder *bb, int o) {
    LM_ASSERT(o >= 0 && o < bb->b.n_out);
    return bb->tokens[bb->rows[o]];
}

int lm_batch_forward(lm_batch_builder *bb, lm_model *m, lm_kv_pool *kv, float *logits, lm_err *e) {
    return lm_model_forward(m, kv, &bb->b, logits, e);
}

int lm_batch_forward_draft(lm_batch_builder *bb, lm_model *m, const lm_draft *d, lm_kv_pool *kv, const float *hidden,
                           float *hidden_out, lm_err *e) {
    return d->forward(m, kv, &bb->b, hidden, hidden_out, e);
}
