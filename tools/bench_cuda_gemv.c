/* bench_cuda_gemv.c - the CUDA backend's decode GEMV and prefill GEMM
 * against the device's copy bandwidth.
 *
 *   bench_cuda_gemv [device] [quant]
 *
 * Measures, on one GPU:
 *   copy   device-to-device cudaMemcpy of 2 GiB; GB/s counts bytes read plus
 *          bytes written (the STREAM convention)
 *   launch a chain of small ops (rms_norm, scale on one 4096 row) issued on
 *          the stream and replayed from a CUDA graph: device and host
 *          microseconds per op, and what capture / instantiate / update cost
 *   gemv   the matmul op at T = 1, 2, 4, 8 for the bf16 weights of a
 *          Llama-3.1-8B layer (k/v, q/o, fused qkv, gate, fused gate+up,
 *          down) and its head: GB/s of weight bytes and % of the copy figure
 *   gemm   the matmul op at T = 4096 on a bf16 [4096][4096] weight, TFLOP/s
 *          (2 T O I flops per call), in the default hi/lo split mode and in
 *          LUMEN_CUDA_GEMM=bf16 mode
 *   qgemv  the matmul op at T = 1, 2, 4, 8 over GGUF block-quantised weights
 *          (Q4_K, Q6_K, Q5_K, Q8_0, Q4_0, IQ4_XS) of the Llama-3.1-8B shapes:
 *          GB/s of the stored (quantised) bytes and % of the copy figure
 *   qgemm  T = 512 and 4096 over a Q4_K [4096][4096] (widened to bf16, then
 *          the bf16 GEMM), TFLOP/s
 * With `quant` only copy, qgemv and qgemm run.
 * Each figure is the median of many reps timed with CUDA events on the
 * backend's stream; weights rotate over enough copies (>= 512 MiB) that L2
 * (50 MB on an H100/H200) cannot serve them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef LUMEN_HAVE_CUDA
int main(void) {
    printf("bench_cuda_gemv: lumen was built without CUDA (nvcc not found at build time)\n");
    return 0;
}
#else

#include <cuda_runtime.h>

#include "backend/lm_backend.h"

/* cuda_backend.cu: the stream the backend's ops run on. */
cudaStream_t lm_cuda_backend_stream(lm_backend *be);

