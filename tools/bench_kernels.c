/* bench_kernels.c - micro-benchmarks of the CPU backend's matmul kernels
 * against this machine's own limits, measured in the same run.
 *
 *   bench_kernels [--threads N] [--isa auto|scalar|avx2|avx512] [--all-isas]
 *                 [--only gemv|gemm|hilo]
 *
 * Prints:
 *   - memory copy bandwidth: STREAM-like copy of a 1 GiB buffer, N threads,
 *     best of 5 (read + write bytes, STREAM's convention; lm_copy_bandwidth);
 *   - bf16 GEMV (T = 1, the decode matmul) for 2048x8192 and 8192x2048
 *     weights ([O][K]) in GB/s of weight streamed and as % of that bandwidth.
 *     The last-level cache of a server CPU can hold a whole test matrix, so
 *     the GEMV cycles through enough copies of the weight to exceed twice the
 *     L3 size: every call then streams its weight from DRAM, as in decoding;
 *   - OpenBLAS sgemm GFLOP/s at 512x2048x2048 with N threads (the f32 peak we
 *     measure against; OpenBLAS is linked into this tool only, when CMake finds
 *     it) and lumen's bf16-weight GEMM at the same shape and at 512x8192x2048,
 *     with the % of the OpenBLAS figure; and both again on one thread timed
 *     by thread CPU time, a comparison that survives a busy machine;
 *   - an experiment: bf16 dot products through vdpbf16ps with x split into
 *     hi + lo bf16 parts, their accuracy and speed against the f32 path.
 * Timings are best of several repetitions after a warm-up. */
#include "backend/lm_backend.h"
#include "base/lm_membw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef LUMEN_HAVE_OPENBLAS
#include <cblas.h> /* pulls in complex.h, whose I macro is why the inner size is K here */
/* Declared by OpenBLAS's own cblas.h only. */
void openblas_set_num_threads(int n);
char *openblas_get_corename(void);
#endif

static float bk_rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void *bk_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static uint16_t *bk_bf16_matrix(int64_t n, uint64_t *s) {
    uint16_t *w = bk_alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) w[i] = lm_f32_to_bf16(0.05f * bk_rnd(s));
    return w;
}

static long bk_l3_bytes(void) {
#ifdef _SC_LEVEL3_CACHE_SIZE
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v > 0) return v;
#endif
    return 64L << 20;
}

/* ---- GEMV ----------------------------------------------------------------- */

static void bk_gemv(lm_backend *be, int64_t O, int64_t K, double copy_bw, double read_bw) {
    uint64_t s = 1;
    size_t wbytes = (size_t)O * (size_t)K * 2;
    int copies = (int)(2 * bk_l3_bytes() / (long)wbytes) + 2;
    uint16_t **w = malloc((size_t)copies * sizeof *w);
    for (int c = 0; c < copies; c++) w[c] = bk_bf16_matrix(O * K, &s);
    float *x = bk_alloc((size_t)K * 4), *y = bk_alloc((size_t)O * 4);
    for (int64_t i = 0; i < K; i++) x[i] = bk_rnd(&s);
    lm_tensor xt = { .type = LM_F32, .rows = 1, .cols = K, .data = x };
    lm_tensor yt = { .type = LM_F32, .rows = 1, .cols = O, .data = y };
    lm_tensor *wt = calloc((size_t)copies, sizeof *wt);
    lm_err e;
    for (int c = 0; c < copies; c++) {
        wt[c] = (lm_tensor){ .type = LM_BF16, .rows = O, .cols = K };
        if (be->ops->upload_weight(be, &wt[c], w[c], &e)) {
            fprintf(stderr, "bench_kernels: %s\n", e.msg);
            exit(1);
        }
    }
    for (int c = 0; c < copies; c++) be->ops->matmul(be, &yt, &xt, &wt[c], NULL); /* warm-up */
    double best = 1e30;
    for (int rep = 0; rep < 10; rep++) {
        double t0 = lm_now();
        for (int c = 0; c < copies; c++) be->ops->matmul(be, &yt, &xt, &wt[c], NULL);
        double dt = (lm_now() - t0) / copies;
        if (dt < best) best = dt;
    }
    /* The same weight over and over: what the last-level cache delivers. */
    double hot = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = lm_now();
        be->ops->matmul(be, &yt, &xt, &wt[0], NULL);
        double dt = lm_now() - t0;
        if (dt < hot) hot = dt;
    }
    double gbs = (double)wbytes / best * 1e-9;
    printf("bf16 GEMV  T=1 O=%-5lld I=%-5lld  %7.3f ms  %6.2f GB/s  %5.1f %% of copy, "
           "%5.1f %% of read bandwidth"
           "  (cache-hot: %.2f GB/s; %d weight copies rotated)\n",
           (long long)O, (long long)K, best * 1e3, gbs, 100.0 * gbs / (copy_bw * 1e-9),
           100.0 * gbs / (read_bw * 1e-9), (double)wbytes / hot * 1e-9, copies);
    for (int c = 0; c < copies; c++) free(w[c]);
    free(w);
    free(wt);
    free(x);
    free(y);
}

