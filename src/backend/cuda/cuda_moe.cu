/* cuda_moe.cu - mixture-of-experts feed-forward on the GPU (the moe op).
 * Semantics are lm_moe_params' (lm_backend.h) and cpu_moe.c's.
 *
 * 1. Route on the host: the router logits [T][E] (and expert_scale) are read
 *    back (one stream synchronisation), and each token's top-k experts and
 *    weights are computed exactly as cpu_moe.c does (ties: lowest index; the
 *    softmax over all E logits in double; optional renormalisation over the
 *    k chosen; times expert_scale).
 * 2. Group: the T*k (token, expert) pairs sorted by expert, tokens ascending
 *    within an expert, as rows of one [T*k][D] buffer; expert e owns rows
 *    [start[e], start[e+1]). Per token, the rows of its k pairs in ascending
 *    expert order, with their weights.
 * 3. Run: one gather kernel fills the grouped input rows; per expert with
 *    tokens, lm_cuda_matmul of its row block by gate and up; one silu_mul
 *    over all T*k rows; per expert, down; then one kernel writes
 *      y[t] = 0 + sum over its pairs, ascending expert, of w * out_row
 *    which is the CPU backend's order of summation, so the result does not
 *    depend on which tokens share the batch, and no atomics are needed.
 *
 * Memory: the grouped buffers ([T*k] rows of D, F, F and D floats) live in
 * lm_cuda_scratch (grow-only; lm_cuda_matmul and silu_mul never touch it).
 * The routing tables are staged with lm_cuda_stage. The one allocation per
 * call is the host routing arrays. */
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* grid (T*k): grouped row i = x[src[i]]. */
__global__ void moe_gather_kernel(float *xe, const float *x, const int32_t *src, int64_t D) {
    const int64_t i = blockIdx.x;
    const float *xr = x + (int64_t)src[i] * D;
    float *dr = xe + i * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dr[d] = xr[d];
}

/* grid (T): y[t] = sum_j w[t][j] * oe[rows[t][j]], j in ascending expert order. */
__global__ void moe_combine_kernel(float *y, const float *oe, const int32_t *rows, const float *w, int k,
                                   int64_t D) {
    const int64_t t = blockIdx.x;
    float *yr = y + t * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += w[t * k + j] * oe[(int64_t)rows[t * k + j] * D + d];
        yr[d] = acc;
    }
}

void lm_cuda_moe(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                 const lm_moe_params *p) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int64_t T = x->rows, D = x->cols;
    const int E = p->n_experts, k = p->top_k;
    lm_check_moe(y, x, router_logits, p);
    const int64_t F = p->gate[0].rows;
    if (T == 0) return;
    LM_ASSERT(T * k <= INT32_MAX);
    const size_t TK = (size_t)T * (size_t)k;

    /* routing waits for the device: not in a graph */
    lm_cuda_graph_abandon(c);
    if (c->gmode != LM_G_OFF) return;
    /* 1. route on the host */
    float *logits = (float *)lm_xmalloc(((size_t)T * (size_t)E + (size_t)E) * sizeof(float));
    float *scale = p->expert_scale ? logits + (size_t)T * (size_t)E : NULL;
    LM_CUDA_CHECK(cudaMemcpyAsync(logits, router_logits->data, (size_t)T * (size_t)E * sizeof(float),
                                  cudaMemcpyDeviceToHost, c->stream));
    if (scale)
        LM_CUDA_CHECK(cudaMemcpyAsync(scale, p->expert_scale->data, (size_t)E * sizeof(float),
                                      cudaMemcpyDeviceToHost, c->stream));
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    int32_t *sel = (int32_t *)lm_xmalloc(TK * sizeof(int32_t));
    float *wsel = (float *)lm_xmalloc(TK * sizeof(float));
    for (int64_t t = 0; t < T; t++)
        lm_moe_route(logits + t * E, scale, E, k, p->norm_topk, sel + t * k, wsel + t * k);
    free(logits);

    /* 2. group: staged as [TK] src token per grouped row, [TK] grouped row per
     * (token, j), [TK] weight per (token, j) (floats as bits) */
    int32_t *start = (int32_t *)lm_xcalloc((size_t)E + 1, sizeof(int32_t));
    int32_t *h = (int32_t *)lm_xmalloc(3 * TK * sizeof(int32_t));
    int32_t *src = h, *rows = h + TK;
    float *wrow = (float *)(h + 2 * TK);
    for (size_t i = 0; i < TK; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    {
        int32_t *fill = (int32_t *)lm_xmalloc((size_t)E * sizeof(int32_t));
        int32_t *nt = (int32_t *)lm_xcalloc((size_t)T, sizeof(int32_t));
        memcpy(fill, start, (size_t)E * sizeof(int32_t));
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < k; j++) src[fill[sel[t * k + j]]++] = (int32_t)t;
        /* walking experts ascending gives each token its pairs in ascending expert order */
        for (int e = 0; e < E; e++)
            for (int32_t i = start[e]; i < start[e + 1]; i++) {
                int32_t t = src[i];
                float w = 0.0f;
                for (int j = 0; j < k; j++)
                    if (sel[t * k + j] == e) w = wsel[t * k + j];
                rows[(int64_t)t * k + nt[t]] = i;
                wrow[(int64_t)t * k + nt[t]] = w;
                nt[t]++;
            }
        free(nt);
        free(fill);
    }
    free(sel);
    free(wsel);
    const int32_t *dh = (const int32_t *)lm_cuda_stage(c, h, 3 * TK * sizeof(int32_t));
    free(h);

    /* 3. run */
    const size_t per_row = 2 * (size_t)D + 2 * (size_t)F;
    float *buf = (float *)lm_cuda_scratch(c, TK * per_row * sizeof(float));
    float *xe = buf, *oe = xe + TK * D, *ge = oe + TK * D, *ue = ge + TK * F;
    lm_cuda_launch(c, moe_gather_kernel, (unsigned)TK, 128, 0, xe, (const float *)x->data, dh, D);
    LM_CUDA_LAUNCHED("moe_gather_kernel");
    for (int e = 0; e < E; e++) {
        int32_t n = start[e + 1] - start[e];
        if (n == 0) continue;
        lm_tensor xt = { LM_F32, n, D, xe + (size_t)start[e] * D };
        lm_tensor gt = { LM_F32, n, F, ge + (size_t)start[e] * F };
        lm_tensor ut = { LM_F32, n, F, ue + (size_t)start[e] * F };
        lm_cuda_matmul(be, &gt, &xt, &p->gate[e], NULL);
        lm_cuda_matmul(be, &ut, &xt, &p->up[e], NULL);
    }
    lm_tensor g_all = { LM_F32, (int64_t)TK, F, ge }, u_all = { LM_F32, (int64_t)TK, F, ue };
    lm_cuda_silu_mul(be, &g_all, &g_all, &u_all);
    for (int e = 0; e < E; e++) {
        int32_t n = start[e + 1] - start[e];
        if (n == 0) continue;
        lm_tensor gt = { LM_F32, n, F, ge + (size_t)start[e] * F };
        lm_tensor ot = { LM_F32, n, D, oe + (size_t)start[e] * D };
        lm_cuda_matmul(be, &ot, &gt, &p->down[e], NULL);
    }
    lm_cuda_launch(c, moe_combine_kernel, (unsigned)T, 128, 0, (float *)y->data, oe, dh + TK,
                   (const float *)(dh + 2 * TK), k, D);
    LM_CUDA_LAUNCHED("moe_combine_kernel");
    free(start);
}
