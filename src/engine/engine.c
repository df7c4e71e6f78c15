/* engine.c - continuous batching over one model (see lm_engine.h).
 *
 * One scheduler thread loops: admit waiting requests (FIFO) while the KV
 * cache can hold prompt + max_tokens, drop cancelled ones, then build one
 * batch: a decode token for every running sequence first, then prefill
 * chunks of admitted prompts in arrival order until the step's token budget
 * is spent. One forward; then each sequence whose last row came out samples
 * its next token and reports it. Blocks for a request's whole budget are
 * reserved at admission, so an admitted request always completes.
 *
 * Prefix cache (opts.cache_ram > 0, lm_prefix_cache.h). At admission the
 * prompt is looked up: the full blocks it shares with cached ones join its
 * block table by reference; a hit ending inside a block copies that block's
 * first rows into a fresh block (copy-on-write); a hybrid model also copies
 * the recurrent-state checkpoint at the hit into the sequence's slot. When
 * the pool is short, cache-only blocks are evicted before the request waits.
 * After every forward the blocks a sequence filled (prompt or generated) are
 * inserted, so concurrent and later requests can share them. Hybrids take
 * checkpoints at the last block boundary <= the prompt end and <= the prompt
 * end - 1 (prefill chunks are cut there), every 1024 prompt tokens when the
 * pool has 16 or more checkpoint slots, and at every block boundary reached
 * while generating (keeping only the latest), so that a next turn - prompt +
 * answer + new message - hits.
 *
 * Greedy look-ahead (opts.look_ahead, lm_model_look_ahead). While every
 * running request decodes greedily, step N+1 is queued with its tokens taken
 * from step N's argmax on the backend before step N's ids are read, so a
 * GPU never waits for this thread between steps. Not when a request could
 * reach its token or context limit within the two steps, when requests wait
 * to prefill, or when handing out step N's ids would take a hybrid's state
 * checkpoint (the copy would queue behind step N+1 and see its state). The
 * queued step's row of a request that stopped on step N is discarded. */
#include "lm_engine.h"

#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lm_kv_cache.h"
#include "lm_prefix_cache.h"

#define HIST_REQUESTS 64          /* requests the miss diagnostics remember */
#define HIST_TOKENS (1u << 22)    /* and at most this many tokens of them */

typedef enum req_state { REQ_QUEUED, REQ_RUNNING, REQ_DONE } req_state;

struct lm_request {
    lm_engine *en;
    int32_t *tokens;        /* prompt, then generated tokens */
    int n_prompt, n_tokens, cap;
    int n_cached;           /* tokens whose K/V are in the cache */
    lm_gen_params p;        /* stop_tokens: the owned copy below; logit_bias: the sampler's */
    int32_t *stop_tokens;
    lm_sampler *sampler;    /* with the request's bias and penalties */
    lm_token_cb cb;
    void *user;
    atomic_int refs;        /* caller + engine */
    atomic_bool cancelled;
    pthread_mutex_t cb_mu;  /* held while calling cb; guards released */
    bool released;
    req_state state;
    lm_kv_seq seq;
    int32_t slot;           /* recurrent-state slot, -1 when the model has none */
    int n_generated;
    double t_submit, t_admit, t_first;
    struct lm_request *next; /* queue link */
    /* prefix cache */
    uint64_t *hashes;       /* [cap / 16 + 1] chain hash of each full block hashed so far */
    int n_hashes;
    int n_ins;              /* leading full blocks known to be in the cache */
    int n_hit;              /* prompt tokens served from the cache */
    bool has_gen_ckpt;      /* this request made the checkpoint on entry gen_ckpt */
    uint64_t gen_ckpt;
    uint64_t hist_id;
    lm_request_trace tr;
    int32_t *step_batch;    /* [max_tokens] for tr.step_batch */
};