/* ---- GEMM ----------------------------------------------------------------- */

/* CPU time of the calling thread: for single-threaded runs it does not count
 * time spent preempted, so it stays meaningful on a busy machine. */
static double bk_thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double bk_time_best_with(double (*clock)(void), int reps, void (*fn)(void *), void *ctx) {
    fn(ctx); /* warm-up */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = clock();
        fn(ctx);
        double dt = clock() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static double bk_time_best(int reps, void (*fn)(void *), void *ctx) {
    return bk_time_best_with(lm_now, reps, fn, ctx);
}

typedef struct bk_mm {
    lm_backend *be;
    lm_tensor y, x, w;
    int64_t T, O, K;
    float *xf, *wf, *yf; /* f32 copies for OpenBLAS */
} bk_mm;

static void bk_lumen_run(void *v) {
    bk_mm *m = v;
    m->be->ops->matmul(m->be, &m->y, &m->x, &m->w, NULL);
}

#ifdef LUMEN_HAVE_OPENBLAS
static void bk_blas_run(void *v) {
    bk_mm *m = v;
    /* y[T][O] = x[T][K] * W[O][K]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m->T, (int)m->O, (int)m->K, 1.0f, m->xf,
                (int)m->K, m->wf, (int)m->K, 0.0f, m->yf, (int)m->O);
}
#endif

static void bk_mm_init(bk_mm *m, lm_backend *be, int64_t T, int64_t O, int64_t K, bool f32_copies) {
    uint64_t s = 7;
    memset(m, 0, sizeof *m);
    m->be = be;
    m->T = T, m->O = O, m->K = K;
    uint16_t *w = bk_bf16_matrix(O * K, &s);
    float *x = bk_alloc((size_t)(T * K) * 4), *y = bk_alloc((size_t)(T * O) * 4);
    for (int64_t i = 0; i < T * K; i++) x[i] = bk_rnd(&s);
    m->x = (lm_tensor){ .type = LM_F32, .rows = T, .cols = K, .data = x };
    m->y = (lm_tensor){ .type = LM_F32, .rows = T, .cols = O, .data = y };
    m->w = (lm_tensor){ .type = LM_BF16, .rows = O, .cols = K };
    lm_err e;
    if (be && be->ops->upload_weight(be, &m->w, w, &e)) {
        fprintf(stderr, "bench_kernels: %s\n", e.msg);
        exit(1);
    }
    m->w.data = w;
    if (f32_copies) {
        m->xf = x;
        m->wf = bk_alloc((size_t)(O * K) * 4);
        for (int64_t i = 0; i < O * K; i++) m->wf[i] = lm_bf16_to_f32(w[i]);
        m->yf = bk_alloc((size_t)(T * O) * 4);
    }
}

static void bk_mm_free(bk_mm *m) {
    free(m->x.data);
    free(m->y.data);
    free(m->w.data);
    free(m->wf);
    free(m->yf);
}

/* Largest difference from OpenBLAS on the same (widened) weights, relative
 * to the largest output: both accumulate in f32, so ~1e-6 is expected. */
static double bk_max_rel_diff(const bk_mm *m) {
    double worst = 0, big = 0;
    const float *a = m->y.data;
    for (int64_t i = 0; i < m->T * m->O; i++) {
        worst = fmax(worst, fabs((double)a[i] - m->yf[i]));
        big = fmax(big, fabs((double)m->yf[i]));
    }
    return big > 0 ? worst / big : worst;
}

static double bk_blas_gflops(int threads, int64_t T, int64_t O, int64_t K) {
#ifdef LUMEN_HAVE_OPENBLAS
    openblas_set_num_threads(threads);
    bk_mm m;
    bk_mm_init(&m, NULL, T, O, K, true);
    double t = bk_time_best(5, bk_blas_run, &m);
    bk_mm_free(&m);
    return 2.0 * (double)T * (double)O * (double)K / t * 1e-9;
#else
    (void)threads, (void)T, (void)O, (void)K;
    return 0;
#endif
}

/* One thread, timed by thread CPU time: lumen's GEMM and OpenBLAS per core. */
static double bk_gemm_per_core(lm_cpu_isa isa, bool blas, int64_t T, int64_t O, int64_t K) {
    lm_err e;
    lm_backend *be = blas ? NULL : lm_cpu_backend_create(1, isa, &e);
    if (!blas && !be) return 0;
    bk_mm m;
    bk_mm_init(&m, be, T, O, K, blas);
    double t = 1e30;
#ifdef LUMEN_HAVE_OPENBLAS
    if (blas) openblas_set_num_threads(1);
    if (blas) t = bk_time_best_with(bk_thread_cpu, 5, bk_blas_run, &m);
#endif
    if (!blas) t = bk_time_best_with(bk_thread_cpu, 5, bk_lumen_run, &m);
    bk_mm_free(&m);
    lm_backend_destroy(be);
    return 2.0 * (double)T * (double)O * (double)K / t * 1e-9;
}

static void bk_gemm(lm_backend *be, int threads, int64_t T, int64_t O, int64_t K, double blas) {
    bk_mm m;
    bk_mm_init(&m, be, T, O, K, true);
    double t = bk_time_best(5, bk_lumen_run, &m);
    double gf = 2.0 * (double)T * (double)O * (double)K / t * 1e-9;
    double diff = -1;
#ifdef LUMEN_HAVE_OPENBLAS
    openblas_set_num_threads(threads);
    bk_blas_run(&m);
    diff = bk_max_rel_diff(&m);
#endif
    printf("bf16 GEMM  T=%-4lld O=%-5lld I=%-5lld  %7.2f ms  %7.2f GFLOP/s  %5.1f %% of OpenBLAS sgemm"
           "  (max rel diff vs sgemm %.1e)\n",
           (long long)T, (long long)O, (long long)K, t * 1e3, gf, blas > 0 ? 100.0 * gf / blas : 0.0, diff);
    bk_mm_free(&m);
}

/* ---- experiment: bf16 dot products with vdpbf16ps on a hi/lo split --------
 *
 * AVX512_BF16 multiplies bf16 pairs, which would round the activation to bf16
 * (8-bit mantissa: logits off by ~1e-2). Splitting x = hi + lo into two bf16
 * parts keeps ~16 bits; is that accurate enough, and is it faster than
 * widening the weight and using f32 FMA? Compiled for the ISA per function,
 * run only where the CPU has AVX512_BF16. */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BK_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

/* y[r] = W[r] . x for R rows; x given as interleaved-pair bf16 hi and lo. */
BK_BF16_TARGET static void bk_hilo_gemv(const uint16_t *w, int64_t R, int64_t n, const uint16_t *xh,
                                        const uint16_t *xl, float *y) {
    for (int64_t r = 0; r < R; r++) {
        const uint16_t *wr = w + r * n;
        __m512 h = _mm512_setzero_ps(), l = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 32) {
            __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + i);
            h = _mm512_dpbf16_ps(h, wv, (__m512bh)_mm512_loadu_si512(xh + i));
            l = _mm512_dpbf16_ps(l, wv, (__m512bh)_mm512_loadu_si512(xl + i));
        }
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(h, l));
    }
}

