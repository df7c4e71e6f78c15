/* engine.c - continuous batching over one model (see lm_engine.h): the
 * scheduler. engine_internal.h lists the files it shares the engine with.
 *
 * One scheduler thread loops: admit waiting requests (FIFO) while the KV
 * cache can hold prompt + max_tokens, drop cancelled ones, then run one
 * step. Blocks for a request's whole budget are reserved at admission, so an
 * admitted request always completes.
 *
 * A step is one forward. Usually it is built here: a decode token for every
 * running sequence first, then prefill chunks of admitted prompts in arrival
 * order until the step's token budget is spent; then issued. But a policy
 * may have issued it already during the last step (the look-ahead queues
 * step N+1 before step N's ids are read): then the step takes that forward
 * as it is. Either way the step's policy (lm_step_policy) finishes it:
 * after_forward (the look-ahead queues the next step; speculation has
 * nothing to do there), then hand_out, which for a plain step advances
 * every sequence by its tokens and gives each sequence whose last row came
 * out its next token. Which policy a built step gets is decided in one
 * place, step(): speculation when it drafted (spec.c), the look-ahead
 * when lm_ahead_claim allows, else plain.
 *
 * Callbacks run on this thread without en->mu: finished and cancelled
 * requests found under the lock are finished after it is dropped. */
#include "engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- request lifetime ---- */

void lm_req_unref(lm_request *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    pthread_mutex_destroy(&r->cb_mu);
    lm_sampler_free(r->sampler);
    free(r->tokens);
    free(r->hashes);
    free(r->step_batch);
    free(r->stop_tokens);
    free(r->ckpt_at);
    lm_embed_pool_free(&r->pool);
    free(r->embedding);
    lm_grammar_matcher_free(r->gm);
    lm_spec_req_free(&r->spec);
    free(r);
}

static void req_emit(lm_request *r, const lm_token_event *ev) {
    pthread_mutex_lock(&r->cb_mu);
    if (!r->released) r->cb(r->user, ev);
    pthread_mutex_unlock(&r->cb_mu);
}

/* Final event and cache blocks back to the pool. The engine's reference is
 * dropped by whoever takes r out of the running set or queue (drop_done,
 * retire), never here: r must stay readable until then. */
static void req_finish(lm_engine *en, lm_request *r, lm_finish why, const char *error) {
    if (r->state == LM_REQ_RUNNING && !r->embed) lm_cache_policy_finish(en, r, why != LM_FINISH_ERROR);
    r->tr.t_submit = r->t_submit;
    r->tr.t_admit = r->t_admit;
    r->tr.t_first = r->t_first;
    r->tr.t_done = lm_now();
    r->tr.n_cached = r->n_hit;
    r->tr.step_batch = r->step_batch;
    lm_token_event ev = { .done = true, .finish = why, .error = error, .n_prompt = r->n_prompt,
                          .n_cached = r->n_hit, .n_generated = r->n_generated,
                          .queue_s = r->t_admit > 0 ? r->t_admit - r->t_submit : lm_now() - r->t_submit,
                          .prefill_s = r->t_first > 0 ? r->t_first - r->t_admit : 0, .trace = &r->tr };
    if (r->embed && why == LM_FINISH_STOP) {
        ev.embedding = r->embedding;
        ev.n_embedding = en->m->cfg.d_model;
    }
    req_emit(r, &ev);
    lm_kv_seq_release(en->kv, &r->seq);
    lm_kv_state_release(en->kv, r->slot);
    lm_dm_end(en, r);
    r->slot = -1;
    r->state = LM_REQ_DONE;
}

/* Finishes r (if not yet) and drops the engine's reference. */
static void retire(lm_engine *en, lm_request *r, lm_finish why, const char *error) {
    if (r->state != LM_REQ_DONE) req_finish(en, r, why, error);
    lm_req_unref(r);
}

void lm_request_cancel(lm_request *r) {
    atomic_store(&r->cancelled, true);
    pthread_mutex_lock(&r->en->mu);
    pthread_cond_signal(&r->en->cv);
    pthread_mutex_unlock(&r->en->mu);
}

void lm_request_release(lm_request *r) {
    pthread_mutex_lock(&r->cb_mu);
    r->released = true;
    pthread_mutex_unlock(&r->cb_mu);
    lm_request_cancel(r);
    lm_req_unref(r);
}

/* ---- tokens ---- */

static bool is_stop_token(const lm_request *r, int32_t tok) {
    for (int i = 0; i < r->p.n_stop_tokens; i++)
        if (r->stop_tokens[i] == tok) return true;
    return false;
}

