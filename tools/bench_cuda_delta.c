/* bench_cuda_delta.c - one Gated DeltaNet layer's recurrent ops on the GPU:
 * the delta rule in the recurrent kernel (token by token) against the
 * chunked kernel, and the causal convolution.
 *
 *   bench_cuda_delta [reps]
 *
 * Shape: Qwen3.5-27B's linear-attention layers (16 key heads, 48 value
 * heads, Dk = Dv = 128, conv width 4 over 2*16*128 + 48*128 = 10240
 * channels). Cases: one sequence of 32768 tokens and 8 sequences of 4096
 * (the published bar for a chunked GDN forward on an H200: 1.26 ms and
 * 0.64 ms a layer), then 8 sequences of 1 .. 64 tokens for the crossover
 * between the two kernels. Each sequence starts at position 0 (zero state,
 * so every rep does the same work); inputs are random (q, k, v in [-1, 1],
 * g in [-0.5, 0], beta in [0.05, 1]).
 *
 * Two GPU backends: LUMEN_CUDA_DELTA_CHUNK_MIN=0 (every sequence recurrent)
 * and =1 (every sequence chunked). Each figure is the median of reps calls
 * timed with CUDA events on the backend's stream, after one warm-up call.
 * For the two large cases the chunked output is compared with the recurrent
 * one (max |diff| / max(|ref|, 1): a sanity line, ~1e-5 expected). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef LUMEN_HAVE_CUDA
int main(void) {
    printf("bench_cuda_delta: lumen was built without CUDA (nvcc not found at build time)\n");
    return 0;
}
#else

#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/lm_backend.h"

/* cuda_backend.cu: the stream the backend's ops run on. */
cudaStream_t lm_cuda_backend_stream(lm_backend *be);

#define BD_CHECK(x)                                                                                       \
    do {                                                                                                  \
        cudaError_t err_ = (x);                                                                           \
        if (err_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "bench_cuda_delta: %s: %s\n", #x, cudaGetErrorString(err_));                  \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

enum { BD_HK = 16, BD_HV = 48, BD_D = 128, BD_K = 4 };
#define BD_C ((int64_t)2 * BD_HK * BD_D + (int64_t)BD_HV * BD_D)
#define BD_O ((int64_t)BD_HV * BD_D)

static int bd_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float bd_median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bd_cmp_float);
    return v[n / 2];
}

static void bd_fill(float *p, size_t n, uint64_t *s, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = lo + (hi - lo) * (float)((*s >> 40) & 0xffffff) / (float)0x1000000;
    }
}

/* One case's inputs on one backend. */
typedef struct bd_case {
    int S, n, T;
    int32_t *pos, *seq, *slot;
    lm_attn_batch b;
    lm_tensor qkv, conv_out, g, beta, w, out;
    float *state;
    int64_t floats;
    lm_kv_pool kv;
} bd_case;

static lm_tensor bd_tensor(lm_backend *be, int64_t rows, int64_t cols, const float *host) {
    lm_tensor t;
    if (lm_tensor_alloc(be, &t, rows, cols) != 0) {
        fprintf(stderr, "bench_cuda_delta: out of device memory ([%lld][%lld])\n", (long long)rows, (long long)cols);
        exit(1);
    }
    if (host) be->ops->write(be, t.data, host, (size_t)(rows * cols) * sizeof(float));
    return t;
}

/* S sequences of n tokens, one after another in the batch (a prefill
 * batch's order); host: random [T][C] inputs, [T][Hv] g and beta. */
