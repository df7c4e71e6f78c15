/* base.c - error formatting, checked allocation, clock. */
#include "lm_base.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int lm_errf(lm_err *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int lm_err_prefix(lm_err *e, const char *fmt, ...) {
    if (!e) return -1;
    char old[LM_ERR_MAX], pre[LM_ERR_MAX];
    memcpy(old, e->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* both halves fit in LM_ERR_MAX on their own; the joined line is cut to fit */
    size_t n = strnlen(pre, sizeof pre - 1);
    memcpy(e->msg, pre, n);
    if (n + 2 < sizeof e->msg) {
        memcpy(e->msg + n, ": ", 2);
        n += 2;
        size_t rest = LM_MIN(strnlen(old, sizeof old - 1), sizeof e->msg - 1 - n);
        memcpy(e->msg + n, old, rest);
        n += rest;
    }
    e->msg[n] = 0;
    return -1;
}

void lm_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "lumen: internal error: assertion `%s` failed at %s:%d\n", expr, file, line);
    abort();
}

static void oom(size_t n) {
    fprintf(stderr, "lumen: out of memory allocating %zu bytes\n", n);
    abort();
}

void *lm_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *lm_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *lm_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *lm_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = lm_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

void *lm_xaligned(size_t n) {
    void *p = NULL;
    size_t rounded = (n + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) oom(n);
    return p;
}

void lm_afree(void *p) { free(p); }

double lm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Over 8 independent lanes, which the compiler vectorises: one dependent
 * compare per element ran at ~4 ns, which at 128 sequences of a 128k
 * vocabulary was most of a batched decode step. */
float lm_max(const float *x, int n) {
    float m[8];
    for (int k = 0; k < 8; k++) m[k] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float best = m[0];
    for (int k = 1; k < 8; k++) best = m[k] > best ? m[k] : best;
    return best;
}

/* The first index of the largest value (NaN never wins; NaN at 0 wins by
 * default, as with a plain "x[i] > x[best]" scan): lm_max, then the first
 * match. */
int lm_argmax(const float *x, int n) {
    if (n <= 1 || x[0] != x[0]) return 0;
    const float best = lm_max(x, n);
    for (int i = 0; i < n; i++)
        if (x[i] == best) return i;
    return 0;
}

/* Without copying the row. Two passes over the mask's words: the maximum
 * (runs of words that allow all 32 ids read as one span, a JSON string's
 * mask being mostly such words), then its first allowed id. */
int lm_argmax_masked(const float *x, int V, const uint32_t *allow) {
    const int W = (V + 31) / 32;
    float m = -INFINITY;
    for (int w = 0; w < W;) {
        int e = w; /* a run of words that allow every id, read as one span */
        while (e < W && allow[e] == ~0u && 32 * e + 32 <= V) e++;
        if (e > w) {
            const float mw = lm_max(x + 32 * w, 32 * (e - w));
            m = mw > m ? mw : m;
            w = e;
            continue;
        }
        for (uint32_t b = allow[w]; b; b &= b - 1) {
            const int v = 32 * w + __builtin_ctz(b);
            if (v < V && x[v] > m) m = x[v];
        }
        w++;
    }
    int first = -1;
    for (int w = 0; w < W;) {
        int e = w;
        while (e < W && allow[e] == ~0u && 32 * e + 32 <= V) e++;
        if (e > w) {
            for (int v = 32 * w; v < 32 * e; v++)
                if (x[v] == m) return v;
            if (first < 0) first = 32 * w;
            w = e;
            continue;
        }
        for (uint32_t b = allow[w]; b; b &= b - 1) {
            const int v = 32 * w + __builtin_ctz(b);
            if (v >= V) break;
            if (x[v] == m) return v;
            if (first < 0) first = v;
        }
        w++;
    }
    return first < 0 ? 0 : first;
}