bool lm_engine_opt_on(const lm_engine *en, int opt) {
    if (opt != 0) return opt > 0;
    size_t free_b = 0, total_b = 0; /* total > 0: a backend with its own memory */
    lm_backend_mem_info(en->m->be, &free_b, &total_b);
    return total_b > 0;
}

bool lm_req_plain_greedy(const lm_request *r) {
    return lm_sampler_plain_greedy(r->sampler) && !r->p.logprobs && r->p.top_logprobs == 0 && !r->gm;
}

/* Most tokens one strict fill appends. */
#define LM_FILL_MAX 32

/* Strict fill (lm_engine_opts): the tokens the grammar forces after r's
 * last one, taken as generated (no logprobs: nothing chose them); the next
 * step feeds them with r's last token in one forward. */
static void strict_fill(lm_engine *en, lm_request *r) {
    int32_t ids[LM_FILL_MAX];
    int room = LM_MIN(LM_MIN(r->p.max_tokens - r->n_generated, en->o.ctx - r->n_tokens), LM_FILL_MAX);
    int n = room > 0 ? lm_grammar_fill(r->gm, ids, room) : 0;
    for (int i = 0; i < n; i++) {
        r->n_generated++;
        en->step_generated++;
        en->grammar_fill_tokens++;
        lm_token_event ev = { .token = ids[i], .has_token = true, .n_prompt = r->n_prompt, .n_generated = r->n_generated };
        req_emit(r, &ev);
        r->tokens[r->n_tokens++] = ids[i];
        lm_sampler_accept(r->sampler, ids[i]);
    }
    if (n && (r->n_generated >= r->p.max_tokens || r->n_tokens >= en->o.ctx)) req_finish(en, r, LM_FINISH_LENGTH, NULL);
}

void lm_req_take_token(lm_engine *en, lm_request *r, const float *logits, int32_t greedy) {
    int32_t tok;
    if (r->gm && r->gm_live && !logits) { /* the look-ahead's argmax under r's mask */
        if (greedy < 0) {
            req_finish(en, r, LM_FINISH_ERROR, "the grammar allows no token of this vocabulary here");
            return;
        }
        tok = greedy;
        if (!is_stop_token(r, tok)) LM_ASSERT(lm_grammar_accept(r->gm, tok));
    } else if (r->gm && r->gm_live) {
        int n;
        const uint32_t *mask = lm_mask_ahead_take(en->ma, r, &n);
        if (!mask) { /* not computed during the forward, or no longer r's */
            const double t0 = lm_now();
            n = lm_grammar_mask(r->gm, en->gmask);
            mask = en->gmask;
            const double dt = lm_now() - t0;
            en->grammar_mask_s += dt;
            en->grammar_wait_s += dt;
        } else {
            en->grammar_masks_ahead++;
        }
        en->grammar_masks++;
        if (n == 0) {
            req_finish(en, r, LM_FINISH_ERROR, "the grammar allows no token of this vocabulary here");
            return;
        }
        tok = lm_sample_masked(r->sampler, logits, en->work, mask);
        if (!is_stop_token(r, tok)) LM_ASSERT(lm_grammar_accept(r->gm, tok));
    } else {
        tok = logits ? lm_sample_adjusted(r->sampler, logits, en->work) : greedy;
        if (r->gm && tok == r->p.grammar_trigger) r->gm_live = true;
    }
    if (r->t_first == 0) r->t_first = lm_now();
    r->n_generated++;
    en->step_generated++;
    if (is_stop_token(r, tok)) {
        req_finish(en, r, LM_FINISH_STOP, NULL);
        return;
    }
    lm_token_event ev = { .token = tok, .has_token = true, .n_prompt = r->n_prompt, .n_generated = r->n_generated };
    if (r->p.logprobs || r->p.top_logprobs > 0) {
        ev.n_top = LM_MIN(r->p.top_logprobs, en->vocab);
        ev.logprob = lm_logprobs(logits, en->vocab, tok, ev.n_top, ev.top_ids, ev.top_logprobs);
    }
    req_emit(r, &ev);
    r->tokens[r->n_tokens++] = tok;
    lm_sampler_accept(r->sampler, tok);
    if (r->n_generated >= r->p.max_tokens || r->n_tokens >= en->o.ctx) req_finish(en, r, LM_FINISH_LENGTH, NULL);
    else if (r->gm && r->gm_live && en->o.strict_fill >= 0) strict_fill(en, r);
}

/* ---- admission ---- */

static int blocks_for(const lm_engine *en, int tokens) {
    return (tokens + en->kv->pool.block_size - 1) / en->kv->pool.block_size;
}