struct lm_engine {
    lm_model *m;
    lm_kv_cache *kv;
    lm_engine_opts o;
    int vocab;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    lm_request *q_head, *q_tail; /* waiting for admission */
    int n_queued;
    lm_request **running;        /* [parallel] */
    int n_running;
    /* batch scratch */
    int32_t *b_tokens, *b_pos, *b_seq, *b_rows;
    const int32_t **b_tables;
    int32_t *b_slots;            /* [parallel] recurrent-state slot per batch sequence */
    lm_request **row_req;        /* [parallel] which request owns logits row i */
    lm_request **seq_req;        /* [parallel] request of batch sequence s */
    int *seq_n;                  /* [parallel] its tokens in this batch */
    float *logits;               /* [parallel][V] */
    float *work;                 /* [V] biased/penalised copy for sampling */
    int32_t *greedy;             /* [parallel] argmax of each logits row, from the backend */
    int ckpt_slots;              /* recurrent-state slots set aside for checkpoints */
    uint8_t *want_logits;        /* [parallel] rows whose request needs the full logits */
    lm_engine_stats st;          /* under mu; the engine thread publishes after each step */
    uint64_t step_generated;     /* engine thread only */
    /* prefix cache (engine thread only) */
    lm_prefix_cache *pc;         /* NULL without one */
    lm_req_history *hist;
    bool stateful;               /* the model has recurrent state */
    int bs;                      /* tokens per KV block */
    int32_t *hit_blocks;         /* [ctx / bs + 1] lookup scratch */
    /* greedy look-ahead (opts.look_ahead): the decode forward queued before
     * the last one's ids were read; its tokens came from the backend */
    bool ahead_on;
    int ahead_n;                 /* its sequences; 0: none in flight */
    lm_request **ahead_req;      /* [parallel] their requests, a reference each */
    int32_t *a_ids[2];           /* [parallel] where its ids land, alternating */
    int a_cur;                   /* a_ids[a_cur]: the last one queued */
};

/* ---- request lifetime ---- */

static void req_unref(lm_request *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    pthread_mutex_destroy(&r->cb_mu);
    lm_sampler_free(r->sampler);
    free(r->tokens);
    free(r->hashes);
    free(r->step_batch);
    free(r->stop_tokens);
    free(r);
}

static void req_emit(lm_request *r, const lm_token_event *ev) {
    pthread_mutex_lock(&r->cb_mu);
    if (!r->released) r->cb(r->user, ev);
    pthread_mutex_unlock(&r->cb_mu);
}

/* ---- prefix cache ---- */

/* Chain hashes of r's full blocks among its first n tokens. */
static void hash_blocks(lm_engine *en, lm_request *r, int n) {
    for (int i = r->n_hashes; i < n / en->bs; i++) {
        uint64_t parent = i ? r->hashes[i - 1] : lm_pcache_seed(en->pc);
        r->hashes[i] = lm_pcache_hash(parent, r->tokens + (size_t)i * en->bs, en->bs);
        r->n_hashes = i + 1;
    }
}

static int insert_block(lm_engine *en, lm_request *r, int i) {
    uint64_t parent = i ? r->hashes[i - 1] : lm_pcache_seed(en->pc);
    return lm_pcache_insert(en->pc, r->hashes[i], parent, r->tokens + (size_t)i * en->bs, r->seq.blocks[i]);
}

/* Prompt checkpoints every LM_CKPT_EVERY tokens as well, when the pool has
 * slots to spare (LM_CKPT_EVERY_MIN_SLOTS): a prompt that departs from a long
 * earlier one (a rewritten turn, dropped reasoning) then resumes from the
 * last multiple before the divergence instead of from nothing. */
#define LM_CKPT_EVERY 1024
#define LM_CKPT_EVERY_MIN_SLOTS 16

/* The prompt checkpoint positions of a hybrid: the last block boundary
 * <= n_prompt - 1 (a repeat of the prompt hits it) and <= n_prompt (a prompt
 * that extends this one hits it), and the multiples of LM_CKPT_EVERY. */
static bool is_prompt_ckpt(const lm_engine *en, const lm_request *r, int pos) {
    if (pos <= 0) return false;
    if (en->ckpt_slots >= LM_CKPT_EVERY_MIN_SLOTS && pos % LM_CKPT_EVERY == 0) return true;
    return pos == (r->n_prompt - 1) / en->bs * en->bs || pos == r->n_prompt / en->bs * en->bs;
}

/* Cuts a prefill chunk of n tokens at the next checkpoint position. */
static int ckpt_cut(const lm_engine *en, const lm_request *r, int n) {
    if (!en->pc || !en->stateful) return n;
    int cut = n;
    for (int p = r->n_cached + 1; p < r->n_cached + n; p++)
        if (p % en->bs == 0 && is_prompt_ckpt(en, r, p)) {
            cut = p - r->n_cached;
            break;
        }
    return cut;
}

/* After a forward: the blocks r filled go into the cache, and a hybrid
 * checkpoints its state when it stands on a checkpoint position. */
static void cache_progress(lm_engine *en, lm_request *r) {
    if (!en->pc) return;
    int full = r->n_cached / en->bs;
    hash_blocks(en, r, r->n_cached);
    while (r->n_ins < full && insert_block(en, r, r->n_ins) == 0) r->n_ins++;
    if (!en->stateful || r->n_cached % en->bs || r->n_cached == 0 || r->n_ins < full) return;
    uint64_t h = r->hashes[full - 1];
    if (r->n_cached <= r->n_prompt) {
        if (is_prompt_ckpt(en, r, r->n_cached)) lm_pcache_checkpoint(en->pc, h, r->slot);
        return;
    }
    /* generating: keep only the latest boundary's checkpoint */
    if (lm_pcache_checkpoint(en->pc, h, r->slot) == 1) {
        if (r->has_gen_ckpt) lm_pcache_drop_checkpoint(en->pc, r->gen_ckpt);
        r->has_gen_ckpt = true;
        r->gen_ckpt = h;
    }
}

