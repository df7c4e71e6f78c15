/* cpu_pool.c - persistent pthread pool with spin-then-sleep workers.
 *
 * Protocol. The caller publishes (fn, ctx), sets `pending` to the number of
 * workers and bumps the generation counter `gen`. Each worker waits for `gen`
 * to change, runs fn, and decrements `pending`; the caller runs its own share
 * as thread 0 and then waits for `pending` to reach zero.
 *
 * Waiting. A worker first spins on `gen` for about LM_POOL_SPIN_NS, so the
 * next op of a decode step (microseconds later) finds it awake. After that it
 * sleeps on a condition variable. To keep the mutex off the fast path, a worker
 * announces itself in `sleepers` (under the mutex) before re-checking `gen` and
 * waiting; the caller bumps `gen` and then reads `sleepers`, both sequentially
 * consistent, so either the caller sees the sleeper and broadcasts under the
 * mutex, or the sleeper sees the new generation and never waits: no lost wake.
 *
 * Ordering. fn/ctx are plain fields written before the seq_cst increment of
 * `gen` and read after a worker's acquire load of it; a worker's results are
 * released by its decrement of `pending` and acquired by the caller's load.
 * The caller only rewrites fn/ctx after `pending` is zero, i.e. after every
 * worker has finished reading them. */
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LM_POOL_SPIN_NS 200000 /* 0.2 ms: longer than the gap between two ops */

typedef struct lm_pool_worker {
    lm_pool *pool;
    int ith;
    pthread_t tid;
} lm_pool_worker;

struct lm_pool {
    int n; /* threads including the caller */
    lm_pool_worker *workers; /* [n - 1] */
    int n_started;

    /* Hot shared words, each on its own cache line so that spinning workers
     * reading `gen` do not contend with the decrements of `pending`. */
    _Alignas(64) atomic_uint gen;
    _Alignas(64) atomic_int pending;
    _Alignas(64) atomic_int sleepers;
    atomic_bool stop;
    lm_pool_fn fn;
    void *ctx;

    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static inline void lm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t lm_pool_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Returns the first generation different from `seen`. */
static unsigned lm_pool_wait_gen(lm_pool *p, unsigned seen) {
    unsigned g;
    int64_t t0 = 0;
    for (int i = 0;; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        lm_cpu_relax();
        if ((i & 255) == 255) { /* read the clock rarely: it costs ~20 ns */
            int64_t now = lm_pool_ns();
            if (!t0) t0 = now;
            else if (now - t0 > LM_POOL_SPIN_NS) break;
        }
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *lm_pool_main(void *arg) {
    lm_pool_worker *w = arg;
    lm_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = lm_pool_wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

/* Publishes a new generation and wakes sleepers if there are any. */
static void lm_pool_kick(lm_pool *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void lm_pool_join(lm_pool *p) {
    atomic_store_explicit(&p->stop, true, memory_order_release);
    lm_pool_kick(p);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].tid, NULL);
    p->n_started = 0;
}

lm_pool *lm_pool_create(int n_threads, lm_err *e) {
    LM_ASSERT(n_threads >= 1);
    lm_pool *p = lm_xaligned(sizeof *p);
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->workers = lm_xcalloc((size_t)n_threads, sizeof *p->workers);
    for (int i = 0; i + 1 < n_threads; i++) {
        lm_pool_worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i + 1;
        int rc = pthread_create(&w->tid, NULL, lm_pool_main, w);
        if (rc != 0) {
            lm_errf(e, "cpu backend: cannot start worker thread %d of %d: %s", i + 1,
                    n_threads - 1, strerror(rc));
            lm_pool_free(p);
            return NULL;
        }
        p->n_started++;
    }
    return p;
}

void lm_pool_free(lm_pool *p) {
    if (!p) return;
    lm_pool_join(p);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    lm_afree(p);
}

int lm_pool_threads(const lm_pool *p) { return p->n; }

void lm_pool_run(lm_pool *p, lm_pool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    lm_pool_kick(p);
    fn(ctx, 0, p->n);
    /* The workers usually finish within microseconds of the caller; yield
     * after a while in case one of them was preempted (more threads than
     * cores), so that it can run on this core. */
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++) {
        if (i < 4096) lm_cpu_relax();
        else sched_yield();
    }
}
