/* cpu_pool.c - persistent pthread pool: spin-then-sleep workers that join a
 * run only if they are in time.
 *
 * State. One 64-bit atomic word holds the run's generation (high 32 bits),
 * whether the run is still open to workers (bit 31) and how many workers
 * have joined it (low bits). A run goes:
 *   caller: publish fn/ctx, finished = 0, state = (gen+1, open, 0), wake
 *   worker: sees the new generation; CAS (gen, open, j) -> (gen, open, j+1)
 *           to join; runs fn; increments `finished`
 *   caller: runs fn itself, then CAS (gen, open, j) -> (gen, closed, j) and
 *           waits until finished == j.
 * A worker whose CAS finds the run closed (or a newer generation) skips it
 * without touching fn/ctx. Since every op shares its work through a counter
 * (cpu_pool.h), a late worker costs nothing, and an oversubscribed machine
 * degrades to fewer threads instead of waiting a scheduler time slice for a
 * preempted worker on every op.
 *
 * Waiting. A worker first spins on the generation for about LM_POOL_SPIN_NS,
 * so the next op of a decode step (microseconds later) finds it awake; then
 * it sleeps on `cv`. To keep the mutex off the fast path, a worker counts
 * itself in `sleepers` (under the mutex) before re-checking the state and
 * waiting; the caller stores the state and then reads `sleepers`, both
 * sequentially consistent, so either the caller sees the sleeper and
 * broadcasts under the mutex, or the sleeper sees the new generation: no lost
 * wake-up. The caller's wait for `finished` is the same pattern in reverse
 * (short spin, then `done_cv`, signalled by a finishing worker that sees
 * `caller_sleeps`).
 *
 * Ordering. fn/ctx are plain fields written before the release store that
 * opens a run and read only after a successful join (an acquire RMW in the
 * release sequence of that store). The caller rewrites them only after the
 * run is closed and every joined worker has released its `finished`
 * increment, i.e. after every reader is done with them. */
#include "cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LM_POOL_SPIN_NS 200000     /* workers: 0.2 ms, longer than the gap between two ops */
#define LM_POOL_WAIT_SPIN_NS 50000 /* caller: 50 us, longer than a joined worker's usual lag */

#define LM_ST_OPEN ((uint64_t)1 << 31)
#define LM_ST_JOINED(s) ((int)((s) & (LM_ST_OPEN - 1)))
#define LM_ST_GEN(s) ((uint32_t)((s) >> 32))
#define LM_ST_MAKE(gen, open) (((uint64_t)(gen) << 32) | ((open) ? LM_ST_OPEN : 0))

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
     * reading `state` do not contend with the increments of `finished`. */
    _Alignas(64) _Atomic uint64_t state;
    _Alignas(64) atomic_int finished;
    _Alignas(64) atomic_int sleepers;
    atomic_bool caller_sleeps;
    atomic_bool stop;
    lm_pool_fn fn;
    void *ctx;

    pthread_mutex_t mu;
    pthread_cond_t cv;      /* workers wait here for a new generation */
    pthread_cond_t done_cv; /* the caller waits here for the joined workers */
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

/* Spins while cond(p) holds, for at most ns; returns whether it still holds. */
#define LM_POOL_SPIN_WHILE(cond, ns)                                      \
    do {                                                                  \
        int64_t t0_ = 0;                                                  \
        for (int i_ = 0; (cond); i_++) {                                  \
            lm_cpu_relax();                                               \
            if ((i_ & 255) == 255) { /* the clock costs ~20 ns: rarely */ \
                int64_t now_ = lm_pool_ns();                              \
                if (!t0_) t0_ = now_;                                     \
                else if (now_ - t0_ > (ns)) break;                        \
            }                                                             \
        }                                                                 \
    } while (0)

static uint32_t lm_pool_gen(lm_pool *p) {
    return LM_ST_GEN(atomic_load_explicit(&p->state, memory_order_acquire));
}

/* Returns the first generation different from `seen`. */
static uint32_t lm_pool_wait_gen(lm_pool *p, uint32_t seen) {
    LM_POOL_SPIN_WHILE(lm_pool_gen(p) == seen, LM_POOL_SPIN_NS);
    if (lm_pool_gen(p) != seen) return lm_pool_gen(p);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t g;
    while ((g = LM_ST_GEN(atomic_load(&p->state))) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

/* Joins run `gen` if it is still open. */
static bool lm_pool_join_run(lm_pool *p, uint32_t gen) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (LM_ST_GEN(s) != gen || !(s & LM_ST_OPEN)) return false;
        if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return true;
    }
}

static void *lm_pool_main(void *arg) {
    lm_pool_worker *w = arg;
    lm_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = lm_pool_wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        if (!lm_pool_join_run(p, seen)) continue; /* late: the caller has done the work */
        p->fn(p->ctx, w->ith, p->n);
        /* seq_cst pairs with the caller's store to caller_sleeps and load of
         * finished: either it sees this increment or we see it asleep. */
        atomic_fetch_add(&p->finished, 1);
        if (atomic_load(&p->caller_sleeps)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Publishes a new state and wakes sleeping workers if there are any. */
static void lm_pool_publish(lm_pool *p, uint64_t s) {
    atomic_store(&p->state, s);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Closes the run to latecomers; returns how many workers joined it. */
static int lm_pool_close(lm_pool *p) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    while (!atomic_compare_exchange_weak_explicit(&p->state, &s, s & ~LM_ST_OPEN, memory_order_acq_rel,
                                                  memory_order_acquire)) {
    }
    return LM_ST_JOINED(s);
}

static void lm_pool_wait_finished(lm_pool *p, int joined) {
    LM_POOL_SPIN_WHILE(atomic_load_explicit(&p->finished, memory_order_acquire) != joined,
                       LM_POOL_WAIT_SPIN_NS);
    if (atomic_load_explicit(&p->finished, memory_order_acquire) == joined) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_sleeps, true);
    while (atomic_load(&p->finished) != joined) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->caller_sleeps, false);
    pthread_mutex_unlock(&p->mu);
}

lm_pool *lm_pool_create(int n_threads, lm_err *e) {
    LM_ASSERT(n_threads >= 1 && n_threads < (1 << 30));
    lm_pool *p = lm_xaligned(sizeof *p);
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    atomic_init(&p->state, LM_ST_MAKE(0, false));
    atomic_init(&p->finished, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeps, false);
    atomic_init(&p->stop, false);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
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
    atomic_store_explicit(&p->stop, true, memory_order_release);
    lm_pool_publish(p, LM_ST_MAKE(lm_pool_gen(p) + 1, false)); /* a closed run: nobody joins */
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].tid, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->done_cv);
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
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    lm_pool_publish(p, LM_ST_MAKE(lm_pool_gen(p) + 1, true));
    fn(ctx, 0, p->n);
    lm_pool_wait_finished(p, lm_pool_close(p));
}