/* At the end of a request: its full blocks (prompt and generated tokens with
 * K/V) are kept, including any evicted while it ran, most recent first. */
static void cache_finish(lm_engine *en, lm_request *r) {
    if (!en->pc) return;
    cache_progress(en, r);
    int full = r->n_cached / en->bs, ok = 0;
    while (ok < full && insert_block(en, r, ok) == 0) ok++;
    if (ok > 0) lm_pcache_touch(en->pc, r->hashes[ok - 1]);
}

/* Miss diagnostics: the closest earlier request, and why the hit fell short. */
static lm_cache_miss diagnose(lm_engine *en, lm_request *r, const lm_pcache_hit *hit) {
    lm_hist_match hm;
    lm_hist_closest(en->hist, r->tokens, r->n_prompt, &hm);
    lm_request_trace *t = &r->tr;
    t->n_shared = hm.n_shared;
    t->diverge_pos = hm.diverge_pos;
    t->prev_start = hm.prev_start;
    t->n_prev = hm.n_prev;
    memcpy(t->prev_window, hm.prev_window, sizeof t->prev_window);
    int usable = LM_MIN(hm.n_shared, r->n_prompt - 1);
    int aligned = usable / en->bs * en->bs;
    if (en->pc && hit->n_tokens < aligned)
        return en->stateful && hit->kv_blocks * en->bs >= aligned ? LM_MISS_STATE : LM_MISS_EVICTED;
    return hm.diverge_pos >= 0 ? LM_MISS_DIVERGED : LM_MISS_NONE;
}

/* Final event and cache blocks back to the pool. The engine's reference is
 * dropped by whoever takes r out of the running set or queue (drop_done,
 * retire), never here: r must stay readable until then. */
static void req_finish(lm_engine *en, lm_request *r, lm_finish why, const char *error) {
    if (r->state == REQ_RUNNING) {
        if (why != LM_FINISH_ERROR) cache_finish(en, r);
        lm_hist_update(en->hist, r->hist_id, r->tokens, r->n_tokens);
    }
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
    req_emit(r, &ev);
    lm_kv_seq_release(en->kv, &r->seq);
    lm_kv_state_release(en->kv, r->slot);
    r->slot = -1;
    r->state = REQ_DONE;
}

/* Finishes r (if not yet) and drops the engine's reference. */
static void retire(lm_engine *en, lm_request *r, lm_finish why, const char *error) {
    if (r->state != REQ_DONE) req_finish(en, r, why, error);
    req_unref(r);
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
    req_unref(r);
}

/* ---- sampling ---- */

static bool is_stop_token(const lm_request *r, int32_t tok) {
    for (int i = 0; i < r->p.n_stop_tokens; i++)
        if (r->stop_tokens[i] == tok) return true;
    return false;
}

/* One sampled token for r: report it, append it, finish when due. */
/* A request whose next token is the argmax of the model's logits, which the
 * backend computes without copying the logits out. */
static bool plain_greedy(const lm_request *r) {
    return lm_sampler_plain_greedy(r->sampler) && !r->p.logprobs && r->p.top_logprobs == 0;
}

/* logits NULL: a plain-greedy request, whose token is `greedy`. */
static void take_token(lm_engine *en, lm_request *r, const float *logits, int32_t greedy) {
    int32_t tok = logits ? lm_sample_adjusted(r->sampler, logits, en->work) : greedy;
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
}

/* ---- scheduling ---- */

static int blocks_for(const lm_engine *en, int tokens) {
    return (tokens + en->kv->pool.block_size - 1) / en->kv->pool.block_size;
}

/* Gives r its blocks and state (under en->mu): the prefix cache's hit by
 * reference, copy-on-write of a partly shared block, the state checkpoint,
 * fresh blocks for the rest of prompt + max_tokens. false (nothing taken)
 * when the pool cannot hold it even after evicting cache-only blocks. */
