/* bench_qgemm.c - the int8 GEMM (prefill on quantised weights): its tiles on
 * one core, and whole matmuls through the CPU backend.
 *
 *   bench_qgemm [--threads 1,16] [--tokens 512] [--reps 5] [--tiles-only] [--exact] [--type Q4_K]
 *
 * Tiles: one 32-row x 512-value panel (cpu_qblock.h; held in L1) swept by
 * the AVX-512 VNNI tile and the AVX2 tile (those this CPU has) over T q8x
 * token rows, thread CPU time, best of reps: GMAC/s of one core, and the
 * time to unpack the panel (paid once per unit of up to 512 tokens) by the
 * GEMM's packer and the portable one. Matmuls: the Llama-3.2-1B projection
 * shapes (q/o 2048x2048, k/v 512x2048, gate/up 8192x2048, down 2048x8192)
 * on Q4_K weights (--type: another; --exact: the widening path instead),
 * wall time, best of reps, for each thread count. What it separates: the tile's own rate, the unpacking, and what the threads add
 * (run one-thread copies side by side, pinned, to see what the cores alone
 * give; history/26-cpu-16-threads.md). */
#include "backend/cpu/cpu_kern.h"
#include "backend/cpu/cpu_qblock.h"
#include "backend/lm_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t bg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 24;
}

static double bg_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random codes with sane f16 scales (non-finite ones would slow the f32 part). */
static uint8_t *bg_weight(lm_dtype t, int64_t rows, int64_t cols, uint64_t *s) {
    size_t bytes = lm_dtype_row_bytes(t, cols) * (size_t)rows, bb = (size_t)lm_dtype_block_bytes(t);
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)bg_next(s);
    const uint16_t h = lm_f32_to_f16(0.01f);
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *blk = w + b * bb;
        if (t == LM_Q6_K) memcpy(blk + 208, &h, 2);
        else if (t == LM_Q4_K || t == LM_Q5_K) memcpy(blk, &h, 2), memcpy(blk + 2, &h, 2);
        else memcpy(blk, &h, 2);
    }
    return w;
}

static float *bg_x(int64_t n, uint64_t *s) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(bg_next(s) % 2001) / 1000.0f - 1.0f;
    return x;
}

enum { BG_NB = 16, BG_I = 32 * BG_NB };

static void bg_tiles(lm_dtype t, int T, int reps, uint64_t *s) {
    uint8_t *w = bg_weight(t, LM_QP_ROWS, BG_I, s);
    size_t ldq = lm_q8x_row_bytes(BG_I);
    int8_t *xq = aligned_alloc(64, (ldq * (size_t)T + 63) / 64 * 64);
    float *x = bg_x(BG_I, s), *xf = malloc((size_t)T * 4 * BG_NB * sizeof(float));
    float *y = malloc((size_t)T * LM_QP_ROWS * sizeof(float));
    uint8_t *panel = aligned_alloc(64, (size_t)BG_NB * LM_QP_BLOCK_BYTES);
    for (int tk = 0; tk < T; tk++) {
        lm_q8x_quantize(x, BG_I, xq + (size_t)tk * ldq);
        for (int i = 0; i < 4 * BG_NB; i++) xf[tk * 4 * BG_NB + i] = 1e-3f * (float)(i % 5);
    }
    const lm_qblock_type *qt = &lm_qblock_types[t];
    const size_t ldw = lm_dtype_row_bytes(t, BG_I);
    /* the portable packer and the ISA's (the one the GEMM uses) */
    void (*const packers[2])(lm_dtype, const void *, size_t, int, int64_t, int, uint8_t *) = {
        lm_qpanel_pack, lm_cpu_has_avx512_vnni() ? lm_cpu_qkern_vnni.qpanel_pack : NULL
    };
    double packs[2] = { 1e30, 1e30 };
    for (int r = 0; r < reps + 1; r++)
        for (int k = 0; k < 2; k++) {
            if (!packers[k]) continue;
            double t0 = bg_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int i = 0; i < 100; i++) packers[k](t, w, ldw, LM_QP_ROWS, 0, BG_NB, panel);
            double dt = (bg_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / 100;
            if (r && dt < packs[k]) packs[k] = dt;
        }
    const double pack = packers[1] ? packs[1] : packs[0];
    /* each tile this CPU runs: VNNI where present, AVX2 */
    const struct { const char *name; lm_qgemm_fn fn; int mr; bool ok; } tiles[] = {
        { "vnni", lm_qgemm_vnni, LM_QGEMM_VNNI_MR, lm_cpu_has_avx512_vnni() },
        { "avx2", lm_qgemm_avx2, LM_QGEMM_AVX2_MR,
          lm_cpu_isa_detect() >= LM_ISA_AVX2 && qt->max_code <= LM_QGEMM_AVX2_MAX_CODE },
    };
    for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++) {
        if (!tiles[ti].ok) continue;
        const int mr = tiles[ti].mr;
        const double macs = (double)T * LM_QP_ROWS * BG_I;
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            double t0 = bg_clock(CLOCK_THREAD_CPUTIME_ID);
            for (int i = 0; i < 10; i++)
                for (int tt = 0; tt < T; tt += mr)
                    tiles[ti].fn(panel, BG_NB, qt, xq + (size_t)tt * ldq, ldq, xf + tt * 4 * BG_NB, 4 * BG_NB,
                                 T - tt < mr ? T - tt : mr, LM_QP_ROWS, y + tt * LM_QP_ROWS, LM_QP_ROWS, NULL, i == 0);
            double dt = (bg_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / 10;
            if (r && dt < best) best = dt;
        }
        printf("tile %s %-6s T=%d: %7.1f GMAC/s a core (%.2f us a panel sweep); unpacking %.2f us (%.1f %% of it; "
               "portable packer %.2f us)\n",
               tiles[ti].name, lm_dtype_name(t), T, macs / best / 1e9, best * 1e6, pack * 1e6, 100 * pack / best,
               packs[0] * 1e6);
    }
    free(w), free(xq), free(x), free(xf), free(y), free(panel);
}

