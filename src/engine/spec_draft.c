/* spec_draft.c - the draft-model proposer (lm_spec.h): a separate, smaller
 * model with the same tokenizer (Qwen3-0.6B for Qwen3-8B, Llama-3.2-1B for
 * Llama-3.1-8B) guesses each sequence's next tokens by decoding them
 * greedily itself.
 *
 * The draft keeps K/V of its own for every position, in a pool beside the
 * model's with the same block size and count, so that a sequence's block
 * table serves both; a recurrent draft (Qwen3.5, or a sliding-window ring)
 * also has a state slot per sequence and one for a snapshot.
 *
 * Per sequence the draft's cache covers positions < dm_n of its tokens.
 * After each step's hand-out, for every sequence the policy will want
 * guesses from (and every one still prefilling where a new sequence would
 * draft, so that the draft keeps pace with the prompt):
 *  - rollback: the guesses the last chain fed are checked against the
 *    tokens the sequence now has; dm_n stays past those that match (an
 *    attention draft's rows after it are simply rewritten later). A
 *    recurrent draft whose fed guesses were not all kept goes back to the
 *    snapshot taken before the chain (its state after the newest token
 *    then) and feeds the accepted tokens again in the next catch-up;
 *  - catch-up: one batched forward over every sequence's tokens
 *    [dm_n, n_tokens) (at most step_tokens in all; the rest next step); the
 *    last row of a sequence that is caught up gives its first guess;
 *  - chain: up to depth - 1 forwards of one token a sequence, each guess
 *    fed to get the next.
 * The guesses wait in the request for the next step's proposal.
 *
 * A prefix-cache hit shares blocks whose draft rows another request wrote:
 * each pool block remembers the chain hash (the prefix cache's) of the
 * tokens its draft rows were computed for, so a new sequence of an
 * attention draft starts past the leading blocks whose hash matches its
 * own; a recurrent draft starts at 0 (its state is not in blocks). The
 * draft is only a proposer: whatever it holds, the verifier decides. */
#include "engine_internal.h"

#include "../tokenizer/lm_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lm_spec_dm {
    lm_model *m;              /* the draft (the engine's en->dm_model) */
    lm_kv_cache *kv;          /* its pool: a block for each of the engine's, the same ids */
    lm_batch_builder *bb;     /* its batches */
    bool stateful;            /* recurrent state or rings: a slot per sequence */
    int cap;                  /* most tokens a draft forward feeds */
    int32_t *ids;             /* [parallel] its guesses */
    lm_request **out_req;     /* [parallel] the request of each out row */
    uint64_t *bhash;          /* [n_blocks] chain hash of the tokens a full block's draft rows are of; 0 none */
    int32_t *zeros;           /* [cap] token ids for lm_dm_time_guess */
    bool off;                 /* a draft forward failed: no more guesses */
};

/* ---- loading ---- */

/* Whether the two tokenizers map every id to the same token. */
static int same_vocab(const lm_tokenizer *a, const lm_tokenizer *b, const char *path, lm_err *e) {
    const int32_t na = lm_tokenizer_n_vocab(a), nb = lm_tokenizer_n_vocab(b);
    if (na != nb)
        return lm_errf(e, "draft model %s: its tokenizer has %d tokens, the model's %d (a draft must share the "
                          "model's tokenizer)", path, nb, na);
    for (int32_t id = 0; id < na; id++) {
        size_t la = 0, lb = 0;
        const char *ta = lm_tokenizer_id_to_token(a, id, &la), *tb = lm_tokenizer_id_to_token(b, id, &lb);
        if (!ta != !tb || la != lb || (ta && memcmp(ta, tb, la)))
            return lm_errf(e, "draft model %s: token %d is \"%.*s\" there and \"%.*s\" in the model's tokenizer (a "
                              "draft must share the model's tokenizer)",
                           path, id, (int)LM_MIN(lb, 40), tb ? tb : "", (int)LM_MIN(la, 40), ta ? ta : "");
    }
    return 0;
}

