/* mask_ahead.c - a step's grammar token masks computed while its forward
 * runs (lm_engine_opts.mask_ahead).
 *
 * The mask of an output row depends only on the request's grammar state
 * before the row's token is chosen, and that is known when the step is
 * issued: for a request's first row, its matcher as it stands; for the
 * rows of a speculative draft, the matcher after the draft tokens before
 * the row, which the helper accepts and then rolls back. So a helper
 * thread computes them during the forward (on a GPU the host is idle
 * then; on a CPU they take a core the forward leaves free) and the
 * hand-out picks them up instead of computing them after the logits.
 *
 * The engine thread does not touch a posted request's matcher until
 * lm_mask_ahead_wait, which first computes itself whatever the helper has
 * not started (a helper that wakes late costs no more than computing
 * inline) and then waits for the rest. A row's mask is taken only while
 * the request stands where it was computed for (the matcher's step count
 * and the token handed out before it); a strict fill or a rejected draft
 * moves it elsewhere, and the mask is then computed inline as without the
 * helper. */
#include "engine_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct mask_job {
    lm_request *r;
    int row0, n; /* its rows row0 .. row0 + n - 1 of the step */
} mask_job;

struct lm_mask_ahead {
    int words, rows;
    uint32_t *masks; /* [rows][words], made at the first post */
    int *count;      /* [rows] tokens each mask allows */
    int32_t *in;     /* [rows] the token fed at each row (a draft's rows: the draft token before it) */
    mask_job *jobs;  /* [rows] */
    int n_jobs;
    atomic_int next; /* the next job to claim, by either thread */
    uint64_t serial; /* posts so far: a request's masks are only for the post that made them */
    /* under mu */
    int done;        /* jobs of this post finished */
    uint64_t gen;    /* posts the helper has been told of */
    bool open;       /* a post's jobs may be claimed: from start until wait returns */
    bool busy;       /* the helper is claiming jobs */
    bool stop;
    double mask_s;   /* compute seconds of this post */
    pthread_mutex_t mu;
    pthread_cond_t go, fin;
    pthread_t th;
    bool started;    /* th runs */
};

/* Job j's masks: row 0 from the matcher as it is, row i after the row's
 * fed token (a draft token) is accepted; then the matcher as before. */
static void run_job(lm_mask_ahead *ma, const mask_job *j) {
    const double t0 = lm_now();
    lm_grammar_matcher *gm = j->r->gm;
    int taken = 0;
    for (int i = 0; i < j->n; i++) {
        const int row = j->row0 + i;
        if (i > 0) {
            if (!lm_grammar_accept(gm, ma->in[row])) break; /* not reached: drafts are cut to the grammar */
            taken++;
        }
        ma->count[row] = lm_grammar_mask(gm, ma->masks + (size_t)row * (size_t)ma->words);
    }
    if (taken) lm_grammar_rollback(gm, taken);
    pthread_mutex_lock(&ma->mu);
    ma->mask_s += lm_now() - t0;
    ma->done++;
    pthread_mutex_unlock(&ma->mu);
}

/* Claims and runs jobs until none is left to start. */
static void drain(lm_mask_ahead *ma) {
    for (int j; (j = atomic_fetch_add(&ma->next, 1)) < ma->n_jobs;) run_job(ma, &ma->jobs[j]);
}

static void *helper_main(void *arg) {
    lm_mask_ahead *ma = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&ma->mu);
    for (;;) {
        /* a post it woke too late for (wait ran it all) is closed: the
         * engine may be filling the next one's jobs */
        while (!ma->stop && !(ma->open && ma->gen != seen)) pthread_cond_wait(&ma->go, &ma->mu);
        if (ma->stop) break;
        seen = ma->gen;
        ma->busy = true;
        pthread_mutex_unlock(&ma->mu);
        drain(ma);
        pthread_mutex_lock(&ma->mu);
        ma->busy = false;
        pthread_cond_signal(&ma->fin);
    }
    pthread_mutex_unlock(&ma->mu);
    return NULL;
}