static void bg_matmuls(int threads, int T, int reps, bool exact, lm_dtype wt_type, uint64_t *s) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_cpu_backend_create(threads, LM_ISA_AUTO, &e);
    if (!be) {
        fprintf(stderr, "bench_qgemm: %s\n", e.msg);
        exit(1);
    }
    lm_cpu_backend_quant_exact(be, exact);
    const struct { const char *name; int64_t O, I; } shapes[] = {
        { "q/o", 2048, 2048 }, { "k/v", 512, 2048 }, { "gate/up", 8192, 2048 }, { "down", 2048, 8192 },
    };
    double layer = 0, layer_macs = 0;
    printf("matmuls, %s, %d threads, %s:", lm_dtype_name(wt_type), threads,
           exact ? "exact (weights widened to f32)" : lm_cpu_qkern_for(lm_cpu_isa_detect())->name);
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const int64_t O = shapes[k].O, I = shapes[k].I;
        uint8_t *w = bg_weight(wt_type, O, I, s);
        float *x = bg_x(I * T, s), *y = malloc((size_t)(O * T) * sizeof(float));
        lm_tensor wt = { .type = wt_type, .rows = O, .cols = I };
        lm_tensor xt = { .type = LM_F32, .rows = T, .cols = I, .data = x };
        lm_tensor yt = { .type = LM_F32, .rows = T, .cols = O, .data = y };
        if (be->ops->upload_weight(be, &wt, w, &e) != 0) exit(1);
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            double t0 = bg_clock(CLOCK_MONOTONIC);
            be->ops->matmul(be, &yt, &xt, &wt, NULL);
            double dt = bg_clock(CLOCK_MONOTONIC) - t0;
            if (r && dt < best) best = dt;
        }
        double macs = (double)O * I * T;
        int uses = k == 3 ? 1 : 2; /* q and o, k and v, gate and up; down once */
        layer += uses * best, layer_macs += uses * macs;
        printf("  %s %.2f ms (%.0f GMAC/s)", shapes[k].name, best * 1e3, macs / best / 1e9);
        free(w), free(x), free(y);
    }
    printf("  | a layer %.2f ms, %.0f GMAC/s\n", layer * 1e3, layer_macs / layer / 1e9);
    lm_backend_destroy(be);
}

int main(int argc, char **argv) {
    const char *threads = "1,16";
    int T = 512, reps = 5;
    bool tiles_only = false, exact = false;
    lm_dtype wt_type = LM_Q4_K;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tiles-only")) tiles_only = true;
        else if (!strcmp(argv[i], "--exact")) exact = true;
        else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            const char *name = argv[++i];
            int t = 0;
            while (t < LM_DTYPE_COUNT && (!lm_qblock_types[t].pack || strcmp(lm_dtype_name((lm_dtype)t), name))) t++;
            if (t == LM_DTYPE_COUNT) {
                fprintf(stderr, "bench_qgemm: --type %s: not a type the int8 GEMM takes\n", name);
                return 2;
            }
            wt_type = (lm_dtype)t;
        }
        else {
            fprintf(stderr, "usage: bench_qgemm [--threads 1,16] [--tokens 512] [--reps 5] [--tiles-only] [--exact] [--type Q4_K]\n");
            return 2;
        }
    }
    if (T < 1 || reps < 1) return 2;
    uint64_t s = 1;
    const lm_dtype types[] = { LM_Q4_K, LM_Q5_K, LM_Q6_K, LM_Q8_0, LM_IQ4_XS, LM_Q3_K }; /* the AVX2 tile: no Q8_0, IQ4_XS */
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) bg_tiles(types[i], T, reps, &s);
    if (tiles_only) return 0;
    char *list = strdup(threads);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int n = atoi(tok);
        if (n < 1) continue;
        bg_matmuls(n, T, reps, exact, wt_type, &s);
    }
    free(list);
    return 0;
}
