/* spec_mtp.c - the MTP proposer (lm_spec.h): the model's own draft head
 * (lm_arch.h's lm_draft; Qwen3.5's mtp.* layers) guesses the tokens after
 * each sequence's next one.
 *
 * The head at position t reads the main model's final hidden state h_t and
 * the token at t + 1, and guesses t + 2; its attention layer keeps K/V of
 * its own for every position, in a pool beside the model's with the same
 * block size and count, so that a sequence's block table serves both (a
 * prefix-cache hit shares the head's K/V of those blocks too).
 *
 * Per step, for every sequence that speculates with the head:
 *  - before the forward, the forward is asked for the hidden rows of all of
 *    its tokens (en->hidden, the buffer embeddings use);
 *  - after the hand-out, one batched head forward "catches up" every
 *    position whose hidden row is now known and whose next token is known
 *    (positions mtp_n .. n_tokens - 2: its K/V, and on the last row the
 *    guess d1 for the token after t0, the newest token); the hidden row of
 *    the newest position waits in the request for the next step;
 *  - then up to depth - 1 chained forwards, one token per sequence each:
 *    the head at n_tokens - 1 + j with guess d_j and its own last hidden
 *    state in place of the model's (not known before the verify) gives
 *    d_j+1. Their K/V rows are past the accepted position and the next
 *    catch-up overwrites them: the head's rollback.
 * The guesses wait in the request until the next step's proposal takes
 * them (if its newest token is still the one they follow). */
#include "engine_internal.h"

#include "../model/lm_arch.h"

#include <stdlib.h>
#include <string.h>

struct lm_spec_mtp {
    const lm_draft *d;
    lm_kv_cache *kv;          /* the head's own pool */
    lm_batch_builder *bb;     /* its batches */
    int D, cap;               /* width; most tokens of one catch-up */
    float *hid_in;            /* [cap][D] host: the hidden rows a head forward reads */
    float *hid_out;           /* [parallel][D] host: its out rows' hidden states */
    float *hid_prev;          /* [parallel][D] host: the last chain step's */
    int32_t *ids;             /* [parallel] its guesses */
    lm_request **out_req;     /* [parallel] the request of each out row */
    int *h0;                  /* [parallel] hidden index of each batch sequence's first token (-1: none) */
    int *base;                /* [parallel] its position (n_cached before the step) */
};

lm_spec_mtp *lm_mtp_create(lm_engine *en, lm_err *e) {
    const lm_draft *d = lm_model_draft(en->m);
    if (!d) return NULL;
    lm_spec_mtp *M = lm_xcalloc(1, sizeof *M);
    M->d = d;
    if (lm_kv_cache_create(&M->kv, en->m->be, d->kv_layers(en->m), en->m->kv_width, en->kv->pool.block_size,
                           en->kv->pool.n_blocks, NULL, e)) {
        free(M);
        return NULL;
    }
    const size_t P = (size_t)en->o.parallel;
    M->D = en->m->cfg.d_model;
    /* a catch-up covers at most what one forward fed (and a carried
     * position each): within the step budget the warm-up sized the
     * activations for, so a GPU never grows them mid-request */
    M->cap = lm_engine_max_step(en);
    M->bb = lm_batch_builder_create(M->cap, (int)P, (int)P, false);
    M->hid_in = lm_xmalloc((size_t)M->cap * (size_t)M->D * sizeof(float));
    M->hid_out = lm_xmalloc(P * (size_t)M->D * sizeof(float));
    M->hid_prev = lm_xmalloc(P * (size_t)M->D * sizeof(float));
    M->ids = lm_xmalloc(P * sizeof *M->ids);
    M->out_req = lm_xcalloc(P, sizeof *M->out_req);
    M->h0 = lm_xmalloc(P * sizeof *M->h0);
    M->base = lm_xmalloc(P * sizeof *M->base);
    if (!en->hidden) en->hidden = lm_xmalloc((size_t)lm_engine_max_step(en) * (size_t)M->D * sizeof(float));
    return M;
}

size_t lm_mtp_bytes(const lm_spec_mtp *M) {
    return M ? (size_t)M->kv->pool.n_blocks * lm_kv_block_bytes(M->kv) : 0;
}

void lm_mtp_free(lm_spec_mtp *M) {
    if (!M) return;
    lm_kv_cache_free(M->kv);
    lm_batch_builder_free(M->bb);
    free(M->hid_in), free(M->hid_out), free(M->hid_prev), free(M->ids), free(M->out_req), free(M->h0), free(M->base);
    free(M);
}

bool lm_mtp_tracked(const lm_request *r) { return !r->embed && !r->p.no_spec && !r->gm && !r->spec.mtp_off; }

void lm_mtp_before_issue(lm_engine *en, lm_step *st) {
    lm_spec_mtp *M = en->spec_mtp;
    bool any = false;
    for (int s = 0, row = 0; s < st->S; row += st->seq_n[s++]) {
        M->h0[s] = -1;
        lm_request *r = st->seq_req[s];
        if (!lm_mtp_tracked(r)) continue;
        M->h0[s] = lm_batch_n_hidden(en->bb);
        M->base[s] = r->n_cached;
        for (int i = 0; i < st->seq_n[s]; i++) lm_batch_add_hidden(en->bb, row + i);
        any = true;
    }
    if (any) lm_batch_set_hidden(en->bb, en->hidden);
}