#define BC_CHECK(x)                                                                                       \
    do {                                                                                                  \
        cudaError_t err_ = (x);                                                                           \
        if (err_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "bench_cuda_gemv: %s: %s\n", #x, cudaGetErrorString(err_));                   \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

static int bc_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float bc_median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bc_cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t bc_seed = 88172645463325252ull;
static float bc_rnd(void) {
    bc_seed ^= bc_seed << 13;
    bc_seed ^= bc_seed >> 7;
    bc_seed ^= bc_seed << 17;
    return (float)((bc_seed >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* Median milliseconds of one call of the matmul op, `reps` reps of `inner`
 * calls each (weights rotated every call). */
static float bc_time_matmul(lm_backend *be, lm_tensor *w, int n_w, lm_tensor *y, lm_tensor *x, int reps, int inner) {
    cudaStream_t st = lm_cuda_backend_stream(be);
    cudaEvent_t a, b;
    BC_CHECK(cudaEventCreate(&a));
    BC_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) be->ops->matmul(be, y, x, &w[i % n_w], NULL); /* warm up */
    float *ms = malloc((size_t)reps * sizeof *ms);
    int k = 0;
    for (int r = 0; r < reps; r++) {
        BC_CHECK(cudaEventRecord(a, st));
        for (int i = 0; i < inner; i++, k++) be->ops->matmul(be, y, x, &w[k % n_w], NULL);
        BC_CHECK(cudaEventRecord(b, st));
        BC_CHECK(cudaEventSynchronize(b));
        BC_CHECK(cudaEventElapsedTime(&ms[r], a, b));
        ms[r] /= (float)inner;
    }
    float m = bc_median(ms, reps);
    free(ms);
    BC_CHECK(cudaEventDestroy(a));
    BC_CHECK(cudaEventDestroy(b));
    return m;
}

/* Random bytes of a quantised [O][I] with finite f16 scales (small, so
 * that sums stay finite). */
static void *bc_quant_host(lm_dtype t, int64_t O, int64_t I) {
    const size_t bytes = (size_t)O * lm_dtype_row_bytes(t, I), bb = (size_t)lm_dtype_block_bytes(t);
    uint8_t *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) h[i] = (uint8_t)(bc_rnd() * 127.0f);
    const int f0 = t == LM_Q6_K ? 208 : 0, f1 = t == LM_Q4_K || t == LM_Q5_K ? 2 : -1;
    for (size_t off = 0; off < bytes; off += bb) {
        const uint16_t d = lm_f32_to_f16(0.001f * (1.5f + bc_rnd()));
        memcpy(h + off + f0, &d, 2);
        if (f1 >= 0) memcpy(h + off + f1, &d, 2);
    }
    return h;
}

/* n_w copies of a random [O][I] weight of type t on be. */
static lm_tensor *bc_weights_t(lm_backend *be, lm_dtype t, int64_t O, int64_t I, int n_w) {
    size_t n = (size_t)(O * I);
    void *h;
    if (t == LM_BF16) {
        uint16_t *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++) b[i] = lm_f32_to_bf16(0.05f * bc_rnd());
        h = b;
    } else {
        h = bc_quant_host(t, O, I);
    }
    lm_tensor *w = calloc((size_t)n_w, sizeof *w);
    for (int i = 0; i < n_w; i++) {
        lm_err e = { { 0 } };
        w[i] = (lm_tensor){ .type = t, .rows = O, .cols = I };
        if (be->ops->upload_weight(be, &w[i], h, &e)) {
            fprintf(stderr, "bench_cuda_gemv: %s\n", e.msg);
            exit(1);
        }
    }
    free(h);
    return w;
}

static lm_tensor *bc_weights(lm_backend *be, int64_t O, int64_t I, int n_w) {
    return bc_weights_t(be, LM_BF16, O, I, n_w);
}

static void bc_free_weights(lm_backend *be, lm_tensor *w, int n_w) {
    for (int i = 0; i < n_w; i++) be->ops->free(be, w[i].data);
    free(w);
}

static lm_tensor bc_act(lm_backend *be, int64_t rows, int64_t cols, bool fill) {
    lm_tensor t;
    if (lm_tensor_alloc(be, &t, rows, cols)) {
        fprintf(stderr, "bench_cuda_gemv: out of GPU memory for [%lld][%lld]\n", (long long)rows, (long long)cols);
        exit(1);
    }
    if (fill) {
        size_t n = (size_t)(rows * cols);
        float *h = malloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++) h[i] = bc_rnd();
        be->ops->write(be, t.data, h, n * sizeof *h);
        free(h);
    }
    return t;
}

static double bc_copy_gbs(lm_backend *be) {
    const size_t bytes = (size_t)2 << 30;
    void *src = be->ops->alloc(be, bytes), *dst = be->ops->alloc(be, bytes);
    if (!src || !dst) {
        fprintf(stderr, "bench_cuda_gemv: cannot allocate 2 x 2 GiB for the copy test\n");
        exit(1);
    }
    cudaStream_t st = lm_cuda_backend_stream(be);
    cudaEvent_t a, b;
    BC_CHECK(cudaEventCreate(&a));
    BC_CHECK(cudaEventCreate(&b));
    BC_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    enum { REPS = 15 };
    float ms[REPS];
    for (int r = 0; r < REPS; r++) {
        BC_CHECK(cudaEventRecord(a, st));
        BC_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
        BC_CHECK(cudaEventRecord(b, st));
        BC_CHECK(cudaEventSynchronize(b));
        BC_CHECK(cudaEventElapsedTime(&ms[r], a, b));
    }
    float m = bc_median(ms, REPS);
    BC_CHECK(cudaEventDestroy(a));
    BC_CHECK(cudaEventDestroy(b));
    be->ops->free(be, src);
    be->ops->free(be, dst);
    return 2.0 * (double)bytes / (m * 1e-3) / 1e9;
}

static void bc_gemm(lm_backend *be, const char *mode) {
    const int64_t N = 4096;
    lm_tensor *w = bc_weights(be, N, N, 2);
    lm_tensor x = bc_act(be, N, N, true), y = bc_act(be, N, N, false);
    float ms = bc_time_matmul(be, w, 2, &y, &x, 21, 1);
    printf("gemm  %-22s T=%-5lld %9.3f ms  %7.1f TFLOP/s\n", mode, (long long)N, ms,
           2.0 * (double)N * N * N / (ms * 1e-3) / 1e12);
    lm_tensor_release(be, &x);
    lm_tensor_release(be, &y);
    bc_free_weights(be, w, 2);
}

/* The matmul op over quantised weights of the Llama-3.1-8B shapes at T =
 * 1..8 (GB/s of stored bytes), and a Q4_K prefill product. */
static void bc_quant(lm_backend *be, double copy) {
    static const lm_dtype types[] = { LM_Q4_K, LM_Q6_K, LM_Q5_K, LM_Q8_0, LM_Q4_0, LM_IQ4_XS };
    static const int64_t shapes[][2] = { { 4096, 4096 }, { 14336, 4096 }, { 4096, 14336 }, { 128256, 4096 } };
    static const int64_t Ts[] = { 1, 2, 4, 8 };
    printf("%-6s %-7s %-16s %-3s %10s %10s %8s\n", "op", "type", "weight [O][I]", "T", "us/call", "GB/s", "% copy");
    for (size_t qi = 0; qi < sizeof types / sizeof types[0]; qi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const lm_dtype t = types[qi];
            const int64_t O = shapes[si][0], I = shapes[si][1];
            if (O == 128256 && t != LM_Q6_K && t != LM_Q4_K) continue; /* the head: Q6_K in Q4_K_M files */
            const double wbytes = (double)O * (double)lm_dtype_row_bytes(t, I);
            int n_w = (int)((512.0 * 1048576.0 + wbytes - 1) / wbytes);
            if (n_w < 2) n_w = 2;
            lm_tensor *w = bc_weights_t(be, t, O, I, n_w);
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const int64_t T = Ts[ti];
                lm_tensor x = bc_act(be, T, I, true), y = bc_act(be, T, O, false);
                const int inner = wbytes < 64e6 ? 20 : wbytes < 256e6 ? 5 : 1;
                const float ms = bc_time_matmul(be, w, n_w, &y, &x, 51, inner);
                const double gbs = wbytes / (ms * 1e-3) / 1e9;
                char sh[32];
                snprintf(sh, sizeof sh, "%lldx%lld", (long long)O, (long long)I);
                printf("%-6s %-7s %-16s %-3lld %10.2f %10.0f %7.1f%%\n", "qgemv", lm_dtype_name(t), sh, (long long)T,
                       ms * 1e3, gbs, 100.0 * gbs / copy);
                lm_tensor_release(be, &x);
                lm_tensor_release(be, &y);
            }
            bc_free_weights(be, w, n_w);
        }
    const int64_t N = 4096;
    lm_tensor *w = bc_weights_t(be, LM_Q4_K, N, N, 2);
    for (int64_t T = 512; T <= N; T *= 8) {
        lm_tensor x = bc_act(be, T, N, true), y = bc_act(be, T, N, false);
        const float ms = bc_time_matmul(be, w, 2, &y, &x, 11, 1);
        printf("qgemm  Q4_K    %-16s T=%-5lld %9.3f ms  %7.1f TFLOP/s\n", "4096x4096", (long long)T, ms,
               2.0 * (double)T * N * N / (ms * 1e-3) / 1e12);
        lm_tensor_release(be, &x);
        lm_tensor_release(be, &y);
    }
    bc_free_weights(be, w, 2);
}