BK_BF16_TARGET static void bk_hilo_dot3(const uint16_t *w, const float *x, const uint16_t *xh,
                                        const uint16_t *xl, int64_t n, double out[3]) {
    __m512 a = _mm512_setzero_ps(), h = _mm512_setzero_ps(), l = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 wf = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + i))), 16));
        a = _mm512_fmadd_ps(wf, _mm512_loadu_ps(x + i), a);
    }
    for (int64_t i = 0; i < n; i += 32) {
        __m512bh wv = (__m512bh)_mm512_loadu_si512(w + i);
        h = _mm512_dpbf16_ps(h, wv, (__m512bh)_mm512_loadu_si512(xh + i));
        l = _mm512_dpbf16_ps(l, wv, (__m512bh)_mm512_loadu_si512(xl + i));
    }
    out[0] = _mm512_reduce_add_ps(a);
    out[1] = (double)_mm512_reduce_add_ps(h) + (double)_mm512_reduce_add_ps(l);
    out[2] = _mm512_reduce_add_ps(h);
}

static void bk_hilo(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16") || lm_cpu_isa_detect() != LM_ISA_AVX512) {
        printf("bf16 hi/lo experiment: skipped (no AVX512_BF16)\n");
        return;
    }
    enum { N = 2048, TRIALS = 500, R = 256 };
    uint64_t s = 3;
    uint16_t *w = bk_alloc((size_t)R * N * 2), *xh = bk_alloc(N * 2), *xl = bk_alloc(N * 2);
    float *x = bk_alloc(N * 4), *y = bk_alloc(R * 4);
    double err[3] = { 0 };
    for (int t = 0; t < TRIALS; t++) {
        for (int i = 0; i < N; i++) {
            w[i] = lm_f32_to_bf16(0.05f * bk_rnd(&s));
            x[i] = bk_rnd(&s) * (i % 97 == 0 ? 20.0f : 1.0f); /* a few outlier channels */
            xh[i] = lm_f32_to_bf16(x[i]);
            xl[i] = lm_f32_to_bf16(x[i] - lm_bf16_to_f32(xh[i]));
        }
        double ref = 0, got[3];
        for (int i = 0; i < N; i++) ref += (double)lm_bf16_to_f32(w[i]) * x[i];
        bk_hilo_dot3(w, x, xh, xl, N, got);
        for (int k = 0; k < 3; k++) err[k] += fabs(got[k] - ref) / fabs(ref) / TRIALS;
    }
    printf("bf16 dot products (n=%d, mean relative error vs f64): f32 FMA %.1e, vdpbf16ps hi+lo %.1e, "
           "vdpbf16ps hi only %.1e\n", N, err[0], err[1], err[2]);
    /* Speed, one thread, weight hot in L2: the compute side of the kernels. */
    for (int64_t i = 0; i < (int64_t)R * N; i++) w[i] = lm_f32_to_bf16(0.05f * bk_rnd(&s));
    double hl = 1e30;
    for (int rep = 0; rep < 200; rep++) {
        double t0 = lm_now();
        bk_hilo_gemv(w, R, N, xh, xl, y);
        hl = fmin(hl, lm_now() - t0);
    }
    lm_err e;
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AVX512, &e);
    lm_tensor wt = { .type = LM_BF16, .rows = R, .cols = N, .data = w };
    lm_tensor xt = { .type = LM_F32, .rows = 1, .cols = N, .data = x };
    lm_tensor yt = { .type = LM_F32, .rows = 1, .cols = R, .data = y };
    double f = 1e30;
    for (int rep = 0; rep < 200; rep++) {
        double t0 = lm_now();
        be->ops->matmul(be, &yt, &xt, &wt, NULL);
        f = fmin(f, lm_now() - t0);
    }
    lm_backend_destroy(be);
    printf("bf16 GEMV %dx%d, 1 thread, L2-hot: lumen f32-FMA kernel %.1f us, vdpbf16ps hi+lo %.1f us\n", R, N,
           f * 1e6, hl * 1e6);
    free(w), free(xh), free(xl), free(x), free(y);
}
#else
static void bk_hilo(void) { printf("bf16 hi/lo experiment: skipped (not x86-64 GCC)\n"); }
#endif

