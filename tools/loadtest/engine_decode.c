/* engine_decode.c - time per generated token through the engine alone (no
 * HTTP): one request at a time, a callback that only timestamps. The middle
 * rung between `lumen bench` (the bare decode loop) and a streamed request
 * through `lumen serve`; loadtest.mjs --overhead builds and runs it.
 *
 *   engine_decode MODEL GEN REPS THREADS
 * prints one JSON line: engine_ms_per_token (median over REPS of the wall
 * time between tokens) and engine_cpu_ms_per_token (CPU time of the whole
 * process, all threads, over all tokens: immune to other load on the box). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "engine/lm_engine.h"

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double first, last;
    int n;
    bool done;
} waiter;

static void on_token(void *user, const lm_token_event *ev) {
    waiter *w = user;
    pthread_mutex_lock(&w->mu);
    if (ev->has_token) {
        double t = lm_now();
        if (w->n++ == 0) w->first = t;
        w->last = t;
    }
    if (ev->done) {
        w->done = true;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: engine_decode MODEL GEN REPS THREADS\n");
        return 2;
    }
    int gen = atoi(argv[2]), reps = atoi(argv[3]);
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(atoi(argv[4]), LM_ISA_AUTO, &e);
    lm_model *m = NULL;
    lm_engine *en = NULL;
    if (!be || lm_model_load(&m, argv[1], be, &e)) goto fail;
    lm_engine_opts eo = { .ctx = 0, .parallel = 4 }; /* what lumen serve uses by default */
    if (lm_engine_create(&en, m, &eo, &e)) goto fail;
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = 10 + 7 * i;
    double *ms = calloc((size_t)reps, sizeof *ms);
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    long tokens = 0;
    for (int r = 0; r < reps; r++) {
        waiter w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
        lm_gen_params p = { .sampling = { .temperature = 0, .top_p = 1 }, .repetition_penalty = 1, .max_tokens = gen };
        lm_request *req;
        if (lm_engine_submit(en, prompt, 16, &p, on_token, &w, &req, &e) != LM_ENGINE_OK) goto fail;
        pthread_mutex_lock(&w.mu);
        while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        lm_request_release(req);
        ms[r] = (w.last - w.first) * 1000 / (w.n - 1);
        tokens += w.n;
    }
    getrusage(RUSAGE_SELF, &u1);
    double cpu = (double)(u1.ru_utime.tv_sec - u0.ru_utime.tv_sec + u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) * 1e3 +
                 (double)(u1.ru_utime.tv_usec - u0.ru_utime.tv_usec + u1.ru_stime.tv_usec - u0.ru_stime.tv_usec) / 1e3;
    qsort(ms, (size_t)reps, sizeof *ms, cmp);
    printf("{\"engine_ms_per_token\":%.4f,\"engine_cpu_ms_per_token\":%.4f}\n", ms[reps / 2], cpu / (double)tokens);
    free(ms);
    lm_engine_free(en);
    lm_model_free(m);
    lm_backend_destroy(be);
    return 0;
fail:
    fprintf(stderr, "engine_decode: %s\n", e.msg);
    return 1;
}