static double bc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A decode step's small ops: N rms_norm + add pairs on one [1][4096] row,
 * issued on the stream, and the same captured once into a CUDA graph and
 * replayed; microseconds per op on the device and on the host. */
static void bc_launch(lm_backend *be) {
    enum { N = 224, REPS = 21 };
    lm_tensor x = bc_act(be, 1, 4096, true), y = bc_act(be, 1, 4096, false), w = bc_act(be, 1, 4096, true);
    cudaStream_t st = lm_cuda_backend_stream(be);
    cudaEvent_t a, b;
    BC_CHECK(cudaEventCreate(&a));
    BC_CHECK(cudaEventCreate(&b));
    float ms[REPS];
    double host[REPS];
    for (int r = 0; r < REPS; r++) {
        BC_CHECK(cudaEventRecord(a, st));
        double t0 = bc_now();
        for (int i = 0; i < N; i++) {
            be->ops->rms_norm(be, &y, &x, &w, 1e-5f, 0.0f);
            be->ops->scale(be, &y, 0.5f);
        }
        host[r] = bc_now() - t0;
        BC_CHECK(cudaEventRecord(b, st));
        BC_CHECK(cudaEventSynchronize(b));
        BC_CHECK(cudaEventElapsedTime(&ms[r], a, b));
    }
    float sm = bc_median(ms, REPS);
    double hmin = host[0];
    for (int r = 1; r < REPS; r++) hmin = host[r] < hmin ? host[r] : hmin;
    printf("launch stream: %d small ops: %.2f us/op on the device, %.2f us/op to issue\n", 2 * N, 1e3 * sm / (2 * N),
           1e6 * hmin / (2 * N));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    double t0 = bc_now();
    BC_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < N; i++) {
        be->ops->rms_norm(be, &y, &x, &w, 1e-5f, 0.0f);
        be->ops->scale(be, &y, 0.5f);
    }
    BC_CHECK(cudaStreamEndCapture(st, &g));
    double t1 = bc_now();
    BC_CHECK(cudaGraphInstantiate(&ge, g, 0));
    double t2 = bc_now();
    /* a second capture of the same ops, applied by update (what a re-captured step costs) */
    cudaGraph_t g2;
    BC_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < N; i++) {
        be->ops->rms_norm(be, &y, &x, &w, 1e-5f, 0.0f);
        be->ops->scale(be, &y, 0.5f);
    }
    BC_CHECK(cudaStreamEndCapture(st, &g2));
    double t3 = bc_now();
    cudaGraphExecUpdateResultInfo info;
    BC_CHECK(cudaGraphExecUpdate(ge, g2, &info));
    double t4 = bc_now();
    for (int r = 0; r < REPS; r++) {
        BC_CHECK(cudaEventRecord(a, st));
        double h0 = bc_now();
        BC_CHECK(cudaGraphLaunch(ge, st));
        host[r] = bc_now() - h0;
        BC_CHECK(cudaEventRecord(b, st));
        BC_CHECK(cudaEventSynchronize(b));
        BC_CHECK(cudaEventElapsedTime(&ms[r], a, b));
    }
    float gm = bc_median(ms, REPS);
    printf("launch graph:  %.2f us/op on the device; capture %.2f us/op, instantiate %.0f us, update %.0f us, "
           "launch %.0f us\n",
           1e3 * gm / (2 * N), 1e6 * (t1 - t0) / (2 * N), 1e6 * (t2 - t1), 1e6 * (t4 - t3), 1e6 * host[REPS - 1]);
    BC_CHECK(cudaGraphExecDestroy(ge));
    BC_CHECK(cudaGraphDestroy(g));
    BC_CHECK(cudaGraphDestroy(g2));
    BC_CHECK(cudaEventDestroy(a));
    BC_CHECK(cudaEventDestroy(b));
    lm_tensor_release(be, &x);
    lm_tensor_release(be, &y);
    lm_tensor_release(be, &w);
}