int lm_dm_load(lm_model **out, const char *path, const lm_model *main, lm_err *e) {
    *out = NULL;
    lm_tokenizer *ta = NULL, *tb = NULL;
    int rc = -1;
    if (!main->path) {
        lm_errf(e, "a draft model needs the model's own path to check their tokenizers");
        goto done;
    }
    if (lm_tokenizer_load(&ta, main->path, e)) goto done;
    if (lm_tokenizer_load(&tb, path, e)) {
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        if (!strstr(msg, path)) lm_errf(e, "draft model %s: %s", path, msg);
        else lm_errf(e, "draft model %s", msg);
        goto done;
    }
    if (same_vocab(ta, tb, path, e)) goto done;
    if (lm_model_load(out, path, main->be, e)) {
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        lm_errf(e, "draft model %s: %s", path, msg);
        goto done;
    }
    rc = 0;
done:
    lm_tokenizer_free(ta);
    lm_tokenizer_free(tb);
    return rc;
}

/* ---- the proposer ---- */

static int dm_ring(const lm_engine_opts *o, const lm_model *dm, int block) {
    return lm_kv_ring_for(dm, block, o->ctx, o->step_tokens);
}

size_t lm_dm_block_bytes(const lm_engine_opts *o, const lm_model *dm, int block) {
    return (size_t)block * lm_kv_model_bytes_per_token(dm, o->kv_type, dm_ring(o, dm, block));
}

size_t lm_dm_state_bytes(const lm_engine_opts *o, const lm_model *dm, int block) {
    /* a live slot and a snapshot a sequence */
    return lm_kv_model_state_bytes(dm, o->kv_type, block, dm_ring(o, dm, block)) * 2 * (size_t)LM_MAX(o->parallel, 1);
}

lm_spec_dm *lm_dm_create(lm_engine *en, lm_model *dm, lm_err *e) {
    if (dm->cfg.vocab > en->vocab + 1024 || en->vocab > dm->cfg.vocab + 1024) {
        lm_errf(e, "draft model %s: %d logits against the model's %d", dm->path ? dm->path : "", dm->cfg.vocab,
                en->vocab);
        return NULL;
    }
    if (lm_kv_check_model(dm, en->o.kv_type, e)) return NULL;
    lm_spec_dm *D = lm_xcalloc(1, sizeof *D);
    D->m = dm;
    const size_t P = (size_t)en->o.parallel;
    if (lm_kv_cache_create_for(&D->kv, dm, en->o.kv_type, en->bs, en->kv->pool.n_blocks, 2 * (int)P,
                               dm_ring(&en->o, dm, en->bs), e)) {
        free(D);
        return NULL;
    }
    D->stateful = D->kv->pool.n_state > 0;
    D->cap = en->o.step_tokens;
    D->bb = lm_batch_builder_create(D->cap, (int)P, (int)P, D->stateful);
    D->ids = lm_xmalloc(P * sizeof *D->ids);
    D->out_req = lm_xcalloc(P, sizeof *D->out_req);
    D->bhash = lm_xcalloc((size_t)en->kv->pool.n_blocks, sizeof *D->bhash);
    D->zeros = lm_xcalloc((size_t)D->cap, sizeof *D->zeros);
    return D;
}

size_t lm_dm_bytes(const lm_spec_dm *D) {
    return D ? (size_t)D->kv->pool.n_blocks * lm_kv_block_bytes(D->kv) +
                   (size_t)D->kv->pool.n_state_slots * lm_kv_state_bytes(D->kv)
             : 0;
}

void lm_dm_free(lm_spec_dm *D) {
    if (!D) return;
    lm_kv_cache_free(D->kv);
    lm_batch_builder_free(D->bb);
    free(D->ids), free(D->out_req), free(D->bhash), free(D->zeros);
    free(D);
}

void lm_dm_end(lm_engine *en, lm_request *r) {
    lm_spec_dm *D = en->spec_dm;
    lm_spec_req *q = &r->spec;
    if (!D) return;
    if (q->dm_slot > 0) lm_kv_state_release(D->kv, q->dm_slot - 1);
    if (q->dm_snap > 0) lm_kv_state_release(D->kv, q->dm_snap - 1);
    q->dm_slot = q->dm_snap = 0;
}

/* The first time r is seen: where its draft rows are already valid (the
 * leading shared blocks whose hash matches) and its state slots. false
 * when a recurrent draft has no slot free (r then goes without guesses). */