static bool take_blocks(lm_engine *en, lm_request *r) {
    int need = r->n_prompt + r->p.max_tokens;
    lm_pcache_hit hit = { .cow_block = -1, .ckpt = -1 };
    double t0 = lm_now();
    if (en->pc) {
        hash_blocks(en, r, r->n_prompt);
        lm_pcache_lookup(en->pc, r->tokens, r->n_prompt, r->hashes, en->stateful, &hit, en->hit_blocks);
    }
    double t1 = lm_now();
    int fresh = blocks_for(en, need) - hit.n_blocks;
    if (fresh > en->kv->n_free && !(en->pc && lm_pcache_make_room(en->pc, fresh))) {
        if (en->pc) lm_pcache_unpin(en->pc);
        return false;
    }
    lm_kv_seq_share(en->kv, &r->seq, en->hit_blocks, hit.n_blocks);
    int rc = lm_kv_seq_reserve(en->kv, &r->seq, need, NULL);
    LM_ASSERT(rc == 0);
    /* running slots exist beyond the checkpoints': never -1 for a stateful model */
    r->slot = hit.ckpt >= 0 ? lm_kv_state_take(en->kv) : lm_kv_state_acquire(en->kv);
    if (hit.cow_block >= 0)
        lm_kv_block_copy_rows(en->kv, r->seq.blocks[hit.n_blocks], hit.cow_block, hit.n_tokens % en->bs);
    if (hit.ckpt >= 0) lm_kv_state_copy(en->kv, r->slot, hit.ckpt);
    if (en->pc) lm_pcache_unpin(en->pc);
    r->tr.lookup_s = t1 - t0;
    r->tr.restore_s = lm_now() - t1;
    r->n_cached = r->n_hit = hit.n_tokens;
    r->n_ins = hit.n_blocks;
    r->tr.miss = diagnose(en, r, &hit);
    r->hist_id = lm_hist_add(en->hist, r->tokens, r->n_prompt);
    if (en->pc) {
        en->st.cache_lookup_tokens += (uint64_t)r->n_prompt;
        en->st.cache_hit_tokens += (uint64_t)hit.n_tokens;
    }
    en->st.miss_diverged += r->tr.miss == LM_MISS_DIVERGED;
    en->st.miss_evicted += r->tr.miss == LM_MISS_EVICTED;
    en->st.miss_state += r->tr.miss == LM_MISS_STATE;
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
        r->state = REQ_RUNNING;
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
        if (en->running[i]->state == REQ_DONE) req_unref(en->running[i]);
        else en->running[k++] = en->running[i];
    }
    en->n_running = k;
}

/* Adds tokens [from, from + n) of r to the batch; returns the row of the last. */
static int add_tokens(lm_engine *en, int *T, int s, lm_request *r, int from, int n) {
    for (int i = 0; i < n; i++) {
        en->b_tokens[*T] = r->tokens[from + i];
        en->b_pos[*T] = from + i;
        en->b_seq[*T] = s;
        (*T)++;
    }
    return *T - 1;
}

/* Whether a decode forward for the requests of `reqs` may be queued before
 * the ids of the one in flight for them (or just issued) are read: each
 * decodes greedily with room for two more tokens, and for a hybrid with a
 * prefix cache, reading those ids will not take a state checkpoint (it
 * would be issued after the queued forward and see its state). */
static bool ahead_ok(const lm_engine *en, lm_request *const *reqs, int n) {
    if (!en->ahead_on || n == 0 || n != en->n_running) return false;
    for (int i = 0; i < n; i++) {
        const lm_request *r = reqs[i];
        if (r->state != REQ_RUNNING || atomic_load(&r->cancelled) || !plain_greedy(r)) return false;
        if (r->n_cached < r->n_prompt || r->n_generated + 2 > r->p.max_tokens || r->n_tokens + 2 > en->o.ctx)
            return false;
        if (en->stateful && en->pc && (r->n_cached + 1) % en->bs == 0) return false;
    }
    return true;
}

/* Queues the look-ahead forward for reqs: token i is the argmax row i of
 * the forward just issued (for the same requests, in order), at the
 * position after it (n_cached is still the one that forward fed), its ids
 * into the other a_ids; it is then the one in flight, with a reference to
 * each request. The batch arrays are free again: the forward just issued
 * has taken what it needs from them. On an error nothing is queued; the
 * next step meets it again. */
static void ahead_issue(lm_engine *en, lm_request *const *reqs, int n) {
    for (int i = 0; i < n; i++) {
        lm_request *r = reqs[i];
        en->b_pos[i] = r->n_cached + 1;
        en->b_seq[i] = i;
        en->b_rows[i] = i;
        en->b_tables[i] = r->seq.blocks;
        en->b_slots[i] = r->slot;
    }
    const int next = en->a_cur ^ 1;
    lm_batch b = { .n_tokens = n, .tokens = NULL, .pos = en->b_pos, .seq = en->b_seq, .n_seqs = n,
                   .block_tables = en->b_tables, .state_slot = en->kv->pool.n_state ? en->b_slots : NULL,
                   .n_out = n, .out_rows = en->b_rows, .out_argmax = en->a_ids[next], .argmax_later = true };
    lm_err e = { { 0 } };
    if (lm_model_forward(en->m, &en->kv->pool, &b, NULL, &e)) return;
    for (int i = 0; i < n; i++) {
        en->ahead_req[i] = reqs[i];
        atomic_fetch_add(&reqs[i]->refs, 1);
    }
    en->ahead_n = n, en->a_cur = next;
}