/* Gives r its blocks and state (under en->mu): the prefix cache's hit by
 * reference (cache_policy.c restores the rest of it), fresh blocks for the
 * rest of prompt + max_tokens, a state slot. false (nothing taken) when the
 * pool cannot hold it even after evicting cache-only blocks. */
static bool take_blocks(lm_engine *en, lm_request *r) {
    const int need = r->n_prompt + r->p.max_tokens;
    if (r->embed) { /* fresh blocks only: embeddings bypass the prefix cache */
        int fresh = blocks_for(en, need);
        if (fresh > en->kv->n_free && !lm_cache_policy_make_room(en, fresh)) return false;
        int rc = lm_kv_seq_reserve(en->kv, &r->seq, need, NULL);
        LM_ASSERT(rc == 0);
        r->slot = lm_kv_state_acquire(en->kv);
        return true;
    }
    lm_cache_hit hit;
    lm_cache_policy_lookup(en, r, &hit);
    int fresh = blocks_for(en, need) - hit.ram.n_blocks;
    if (fresh > en->kv->n_free && !lm_cache_policy_make_room(en, fresh)) {
        lm_cache_policy_unpin(en);
        return false;
    }
    lm_kv_seq_share(en->kv, &r->seq, hit.blocks, hit.ram.n_blocks);
    int rc = lm_kv_seq_reserve(en->kv, &r->seq, need, NULL);
    LM_ASSERT(rc == 0);
    /* running slots exist beyond the checkpoints': never -1 for a stateful model */
    r->slot = hit.ram.ckpt >= 0 ? lm_kv_state_take(en->kv) : lm_kv_state_acquire(en->kv);
    lm_cache_policy_restore(en, r, &hit);
    return true;
}

/* Moves queue heads into the running set while they fit (under en->mu).
 * Cancelled heads go to *dead, to be finished after the lock is dropped so
 * that no callback runs under it. */
static void admit(lm_engine *en, lm_request **dead) {
    while (en->q_head && en->n_running < en->o.parallel) {
        lm_request *r = en->q_head;
        if (!atomic_load(&r->cancelled) && !take_blocks(en, r)) break; /* FIFO: nobody overtakes the head */
        en->q_head = r->next;
        if (!en->q_head) en->q_tail = NULL;
        en->n_queued--;
        r->next = NULL;
        if (atomic_load(&r->cancelled)) {
            r->next = *dead;
            *dead = r;
            continue;
        }
        r->t_admit = lm_now();
        r->state = LM_REQ_RUNNING;
        en->running[en->n_running++] = r;
    }
}

static void drop_cancelled(lm_engine *en) {
    int k = 0;
    for (int i = 0; i < en->n_running; i++) {
        lm_request *r = en->running[i];
        if (atomic_load(&r->cancelled)) retire(en, r, LM_FINISH_CANCELLED, NULL);
        else en->running[k++] = r;
    }
    en->n_running = k;
}

static void drop_done(lm_engine *en) {
    int k = 0;
    for (int i = 0; i < en->n_running; i++) {
        if (en->running[i]->state == LM_REQ_DONE) lm_req_unref(en->running[i]);
        else en->running[k++] = en->running[i];
    }
    en->n_running = k;
}

/* ---- the step ---- */

void lm_step_count(lm_engine *en, int T, int S, bool ahead, uint64_t discarded) {
    int bucket = 0;
    while (bucket < 7 && (2 << bucket) <= S) bucket++;
    pthread_mutex_lock(&en->mu);
    en->st.steps++;
    en->st.batch_tokens_total += (uint64_t)T;
    en->st.batch_hist[bucket]++;
    en->st.ahead_steps += ahead;
    en->st.ahead_discarded += discarded;
    pthread_mutex_unlock(&en->mu);
}

/* An embedding request's hidden rows of this step into its pool; at the
 * end of its prompt, the vector in its final event. */
static void embed_progress(lm_engine *en, lm_step *st, int s, lm_request *r) {
    if (st->seq_hn[s]) lm_embed_pool_add(&r->pool, en->hidden + (size_t)st->seq_h0[s] * (size_t)en->m->cfg.d_model,
                                   st->seq_hn[s]);
    if (r->n_cached < r->n_prompt) return;
    if (r->t_first == 0) r->t_first = lm_now();
    r->embedding = lm_xmalloc((size_t)en->m->cfg.d_model * sizeof(float));
    bool ok = lm_embed_pool_end(&r->pool, r->embedding);
    LM_ASSERT(ok); /* lm_pooling_span covers at least one position of a non-empty prompt */
    req_finish(en, r, LM_FINISH_STOP, NULL);
}