int main(int argc, char **argv) {
    int device = argc > 1 ? atoi(argv[1]) : 0;
    const bool quant_only = argc > 2 && strcmp(argv[2], "quant") == 0;
    char why[512];
    if (!lm_cuda_available(why, sizeof why)) {
        printf("bench_cuda_gemv: %s\n", why);
        return 0;
    }
    printf("%s\n", why);
    lm_err e = { { 0 } };
    unsetenv("LUMEN_CUDA_GEMM");
    lm_backend *be = lm_cuda_backend_create(device, &e);
    if (!be) {
        fprintf(stderr, "bench_cuda_gemv: %s\n", e.msg);
        return 1;
    }
    double copy = bc_copy_gbs(be);
    printf("copy  device-to-device 2 GiB: %.0f GB/s (read + write)\n\n", copy);
    bc_quant(be, copy);
    printf("\n");
    if (quant_only) {
        lm_backend_destroy(be);
        return 0;
    }
    bc_launch(be);
    printf("\n");

    static const int64_t shapes[][2] = { { 1024, 4096 },  { 4096, 4096 },  { 6144, 4096 },  { 14336, 4096 },
                                         { 28672, 4096 }, { 4096, 14336 }, { 128256, 4096 } };
    static const int64_t Ts[] = { 1, 2, 4, 8 };
    printf("%-6s %-16s %-3s %10s %10s %8s\n", "op", "weight [O][I]", "T", "us/call", "GB/s", "% copy");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t O = shapes[si][0], I = shapes[si][1];
        double wbytes = (double)O * (double)I * 2.0;
        int n_w = (int)((512.0 * 1048576.0 + wbytes - 1) / wbytes);
        if (n_w < 2) n_w = 2;
        lm_tensor *w = bc_weights(be, O, I, n_w);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            int64_t T = Ts[ti];
            lm_tensor x = bc_act(be, T, I, true), y = bc_act(be, T, O, false);
            int inner = wbytes < 64e6 ? 20 : wbytes < 256e6 ? 5 : 1;
            float ms = bc_time_matmul(be, w, n_w, &y, &x, 51, inner);
            double gbs = wbytes / (ms * 1e-3) / 1e9;
            char sh[32];
            snprintf(sh, sizeof sh, "%lldx%lld", (long long)O, (long long)I);
            printf("%-6s %-16s %-3lld %10.2f %10.0f %7.1f%%\n", "gemv", sh, (long long)T, ms * 1e3, gbs,
                   100.0 * gbs / copy);
            lm_tensor_release(be, &x);
            lm_tensor_release(be, &y);
        }
        bc_free_weights(be, w, n_w);
    }
    printf("\n");
    bc_gemm(be, "bf16 hi/lo (default)");
    lm_backend_destroy(be);

    setenv("LUMEN_CUDA_GEMM", "bf16", 1);
    be = lm_cuda_backend_create(device, &e);
    if (!be) {
        fprintf(stderr, "bench_cuda_gemv: %s\n", e.msg);
        return 1;
    }
    bc_gemm(be, "bf16 (LUMEN_CUDA_GEMM)");
    lm_backend_destroy(be);
    return 0;
}
#endif
