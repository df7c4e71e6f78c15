/* lookahead.c - the greedy look-ahead (lm_lookahead.h), and the engine's
 * step policy for it (opts.look_ahead).
 *
 * While every running request decodes greedily, step N+1 is queued with its
 * tokens taken from step N's argmax on the backend before step N's ids are
 * read, so a GPU never waits for the engine thread between steps. A built
 * step the policy claims is issued with argmax_later; after its forward the
 * policy queues the next step (en->queued) and only then waits for the ids
 * and hands them out as a plain step does. The queued step is the next
 * step: it may chain another in turn, then hands out its ids.
 *
 * Not when a request could reach its token or context limit within the two
 * steps, when requests wait to prefill, or when handing out step N's ids
 * would take a hybrid's state checkpoint (the copy would queue behind step
 * N+1 and see its state). The queued step's row of a request that stopped
 * on step N is discarded. A queued step holds a reference to each of its
 * requests, so a request retired meanwhile stays readable until then. */
#include "engine_internal.h"

#include <stdlib.h>

int lm_lookahead_queue(lm_model *m, lm_kv_pool *kv, lm_batch_builder *bb, int32_t *ids, lm_err *e) {
    const int n = lm_batch_n_tokens(bb);
    for (int t = 0; t < n; t++) lm_batch_add_out(bb, t);
    lm_batch_set_argmax(bb, ids, NULL, true);
    return lm_batch_forward(bb, m, kv, NULL, e);
}

/* ---- the engine's policy ---- */

void lm_ahead_create(lm_engine *en) {
    en->ahead_on = lm_model_look_ahead(en->m) && lm_engine_opt_on(en, en->o.look_ahead);
    const size_t P = (size_t)en->o.parallel;
    for (int k = 0; k < 2; k++) {
        lm_step *q = &en->ahead[k];
        *q = (lm_step){ .policy = &lm_ahead_policy, .queued = true };
        q->seq_req = q->row_req = lm_xcalloc(P, sizeof *q->seq_req);
        q->ids = lm_xmalloc(P * sizeof *q->ids);
    }
}

void lm_ahead_free(lm_engine *en) {
    for (int k = 0; k < 2; k++) free(en->ahead[k].seq_req), free(en->ahead[k].ids);
}

/* Whether a decode forward for the requests of `reqs` may be queued before
 * the ids of the one in flight for them (or just issued) are read: each
 * decodes greedily with room for two more tokens, and for a hybrid with a
 * prefix cache, reading those ids will not take a state checkpoint (it
 * would be issued after the queued forward and see its state). */
static bool ahead_ok(lm_engine *en, lm_request *const *reqs, int n) {
    if (!en->ahead_on || n == 0 || n != en->n_running) return false;
    for (int i = 0; i < n; i++) {
        const lm_request *r = reqs[i];
        if (r->state != LM_REQ_RUNNING || atomic_load(&r->cancelled) || !lm_req_plain_greedy(r)) return false;
        if (r->n_cached < r->n_prompt || r->n_generated + 2 > r->p.max_tokens || r->n_tokens + 2 > en->o.ctx)
            return false;
        if (lm_cache_policy_may_checkpoint(en, r->n_cached + 1)) return false;
        if (en->spec_mtp && lm_mtp_tracked(r)) return false; /* the head reads its hidden rows */
    }
    /* speculation: only while no sequence would draft (a chained step has none) */
    for (int i = 0; en->spec && i < n; i++)
        if (lm_spec_would_draft(en, reqs[i])) return false;
    return true;
}

bool lm_ahead_claim(lm_engine *en, const lm_step *st) {
    /* a decode step of every running request, all greedy */
    return st->T == st->S && st->n_out == st->S && ahead_ok(en, st->seq_req, st->S);
}

/* Queues the look-ahead forward for reqs: token i is the argmax row i of
 * the forward just issued (for the same requests, in order), at the
 * position after it (n_cached is still the one that forward fed), its ids
 * into the other queued step's buffer; that step is then en->queued, with a
 * reference to each request. The builder is free again: the forward just
 * issued has taken what it needs from it. On an error nothing is queued;
 * the next step meets it again. */
static void ahead_issue(lm_engine *en, lm_request *const *reqs, int n) {
    lm_batch_builder *bb = en->bb;
    lm_batch_reset(bb);
    for (int i = 0; i < n; i++) {
        const lm_request *r = reqs[i];
        lm_batch_add_from_argmax(bb, lm_batch_add_seq(bb, r->seq.blocks, r->slot), r->n_cached + 1);
    }
    lm_step *q = &en->ahead[en->ahead_next];
    lm_err e = { { 0 } };
    if (lm_lookahead_queue(en->m, &en->kv->pool, bb, q->ids, &e)) return;
    for (int i = 0; i < n; i++) {
        q->seq_req[i] = reqs[i]; /* reqs may be the other queued step's: a chain keeps its requests */
        atomic_fetch_add(&reqs[i]->refs, 1);
    }
    q->T = q->S = q->n_out = n;
    en->ahead_next ^= 1;
    en->queued = q;
}

/* A claimed step queues the next unconditionally (it was checked before its
 * forward); a queued one chains another only while that is still safe. Then
 * the ids of this step's forward. */
static void ahead_after_forward(lm_engine *en, lm_step *st) {
    if (!st->queued || ahead_ok(en, st->seq_req, st->S)) ahead_issue(en, st->seq_req, st->S);
    lm_model_wait_argmax(en->m);
}

/* A claimed step hands out as a plain one. A queued step's rows: each
 * request advances by its token, in order, unless it stopped on the step
 * before (its row is past its end). */
static void ahead_hand_out(lm_engine *en, lm_step *st) {
    if (!st->queued) {
        lm_step_hand_out(en, st);
        return;
    }
    const int n = st->S;
    uint64_t discarded = 0;
    for (int i = 0; i < n; i++) {
        lm_request *r = st->seq_req[i];
        if (r->state != LM_REQ_RUNNING) {
            discarded++;
            continue;
        }
        r->step_batch[r->tr.n_steps++] = n;
        r->n_cached++;
        lm_cache_policy_progress(en, r);
        lm_req_take_token(en, r, NULL, st->ids[i]);
    }
    for (int i = 0; i < n; i++) lm_req_unref(st->seq_req[i]);
    lm_step_count(en, n, n, true, discarded);
}

/* Reads the ids of a queued forward nobody will use (the engine stops). */
static void ahead_abandon(lm_engine *en, lm_step *st) {
    lm_model_wait_argmax(en->m);
    for (int i = 0; i < st->S; i++) lm_req_unref(st->seq_req[i]);
}

const lm_step_policy lm_ahead_policy = {
    .name = "look-ahead",
    .argmax_later = true,
    .after_forward = ahead_after_forward,
    .hand_out = ahead_hand_out,
    .abandon = ahead_abandon,
};