void lm_step_advance(lm_engine *en, lm_step *st, int i) {
    lm_request *r = st->seq_req[i];
    if (r->n_cached >= r->n_prompt && r->tr.n_steps < r->p.max_tokens)
        r->step_batch[r->tr.n_steps++] = st->T; /* a decode step */
    r->n_cached += st->seq_n[i];
    if (r->embed) embed_progress(en, st, i, r);
    else lm_cache_policy_progress(en, r);
}

void lm_step_hand_out(lm_engine *en, lm_step *st) {
    lm_step_count(en, st->T, st->S, false, 0);
    for (int i = 0; i < st->S; i++) lm_step_advance(en, st, i);
    for (int i = 0; i < st->n_out; i++)
        lm_req_take_token(en, st->row_req[i], st->want_logits[i] ? st->logits + (size_t)i * en->vocab : NULL,
                          st->ids[i]);
}

static const lm_step_policy plain_policy = { .name = "plain", .hand_out = lm_step_hand_out };

/* Tokens [n_cached, n_cached + n) of r as a new sequence of the step. */
static int step_add(lm_engine *en, lm_step *st, lm_request *r, int n, int *last) {
    int s = lm_batch_add_seq(en->bb, r->seq.blocks, r->slot);
    st->seq_req[s] = r;
    st->seq_n[s] = n;
    st->seq_hn[s] = 0;
    st->S = s + 1;
    *last = lm_batch_add_tokens(en->bb, s, r->tokens + r->n_cached, r->n_cached, n);
    return s;
}

static void step_out(lm_engine *en, lm_step *st, lm_request *r, int row) {
    int o = lm_batch_add_out(en->bb, row);
    st->row_req[o] = r;
    st->n_out = o + 1;
}

/* The hidden rows an embedding request's pooling reads among its tokens of
 * this step (rows row0 ..., positions n_cached ...). */
static void step_hidden(lm_engine *en, lm_step *st, int s, lm_request *r, int row0) {
    int first, count;
    lm_pooling_span(&r->pool.how, r->n_prompt, &first, &count);
    int lo = LM_MAX(first, r->n_cached), hi = LM_MIN(first + count, r->n_cached + st->seq_n[s]);
    if (lo >= hi) return;
    if (!en->hidden)
        en->hidden = lm_xmalloc((size_t)lm_engine_max_step(en) * (size_t)en->m->cfg.d_model * sizeof(float));
    lm_batch_set_hidden(en->bb, en->hidden);
    st->seq_h0[s] = lm_batch_n_hidden(en->bb);
    st->seq_hn[s] = hi - lo;
    for (int p = lo; p < hi; p++) lm_batch_add_hidden(en->bb, row0 + (p - r->n_cached));
}

/* Builds a step into st and en->bb; false when there is nothing to run. */
static bool step_build(lm_engine *en, lm_step *st) {
    lm_batch_reset(en->bb);
    st->queued = st->masked = false;
    st->S = st->n_out = st->n_draft = 0;
    /* while a stream decodes, the step is held to step_tokens so that it
     * does not wait long; prompts alone take prefill_tokens */
    int budget = en->o.prefill_tokens, last;
    for (int i = 0; i < en->n_running; i++)
        if (en->running[i]->n_cached >= en->running[i]->n_prompt) budget = en->o.step_tokens;
    /* decode tokens first: running streams never wait behind a prompt */
    for (int i = 0; i < en->n_running; i++) {
        lm_request *r = en->running[i];
        if (r->n_cached < r->n_prompt) continue;
        /* its last token, and after a strict fill the tokens that follow;
         * every later running request keeps room for its one token */
        int want = r->n_tokens - r->n_cached;
        int n = LM_MAX(1, LM_MIN(want, budget - (en->n_running - 1 - i)));
        int s = step_add(en, st, r, n, &last);
        if (n == want) step_out(en, st, r, last);
        budget -= n;
        /* speculation's proposer may follow r's token with a draft (lm_spec.h);
         * every later running request may still need its token */
        budget -= lm_spec_propose(en, st, s, r, budget - (en->n_running - 1 - i));
    }
    for (int i = 0; i < en->n_running && budget > 0; i++) {
        lm_request *r = en->running[i];
        if (r->n_cached >= r->n_prompt) continue;
        int n = LM_MIN(budget, r->n_prompt - r->n_cached);
        if (!r->embed) n = lm_cache_policy_cut(en, r, n);
        r->tr.n_prefill_chunks++;
        int s = step_add(en, st, r, n, &last);
        budget -= n;
        if (r->embed) step_hidden(en, st, s, r, last - n + 1);
        else if (r->n_cached + n == r->n_prompt) step_out(en, st, r, last);
    }
    st->T = lm_batch_n_tokens(en->bb);
    if (st->T == 0) return false;
    for (int i = 0; i < st->n_out; i++) st->want_logits[i] = !lm_req_plain_greedy(st->row_req[i]);
    return true;
}

