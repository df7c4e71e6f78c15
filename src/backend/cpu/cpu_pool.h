/* cpu_pool.h - the CPU backend's persistent thread pool.
 *
 * One pool per backend (no globals). lm_pool_run(p, fn, ctx) calls fn(ctx, ith,
 * nth) once on every thread, ith = 0 .. nth-1, with the caller itself acting as
 * thread 0, and returns when all calls have returned. An op splits its work by
 * ith (static split) or through an atomic counter in ctx (dynamic split).
 *
 * Waking threads is the cost that matters in decoding: a token runs ~100 small
 * ops back to back, so idle workers spin (with pause) for a short while before
 * they sleep on a condition variable; the caller only touches the mutex when a
 * worker actually sleeps. A run allocates nothing. */
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
