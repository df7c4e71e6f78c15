/* enginegen.c - generation through the engine for the terminal commands
 * (enginegen.h): submit, wait, collect. */
#include "enginegen.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct egen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lm_egen_req *reqs;
    int cap;             /* tokens each out holds */
    int n_done;
    double t0, t_last;
    lm_egen_tok cb;
    void *user;
    char error[256];
} egen;

typedef struct egen_slot {
    egen *g;
    int i;
} egen_slot;

static void on_event(void *user, const lm_token_event *ev) {
    egen_slot *sl = user;
    egen *g = sl->g;
    lm_egen_req *q = &g->reqs[sl->i];
    if (ev->has_token) {
        if (q->n_out == 0) q->first_s = lm_now() - g->t0;
        if (q->n_out < g->cap) q->out[q->n_out++] = ev->token;
        if (g->cb) g->cb(g->user, sl->i, ev->token);
    }
    if (!ev->done) return;
    pthread_mutex_lock(&g->mu);
    q->finish = ev->finish;
    if (ev->finish == LM_FINISH_ERROR && !g->error[0]) snprintf(g->error, sizeof g->error, "%s", ev->error);
    g->n_done++;
    g->t_last = lm_now();
    q->done_s = g->t_last - g->t0;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

int lm_egen_run(lm_model *m, const lm_engine_opts *eo, const lm_gen_params *gp, lm_egen_req *reqs, int n_req,
                lm_egen_tok cb, void *user, lm_engine_stats *st, double *wall_s, lm_err *e) {
    lm_engine_opts o = *eo;
    if (o.max_queue < n_req) o.max_queue = n_req;
    lm_engine *en = NULL;
    if (lm_engine_create(&en, m, &o, e)) return -1;
    egen g = { .reqs = reqs, .cap = gp->max_tokens, .cb = cb, .user = user };
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    egen_slot *slots = lm_xcalloc((size_t)n_req, sizeof *slots);
    lm_request **handles = lm_xcalloc((size_t)n_req, sizeof *handles);
    int rc = 0, submitted = 0;
    const double t0 = g.t0 = lm_now();
    for (int i = 0; i < n_req; i++) {
        reqs[i].n_out = 0;
        reqs[i].first_s = reqs[i].done_s = 0;
        reqs[i].finish = LM_FINISH_NONE;
        slots[i] = (egen_slot){ &g, i };
        if (lm_engine_submit(en, reqs[i].ids, reqs[i].n, gp, on_event, &slots[i], &handles[i], e) != LM_ENGINE_OK) {
            rc = -1;
            break;
        }
        submitted++;
    }
    pthread_mutex_lock(&g.mu);
    while (g.n_done < submitted) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    *wall_s = g.t_last - t0;
    for (int i = 0; i < submitted; i++) lm_request_release(handles[i]);
    if (rc == 0 && g.error[0]) rc = lm_errf(e, "%s", g.error);
    /* the counters are published after the step that ended the last request */
    for (int k = 0; k < 1000; k++) {
        lm_engine_get_stats(en, st);
        if (st->running == 0 && st->queued == 0) break;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    lm_engine_free(en);
    free(slots);
    free(handles);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    return rc;
}

void lm_egen_spec_json(const lm_engine_stats *s, char *buf, size_t n) {
    size_t k = 0;
#define ADD(...) k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__)
    ADD("\"verify_steps\":%llu,\"tokens_per_verify\":%.3f,\"drafted\":%llu,\"accepted\":%llu,\"acceptance\":%.3f,"
        "\"acceptance_by_position\":[",
        (unsigned long long)s->spec_verifies,
        s->spec_verifies ? (double)s->spec_verify_tokens / (double)s->spec_verifies : 0.0,
        (unsigned long long)s->spec_drafted, (unsigned long long)s->spec_accepted,
        s->spec_drafted ? (double)s->spec_accepted / (double)s->spec_drafted : 0.0);
    int last = 0;
    for (int i = 0; i < LM_SPEC_MAX_DRAFT; i++)
        if (s->spec_pos_drafted[i]) last = i + 1;
    for (int i = 0; i < last; i++)
        ADD("%s%.3f", i ? "," : "", (double)s->spec_pos_accepted[i] / (double)LM_MAX(s->spec_pos_drafted[i], 1));
    ADD("],\"replayed\":%llu,\"undrafted_steps\":%llu,\"draft_model_tokens\":%llu,\"draft_s\":%.3f,"
        "\"verify_s\":%.3f",
        (unsigned long long)s->spec_replayed, (unsigned long long)s->spec_off_steps,
        (unsigned long long)s->spec_model_tokens, s->spec_draft_s, s->spec_verify_s);
#undef ADD
    if (k >= n && n > 0) buf[n - 1] = 0;
}