/* The built step's forward, as its policy wants its ids. On an error every
 * running request ends with it. */
static bool step_issue(lm_engine *en, lm_step *st) {
    lm_batch_set_argmax(en->bb, st->ids, st->want_logits, st->policy->argmax_later);
    if (st->masked) lm_batch_defer_argmax(en->bb);
    lm_err e = { { 0 } };
    const bool masks = en->ma && lm_mask_ahead_start(en->ma, st, en->bb) > 0;
    const int rc = lm_batch_forward(en->bb, en->m, &en->kv->pool, st->logits, &e);
    if (masks) {
        double mask_s;
        en->grammar_wait_s += lm_mask_ahead_wait(en->ma, &mask_s);
        en->grammar_mask_s += mask_s;
    }
    if (rc == 0) return true;
    for (int i = 0; i < en->n_running; i++) retire(en, en->running[i], LM_FINISH_ERROR, e.msg);
    en->n_running = 0;
    return false;
}

/* One step (the design note above). */
static void step(lm_engine *en) {
    lm_step *st = en->queued; /* issued by the last step's policy */
    en->queued = NULL;
    if (en->spec) lm_spec_step_start(en);
    if (!st) {
        st = &en->cur;
        if (!step_build(en, st)) return;
        st->policy = st->n_draft ? &lm_spec_policy : lm_ahead_claim(en, st) ? &lm_ahead_policy : &plain_policy;
        if (en->spec) lm_spec_before_issue(en, st);
        const double t0 = lm_now();
        if (!step_issue(en, st)) return;
        if (en->spec) lm_spec_after_issue(en, st, lm_now() - t0);
    }
    if (st->policy->after_forward) st->policy->after_forward(en, st);
    st->policy->hand_out(en, st);
    if (en->spec) lm_spec_after_hand_out(en, st);
    drop_done(en);
}

/* ---- the thread ---- */

static void finish_list(lm_engine *en, lm_request *r, lm_finish why) {
    while (r) {
        lm_request *next = r->next;
        retire(en, r, why, NULL);
        r = next;
    }
}

static void *engine_main(void *arg) {
    lm_engine *en = arg;
    for (;;) {
        lm_request *dead = NULL;
        pthread_mutex_lock(&en->mu);
        while (!en->stopping && en->n_running == 0 && !en->q_head && !en->queued) pthread_cond_wait(&en->cv, &en->mu);
        pthread_mutex_unlock(&en->mu);
        lm_cache_policy_prefetch(en); /* disk reads for the queue head, outside the lock */
        pthread_mutex_lock(&en->mu);
        admit(en, &dead);
        bool stop = en->stopping;
        pthread_mutex_unlock(&en->mu);
        finish_list(en, dead, LM_FINISH_CANCELLED);
        if (stop) {
            if (en->queued) en->queued->policy->abandon(en, en->queued);
            en->queued = NULL;
            break;
        }
        drop_cancelled(en);
        step(en);
        pthread_mutex_lock(&en->mu);
        en->st.generated_tokens += en->step_generated;
        en->step_generated = 0;
        en->st.grammar_masks = en->grammar_masks;
        en->st.grammar_mask_s = en->grammar_mask_s;
        en->st.grammar_wait_s = en->grammar_wait_s;
        en->st.grammar_masks_ahead = en->grammar_masks_ahead;
        en->st.grammar_masks_chained = en->grammar_masks_chained;
        en->st.grammar_fill_tokens = en->grammar_fill_tokens;
        en->st.running = en->n_running;
        en->st.kv_blocks_free = en->kv->n_free;
        lm_cache_policy_stats(en);
        pthread_mutex_unlock(&en->mu);
    }
    return NULL;
}

/* ---- public API ---- */

/* Everything create made; the thread is gone and no request is left. */
static void engine_destroy(lm_engine *en) {
    pthread_mutex_destroy(&en->mu);
    pthread_cond_destroy(&en->cv);
    lm_cache_policy_free(en);
    lm_kv_cache_free(en->kv);
    lm_spec_free(en->spec);
    lm_mtp_free(en->spec_mtp);
    lm_dm_free(en->spec_dm);
    lm_model_free(en->dm_model);
    lm_ahead_free(en);
    lm_mask_ahead_free(en->ma);
    lm_batch_builder_free(en->bb);
    free(en->running);
    free(en->cur.seq_req);
    free(en->cur.seq_n);
    free(en->cur.row_req);
    free(en->cur.ids);
    free(en->cur.want_logits);
    lm_backend_host_free(en->m->be, en->cur.logits);
    free(en->cur.seq_h0);
    free(en->cur.seq_hn);
    free(en->hidden);
    free(en->work);
    free(en->gmask);
    free(en);
}