/* A forward of T tokens over S sequences in the stats (under en->mu). */
static void count_step(lm_engine *en, int T, int S, bool ahead, uint64_t discarded) {
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

/* The look-ahead forward in flight becomes this step: perhaps queue the
 * next one behind it, then read its ids and hand them out. */
static void step_ahead(lm_engine *en) {
    const int n = en->ahead_n;
    const int32_t *ids = en->a_ids[en->a_cur];
    lm_request **reqs = en->ahead_req; /* a chained forward is for the same requests */
    en->ahead_n = 0;
    if (ahead_ok(en, reqs, n)) ahead_issue(en, reqs, n);
    lm_model_wait_argmax(en->m);
    uint64_t discarded = 0;
    for (int i = 0; i < n; i++) {
        lm_request *r = reqs[i];
        if (r->state != REQ_RUNNING) { /* it stopped on the step before: this row is past its end */
            discarded++;
            continue;
        }
        r->step_batch[r->tr.n_steps++] = n;
        r->n_cached++;
        cache_progress(en, r);
        take_token(en, r, NULL, ids[i]);
    }
    for (int i = 0; i < n; i++) req_unref(reqs[i]);
    count_step(en, n, n, true, discarded);
    drop_done(en);
}

/* Reads the ids of a look-ahead forward nobody will use (the engine stops). */
static void ahead_drain(lm_engine *en) {
    if (!en->ahead_n) return;
    lm_model_wait_argmax(en->m);
    for (int i = 0; i < en->ahead_n; i++) req_unref(en->ahead_req[i]);
    en->ahead_n = 0;
}

static void step(lm_engine *en) {
    if (en->ahead_n) {
        step_ahead(en);
        return;
    }
    int T = 0, n_out = 0, S = 0, budget = en->o.step_tokens;
    /* decode tokens first: running streams never wait behind a prompt */
    for (int i = 0; i < en->n_running; i++) {
        lm_request *r = en->running[i];
        if (r->n_cached < r->n_prompt) continue;
        en->b_tables[S] = r->seq.blocks;
        en->b_slots[S] = r->slot;
        en->seq_req[S] = r;
        en->seq_n[S] = 1;
        en->b_rows[n_out] = add_tokens(en, &T, S++, r, r->n_cached, 1);
        en->row_req[n_out++] = r;
        budget--;
    }
    for (int i = 0; i < en->n_running && budget > 0; i++) {
        lm_request *r = en->running[i];
        if (r->n_cached >= r->n_prompt) continue;
        int n = ckpt_cut(en, r, LM_MIN(budget, r->n_prompt - r->n_cached));
        r->tr.n_prefill_chunks++;
        en->b_tables[S] = r->seq.blocks;
        en->b_slots[S] = r->slot;
        en->seq_req[S] = r;
        en->seq_n[S] = n;
        int last = add_tokens(en, &T, S++, r, r->n_cached, n);
        budget -= n;
        if (r->n_cached + n == r->n_prompt) {
            en->b_rows[n_out] = last;
            en->row_req[n_out++] = r;
        }
    }
    if (T == 0) return;
    for (int i = 0; i < n_out; i++) en->want_logits[i] = !plain_greedy(en->row_req[i]);
    /* a decode step of every running request, all greedy: the next step can go ahead of its ids */
    const bool ahead = T == S && n_out == S && ahead_ok(en, en->seq_req, S);
    lm_batch b = { T, en->b_tokens, en->b_pos, en->b_seq, S, en->b_tables,
                   en->kv->pool.n_state ? en->b_slots : NULL, n_out, en->b_rows, en->greedy, en->want_logits,
                   ahead };
    lm_err e = { { 0 } };
    if (lm_model_forward(en->m, &en->kv->pool, &b, en->logits, &e)) {
        for (int i = 0; i < en->n_running; i++) retire(en, en->running[i], LM_FINISH_ERROR, e.msg);
        en->n_running = 0;
        return;
    }
    if (ahead) {
        ahead_issue(en, en->seq_req, S);
        lm_model_wait_argmax(en->m);
    }
    count_step(en, T, S, false, 0);
    for (int i = 0; i < S; i++) {
        lm_request *r = en->seq_req[i];
        if (r->n_cached >= r->n_prompt) r->step_batch[r->tr.n_steps++] = T; /* a decode step */
        r->n_cached += en->seq_n[i];
        cache_progress(en, r);
    }
    for (int i = 0; i < n_out; i++)
        take_token(en, en->row_req[i], en->want_logits[i] ? en->logits + (size_t)i * en->vocab : NULL, en->greedy[i]);
    drop_done(en);
}

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
        admit(en, &dead);
        while (!en->stopping && en->n_running == 0 && !en->q_head && !dead && !en->ahead_n) {
            pthread_cond_wait(&en->cv, &en->mu);
            admit(en, &dead);
        }
        bool stop = en->stopping;
        pthread_mutex_unlock(&en->mu);
        finish_list(en, dead, LM_FINISH_CANCELLED);
        if (stop) {
            ahead_drain(en);
            break;
        }
        drop_cancelled(en);
        step(en);
        pthread_mutex_lock(&en->mu);
        en->st.generated_tokens += en->step_generated;
        en->step_generated = 0;
        en->st.running = en->n_running;
        en->st.kv_blocks_free = en->kv->n_free;
        if (en->pc) {
            lm_pcache_stats ps;
            lm_pcache_get_stats(en->pc, &ps);
            en->st.cache_blocks = ps.blocks;
            en->st.cache_checkpoints = ps.checkpoints;
            en->st.cache_bytes = ps.bytes;
            en->st.cache_evicted_blocks = ps.evicted_blocks;
        }
        pthread_mutex_unlock(&en->mu);
    }
    return NULL;
}

