/* cuda_moe.cu - mixture-of-experts feed-forward on the GPU (the moe op).
 * Semantics are lm_moe_params' (lm_backend.h) and cpu_moe.c's.
 *
 * 1. Route on the device (moe_route_kernel, a block per token): each token's
 *    top-k experts and weights as lm_moe_route computes them on the host
 *    (ties: lowest index; the softmax over all E logits in double, summed in
 *    expert order; optional renormalisation over the k chosen; times
 *    expert_scale), listed in ascending expert order.
 * 2a. Few tokens (decode, T <= LM_MOE_DEVICE_MAX_T) with bf16/f16 experts:
 *    nothing comes back to the host. One GEMV launch computes silu(gate x) *
 *    (up x) for every (token, expert) pair, reading each pair's expert from
 *    the routing, one the down projections, and one kernel sums each token's
 *    pairs in ascending expert order. So a decode step with MoE layers is
 *    recorded in a CUDA graph like any other.
 * 2b. Up to LM_MOE_GROUP_MAX_T tokens (a decode step of a batch) with
 *    bf16/f16 experts, at most 1,024 of them and tokens x experts within
 *    40 KB: moe_group_kernel groups the pairs by expert on the device
 *    (tokens ascending within an expert, as 2c below) and cuts each
 *    expert's rows into chunks of up to LM_MOE_CHUNK tokens; one GEMV launch
 *    runs every chunk of gate and up (an expert's weights read once a chunk
 *    instead of once a pair), one the down projections, and the combine
 *    reads each pair's grouped row. Nothing comes back: a graph records it.
 * 2c. More tokens: the routing is read back (one stream synchronisation) and
 *    the T*k pairs are grouped by expert, tokens ascending within an expert,
 *    as rows of one [T*k][D] buffer (expert e owns rows [start[e],
 *    start[e+1])); a gather kernel fills them, lm_cuda_matmul runs each
 *    expert's row block by gate and up (GEMV or GEMM by its row count), one
 *    silu_mul covers all rows, then down per expert, and the same combine.
 * All sum a token's pairs in the CPU backend's order, so the result does
 * not depend on which tokens share the batch, and no atomics are needed; an
 * expert's GEMV output for one token does not depend on how many tokens
 * share its launch (cuda_matmul.cu), so 2a and 2b agree bit for bit, and
 * with 2c while an expert has at most LM_GEMV_MAX_T tokens there.
 *
 * Memory: the pair buffers live in lm_cuda_scratch (grow-only; lm_cuda_matmul
 * and silu_mul never touch it); the routing and the expert tables are
 * staged with lm_cuda_stage. */
#include "cuda_internal.h"
#include "../moe_topk.h"

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

/* grid (T, D / 256): y[t] = sum_j w[t][j] * oe[rows[t][j]], j in ascending
 * expert order; a thread an element, so a token's k loads are in flight at
 * once (a block a token was ~30 us a layer on the H200, latency-bound). */
#define LM_MOE_COMBINE_THREADS 256
__global__ void moe_combine_kernel(float *y, const float *oe, const int32_t *rows, const float *w, int k,
                                   int64_t D) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t t = blockIdx.x, d = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= D) return;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc += w[t * k + j] * oe[(int64_t)rows[t * k + j] * D + d];
    y[t * D + d] = acc;
}

static void moe_combine(lm_cuda *c, float *y, const float *oe, const int32_t *rows, const float *w, int64_t T,
                        int k, int64_t D, bool pdl) {
    const dim3 grid((unsigned)T, (unsigned)((D + LM_MOE_COMBINE_THREADS - 1) / LM_MOE_COMBINE_THREADS));
    lm_cuda_launch_ex(c, pdl, moe_combine_kernel, grid, LM_MOE_COMBINE_THREADS, 0, y, oe, rows, w, k, D);
    LM_CUDA_LAUNCHED("moe_combine_kernel");
}

#define LM_MOE_MAX_K 64
/* Tokens up to which the pairs run as GEMVs on the device's routing: at 8
 * tokens of Qwen3-30B-A3B (128 experts, 8 a token) most pairs have an
 * expert to themselves, and a GEMV a pair beats the chunks (H200). */
#define LM_MOE_DEVICE_MAX_T 8
#define LM_MOE_GROUP_MAX_T 128 /* tokens up to which the device groups the pairs (2b): decode batches */
#define LM_MOE_GROUP_MAX_E 1024 /* experts the grouping kernel's block covers, a thread each */

