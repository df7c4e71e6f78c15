/* lookahead.c - the greedy look-ahead (lm_lookahead.h), and the engine's
 * step policy for it (opts.look_ahead).
 *
 * While every running request decodes greedily, step N+1 is queued with its
 * tokens taken from step N's argmax on the backend before step N's ids are
 * read, so a GPU never waits for the engine thread between steps.
 *
 * Requests under a grammar too: the mask of a row depends on the tokens
 * before it, which reach the host only after step N+1 is queued. So such
 * a step's forward issues no argmax (lm_batch.argmax_masked); once step N's
 * ids are handed out, after_forward computes step N+1's masks while its
 * forward runs and issues the argmax under them on the backend, before
 * queuing step N+2 to take those ids. A strict fill found at a hand-out
 * (its tokens must follow the one the queued step feeds) ends the chain:
 * that step's row is not handed out and the next plain step feeds the
 * fill, as it would have. A built
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
#include <string.h>

int lm_lookahead_queue(lm_model *m, lm_kv_pool *kv, lm_batch_builder *bb, int32_t *ids, bool masked, lm_err *e) {
    const int n = lm_batch_n_tokens(bb);
    for (int t = 0; t < n; t++) lm_batch_add_out(bb, t);
    lm_batch_set_argmax(bb, ids, NULL, true);
    if (masked) lm_batch_defer_argmax(bb);
    return lm_batch_forward(bb, m, kv, NULL, e);
}

/* ---- the engine's policy ---- */

void lm_ahead_create(lm_engine *en) {
    en->ahead_on = lm_model_look_ahead(en->m) && lm_engine_opt_on(en, en->o.look_ahead);
    en->ahead_masked = en->ahead_on && lm_model_masked_look_ahead(en->m);
    const size_t P = (size_t)en->o.parallel;
    for (int k = 0; k < 2; k++) {
        lm_step *q = &en->ahead[k];
        *q = (lm_step){ .policy = &lm_ahead_policy, .queued = true };
        q->seq_req = q->row_req = lm_xcalloc(P, sizeof *q->seq_req);
        q->ids = lm_xmalloc(P * sizeof *q->ids);
        q->allowed = lm_xmalloc(P * sizeof *q->allowed);
    }
    en->cur.allowed = lm_xmalloc(P * sizeof *en->cur.allowed); /* a claimed step has a row a sequence */
    if (en->ahead_masked) {
        en->ahead_masks = lm_xmalloc(P * (size_t)lm_grammar_mask_words(en->vocab) * sizeof *en->ahead_masks);
        en->ahead_rows = lm_xmalloc(P);
    }
}

void lm_ahead_free(lm_engine *en) {
    for (int k = 0; k < 2; k++) free(en->ahead[k].seq_req), free(en->ahead[k].ids), free(en->ahead[k].allowed);
    free(en->cur.allowed);
    free(en->ahead_masks);
    free(en->ahead_rows);
}

/* Whether r's token is the backend's argmax: plain greedy, or greedy
 * under a grammar whose masks the backend applies. */
static bool ahead_greedy(const lm_engine *en, const lm_request *r) {
    if (!r->gm) return lm_req_plain_greedy(r);
    return en->ahead_masked && lm_sampler_plain_greedy(r->sampler) && !r->p.logprobs && r->p.top_logprobs == 0;
}

/* Whether a decode forward for the requests of `reqs` may be queued before
 * the ids of the one in flight for them (or just issued) are read: each
 * decodes greedily with room for two more tokens, has no strict fill's
 * tokens waiting to be fed, and for a hybrid with a prefix cache, reading
 * those ids will not take a state checkpoint (it would be issued after the
 * queued forward and see its state). */
static bool ahead_ok(lm_engine *en, lm_request *const *reqs, int n) {
    if (!en->ahead_on || n == 0 || n != en->n_running) return false;
    for (int i = 0; i < n; i++) {
        const lm_request *r = reqs[i];
        if (r->state != LM_REQ_RUNNING || atomic_load(&r->cancelled) || !ahead_greedy(en, r)) return false;
        if (r->n_cached < r->n_prompt || r->n_generated + 2 > r->p.max_tokens || r->n_tokens + 2 > en->o.ctx)
            return false;
        if (r->n_tokens != r->n_cached + 1) return false; /* a strict fill's tokens wait to be fed */
        if (lm_cache_policy_may_checkpoint(en, r->n_cached + 1)) return false;
        if (en->spec_mtp && lm_mtp_tracked(r)) return false; /* the head reads its hidden rows */
    }
    /* speculation: only while no sequence would draft (a chained step has none) */
    for (int i = 0; en->spec && i < n; i++)
        if (lm_spec_would_draft(en, reqs[i])) return false;
    return true;
}