static bool dm_start(lm_engine *en, lm_spec_dm *D, lm_request *r) {
    lm_spec_req *q = &r->spec;
    q->dm_started = true;
    q->dm_n = 0, q->dm_at = -1;
    if (D->stateful) {
        int32_t a = lm_kv_state_acquire(D->kv), b = a >= 0 ? lm_kv_state_take(D->kv) : -1;
        if (b < 0) {
            if (a >= 0) lm_kv_state_release(D->kv, a);
            q->dm_off = true;
            return false;
        }
        q->dm_slot = a + 1, q->dm_snap = b + 1;
        return true;
    }
    int b = 0;
    while (b < r->n_hashes && (b + 1) * en->bs <= r->n_cached && D->bhash[r->seq.blocks[b]] == r->hashes[b]) b++;
    q->dm_n = q->dm_rec = b * en->bs;
    return true;
}

/* The fed guesses r kept: dm_n moves past them; a recurrent draft that lost
 * some goes back to its snapshot (the state after the newest token when
 * the chain began). */
static void dm_rollback(lm_spec_dm *D, lm_request *r) {
    lm_spec_req *q = &r->spec;
    if (q->dm_at < 0 || q->dm_fed == 0) return;
    int kept = 0;
    while (kept < q->dm_fed && q->dm_at + kept < r->n_tokens && r->tokens[q->dm_at + kept] == q->dm_draft[kept]) kept++;
    if (D->stateful && kept < q->dm_fed) {
        const int32_t t = q->dm_slot;
        q->dm_slot = q->dm_snap, q->dm_snap = t; /* the snapshot is at dm_at */
        q->dm_n = q->dm_at;
    } else {
        q->dm_n = q->dm_at + kept;
    }
    q->dm_fed = 0;
}

/* Blocks r's draft rows now fully cover, with the hash of their tokens (an
 * attention draft: a later sequence sharing them starts past them). */
static void dm_record(lm_engine *en, lm_spec_dm *D, lm_request *r) {
    lm_spec_req *q = &r->spec;
    for (int b = q->dm_rec / en->bs; (b + 1) * en->bs <= q->dm_n && b < r->n_hashes; b++) {
        D->bhash[r->seq.blocks[b]] = r->hashes[b];
        q->dm_rec = (b + 1) * en->bs;
    }
}

/* One draft forward of D->bb: guesses into D->ids. false on an error (no
 * guesses this step). */
static bool dm_run(lm_spec_dm *D) {
    lm_batch_set_argmax(D->bb, D->ids, NULL, false);
    lm_err e = { { 0 } };
    return lm_batch_forward(D->bb, D->m, &D->kv->pool, NULL, &e) == 0;
}

bool lm_dm_tracked(const lm_engine *en, const lm_request *r) {
    return en->spec_dm && !en->spec_dm->off && !r->embed && !r->p.no_spec && !r->spec.dm_off;
}