/* OpenBLAS picks its kernels when the library loads. Versions that do not
 * know a newer CPU fall back to "Prescott" (SSE3) kernels, several times
 * slower than what the machine can do, which would make a flattering
 * yardstick. In that case restart once with OPENBLAS_CORETYPE naming the
 * kernels for the ISA we detected; an explicit OPENBLAS_CORETYPE is kept. */
static void bk_openblas_kernels(char **argv) {
#ifdef LUMEN_HAVE_OPENBLAS
    if (getenv("OPENBLAS_CORETYPE") || strcmp(openblas_get_corename(), "Prescott") != 0) return;
    lm_cpu_isa isa = lm_cpu_isa_detect();
    const char *want = isa == LM_ISA_AVX512 ? "SkylakeX" : isa == LM_ISA_AVX2 ? "Haswell" : NULL;
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    execv("/proc/self/exe", argv);
    perror("bench_kernels: cannot restart with OPENBLAS_CORETYPE set");
#else
    (void)argv;
#endif
}

/* ---- main ----------------------------------------------------------------- */

static void bk_usage(void) {
    fprintf(stderr, "usage: bench_kernels [--threads N] [--isa auto|scalar|avx2|avx512] [--all-isas]"
                    " [--only gemv|gemm|hilo]\n");
}