/* ---- public API ---- */

/* On a backend with its own memory (a GPU) the KV pool is allocated up
 * front, and the default (parallel * ctx tokens at the model's full context)
 * can be far beyond it. Shrinks the KV tokens, and the context if even one
 * sequence would not fit, to 90 % of the free memory (the rest is for
 * activations and workspaces), saying so; an explicit kv_tokens that does not
 * fit is an error with the numbers. Admission then keeps requests within it. */
static int fit_device_memory(lm_engine *en, const lm_model *m, const lm_engine_opts *opts, size_t block_bytes,
                             size_t state_bytes, size_t cache_blocks, int ckpts, int *n_blocks, lm_err *e) {
    size_t free_b = 0, total_b = 0;
    lm_backend_mem_info(m->be, &free_b, &total_b);
    if (total_b == 0) return 0; /* host memory: pages are touched as they are used */
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const size_t budget = free_b / 10 * 9, block = (size_t)en->bs;
    const size_t fixed = (size_t)(en->o.parallel + ckpts) * state_bytes + cache_blocks * block_bytes;
    const size_t want = (size_t)*n_blocks * block_bytes + fixed;
    if (want <= budget) return 0;
    if (opts && opts->kv_tokens > 0)
        return lm_errf(e, "a KV cache of %d tokens (plus the prefix cache) needs %.2f GiB; the GPU has %.2f GiB free of %.2f",
                       en->o.kv_tokens, want / gib, free_b / gib, total_b / gib);
    size_t fit_blocks = budget > fixed ? (budget - fixed) / block_bytes : 0;
    fit_blocks = fit_blocks > (size_t)en->o.parallel ? fit_blocks - (size_t)en->o.parallel : 0;
    if (fit_blocks * block < 256)
        return lm_errf(e, "a KV cache of 256 tokens and the prefix cache and state slots (%.2f GiB) do not fit in the "
                       "GPU's %.2f GiB free of %.2f (try a smaller --cache-ram)",
                       (double)(fixed + 16 * block_bytes) / gib, free_b / gib, total_b / gib);
    en->o.kv_tokens = (int)LM_MIN(fit_blocks * block, (size_t)INT32_MAX / 2);
    if (en->o.ctx > en->o.kv_tokens) en->o.ctx = en->o.kv_tokens;
    *n_blocks = (en->o.kv_tokens + (int)block - 1) / (int)block + en->o.parallel;
    fprintf(stderr, "lumen: KV cache sized to %d tokens (context %d) to fit the GPU's %.2f GiB free\n",
            en->o.kv_tokens, en->o.ctx, free_b / gib);
    return 0;
}

/* lm_engine_opts.warmup: a prefill of the step budget (capped by the
 * context and the pool) on a scratch sequence, with as many output rows as
 * a decode step of every running sequence asks for; then the sequence is
 * released. The prefix cache never sees it. */