/* Whether any of the requests has a grammar (live or waiting for its
 * trigger): their forward's argmax waits for the masks. */
static bool any_grammar(lm_request *const *reqs, int n) {
    for (int i = 0; i < n; i++)
        if (reqs[i]->gm) return true;
    return false;
}

bool lm_ahead_claim(lm_engine *en, lm_step *st) {
    /* a decode step of every running request, all greedy */
    if (st->T != st->S || st->n_out != st->S || !ahead_ok(en, st->seq_req, st->S)) return false;
    st->masked = any_grammar(st->row_req, st->n_out);
    for (int i = 0; st->masked && i < st->n_out; i++) st->want_logits[i] = 0;
    return true;
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
    q->masked = any_grammar(reqs, n);
    if (lm_lookahead_queue(en->m, &en->kv->pool, bb, q->ids, q->masked, &e)) return;
    for (int i = 0; i < n; i++) {
        q->seq_req[i] = reqs[i]; /* reqs may be the other queued step's: a chain keeps its requests */
        atomic_fetch_add(&reqs[i]->refs, 1);
    }
    q->T = q->S = q->n_out = n;
    en->ahead_next ^= 1;
    en->queued = q;
}

/* A masked step's argmax: each row of a request under a live grammar
 * takes the mask of where its request now stands (its tokens before the
 * row are handed out by now; the helper's from the forward's start for a
 * claimed step, else computed here while the forward runs), the rest plain
 * greedy. A row whose request has stopped, or whose strict fill's tokens
 * wait to be fed (its token would come before them), is not masked: it
 * is not handed out. false when a mask allows nothing (that request ends
 * at the hand-out). */
static bool ahead_masks(lm_engine *en, lm_step *st) {
    const size_t W = (size_t)lm_grammar_mask_words(en->vocab);
    bool ok = true;
    for (int i = 0; i < st->n_out; i++) {
        lm_request *r = st->row_req[i];
        st->allowed[i] = -1;
        en->ahead_rows[i] = 0;
        if (r->state != LM_REQ_RUNNING || !r->gm || !r->gm_live || r->n_tokens != r->n_cached + 1) continue;
        uint32_t *dst = en->ahead_masks + (size_t)i * W;
        int n;
        const uint32_t *mask = lm_mask_ahead_take(en->ma, r, &n);
        if (mask) {
            memcpy(dst, mask, W * sizeof *dst);
            en->grammar_masks_ahead++;
        } else {
            const double t0 = lm_now();
            n = lm_grammar_mask(r->gm, dst);
            en->grammar_mask_s += lm_now() - t0;
            en->grammar_masks_chained++;
        }
        en->grammar_masks++;
        st->allowed[i] = n;
        en->ahead_rows[i] = 1;
        ok &= n > 0;
    }
    lm_model_argmax_masked(en->m, en->ahead_masks, en->ahead_rows);
    return ok;
}

/* A claimed step queues the next unconditionally (it was checked before its
 * forward); a queued one chains another only while that is still safe.
 * Either only once its masked argmax is issued, whose ids the next one
 * takes. Then the ids of this step's forward. */
static void ahead_after_forward(lm_engine *en, lm_step *st) {
    bool chain = !st->queued || ahead_ok(en, st->seq_req, st->S);
    if (st->masked && !ahead_masks(en, st)) chain = false;
    if (chain) ahead_issue(en, st->seq_req, st->S);
    lm_model_wait_argmax(en->m);
}

/* A row whose mask allowed nothing hands out -1 (lm_req_take_token). */
static void ahead_mark_empty(lm_step *st) {
    for (int i = 0; st->masked && i < st->n_out; i++)
        if (st->allowed[i] == 0) st->ids[i] = -1;
}

/* A claimed step hands out as a plain one. A queued step's rows: each
 * request advances by its token, in order, unless it stopped on the step
 * before (its row is past its end). */
static void ahead_hand_out(lm_engine *en, lm_step *st) {
    ahead_mark_empty(st);
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
        if (r->n_tokens > r->n_cached) continue; /* a strict fill after its last token: the next step feeds it */
        lm_req_take_token(en, r, NULL, st->ids[i]);
    }
    for (int i = 0; i < n; i++) lm_req_unref(st->seq_req[i]);
    lm_step_count(en, n, n, true, discarded);
}

/* Reads the ids of a queued forward nobody will use (the engine stops);
 * a masked one's argmax is issued without masks first. */
static void ahead_abandon(lm_engine *en, lm_step *st) {
    if (st->masked) lm_model_argmax_masked(en->m, NULL, NULL); /* its argmax waited for after_forward */
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