int lm_engine_create(lm_engine **out, lm_model *m, const lm_engine_opts *opts, lm_err *e) {
    *out = NULL;
    lm_engine *en = lm_xcalloc(1, sizeof *en);
    en->m = m;
    en->o = opts ? *opts : (lm_engine_opts){ 0 };
    if (en->o.ctx <= 0 || en->o.ctx > m->cfg.max_pos) en->o.ctx = m->cfg.max_pos;
    if (en->o.parallel <= 0) en->o.parallel = 4;
    if (en->o.max_queue <= 0) en->o.max_queue = 256;
    if (en->o.step_tokens <= 0) en->o.step_tokens = 512;
    if (en->o.step_tokens < en->o.parallel) en->o.step_tokens = en->o.parallel;
    if (en->o.prefill_tokens <= 0) en->o.prefill_tokens = lm_engine_opt_on(en, 0) ? 4096 : en->o.step_tokens;
    if (en->o.prefill_tokens < en->o.step_tokens) en->o.prefill_tokens = en->o.step_tokens;
    if (en->o.kv_tokens <= 0) en->o.kv_tokens = en->o.parallel * en->o.ctx;
    if (en->o.kv_tokens < en->o.ctx) en->o.kv_tokens = en->o.ctx;
    en->vocab = m->cfg.vocab;
    en->bs = 16;
    int n_blocks = 0;
    size_t cache_blocks = 0;
    /* a draft model's weights go on the device before its free memory is measured */
    if (en->o.spec == LM_SPEC_DRAFT &&
        (!en->o.spec_model ? lm_errf(e, "speculation by a draft model without its path") < 0
                           : lm_dm_load(&en->dm_model, en->o.spec_model, m, e) != 0)) {
        free(en);
        return -1;
    }
    if (lm_kv_check_model(m, en->o.kv_type, e) || lm_fit_memory(en, opts, &n_blocks, &cache_blocks, e) ||
        lm_kv_cache_create_for(&en->kv, m, en->o.kv_type, en->bs, n_blocks + (int)cache_blocks,
                               en->o.parallel + en->ckpt_slots + lm_spec_state_slots(&en->o, m, en->stateful),
                               en->ring, e)) {
        lm_model_free(en->dm_model);
        free(en);
        return -1;
    }
    if (lm_cache_policy_create(en, cache_blocks, e) || lm_spec_create(en, e)) {
        lm_cache_policy_free(en);
        lm_kv_cache_free(en->kv);
        lm_dm_free(en->spec_dm);
        lm_model_free(en->dm_model);
        free(en);
        return -1;
    }
    /* output rows: one per sequence, and a draft's after it */
    const size_t P = (size_t)en->o.parallel, R = P * (size_t)(1 + lm_spec_max_draft(en->spec));
    en->bb = lm_batch_builder_create(lm_engine_max_step(en), (int)P, (int)R, en->kv->pool.n_state > 0);
    en->running = lm_xcalloc(P, sizeof *en->running);
    en->cur.seq_req = lm_xcalloc(P, sizeof *en->cur.seq_req);
    en->cur.seq_n = lm_xcalloc(P, sizeof *en->cur.seq_n);
    en->cur.seq_h0 = lm_xcalloc(P, sizeof *en->cur.seq_h0);
    en->cur.seq_hn = lm_xcalloc(P, sizeof *en->cur.seq_hn);
    en->cur.row_req = lm_xcalloc(R, sizeof *en->cur.row_req);
    en->cur.ids = lm_xmalloc(R * sizeof *en->cur.ids);
    en->cur.want_logits = lm_xmalloc(R);
    /* the rows a forward reads back for sampling: pinned on a GPU */
    en->cur.logits = lm_backend_host_alloc(en->m->be, R * (size_t)en->vocab * sizeof(float));
    en->work = lm_xmalloc((size_t)en->vocab * sizeof(float));
    en->gmask = lm_xmalloc((size_t)lm_grammar_mask_words(en->vocab) * sizeof *en->gmask);
    lm_ahead_create(en);
    if (lm_engine_opt_on(en, en->o.mask_ahead)) en->ma = lm_mask_ahead_create(en->vocab, (int)R);
    /* a callback's proposals cannot be foreseen (lm_spec.h); the MTP head
     * reads every step's hidden rows on the host, so its sequences are
     * never the look-ahead's (lookahead.c) */
    if (en->o.spec == LM_SPEC_CALLBACK) en->ahead_on = false;
    pthread_mutex_init(&en->mu, NULL);
    pthread_cond_init(&en->cv, NULL);
    if (lm_fit_warm_up(en, !(opts && opts->prefill_tokens > 0), e)) {
        engine_destroy(en);
        return -1;
    }
    if (en->spec) lm_spec_calibrate(en);
    en->st.kv_blocks_free = en->kv->n_free;
    if (pthread_create(&en->thread, NULL, engine_main, en) != 0) {
        lm_engine_free(en);
        return lm_errf(e, "cannot start the engine thread");
    }
    *out = en;
    return 0;
}

