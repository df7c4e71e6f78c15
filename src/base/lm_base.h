/* lm_base.h - errors, allocation and assertions shared by every layer.
 *
 * Two tiers of failure (see STYLE.md): broken invariants abort through
 * LM_ASSERT (on in release builds too); bad input, I/O and memory failures are
 * reported through an lm_err filled by the callee and returned as -1 up to a
 * caller that can explain it. Nothing below main() calls exit(). */
#ifndef LM_BASE_H
#define LM_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define LM_ERR_MAX 512

/* A one-line error message; callers print it as is. */
typedef struct lm_err {
    char msg[LM_ERR_MAX];
} lm_err;

/* The first index of the largest of x[0..n) (NaN never wins). */
int lm_argmax(const float *x, int n);
/* The first id v < n that allow (bits, [ceil(n / 32)] words) allows, of
 * the largest x[v] (NaN never wins, -0 equals 0; the first allowed id when
 * nothing does, 0 when nothing is allowed): greedy under a grammar's mask.
 * The GPU's masked argmax gives the same answer. */
int lm_argmax_masked(const float *x, int n, const uint32_t *allow);
/* The largest of x[0, n); NaN never wins; -inf when nothing does. */
float lm_max(const float *x, int n);

/* Formats into e (if non-NULL) and returns -1, so `return lm_errf(...)` works. */
int lm_errf(lm_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes an existing message: "prefix: old message". Returns -1. */
int lm_err_prefix(lm_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void lm_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define LM_ASSERT(c) ((c) ? (void)0 : lm_assert_fail(#c, __FILE__, __LINE__))

/* Allocation that aborts on failure: for small, bounded allocations whose
 * failure is a broken machine, not bad input. Sizes derived from untrusted
 * input must be validated before they reach these. */
void *lm_xmalloc(size_t n);
void *lm_xcalloc(size_t n, size_t size);
void *lm_xrealloc(void *p, size_t n);
char *lm_xstrdup(const char *s);
/* 64-byte aligned (SIMD rows, cache lines); free with lm_afree. */
void *lm_xaligned(size_t n);
void lm_afree(void *p);

/* Monotonic seconds, for timing. */
double lm_now(void);

#define LM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define LM_COUNT(a) (sizeof(a) / sizeof((a)[0]))

#endif