/* One head forward of M->bb (hidden rows in M->hid_in): guesses into
 * M->ids, out rows' hidden into M->hid_out. false on an error (speculation
 * just goes without guesses this step). */
static bool head_forward(lm_engine *en, lm_spec_mtp *M) {
    lm_batch_set_argmax(M->bb, M->ids, NULL, false);
    lm_err e = { { 0 } };
    return lm_batch_forward_draft(M->bb, en->m, M->d, &M->kv->pool, M->hid_in, M->hid_out, &e) == 0;
}

int lm_mtp_after_hand_out(lm_engine *en, lm_step *st, const int *known) {
    lm_spec_mtp *M = en->spec_mtp;
    const size_t D = (size_t)M->D;
    lm_batch_reset(M->bb);
    int n_out = 0, n_tok = 0;
    for (int s = 0; s < st->S; s++) {
        lm_request *r = st->seq_req[s];
        if (M->h0[s] < 0 || r->state != LM_REQ_RUNNING) continue;
        lm_spec_req *q = &r->spec;
        q->mtp_draft_at = -1;
        /* hidden rows of real tokens: [base, end_h) */
        const int base = M->base[s];
        const int end_h = LM_MIN(known[s] >= 0 ? known[s] : base + st->seq_n[s], r->n_tokens);
        int start = q->mtp_n;
        if (start < base && !(start == base - 1 && q->hid && q->hid_pos == start))
            start = base; /* a gap (a prefix-cache hit): the head's K/V there are the blocks' */
        const int end = LM_MIN(end_h, r->n_tokens - 1); /* positions whose next token is known */
        if (end <= start) continue;
        if (n_tok + (end - start) > M->cap) break;
        int bs = lm_batch_add_seq(M->bb, r->seq.blocks, -1);
        int last = lm_batch_add_tokens(M->bb, bs, r->tokens + start + 1, start, end - start);
        for (int t = start; t < end; t++) {
            const float *src = t >= base ? en->hidden + (size_t)(M->h0[s] + t - base) * D : q->hid;
            memcpy(M->hid_in + (size_t)(n_tok + t - start) * D, src, D * sizeof(float));
        }
        n_tok += end - start;
        q->mtp_n = end;
        if (end_h > end) { /* the newest position's hidden row waits for its next token */
            if (!q->hid) q->hid = lm_xmalloc(D * sizeof(float));
            memcpy(q->hid, en->hidden + (size_t)(M->h0[s] + end - base) * D, D * sizeof(float));
            q->hid_pos = end;
        }
        if (end == r->n_tokens - 1 && q->want > 0) { /* its last row guesses the token after the newest */
            lm_batch_add_out(M->bb, last);
            M->out_req[n_out++] = r;
        }
    }
    if (n_tok == 0 || !head_forward(en, M)) return 0;
    /* chained guesses while the policy wants more */
    int n = n_out;
    (void)st;
    for (int i = 0; i < n; i++) {
        lm_spec_req *q = &M->out_req[i]->spec;
        q->mtp_draft[0] = M->ids[i];
        q->mtp_n_draft = 1;
        q->mtp_draft_at = M->out_req[i]->n_tokens;
    }
    for (int j = 1;; j++) {
        memcpy(M->hid_prev, M->hid_out, (size_t)n * D * sizeof(float));
        lm_batch_reset(M->bb);
        int k = 0;
        for (int i = 0; i < n; i++) {
            lm_request *r = M->out_req[i];
            lm_spec_req *q = &r->spec;
            if (q->want <= j || r->n_tokens + j > r->cap) continue;
            int bs = lm_batch_add_seq(M->bb, r->seq.blocks, -1);
            int row = lm_batch_add_tokens(M->bb, bs, &q->mtp_draft[j - 1], r->n_tokens - 2 + j, 1);
            lm_batch_add_out(M->bb, row);
            memcpy(M->hid_in + (size_t)k * D, M->hid_prev + (size_t)i * D, D * sizeof(float));
            M->out_req[k++] = r;
        }
        if (k == 0 || !head_forward(en, M)) return n_tok;
        n_tok += k;
        for (int i = 0; i < k; i++) {
            lm_spec_req *q = &M->out_req[i]->spec;
            q->mtp_draft[j] = M->ids[i];
            q->mtp_n_draft = j + 1;
        }
        n = k;
    }
}

int lm_mtp_propose(const lm_request *r, int32_t *draft, int max) {
    const lm_spec_req *q = &r->spec;
    if (q->mtp_draft_at != r->n_tokens) return 0;
    int k = LM_MIN(max, q->mtp_n_draft);
    memcpy(draft, q->mtp_draft, (size_t)k * sizeof *draft);
    return k;
}

int lm_mtp_forward_scratch(lm_engine *en, lm_batch_builder *bb, const float *hidden, lm_err *e) {
    lm_spec_mtp *M = en->spec_mtp;
    LM_ASSERT(lm_batch_n_out(bb) <= en->o.parallel); /* M->hid_out's rows */
    return lm_batch_forward_draft(bb, en->m, M->d, &M->kv->pool, hidden, M->hid_out, e);
}
