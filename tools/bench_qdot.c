/* bench_qdot.c - the int8-activation GEMV kernels (cpu_qdot_*.c) of one core,
 * by weight type and ISA table, timed by thread CPU time.
 *
 *   bench_qdot [--tokens T] [--stream]
 *
 * Decode on a quantised model is bound by how fast one core turns weight
 * bytes into dot products (history/26-h200-quant.md: Q4_K_M at 16 threads
 * read only half the memory's rate). This measures exactly that: a
 * 128 x 4096 weight matrix (at most ~430 KB, held in L2) against T q8x
 * activation rows, in GB/s of weight a core and ns per 256 values per
 * token; --stream cycles through copies of the weight well beyond the last
 * level cache, so each call reads DRAM, as decoding does. Thread CPU time
 * survives a busy machine better than wall time; best of 7 after a warm-up. */
#include "backend/cpu/cpu_kern.h"
#include "backend/lm_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BQ_ROWS 128
#define BQ_COLS 4096

static uint64_t bq_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 24;
}

static double bq_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random rows with sane f16 scales: the codes' bits do not change the time,
 * but non-finite scales would make the f32 arithmetic slow on some cores. */
static uint8_t *bq_weight(lm_dtype t, size_t bytes, uint64_t *s) {
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)bq_next(s);
    const size_t bb = (size_t)lm_dtype_block_bytes(t);
    const uint16_t h = lm_f32_to_f16(0.01f);
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *blk = w + b * bb;
        switch (t) { /* where each type keeps its f16 scale(s) */
        case LM_Q6_K: memcpy(blk + 208, &h, 2); break;
        case LM_Q3_K: memcpy(blk + 108, &h, 2); break;
        case LM_Q2_K: memcpy(blk + 80, &h, 2), memcpy(blk + 82, &h, 2); break;
        case LM_Q4_K: case LM_Q5_K: case LM_Q4_1: case LM_Q5_1: memcpy(blk, &h, 2), memcpy(blk + 2, &h, 2); break;
        default: memcpy(blk, &h, 2); break;
        }
    }
    return w;
}

static void bq_type(const lm_cpu_qkern *k, lm_dtype t, int nt, bool stream, uint64_t *s) {
    if (!k->qgemv[t]) return;
    const size_t rb = lm_dtype_row_bytes(t, BQ_COLS), bytes = rb * BQ_ROWS;
    const int copies = stream ? (int)(512u * 1024 * 1024 / bytes) + 1 : 1;
    uint8_t *w = bq_weight(t, bytes * (size_t)copies, s);
    const size_t ldq = lm_q8x_row_bytes(BQ_COLS);
    void *xq = aligned_alloc(64, (ldq * (size_t)nt + 63) / 64 * 64);
    float *x = malloc(sizeof(float) * BQ_COLS), *y = malloc(sizeof(float) * BQ_ROWS * (size_t)nt);
    for (int t2 = 0; t2 < nt; t2++) {
        for (int i = 0; i < BQ_COLS; i++) x[i] = (float)(bq_next(s) % 2001) / 1000.0f - 1.0f;
        lm_q8x_quantize(x, BQ_COLS, (char *)xq + (size_t)t2 * ldq);
    }
    const int calls = stream ? copies : 200;
    double best = 1e30;
    for (int rep = 0; rep < 8; rep++) { /* rep 0 warms up */
        double t0 = bq_cpu_s();
        for (int c = 0; c < calls; c++) {
            const uint8_t *wc = w + (size_t)(c % copies) * bytes;
            for (int r = 0; r < BQ_ROWS; r += LM_GEMV_MAX_ROWS)
                k->qgemv[t](wc + (size_t)r * rb, rb, LM_GEMV_MAX_ROWS, xq, ldq, nt, BQ_COLS, NULL, y + r, BQ_ROWS);
        }
        double dt = (bq_cpu_s() - t0) / calls;
        if (rep && dt < best) best = dt;
    }
    printf("%-12s %-8s T=%d  %7.2f GB/s  %6.1f ns / 256 values / token  (y0 %.3g)\n", k->name, lm_dtype_name(t), nt,
           (double)bytes / best / 1e9, best * 1e9 / ((double)BQ_ROWS * BQ_COLS / 256.0) / nt, (double)y[0]);
    free(w), free(xq), free(x), free(y);
}

int main(int argc, char **argv) {
    int nt = 1;
    bool stream = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) nt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stream")) stream = true;
        else {
            fprintf(stderr, "usage: bench_qdot [--tokens 1..%d] [--stream]\n", LM_GEMV_MAX_TOKENS);
            return 2;
        }
    }
    if (nt < 1 || nt > LM_GEMV_MAX_TOKENS) return 2;
    const lm_dtype types[] = { LM_Q4_K, LM_Q6_K, LM_Q8_0, LM_Q5_K, LM_IQ4_XS, LM_Q4_0, LM_Q3_K, LM_Q2_K };
    const lm_cpu_qkern *tabs[] = { &lm_cpu_qkern_avx2, lm_cpu_has_avx512_vnni() ? &lm_cpu_qkern_vnni : NULL };
    uint64_t s = 1;
    for (size_t a = 0; a < sizeof tabs / sizeof *tabs; a++)
        for (size_t i = 0; tabs[a] && i < sizeof types / sizeof *types; i++) bq_type(tabs[a], types[i], nt, stream, &s);
    return 0;
}