int main(int argc, char **argv) {
    int threads = 2;
    lm_cpu_isa isa = LM_ISA_AUTO;
    bool all_isas = false, gemv = true, gemm = true, hilo = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--all-isas")) all_isas = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *v = argv[++i];
            gemv = !strcmp(v, "gemv");
            gemm = !strcmp(v, "gemm");
            hilo = !strcmp(v, "hilo");
            if (!gemv && !gemm && !hilo) return bk_usage(), 2;
        }
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "scalar")) isa = LM_ISA_SCALAR;
            else if (!strcmp(v, "avx2")) isa = LM_ISA_AVX2;
            else if (!strcmp(v, "avx512")) isa = LM_ISA_AVX512;
            else if (strcmp(v, "auto")) return bk_usage(), 2;
        } else return bk_usage(), 2;
    }
    if (threads < 1) return bk_usage(), 2;
    bk_openblas_kernels(argv);

    double bw = 0, rbw = 0;
    if (gemv) {
        bw = lm_copy_bandwidth((size_t)1 << 30, threads, 5);
        rbw = lm_read_bandwidth((size_t)1 << 30, threads, 5);
        printf("memory copy bandwidth: %.2f GB/s (1 GiB STREAM-like copy, %d threads, best of 5, "
               "read+write bytes)\n", bw * 1e-9, threads);
        printf("memory read bandwidth: %.2f GB/s (1 GiB streaming read, %d threads, best of 5)\n",
               rbw * 1e-9, threads);
    }
    double blas = gemm ? bk_blas_gflops(threads, 512, 2048, 2048) : 0;
    double blas1 = gemm ? bk_gemm_per_core(LM_ISA_AUTO, true, 512, 2048, 2048) : 0;
#ifdef LUMEN_HAVE_OPENBLAS
    if (gemm) {
        printf("OpenBLAS sgemm 512x2048x2048 (%d threads, %s kernels): %.2f GFLOP/s\n", threads,
               openblas_get_corename(), blas);
        printf("OpenBLAS sgemm 512x2048x2048 per core (1 thread, thread CPU time): %.2f GFLOP/s\n", blas1);
    }
#else
    printf("OpenBLAS sgemm: not available (tool built without OpenBLAS)\n");
#endif

    lm_cpu_isa first = isa, last = isa;
    if (all_isas) first = LM_ISA_SCALAR, last = lm_cpu_isa_detect();
    for (int k = first; k <= (int)last && (gemv || gemm); k++) {
        lm_err e;
        lm_backend *be = lm_cpu_backend_create(threads, (lm_cpu_isa)k, &e);
        if (!be) {
            fprintf(stderr, "bench_kernels: %s\n", e.msg);
            return 1;
        }
        printf("-- lumen cpu backend, %s, %d threads\n",
               lm_cpu_isa_name(k == LM_ISA_AUTO ? lm_cpu_isa_detect() : (lm_cpu_isa)k), threads);
        if (gemv) {
            bk_gemv(be, 2048, 8192, bw, rbw);
            bk_gemv(be, 8192, 2048, bw, rbw);
        }
        if (gemm) {
            bk_gemm(be, threads, 512, 2048, 2048, blas);
            bk_gemm(be, threads, 512, 8192, 2048, blas);
            double g1 = bk_gemm_per_core((lm_cpu_isa)k, false, 512, 2048, 2048);
            printf("bf16 GEMM  T=512  O=2048  I=2048  per core (1 thread, thread CPU time): %.2f GFLOP/s  "
                   "%5.1f %% of OpenBLAS per core\n", g1, blas1 > 0 ? 100.0 * g1 / blas1 : 0.0);
        }
        lm_backend_destroy(be);
    }
    if (hilo) bk_hilo();
    return 0;
}