void lm_engine_free(lm_engine *en) {
    if (!en) return;
    if (en->thread) {
        pthread_mutex_lock(&en->mu);
        en->stopping = true;
        pthread_cond_signal(&en->cv);
        pthread_mutex_unlock(&en->mu);
        pthread_join(en->thread, NULL);
    }
    /* the thread is gone: finish what it left */
    for (int i = 0; i < en->n_running; i++) retire(en, en->running[i], LM_FINISH_CANCELLED, NULL);
    finish_list(en, en->q_head, LM_FINISH_CANCELLED);
    engine_destroy(en);
}

int lm_engine_ctx(const lm_engine *en) { return en->o.ctx; }

const char *lm_engine_step_summary(const lm_engine *en, char *buf, size_t n) {
    if (en->o.prefill_tokens > en->o.step_tokens)
        snprintf(buf, n, "steps of %d tokens, %d for prompts alone", en->o.step_tokens, en->o.prefill_tokens);
    else snprintf(buf, n, "steps of %d tokens", en->o.step_tokens);
    return buf;
}

const char *lm_engine_kv_summary(const lm_engine *en, char *buf, size_t n) {
    const lm_kv_pool *p = &en->kv->pool;
    const lm_kv_types t = { p->k_type, p->v_type };
    const size_t per = lm_kv_pool_bytes_per_token(p);
    char name[32];
    lm_kv_types_str(t, name, sizeof name);
    int k = snprintf(buf, n, "KV %s, %.1f KiB a token, %d tokens (%.2f GiB)", name, (double)per / 1024.0,
                     en->o.kv_tokens, (double)per * (double)en->o.kv_tokens / (1024.0 * 1024.0 * 1024.0));
    if (p->ring_blocks > 0 && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "; sliding-window layers in %d-token rings, %.1f KiB a sequence",
                 p->ring_blocks * p->block_size, (double)lm_kv_pool_ring_bytes(p) / 1024.0);
    return buf;
}

/* A new request of a checked prompt (the caller's reference and the engine's). */
static lm_request *req_create(lm_engine *en, const int32_t *prompt, int n_prompt, const lm_gen_params *p,
                              lm_token_cb cb, void *user) {
    lm_request *r = lm_xcalloc(1, sizeof *r);
    r->en = en;
    r->slot = -1;
    r->cap = n_prompt + p->max_tokens;
    r->tokens = lm_xmalloc((size_t)r->cap * sizeof(int32_t));
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    r->n_prompt = r->n_tokens = n_prompt;
    r->p = *p;
    r->stop_tokens = lm_xmalloc((size_t)(p->n_stop_tokens + 1) * sizeof(int32_t));
    if (p->n_stop_tokens) memcpy(r->stop_tokens, p->stop_tokens, (size_t)p->n_stop_tokens * sizeof(int32_t));
    r->p.stop_tokens = r->stop_tokens;
    r->sampler = lm_sampler_create(&p->sampling, en->vocab);
    lm_logit_adjust adj = { .presence_penalty = p->presence_penalty, .frequency_penalty = p->frequency_penalty,
                            .repetition_penalty = p->repetition_penalty, .bias = p->logit_bias,
                            .n_bias = p->n_logit_bias };
    lm_sampler_adjust(r->sampler, &adj, prompt, n_prompt);
    r->p.logit_bias = NULL, r->p.n_logit_bias = 0; /* the sampler has its own copy */
    r->hashes = lm_xmalloc(((size_t)r->cap / (size_t)en->bs + 1) * sizeof(uint64_t));
    r->step_batch = lm_xmalloc((size_t)LM_MAX(p->max_tokens, 1) * sizeof(int32_t));
    lm_cache_policy_plan(en, r, p->prompt_marks, p->n_prompt_marks);
    r->p.prompt_marks = NULL, r->p.n_prompt_marks = 0; /* the caller's; ckpt_at is what is kept */
    r->tr.diverge_pos = -1;
    if (p->grammar) {
        r->gm = lm_grammar_matcher_create(p->grammar, p->grammar_vocab);
        r->gm_live = p->grammar_trigger <= 0;
    }
    r->p.grammar = NULL; /* the matcher holds its own reference */
    r->cb = cb;
    r->user = user;
    atomic_init(&r->refs, 2);
    atomic_init(&r->cancelled, false);
    pthread_mutex_init(&r->cb_mu, NULL);
    r->t_submit = lm_now();
    return r;
}