static int warm_up(lm_engine *en, lm_err *e) {
    size_t free_b = 0, total_b = 0;
    lm_backend_mem_info(en->m->be, &free_b, &total_b);
    if (en->o.warmup < 0 || (en->o.warmup == 0 && total_b == 0)) return 0;
    const int T = LM_MIN(LM_MIN(en->o.step_tokens, en->o.ctx), en->o.kv_tokens);
    const int n_out = LM_MIN(en->o.parallel, T);
    lm_kv_seq seq = { 0 };
    if (lm_kv_seq_reserve(en->kv, &seq, T, e)) return -1;
    int32_t slot = en->stateful ? lm_kv_state_acquire(en->kv) : -1;
    int32_t *tok = lm_xcalloc((size_t)T, sizeof *tok), *pos = lm_xmalloc((size_t)T * sizeof *pos);
    int32_t *sq = lm_xcalloc((size_t)T, sizeof *sq), *rows = lm_xmalloc((size_t)n_out * sizeof *rows);
    int32_t *ids = lm_xmalloc((size_t)n_out * sizeof *ids);
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int i = 0; i < n_out; i++) rows[i] = T - n_out + i;
    const int32_t *table = seq.blocks;
    lm_batch b = { .n_tokens = T, .tokens = tok, .pos = pos, .seq = sq, .n_seqs = 1, .block_tables = &table,
                   .state_slot = slot >= 0 ? &slot : NULL, .n_out = n_out, .out_rows = rows, .out_argmax = ids };
    int rc = lm_model_forward(en->m, &en->kv->pool, &b, NULL, e);
    free(tok), free(pos), free(sq), free(rows), free(ids);
    if (slot >= 0) lm_kv_state_release(en->kv, slot);
    lm_kv_seq_release(en->kv, &seq);
    if (rc && e) {
        char why[sizeof e->msg];
        snprintf(why, sizeof why, "%s", e->msg);
        lm_errf(e, "warm-up forward of %d tokens failed: %s", T, why);
    }
    return rc;
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
    if (en->o.kv_tokens <= 0) en->o.kv_tokens = en->o.parallel * en->o.ctx;
    if (en->o.kv_tokens < en->o.ctx) en->o.kv_tokens = en->o.ctx;
    en->vocab = m->cfg.vocab;
    int block = 16;
    en->bs = block;
    /* one spare block per sequence: budgets rarely end on a block boundary */
    int n_blocks = (en->o.kv_tokens + block - 1) / block + en->o.parallel;
    /* the prefix cache's blocks and checkpoint slots come on top */
    int64_t floats[64];
    int n_state = lm_model_state_spec(m, floats, 64);
    size_t state_bytes = 0, block_bytes = (size_t)2 * (size_t)m->n_kv_layers * (size_t)block * (size_t)m->kv_width * sizeof(float);
    for (int i = 0; i < n_state; i++) state_bytes += (size_t)floats[i] * sizeof(float);
    en->stateful = n_state > 0;
    size_t cache_blocks = en->o.cache_ram / block_bytes;
    int ckpts = 0;
    if (cache_blocks > (size_t)(INT32_MAX / 2 - n_blocks)) cache_blocks = (size_t)(INT32_MAX / 2 - n_blocks);
    if (state_bytes && cache_blocks) {
        /* checkpoint slots for up to half the budget (at least one when it fits next to a block) */
        size_t c = en->o.cache_ram / 2 / state_bytes;
        if (c == 0 && en->o.cache_ram >= state_bytes + block_bytes) c = 1;
        ckpts = (int)LM_MIN(c, (size_t)4096);
    }
    en->ckpt_slots = ckpts;
    if (fit_device_memory(en, m, opts, block_bytes, state_bytes, cache_blocks, ckpts, &n_blocks, e)) {
        free(en);
        return -1;
    }
    if (lm_kv_cache_create_for(&en->kv, m, block, n_blocks + (int)cache_blocks, en->o.parallel + ckpts, e)) {
        free(en);
        return -1;
    }
    if (cache_blocks) {
        struct { int64_t vocab, layers, kv_layers, kv_width, max_pos; } id = {
            m->cfg.vocab, m->cfg.n_layers, m->n_kv_layers, m->kv_width, m->cfg.max_pos };
        uint64_t seed = lm_pcache_model_seed(m->path, &id, sizeof id, m->weight_bytes);
        en->pc = lm_pcache_create(en->kv, en->o.cache_ram, ckpts, seed);
    }
    if (warm_up(en, e)) {
        lm_pcache_free(en->pc);
        lm_kv_cache_free(en->kv);
        free(en);
        return -1;
    }
    en->hist = lm_hist_create(HIST_REQUESTS, HIST_TOKENS);
    en->hit_blocks = lm_xmalloc(((size_t)en->o.ctx / (size_t)block + 2) * sizeof(int32_t));
    int P = en->o.parallel, B = en->o.step_tokens;
    en->running = lm_xcalloc((size_t)P, sizeof *en->running);
    en->b_tokens = lm_xmalloc((size_t)B * sizeof(int32_t));
    en->b_pos = lm_xmalloc((size_t)B * sizeof(int32_t));
    en->b_seq = lm_xmalloc((size_t)B * sizeof(int32_t));
    en->b_rows = lm_xmalloc((size_t)P * sizeof(int32_t));
    en->b_tables = lm_xcalloc((size_t)P, sizeof *en->b_tables);
    en->b_slots = lm_xcalloc((size_t)P, sizeof *en->b_slots);
    en->row_req = lm_xcalloc((size_t)P, sizeof *en->row_req);
    en->seq_req = lm_xcalloc((size_t)P, sizeof *en->seq_req);
    en->seq_n = lm_xcalloc((size_t)P, sizeof *en->seq_n);
    en->logits = lm_xmalloc((size_t)P * (size_t)en->vocab * sizeof(float));
    en->work = lm_xmalloc((size_t)en->vocab * sizeof(float));
    en->greedy = lm_xmalloc((size_t)P * sizeof(int32_t));
    en->want_logits = lm_xmalloc((size_t)P);
    {
        size_t free_b = 0, total_b = 0;
        lm_backend_mem_info(m->be, &free_b, &total_b);
        en->ahead_on = lm_model_look_ahead(m) && (en->o.look_ahead > 0 || (en->o.look_ahead == 0 && total_b > 0));
    }
    en->ahead_req = lm_xcalloc((size_t)P, sizeof *en->ahead_req);
    for (int i = 0; i < 2; i++) en->a_ids[i] = lm_xmalloc((size_t)P * sizeof(int32_t));
    pthread_mutex_init(&en->mu, NULL);
    pthread_cond_init(&en->cv, NULL);
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
    pthread_mutex_destroy(&en->mu);
    pthread_cond_destroy(&en->cv);
    lm_pcache_free(en->pc);
    lm_hist_free(en->hist);
    free(en->hit_blocks);
    lm_kv_cache_free(en->kv);
    free(en->ahead_req), free(en->a_ids[0]), free(en->a_ids[1]);
    free(en->running);
    free(en->b_tokens);
    free(en->b_pos);
    free(en->b_seq);
    free(en->b_rows);
    free(en->b_tables);
    free(en->b_slots);
    free(en->row_req);
    free(en->seq_req);
    free(en->seq_n);
    free(en->logits);
    free(en->work);
    free(en->greedy);
    free(en->want_logits);
    free(en);
}