/* lm_moe_topk's picks (moe_topk.h) by one warp, l in shared memory. A pass
 * of the serial scan takes the earliest expert in top-k order (larger
 * logit, then lower index: a total order on non-NaN logits) among those
 * after the previous pick; here the lanes scan every 32nd expert and a
 * shuffle reduction keeps the earliest, which is the same expert. Its NaN
 * cases are kept: a NaN logit of expert 0 wins the first pass (the scan
 * starts there and nothing comes before a NaN), no later pass picks a NaN,
 * and a pass with no candidate takes the lowest expert not yet picked. The
 * serial scan on one thread took ~80 us of a Qwen3-30B-A3B layer's routing
 * on the H200 (8 passes over 128 logits in global memory). */
static __device__ void moe_topk_warp(const float *l, int E, int k, int32_t *sel) {
    const int lane = threadIdx.x & 31;
    int prev = -1;
    for (int j = 0; j < k; j++) {
        int best = -1;
        if (j == 0 && l[0] != l[0]) {
            best = 0;
        } else {
            for (int e = lane; e < E; e += 32) {
                const float v = l[e];
                if (prev >= 0 && !lm_moe_before(l[prev], prev, v, e)) continue;
                if (v == v && (best < 0 || lm_moe_before(v, e, l[best], best))) best = e;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const int o = __shfl_xor_sync(0xffffffffu, best, off);
                if (o >= 0 && (best < 0 || lm_moe_before(l[o], o, l[best], best))) best = o;
            }
        }
        if (best < 0) { /* the lowest expert not yet picked */
            for (int e = lane; e < E && best < 0; e += 32) {
                bool used = false;
                for (int i = 0; i < j; i++) used |= sel[i] == e;
                if (!used) best = e;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const int o = __shfl_xor_sync(0xffffffffu, best, off);
                if (o >= 0 && (best < 0 || o < best)) best = o;
            }
        }
        if (lane == 0) sel[j] = best;
        __syncwarp();
        prev = best;
    }
}

/* grid (T), block of 128, smem E doubles and E floats: token t's k experts
 * in ascending order into sel[t*k ..], their weights into w, and rows[t*k +
 * j] = t*k + j (the pair rows of the device path). The picks are
 * lm_moe_topk's (moe_topk_warp), the sums run as in lm_moe_route (in double,
 * in expert order); the exponentials spread over the block. */
__global__ void moe_route_kernel(int32_t *sel_out, float *w_out, int32_t *rows_out, const float *logits,
                                 const float *scale, int E, int k, bool norm) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    extern __shared__ double moe_ex[]; /* [E] exponentials, then [E] logits as floats */
    float *ls = (float *)(moe_ex + E);
    __shared__ int32_t sel[LM_MOE_MAX_K];
    const int64_t t = blockIdx.x;
    const float *l = logits + t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) ls[e] = l[e];
    __syncthreads();
    if (threadIdx.x < 32) moe_topk_warp(ls, E, k, sel);
    __syncthreads();
    const double m = ls[sel[0]];
    __shared__ float sc[LM_MOE_MAX_K]; /* the picks' scales, fetched in parallel */
    for (int e = threadIdx.x; e < E; e += blockDim.x) moe_ex[e] = exp((double)ls[e] - m);
    if (threadIdx.x < k) sc[threadIdx.x] = scale ? scale[sel[threadIdx.x]] : 1.0f;
    __syncthreads();
    if (threadIdx.x != 0) return;
    double den = 0.0, chosen = 0.0;
    for (int e = 0; e < E; e++) den += moe_ex[e];
    for (int j = 0; j < k; j++) chosen += moe_ex[sel[j]];
    /* sorted in registers, written once (the insertion used to shift the
     * picks in global memory, reading back what it had just written) */
    int32_t so[LM_MOE_MAX_K];
    float wo[LM_MOE_MAX_K];
    for (int j = 0; j < k; j++) { /* insertion by expert id: the combine's order */
        double wj = moe_ex[sel[j]] / (norm ? chosen : den);
        if (scale) wj *= sc[j];
        int i = j;
        for (; i > 0 && so[i - 1] > sel[j]; i--) so[i] = so[i - 1], wo[i] = wo[i - 1];
        so[i] = sel[j], wo[i] = (float)wj;
    }
    for (int j = 0; j < k; j++)
        sel_out[t * k + j] = so[j], w_out[t * k + j] = wo[j], rows_out[t * k + j] = (int32_t)(t * k + j);
}