lm_mask_ahead *lm_mask_ahead_create(int vocab, int rows) {
    lm_mask_ahead *ma = lm_xcalloc(1, sizeof *ma);
    ma->words = lm_grammar_mask_words(vocab);
    ma->rows = rows;
    ma->jobs = lm_xmalloc((size_t)rows * sizeof *ma->jobs);
    ma->count = lm_xmalloc((size_t)rows * sizeof *ma->count);
    ma->in = lm_xmalloc((size_t)rows * sizeof *ma->in);
    pthread_mutex_init(&ma->mu, NULL);
    pthread_cond_init(&ma->go, NULL);
    pthread_cond_init(&ma->fin, NULL);
    ma->started = pthread_create(&ma->th, NULL, helper_main, ma) == 0;
    if (!ma->started) {
        /* no helper: masks are computed inline, as without one */
        lm_mask_ahead_free(ma);
        return NULL;
    }
    return ma;
}

void lm_mask_ahead_free(lm_mask_ahead *ma) {
    if (!ma) return;
    if (ma->started) {
        pthread_mutex_lock(&ma->mu);
        ma->stop = true;
        pthread_cond_signal(&ma->go);
        pthread_mutex_unlock(&ma->mu);
        pthread_join(ma->th, NULL);
    }
    pthread_mutex_destroy(&ma->mu);
    pthread_cond_destroy(&ma->go);
    pthread_cond_destroy(&ma->fin);
    free(ma->masks), free(ma->count), free(ma->in), free(ma->jobs);
    free(ma);
}

int lm_mask_ahead_start(lm_mask_ahead *ma, const lm_step *st, const lm_batch_builder *bb) {
    ma->serial++;
    ma->n_jobs = 0;
    for (int o = 0; o < st->n_out;) {
        lm_request *r = st->row_req[o];
        int n = 1;
        while (o + n < st->n_out && st->row_req[o + n] == r) n++; /* a request's rows are consecutive */
        if (r->gm && r->gm_live && r->state == LM_REQ_RUNNING) {
            for (int i = 0; i < n; i++) ma->in[o + i] = lm_batch_out_token(bb, o + i);
            ma->jobs[ma->n_jobs++] = (mask_job){ r, o, n };
            r->pre_serial = ma->serial, r->pre_row0 = o, r->pre_n = n, r->pre_next = 0;
            r->pre_steps0 = lm_grammar_steps(r->gm);
        }
        o += n;
    }
    if (ma->n_jobs == 0) return 0;
    if (!ma->masks) ma->masks = lm_xmalloc((size_t)ma->rows * (size_t)ma->words * sizeof *ma->masks);
    atomic_store(&ma->next, 0);
    pthread_mutex_lock(&ma->mu);
    ma->done = 0;
    ma->mask_s = 0;
    ma->gen++;
    ma->open = true;
    pthread_cond_signal(&ma->go);
    pthread_mutex_unlock(&ma->mu);
    return ma->n_jobs;
}

double lm_mask_ahead_wait(lm_mask_ahead *ma, double *mask_s) {
    *mask_s = 0;
    if (ma->n_jobs == 0) return 0;
    const double t0 = lm_now();
    drain(ma);
    pthread_mutex_lock(&ma->mu);
    while (ma->done < ma->n_jobs || ma->busy) pthread_cond_wait(&ma->fin, &ma->mu);
    ma->open = false;
    *mask_s = ma->mask_s;
    pthread_mutex_unlock(&ma->mu);
    ma->n_jobs = 0;
    return lm_now() - t0;
}

const uint32_t *lm_mask_ahead_take(lm_mask_ahead *ma, lm_request *r, int *count) {
    if (!ma || r->pre_serial != ma->serial || r->pre_next >= r->pre_n) return NULL;
    const int i = r->pre_next, row = r->pre_row0 + i;
    if (lm_grammar_steps(r->gm) != r->pre_steps0 + i || (i > 0 && r->tokens[r->n_tokens - 1] != ma->in[row])) {
        r->pre_n = 0; /* it stands elsewhere now: the rest are not its masks either */
        return NULL;
    }
    r->pre_next++;
    *count = ma->count[row];
    return ma->masks + (size_t)row * (size_t)ma->words;
}