int lm_engine_ctx(const lm_engine *en) { return en->o.ctx; }

int lm_engine_submit(lm_engine *en, const int32_t *prompt, int n_prompt, const lm_gen_params *p,
                     lm_token_cb cb, void *user, lm_request **out, lm_err *e) {
    *out = NULL;
    if (n_prompt <= 0) return lm_errf(e, "the prompt is empty"), LM_ENGINE_ERROR;
    if (p->max_tokens <= 0) return lm_errf(e, "max_tokens must be at least 1"), LM_ENGINE_ERROR;
    if ((int64_t)n_prompt + p->max_tokens > en->o.ctx)
        return lm_errf(e, "prompt (%d tokens) + max_tokens (%d) exceed the context of %d tokens", n_prompt,
                       p->max_tokens, en->o.ctx), LM_ENGINE_ERROR;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= en->vocab)
            return lm_errf(e, "token id %d out of range [0, %d)", prompt[i], en->vocab), LM_ENGINE_ERROR;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= en->vocab)
            return lm_errf(e, "logit_bias token %d out of range [0, %d)", p->logit_bias[i].token, en->vocab), LM_ENGINE_ERROR;
    if (p->top_logprobs < 0 || p->top_logprobs > LM_MAX_TOP_LOGPROBS)
        return lm_errf(e, "top_logprobs must be between 0 and %d", LM_MAX_TOP_LOGPROBS), LM_ENGINE_ERROR;

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
    r->step_batch = lm_xmalloc((size_t)p->max_tokens * sizeof(int32_t));
    r->tr.diverge_pos = -1;
    r->cb = cb;
    r->user = user;
    atomic_init(&r->refs, 2);
    atomic_init(&r->cancelled, false);
    pthread_mutex_init(&r->cb_mu, NULL);
    r->t_submit = lm_now();

    pthread_mutex_lock(&en->mu);
    if (en->n_queued >= en->o.max_queue) {
        pthread_mutex_unlock(&en->mu);
        atomic_store(&r->refs, 1);
        req_unref(r);
        return lm_errf(e, "server busy: %d requests already waiting", en->o.max_queue), LM_ENGINE_BUSY;
    }
    if (en->q_tail) en->q_tail->next = r;
    else en->q_head = r;
    en->q_tail = r;
    en->n_queued++;
    en->st.requests++;
    en->st.prompt_tokens += (uint64_t)n_prompt;
    pthread_cond_signal(&en->cv);
    pthread_mutex_unlock(&en->mu);
    *out = r;
    return LM_ENGINE_OK;
}

void lm_engine_get_stats(lm_engine *en, lm_engine_stats *s) {
    pthread_mutex_lock(&en->mu);
    *s = en->st;
    s->queued = en->n_queued;
    s->kv_blocks_total = en->kv->pool.n_blocks;
    pthread_mutex_unlock(&en->mu);
}
