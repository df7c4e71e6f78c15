/* cpu_pool.h - the CPU backend's persistent thread pool.
 *
 * One pool per backend (no globals). lm_pool_run(p, fn, ctx) calls fn(ctx,
 * ith, nth) on the caller (ith = 0) and on every worker that is awake in time
 * to join the run (ith = 1 .. nth-1, each at most once), and returns when all
 * these calls have returned. A worker that is late (preempted, or still
 * waking up) skips the run instead of holding it up, so fn must share its
 * work through an atomic counter in ctx: the caller's call alone has to be
 * able to finish everything. ith is unique among the concurrent calls, so it
 * can index per-thread scratch.
 *
 * Waking threads is the cost that matters in decoding: a token runs ~100 small
 * ops back to back, so idle workers spin (with pause) for a short while before
 * they sleep on a condition variable; the caller only touches the mutex when a
 * thread actually sleeps. A run allocates nothing. */
#ifndef LM_CPU_POOL_H
#define LM_CPU_POOL_H

#include "../../base/lm_base.h"

typedef struct lm_pool lm_pool;
typedef void (*lm_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (the caller counts as one). Returns NULL and fills e if a
 * thread cannot be started. */
lm_pool *lm_pool_create(int n_threads, lm_err *e);
void lm_pool_free(lm_pool *p);
int lm_pool_threads(const lm_pool *p);
/* Not reentrant: fn must not call lm_pool_run on the same pool. */
void lm_pool_run(lm_pool *p, lm_pool_fn fn, void *ctx);

#endif