/* Exclusive prefix sum of v over the block (one value a thread, blockDim a
 * multiple of 32, at most 1024); *total gets the sum. */
static __device__ int moe_block_scan(int v, int *total) {
    __shared__ int warp_sum[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    int inc = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= d) inc += u;
    }
    __syncthreads(); /* warp_sum of an earlier call has been read */
    if (lane == 31) warp_sum[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int w = lane < n_warps ? warp_sum[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += u;
        }
        if (lane < n_warps) warp_sum[lane] = w; /* inclusive sums of the warps */
    }
    __syncthreads();
    *total = warp_sum[n_warps - 1];
    return inc - v + (warp ? warp_sum[warp - 1] : 0);
}

/* One block, a thread per expert (blockDim >= E): groups the T*k pairs of
 * sel (each token's experts ascending, as moe_route_kernel lists them) by
 * expert, tokens ascending within an expert, as 2c does on the host:
 * src[r] = token of grouped row r, rows[t*k + j] = grouped row of pair (t,
 * j). Then cuts expert e's rows into chunks of up to LM_MOE_CHUNK: chunk
 * slot c = (e, first row, tokens), slots past the last chunk (0, 0, 0).
 * rank (smem, T*E bytes): the pair's place among its expert's tokens. */
__global__ void moe_group_kernel(int32_t *src, int32_t *rows, int32_t *chunk, int slots, const int32_t *sel, int T,
                                 int k, int E) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    extern __shared__ unsigned char moe_rank[]; /* [T][E] */
    __shared__ int start_s[LM_MOE_GROUP_MAX_E];
    const int e = threadIdx.x, TK = T * k;
    for (int i = threadIdx.x; i < T * E; i += blockDim.x) moe_rank[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < TK; i += blockDim.x) moe_rank[(i / k) * E + sel[i]] = 1;
    __syncthreads();
    int n = 0; /* expert e's tokens, counted in token order */
    if (e < E)
        for (int t = 0; t < T; t++) {
            const int hit = moe_rank[t * E + e];
            moe_rank[t * E + e] = (unsigned char)n;
            n += hit;
        }
    int total = 0;
    const int start = moe_block_scan(n, &total);
    const int n_chunks = (n + LM_MOE_CHUNK - 1) / LM_MOE_CHUNK;
    const int first = moe_block_scan(n_chunks, &total);
    if (e < E) start_s[e] = start;
    for (int c = 0; c < n_chunks; c++) {
        int32_t *ch = chunk + 3 * (first + c);
        ch[0] = e, ch[1] = start + c * LM_MOE_CHUNK, ch[2] = LM_MIN(LM_MOE_CHUNK, n - c * LM_MOE_CHUNK);
    }
    for (int c = total + threadIdx.x; c < slots; c += blockDim.x) chunk[3 * c] = chunk[3 * c + 1] = chunk[3 * c + 2] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < TK; i += blockDim.x) {
        const int t = i / k, ei = sel[i], r = start_s[ei] + moe_rank[t * E + ei];
        rows[i] = r;
        src[r] = t;
    }
}

/* Whether every expert matrix is a bf16/f16 GEMV operand of one type. */
static bool moe_gemv_ok(const lm_moe_params *p, int64_t D, int64_t F) {
    const lm_dtype wt = p->gate[0].type;
    if ((wt != LM_BF16 && wt != LM_F16) || D % 8 || F % 8) return false;
    for (int e = 0; e < p->n_experts; e++) {
        const lm_tensor *ts[3] = { &p->gate[e], &p->up[e], &p->down[e] };
        for (int i = 0; i < 3; i++)
            if (ts[i]->type != wt || ((uintptr_t)ts[i]->data & 15u)) return false;
    }
    return true;
}