int lm_dm_after_hand_out(lm_engine *en, lm_step *st, bool *lag, int *fed) {
    lm_spec_dm *D = en->spec_dm;
    const int max_pos = D->m->cfg.max_pos;
    lm_batch_reset(D->bb);
    int n_out = 0, n_tok = 0, n_fwd = 0;
    *lag = false;
    *fed = 0;
    for (int s = 0; s < st->S; s++) {
        lm_request *r = st->seq_req[s];
        lm_spec_req *q = &r->spec;
        if (r->state != LM_REQ_RUNNING || !lm_dm_tracked(en, r)) continue;
        /* only where wanted (a prompt followed as it is fed: want 1); a
         * sequence left out lags, and catches up when next asked */
        const bool prefilling = r->n_cached < r->n_prompt;
        if (q->want == 0) continue;
        if (!q->dm_started && !dm_start(en, D, r)) continue;
        dm_rollback(D, r);
        q->dm_at = -1;
        const int start = q->dm_n, end = prefilling ? r->n_cached : r->n_tokens;
        int n = end - start;
        if (n <= 0 || end >= max_pos) continue;
        const int room = D->cap - n_tok;
        if (room <= 0) break;
        *lag |= n > 1 + lm_spec_max_draft(en->spec) || prefilling;
        n = LM_MIN(n, room);
        for (int b = start / en->bs; b <= (start + n - 1) / en->bs; b++) D->bhash[r->seq.blocks[b]] = 0;
        const int bs = lm_batch_add_seq(D->bb, r->seq.blocks, D->stateful ? q->dm_slot - 1 : -1);
        const int last = lm_batch_add_tokens(D->bb, bs, r->tokens + start, start, n);
        n_tok += n;
        q->dm_n = start + n;
        if (!prefilling && q->dm_n == r->n_tokens) { /* its last row guesses the token after the newest */
            lm_batch_add_out(D->bb, last);
            D->out_req[n_out++] = r;
        }
    }
    if (n_tok == 0) return 0;
    if (!dm_run(D)) goto broken;
    *fed = n_tok;
    n_fwd = n_out;
    for (int s = 0; s < st->S; s++)
        if (st->seq_req[s]->spec.dm_started && !D->stateful) dm_record(en, D, st->seq_req[s]);
    for (int i = 0; i < n_out; i++) {
        lm_request *r = D->out_req[i];
        lm_spec_req *q = &r->spec;
        q->dm_draft[0] = D->ids[i];
        q->dm_n_draft = 1;
        q->dm_at = r->n_tokens;
        q->dm_fed = 0;
        /* the chain moves a recurrent draft's state past the newest token */
        if (D->stateful && q->want > 1) lm_kv_state_copy(D->kv, q->dm_snap - 1, q->dm_slot - 1);
    }
    /* chained guesses, one token a sequence a forward */
    for (int j = 1, n = n_out;; j++) {
        lm_batch_reset(D->bb);
        int k = 0;
        for (int i = 0; i < n; i++) {
            lm_request *r = D->out_req[i];
            lm_spec_req *q = &r->spec;
            const int pos = r->n_tokens - 1 + j; /* where guess j is fed */
            if (q->want <= j || pos + 1 > r->cap || pos + 1 >= max_pos) continue;
            const int bs = lm_batch_add_seq(D->bb, r->seq.blocks, D->stateful ? q->dm_slot - 1 : -1);
            lm_batch_add_out(D->bb, lm_batch_add_tokens(D->bb, bs, &q->dm_draft[j - 1], pos, 1));
            D->out_req[k++] = r;
        }
        if (k == 0) break;
        if (!dm_run(D)) goto broken;
        n_fwd += k;
        *fed += k;
        for (int i = 0; i < k; i++) {
            lm_spec_req *q = &D->out_req[i]->spec;
            q->dm_draft[j] = D->ids[i];
            q->dm_n_draft = j + 1;
            q->dm_fed = j;
        }
        n = k;
    }
    return n_fwd;
broken:
    /* a failed draft forward (out of device memory): no guesses from here on */
    for (int i = 0; i < en->n_running; i++) en->running[i]->spec.dm_off = true;
    D->off = true;
    return 0;
}

int lm_dm_propose(const lm_request *r, int32_t *draft, int max) {
    const lm_spec_req *q = &r->spec;
    if (q->dm_at != r->n_tokens) return 0;
    const int k = LM_MIN(max, q->dm_n_draft);
    memcpy(draft, q->dm_draft, (size_t)k * sizeof *draft);
    return k;
}

double lm_dm_time_guess(lm_engine *en, const int32_t *table, int pos) {
    lm_spec_dm *D = en->spec_dm;
    const int32_t slot = D->stateful ? lm_kv_state_acquire(D->kv) : -1;
    if (D->stateful && slot < 0) return 0;
    double best = 0;
    for (int rep = 0; rep < 4; rep++) { /* the first fills positions before pos */
        lm_batch_reset(D->bb);
        const int s = lm_batch_add_seq(D->bb, table, slot);
        const int n = rep == 0 ? LM_MIN(pos, D->cap) : 1, at = rep == 0 ? pos - n : pos;
        if (n <= 0) continue;
        lm_batch_add_out(D->bb, lm_batch_add_tokens(D->bb, s, D->zeros, at, n));
        const double t0 = lm_now();
        if (!dm_run(D)) break;
        const double dt = lm_now() - t0;
        if (rep > 0) best = best > 0 ? LM_MIN(best, dt) : dt;
    }
    if (slot >= 0) lm_kv_state_release(D->kv, slot);
    return best;
}