static void bd_case_make(bd_case *c, lm_backend *be, int S, int n, const float *x, const float *g,
                         const float *beta, const float *w) {
    memset(c, 0, sizeof *c);
    c->S = S, c->n = n, c->T = S * n;
    c->pos = malloc((size_t)c->T * sizeof(int32_t));
    c->seq = malloc((size_t)c->T * sizeof(int32_t));
    c->slot = malloc((size_t)S * sizeof(int32_t));
    for (int t = 0; t < c->T; t++) c->pos[t] = t % n, c->seq[t] = t / n;
    for (int s = 0; s < S; s++) c->slot[s] = s;
    c->b = (lm_attn_batch){ .n_tokens = c->T, .pos = c->pos, .seq = c->seq, .n_seqs = S, .block_tables = NULL,
                            .state_slot = c->slot };
    c->qkv = bd_tensor(be, c->T, BD_C, x);
    c->conv_out = bd_tensor(be, c->T, BD_C, NULL);
    c->g = bd_tensor(be, c->T, BD_HV, g);
    c->beta = bd_tensor(be, c->T, BD_HV, beta);
    c->w = bd_tensor(be, BD_C, BD_K, w);
    c->out = bd_tensor(be, c->T, BD_O, NULL);
    c->floats = (int64_t)(BD_K - 1) * BD_C + (int64_t)BD_HV * BD_D * BD_D;
    c->state = be->ops->alloc(be, (size_t)S * (size_t)c->floats * sizeof(float));
    if (!c->state) {
        fprintf(stderr, "bench_cuda_delta: out of device memory (state)\n");
        exit(1);
    }
    c->kv = (lm_kv_pool){ .n_state = 1, .n_state_slots = S, .state_floats = &c->floats, .state = &c->state };
}

static void bd_case_free(bd_case *c, lm_backend *be) {
    lm_tensor *t[] = { &c->qkv, &c->conv_out, &c->g, &c->beta, &c->w, &c->out };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) lm_tensor_release(be, t[i]);
    be->ops->free(be, c->state);
    free(c->pos), free(c->seq), free(c->slot);
}

static void bd_delta(lm_backend *be, bd_case *c) {
    lm_delta_params dp = { .n_k_heads = BD_HK, .n_v_heads = BD_HV, .k_dim = BD_D, .v_dim = BD_D,
                           .state = { 0, (int64_t)(BD_K - 1) * BD_C }, .v_tiled = true };
    be->ops->gated_delta(be, &c->out, &c->qkv, &c->g, &c->beta, &c->kv, &c->b, &dp);
}

static void bd_conv(lm_backend *be, bd_case *c) {
    be->ops->conv1d_state(be, &c->conv_out, &c->qkv, &c->w, &c->kv, (lm_state_ref){ 0, 0 }, &c->b, true);
}

