/* membw.c - STREAM-like copy bandwidth (see lm_membw.h). */
#include "lm_membw.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

static void *copy_worker(void *arg) {
    copy_job *j = arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

double lm_copy_bandwidth(size_t bytes, int n_threads, int reps) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    char *a = NULL, *b = NULL;
    if (posix_memalign((void **)&a, 4096, bytes) || posix_memalign((void **)&b, 4096, bytes)) {
        free(a);
        return 0;
    }
    memset(a, 1, bytes); /* fault every page in before timing */
    memset(b, 2, bytes);
    pthread_t th[256];
    copy_job jobs[256];
    size_t per = (bytes / (size_t)n_threads) & ~(size_t)4095;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = lm_now();
        for (int i = 0; i < n_threads; i++) {
            size_t off = per * (size_t)i;
            jobs[i] = (copy_job){ b + off, a + off, i == n_threads - 1 ? bytes - off : per };
            pthread_create(&th[i], NULL, copy_worker, &jobs[i]);
        }
        for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
        double bw = 2.0 * (double)bytes / (lm_now() - t0);
        if (bw > best) best = bw;
    }
    free(a);
    free(b);
    return best;
}
