/* quant_rows.c - a whole tensor of rows converted between types, spread
 * over threads (lm_quant_rows in lm_quant.h).
 *
 * Rows are independent, so each thread takes a contiguous share of them
 * with its own f32 row buffer; results do not depend on the thread count. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lm_quant.h"

typedef struct lm_qrows_job {
    const lm_qrows *q;
    int64_t begin, end;
} lm_qrows_job;

/* One thread's share of rows, with its own f32 row. */
static void *lm_qrows_run(void *arg) {
    const lm_qrows_job *j = arg;
    const lm_qrows *q = j->q;
    size_t out_row = lm_dtype_row_bytes(q->to, q->cols);
    float *x = lm_xmalloc((size_t)q->cols * sizeof *x + 1);
    for (int64_t r = j->begin; r < j->end; r++) {
        const uint8_t *src = q->src_row(q->ctx, r);
        uint8_t *dst = q->dst + (size_t)r * out_row;
        if (q->from == q->to) {
            memcpy(dst, src, out_row);
            continue;
        }
        lm_dequant_row(q->from, src, x, q->cols);
        lm_quant_row(q->to, x, dst, q->cols, NULL);
    }
    free(x);
    return NULL;
}

void lm_quant_rows(const lm_qrows *q, int threads) {
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    /* a thread for at least 16 rows of 4k values: smaller tensors are not worth one */
    int64_t per = LM_MAX(1, 65536 / LM_MAX(q->cols, 1));
    if ((int64_t)threads > (q->rows + per - 1) / per) threads = (int)LM_MAX(1, (q->rows + per - 1) / per);
    lm_qrows_job *jobs = lm_xcalloc((size_t)threads, sizeof *jobs);
    pthread_t *tid = lm_xcalloc((size_t)threads, sizeof *tid);
    for (int t = 0; t < threads; t++) {
        jobs[t] = (lm_qrows_job){ q, q->rows * t / threads, q->rows * (t + 1) / threads };
    }
    int started = 0;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tid[t], NULL, lm_qrows_run, &jobs[t]) != 0) break;
        started = t;
    }
    lm_qrows_run(&jobs[0]);
    for (int t = started + 1; t < threads; t++) lm_qrows_run(&jobs[t]); /* threads that did not start */
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    free(jobs);
    free(tid);
}