/* Median milliseconds of reps calls of op (one warm-up first). */
static float bd_time(lm_backend *be, bd_case *c, void (*op)(lm_backend *, bd_case *), int reps) {
    cudaStream_t st = lm_cuda_backend_stream(be);
    cudaEvent_t e0, e1;
    BD_CHECK(cudaEventCreate(&e0));
    BD_CHECK(cudaEventCreate(&e1));
    op(be, c);
    BD_CHECK(cudaStreamSynchronize(st));
    float *ms = malloc((size_t)reps * sizeof(float));
    for (int r = 0; r < reps; r++) {
        BD_CHECK(cudaEventRecord(e0, st));
        op(be, c);
        BD_CHECK(cudaEventRecord(e1, st));
        BD_CHECK(cudaEventSynchronize(e1));
        BD_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    float m = bd_median(ms, reps);
    free(ms);
    BD_CHECK(cudaEventDestroy(e0));
    BD_CHECK(cudaEventDestroy(e1));
    return m;
}

static lm_backend *bd_backend(const char *chunk_min) {
    setenv("LUMEN_CUDA_DELTA_CHUNK_MIN", chunk_min, 1);
    lm_err e;
    lm_backend *be = lm_cuda_backend_create(0, &e);
    unsetenv("LUMEN_CUDA_DELTA_CHUNK_MIN");
    if (!be) {
        fprintf(stderr, "bench_cuda_delta: %s\n", e.msg);
        exit(1);
    }
    return be;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_cuda_delta [reps]\n");
        return 2;
    }
    char why[256];
    if (!lm_cuda_available(why, sizeof why)) {
        printf("bench_cuda_delta: no GPU: %s\n", why);
        return 0;
    }
    const int64_t Tmax = 32768;
    uint64_t seed = 2701;
    float *x = malloc((size_t)(Tmax * BD_C) * sizeof(float));
    float *g = malloc((size_t)(Tmax * BD_HV) * sizeof(float)), *beta = malloc((size_t)(Tmax * BD_HV) * sizeof(float));
    float *w = malloc((size_t)(BD_C * BD_K) * sizeof(float));
    if (!x || !g || !beta || !w) {
        fprintf(stderr, "bench_cuda_delta: out of host memory\n");
        return 1;
    }
    bd_fill(x, (size_t)(Tmax * BD_C), &seed, -1.0f, 1.0f);
    bd_fill(g, (size_t)(Tmax * BD_HV), &seed, -0.5f, 0.0f);
    bd_fill(beta, (size_t)(Tmax * BD_HV), &seed, 0.05f, 1.0f);
    bd_fill(w, (size_t)(BD_C * BD_K), &seed, -0.6f, 0.6f);
    static const struct { int S, n; const char *name; float bar_ms; } cases[] = {
        { 1, 32768, "32k x 1", 1.26f }, { 8, 4096, "8 x 4k", 0.64f }, { 8, 1, "8 x 1", 0 }, { 8, 4, "8 x 4", 0 },
        { 8, 8, "8 x 8", 0 },          { 8, 16, "8 x 16", 0 },       { 8, 32, "8 x 32", 0 }, { 8, 64, "8 x 64", 0 },
        { 1, 16, "1 x 16", 0 },        { 1, 64, "1 x 64", 0 },       { 1, 256, "1 x 256", 0 },
    };
    enum { NC = sizeof cases / sizeof cases[0] };
    printf("# bench_cuda_delta: Qwen3.5-27B GDN layer (Hk %d, Hv %d, Dk = Dv = %d, conv K %d over %lld channels), "
           "median of %d\n",
           BD_HK, BD_HV, BD_D, BD_K, (long long)BD_C, reps);
    float t_delta[2][NC], t_conv[NC];
    float *ref[2] = { NULL, NULL };
    double diff[2] = { 0, 0 };
    for (int mode = 0; mode < 2; mode++) { /* 0 recurrent, 1 chunked */
        lm_backend *be = bd_backend(mode ? "1" : "0");
        for (int ci = 0; ci < NC; ci++) {
            bd_case c;
            bd_case_make(&c, be, cases[ci].S, cases[ci].n, x, g, beta, w);
            const int r = mode == 0 && c.T >= 16384 ? (reps + 1) / 2 : reps; /* the recurrent 32k takes long */
            t_delta[mode][ci] = bd_time(be, &c, bd_delta, r);
            if (mode == 1) t_conv[ci] = bd_time(be, &c, bd_conv, reps);
            if (ci < 2) {
                const size_t no = (size_t)c.T * BD_O;
                float *o = malloc(no * sizeof(float));
                be->ops->read(be, o, c.out.data, no * sizeof(float));
                if (mode == 0) ref[ci] = o;
                else {
                    double m = 0;
                    for (size_t i = 0; i < no; i++) {
                        double d = fabs((double)o[i] - ref[ci][i]) / fmax(fabs((double)ref[ci][i]), 1.0);
                        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
                    }
                    diff[ci] = m;
                    free(o);
                }
            }
            bd_case_free(&c, be);
        }
        lm_backend_destroy(be);
    }
    printf("%-9s %14s %14s %9s %11s %12s\n", "case", "recurrent ms", "chunked ms", "speedup", "bar ms", "conv ms");
    for (int ci = 0; ci < NC; ci++) {
        char bar[32] = "-";
        if (cases[ci].bar_ms > 0) snprintf(bar, sizeof bar, "%.2f", cases[ci].bar_ms);
        printf("%-9s %14.3f %14.3f %8.2fx %11s %12.3f\n", cases[ci].name, t_delta[0][ci], t_delta[1][ci],
               t_delta[0][ci] / t_delta[1][ci], bar, t_conv[ci]);
    }
    for (int ci = 0; ci < 2; ci++)
        printf("check %s: chunked vs recurrent output, max |diff| / max(|ref|, 1) = %.3g\n", cases[ci].name, diff[ci]);
    free(ref[0]), free(ref[1]), free(x), free(g), free(beta), free(w);
    return 0;
}

#endif