/* Into the queue, or LM_ENGINE_BUSY (r freed) when it is full. */
static int req_enqueue(lm_engine *en, lm_request *r, lm_request **out, lm_err *e) {
    pthread_mutex_lock(&en->mu);
    if (en->n_queued >= en->o.max_queue) {
        pthread_mutex_unlock(&en->mu);
        atomic_store(&r->refs, 1);
        lm_req_unref(r);
        return lm_errf(e, "server busy: %d requests already waiting", en->o.max_queue), LM_ENGINE_BUSY;
    }
    if (en->q_tail) en->q_tail->next = r;
    else en->q_head = r;
    en->q_tail = r;
    en->n_queued++;
    en->st.requests++;
    en->st.prompt_tokens += (uint64_t)r->n_prompt;
    pthread_cond_signal(&en->cv);
    pthread_mutex_unlock(&en->mu);
    *out = r;
    return LM_ENGINE_OK;
}

static int check_prompt(const lm_engine *en, const int32_t *prompt, int n_prompt, lm_err *e) {
    if (n_prompt <= 0) return lm_errf(e, "the prompt is empty");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= en->vocab)
            return lm_errf(e, "token id %d out of range [0, %d)", prompt[i], en->vocab);
    return 0;
}

int lm_engine_submit(lm_engine *en, const int32_t *prompt, int n_prompt, const lm_gen_params *p,
                     lm_token_cb cb, void *user, lm_request **out, lm_err *e) {
    *out = NULL;
    if (n_prompt <= 0) return lm_errf(e, "the prompt is empty"), LM_ENGINE_ERROR;
    if (p->max_tokens <= 0) return lm_errf(e, "max_tokens must be at least 1"), LM_ENGINE_ERROR;
    if ((int64_t)n_prompt + p->max_tokens > en->o.ctx)
        return lm_errf(e, "prompt (%d tokens) + max_tokens (%d) exceed the context of %d tokens", n_prompt,
                       p->max_tokens, en->o.ctx), LM_ENGINE_ERROR;
    if (check_prompt(en, prompt, n_prompt, e)) return LM_ENGINE_ERROR;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= en->vocab)
            return lm_errf(e, "logit_bias token %d out of range [0, %d)", p->logit_bias[i].token, en->vocab), LM_ENGINE_ERROR;
    if (p->grammar && (!p->grammar_vocab || lm_grammar_vocab_size(p->grammar_vocab) != en->vocab))
        return lm_errf(e, "the grammar's vocabulary does not match the model's %d tokens", en->vocab), LM_ENGINE_ERROR;
    if (p->top_logprobs < 0 || p->top_logprobs > LM_MAX_TOP_LOGPROBS)
        return lm_errf(e, "top_logprobs must be between 0 and %d", LM_MAX_TOP_LOGPROBS), LM_ENGINE_ERROR;
    return req_enqueue(en, req_create(en, prompt, n_prompt, p, cb, user), out, e);
}

int lm_engine_submit_embed(lm_engine *en, const int32_t *prompt, int n_prompt, lm_token_cb cb, void *user,
                           lm_request **out, lm_err *e) {
    *out = NULL;
    const lm_pooling *how = &en->m->pooling;
    if (how->mode == LM_POOL_NONE)
        return lm_errf(e, "this model gives no embeddings: %s", how->source), LM_ENGINE_ERROR;
    if (check_prompt(en, prompt, n_prompt, e)) return LM_ENGINE_ERROR;
    if (n_prompt > en->o.ctx)
        return lm_errf(e, "the input (%d tokens) exceeds the context of %d tokens", n_prompt, en->o.ctx),
               LM_ENGINE_ERROR;
    lm_gen_params p = { .sampling = { .temperature = 0 } };
    lm_request *r = req_create(en, prompt, n_prompt, &p, cb, user);
    r->embed = true;
    lm_embed_pool_begin(&r->pool, how, en->m->cfg.d_model);
    return req_enqueue(en, r, out, e);
}

void lm_engine_get_stats(lm_engine *en, lm_engine_stats *s) {
    pthread_mutex_lock(&en->mu);
    *s = en->st;
    s->queued = en->n_queued;
    s->kv_blocks_total = en->kv->pool.n_blocks;
    pthread_mutex_unlock(&en->mu);
}

lm_disk_cache *lm_engine_disk_cache(lm_engine *en) { return en->dc; }
