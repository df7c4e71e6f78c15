/* runner.c - feed one sequence through the model in chunks. */
#include "lm_runner.h"

#include <stdlib.h>
#include <string.h>

#define LM_KV_BLOCK 16

int lm_runner_create(lm_runner **out, lm_model *m, int ctx, int chunk, lm_err *e) {
    return lm_runner_create_kv(out, m, ctx, chunk, (lm_kv_types){ LM_KV_F32, LM_KV_F32 }, e);
}

int lm_runner_create_kv(lm_runner **out, lm_model *m, int ctx, int chunk, lm_kv_types kvt, lm_err *e) {
    *out = NULL;
    if (ctx <= 0) ctx = m->cfg.max_pos;
    if (chunk <= 0) chunk = 512;
    lm_runner *r = lm_xcalloc(1, sizeof *r);
    r->model = m;
    r->ctx = ctx;
    r->chunk = chunk;
    int n_blocks = (ctx + LM_KV_BLOCK - 1) / LM_KV_BLOCK;
    /* sliding-window layers in a ring that holds a window and a chunk */
    int ring = lm_kv_ring_for(m, LM_KV_BLOCK, ctx, chunk);
    if (lm_kv_cache_create_for(&r->kv, m, kvt, LM_KV_BLOCK, n_blocks, 1, ring, e)) {
        free(r);
        return -1;
    }
    r->slot = lm_kv_state_acquire(r->kv);
    r->bb = lm_batch_builder_create(chunk, 1, chunk, r->kv->pool.n_state > 0);
    *out = r;
    return 0;
}

void lm_runner_free(lm_runner *r) {
    if (!r) return;
    lm_kv_seq_release(r->kv, &r->seq);
    lm_kv_cache_free(r->kv);
    lm_batch_builder_free(r->bb);
    free(r);
}

void lm_runner_reset(lm_runner *r) {
    lm_kv_seq_release(r->kv, &r->seq);
    if (r->slot >= 0) lm_kv_state_clear(r->kv, r->slot);
    r->n_past = 0;
}

/* Appends n tokens; the last token's logits into logits (all of them when
 * all_logits) and/or its greedy id into next (argmax on the backend: no
 * logits cross to the host). */
static int runner_eval(lm_runner *r, const int32_t *tokens, int n, bool all_logits, float *logits, int32_t *next,
                       lm_err *e) {
    if (n <= 0) return lm_errf(e, "no tokens to evaluate");
    if (r->n_past + n > r->ctx)
        return lm_errf(e, "%d tokens exceed the context of %d (%d already used)", n, r->ctx, r->n_past);
    if (lm_kv_seq_reserve(r->kv, &r->seq, r->n_past + n, e)) return -1;
    const int V = r->model->cfg.vocab;
    const int32_t *table = r->seq.blocks;
    for (int done = 0; done < n;) {
        int t = LM_MIN(r->chunk, n - done);
        bool last_chunk = done + t == n;
        lm_batch_reset(r->bb);
        int s = lm_batch_add_seq(r->bb, table, r->slot);
        int last = lm_batch_add_tokens(r->bb, s, tokens + done, r->n_past, t);
        float *dst = NULL;
        if (logits && all_logits) {
            for (int i = 0; i < t; i++) lm_batch_add_out(r->bb, i);
            dst = logits + (size_t)done * V;
        } else if ((logits || next) && last_chunk) {
            lm_batch_add_out(r->bb, last);
            dst = logits;
        }
        if (next && last_chunk) {
            LM_ASSERT(!all_logits);
            lm_batch_set_argmax(r->bb, next, NULL, false);
        }
        if (lm_batch_forward(r->bb, r->model, &r->kv->pool, dst, e)) return -1;
        r->n_past += t;
        done += t;
    }
    return 0;
}

int lm_runner_eval(lm_runner *r, const int32_t *tokens, int n, bool all_logits, float *logits, lm_err *e) {
    return runner_eval(r, tokens, n, all_logits, logits, NULL, e);
}

int lm_runner_eval_greedy(lm_runner *r, const int32_t *tokens, int n, int32_t *next, lm_err *e) {
    return runner_eval(r, tokens, n, false, NULL, next, e);
}

int lm_runner_next(lm_runner *r, const int32_t *tokens, int n, lm_sampler *s, float *logits, int32_t *next,
                   lm_err *e) {
    if (lm_sampler_greedy(s)) return lm_runner_eval_greedy(r, tokens, n, next, e);
    if (lm_runner_eval(r, tokens, n, false, logits, e)) return -1;
    *next = lm_sample(s, logits);
    return 0;
}
