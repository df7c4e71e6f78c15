/* membw.c - STREAM-like copy bandwidth (see lm_membw.h). */
#include "lm_membw.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct copy_job {
    char *dst;       /* NULL: read only */
    const char *src;
    size_t n;
    const void *hit;
} copy_job;

static void *copy_worker(void *arg) {
    copy_job *j = arg;
    if (j->dst) memcpy(j->dst, j->src, j->n);
    /* memchr for a byte that is not there reads the range with libc's
     * vectorised loop: memory-bound, not compute-bound */
    else j->hit = memchr(j->src, 0, j->n);
    return NULL;
}

/* Copies (or, with read_only, reads) `bytes` over n threads; best of reps. */
static double stream(size_t bytes, int n_threads, int reps, bool read_only) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    char *a = NULL, *b = NULL;
    if (posix_memalign((void **)&a, 4096, bytes) || (!read_only && posix_memalign((void **)&b, 4096, bytes))) {
        free(a);
        return 0;
    }
    memset(a, 1, bytes); /* fault every page in before timing */
    if (b) memset(b, 2, bytes);
    pthread_t th[256];
    copy_job jobs[256];
    size_t per = (bytes / (size_t)n_threads) & ~(size_t)4095;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = lm_now();
        for (int i = 0; i < n_threads; i++) {
            size_t off = per * (size_t)i;
            jobs[i] = (copy_job){ b ? b + off : NULL, a + off, i == n_threads - 1 ? bytes - off : per, NULL };
            pthread_create(&th[i], NULL, copy_worker, &jobs[i]);
        }
        for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
        double bw = (read_only ? 1.0 : 2.0) * (double)bytes / (lm_now() - t0);
        if (bw > best) best = bw;
    }
    free(a);
    free(b);
    return best;
}

double lm_copy_bandwidth(size_t bytes, int n_threads, int reps) { return stream(bytes, n_threads, reps, false); }

double lm_read_bandwidth(size_t bytes, int n_threads, int reps) { return stream(bytes, n_threads, reps, true); }