/* The experts' matrices on the device: E gate, E up, E down pointers, staged. */
static const unsigned char *const *moe_table(lm_cuda *c, const lm_moe_params *p) {
    const int E = p->n_experts;
    const unsigned char **tab = (const unsigned char **)lm_xmalloc(3 * (size_t)E * sizeof *tab);
    for (int e = 0; e < E; e++)
        tab[e] = (const unsigned char *)p->gate[e].data, tab[E + e] = (const unsigned char *)p->up[e].data,
        tab[2 * E + e] = (const unsigned char *)p->down[e].data;
    const unsigned char *const *dtab = (const unsigned char *const *)lm_cuda_stage(c, tab, 3 * (size_t)E * sizeof *tab);
    free(tab);
    return dtab;
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

    LM_ASSERT(k <= LM_MOE_MAX_K);
    /* 1. route on the device: [TK] experts, [TK] weights, [TK] pair rows,
     * behind the pair buffers (which start at the scratch's alignment: the
     * GEMVs read them in 16-byte chunks) */
    const size_t n_buf = TK * (2 * (size_t)D + 2 * (size_t)F);
    /* 2b's chunk slots: an expert's chunks are ceil(n / CHUNK) <= 1 + (n - 1) / CHUNK */
    const int used = (int)LM_MIN((int64_t)E, (int64_t)TK);
    const int slots = used + (int)((TK - (size_t)used + LM_MOE_CHUNK - 1) / LM_MOE_CHUNK);
    float *buf = (float *)lm_cuda_scratch(c, n_buf * sizeof(float) + (5 * TK + 3 * (size_t)slots) * sizeof(int32_t));
    int32_t *route = (int32_t *)(buf + n_buf);
    int32_t *dsel = route, *drows = route + 2 * TK;
    float *dw = (float *)(route + TK);
    lm_cuda_launch_pdl(c, moe_route_kernel, (unsigned)T, 128, (size_t)E * (sizeof(double) + sizeof(float)), dsel, dw, drows,
                       (const float *)router_logits->data, p->expert_scale ? (const float *)p->expert_scale->data : NULL,
                       E, k, p->norm_topk);
    LM_CUDA_LAUNCHED("moe_route_kernel");
    float *xe = buf, *oe = xe + TK * D, *ge = oe + TK * D, *ue = ge + TK * F;

    if (T <= LM_MOE_DEVICE_MAX_T && moe_gemv_ok(p, D, F)) { /* 2a */
        const unsigned char *const *dtab = moe_table(c, p);
        lm_cuda_moe_gemv(c, ge, (const float *)x->data, dsel, dtab, E, k, (int)TK, F, D, p->gate[0].type, true);
        lm_cuda_moe_gemv(c, oe, ge, dsel, dtab + 2 * E, E, k, (int)TK, D, F, p->gate[0].type, false);
        moe_combine(c, (float *)y->data, oe, drows, dw, T, k, D, true);
        return;
    }

    /* 2b's rank table (T*E bytes) within the 48 KB a block may take unasked */
    if (T <= LM_MOE_GROUP_MAX_T && E <= LM_MOE_GROUP_MAX_E && T * E <= 40 * 1024 && moe_gemv_ok(p, D, F)) { /* 2b */
        int32_t *gsrc = route + 3 * TK, *grows = gsrc + TK, *gchunk = grows + TK;
        const unsigned threads = (unsigned)((E + 31) / 32 * 32);
        lm_cuda_launch_pdl(c, moe_group_kernel, 1, threads, (size_t)T * (size_t)E, gsrc, grows, gchunk, slots,
                           (const int32_t *)dsel, (int)T, k, E);
        LM_CUDA_LAUNCHED("moe_group_kernel");
        const unsigned char *const *dtab = moe_table(c, p);
        lm_cuda_moe_group_gemv(c, ge, (const float *)x->data, gchunk, gsrc, dtab, E, slots, F, D, p->gate[0].type, true);
        lm_cuda_moe_group_gemv(c, oe, ge, gchunk, NULL, dtab + 2 * E, E, slots, D, F, p->gate[0].type, false);
        moe_combine(c, (float *)y->data, oe, grows, dw, T, k, D, true);
        return;
    }

    /* 2c: the grouping needs the routing on the host: not in a graph */
    lm_cuda_graph_abandon(c);
    if (c->gmode != LM_G_OFF) return;
    int32_t *sel = (int32_t *)lm_xmalloc(TK * sizeof(int32_t));
    float *wsel = (float *)lm_xmalloc(TK * sizeof(float));
    LM_CUDA_CHECK(cudaMemcpyAsync(sel, dsel, TK * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    LM_CUDA_CHECK(cudaMemcpyAsync(wsel, dw, TK * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));

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
    moe_combine(c, (float *)y->data, oe, dh + TK, (const float *)(dh + 2 * TK), T, k, D, false);
    free(start);
}
