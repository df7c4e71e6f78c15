/* cuda_moe.cu - mixture-of-experts feed-forward on the GPU (the moe op).
 * Semantics are lm_moe_params' (lm_backend.h) and cpu_moe.c's.
 *
 * 1. Route on the device (moe_route_kernel, a block per token): each token's
 *    top-k experts and weights as lm_moe_route computes them on the host
 *    (ties: lowest index; the softmax over all E logits in double, summed in
 *    expert order; optional renormalisation over the k chosen; times
 *    expert_scale), listed in ascending expert order.
 * 2a. Few tokens (decode, T <= LM_MOE_DEVICE_MAX_T) with bf16/f16 experts:
 *    nothing comes back to the host. One GEMV launch computes act(gate x) *
 *    (up x) for every (token, expert) pair, reading each pair's matrices
 *    from the routing kernel's list, one the down projections, and one
 *    kernel sums each token's pairs in ascending expert order (for moe_add
 *    also the residual add and the next norm). So a decode step with MoE
 *    layers is recorded in a CUDA graph like any other.
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
 *    The GEMVs of 2a and 2b fuse the gate's activation (SiLU, or GELU for
 *    Gemma 4's experts) as the element-wise ops compute it.
 * All sum a token's pairs in the CPU backend's order, so the result does
 * not depend on which tokens share the batch, and no atomics are needed; an
 * expert's GEMV output for one token does not depend on how many tokens
 * share its launch (cuda_gemv.cu), so 2a and 2b agree bit for bit, and
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
 * once (a block a token was ~30 us a layer on the H200, latency-bound).
 * add: y[t] += that sum instead (the add op's bits). norm_y: then the last
 * of token t's blocks to finish norms row t of y into norm_y (the rms_norm
 * op's bits; cnt[t] counts the blocks), which saves the add's and the
 * norm's launches. */
#define LM_MOE_COMBINE_THREADS 256
static_assert(LM_NORM_VT % LM_MOE_COMBINE_THREADS == 0, "the fused norm runs on the combine's block");
__global__ void moe_combine_kernel(float *y, const float *oe, const int32_t *rows, const float *w, int k, int64_t D,
                                   bool add, float *norm_y, const float *norm_w, double eps, double w_offset,
                                   int *cnt) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t t = blockIdx.x, d = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (d < D) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += w[t * k + j] * oe[(int64_t)rows[t * k + j] * D + d];
        if (add) y[t * D + d] += acc;
        else y[t * D + d] = acc;
    }
    if (norm_y && lm_last_block(cnt + t, (int)gridDim.y))
        lm_norm_row_op(norm_y + t * D, y + t * D, norm_w, D, eps, w_offset);
}

/* y = the combine of oe, or y += it (add); then the norm of y when norm is
 * not NULL: in the combine's last blocks when it fits, else the op. */
static void moe_combine(lm_backend *be, float *y, const float *oe, const int32_t *rows, const float *w, int64_t T,
                        int k, int64_t D, bool pdl, bool add, const lm_norm_out *norm) {
    lm_cuda *c = lm_cuda_of(be);
    const dim3 grid((unsigned)T, (unsigned)((D + LM_MOE_COMBINE_THREADS - 1) / LM_MOE_COMBINE_THREADS));
    const bool fuse = T <= LM_CUDA_COUNTERS - 1 && lm_norm_out_fits(norm, y, T, D);
    lm_cuda_launch_ex(c, pdl, moe_combine_kernel, grid, LM_MOE_COMBINE_THREADS, 0, y, oe, rows, w, k, D, add,
                      fuse ? (float *)norm->y->data : (float *)NULL, fuse ? (const float *)norm->w->data : NULL,
                      fuse ? (double)norm->eps : 0.0, fuse ? (double)norm->w_offset : 0.0, c->counters + 1);
    LM_CUDA_LAUNCHED("moe_combine_kernel");
    if (norm && !fuse) {
        lm_tensor yt = { LM_F32, T, D, y };
        lm_cuda_rms_norm(be, norm->y, &yt, norm->w, norm->eps, norm->w_offset);
    }
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

/* Threads of the routing kernel's block: one an expert up to 1,024. */
static unsigned moe_route_threads(int E) { return (unsigned)LM_MIN(1024, (E + 31) / 32 * 32); }

/* grid (T), block of moe_route_threads(E), smem E doubles and E floats:
 * token t's k experts in ascending order into sel[t*k ..], their weights
 * into w, rows[t*k + j] = t*k + j (the pair rows of the device path), and
 * with wtab (E gate, E up, E down matrices) each pair's three matrices into
 * wp ([3][T*k], the pair GEMVs' operands, so that they need not look the
 * expert up). The picks are lm_moe_topk's, the weights lm_moe_route's
 * bits: the softmax denominator in lm_moe_softmax_den's order (a warp's
 * butterfly), the renormalisation in top-k order, all in double.
 * Without NaN logits and with an expert a thread the picks come from ranks:
 * each warp's first min(k, 32) experts in top-k order are the candidates
 * (a global pick is a pick of its warp), and a candidate's rank among them
 * is its rank among all (everything before a pick is a pick). Else one
 * warp runs lm_moe_topk's passes (moe_topk_warp). Under ncu on the H200
 * (Qwen3-30B-A3B, one token) this kernel took 12.5 us with the passes and
 * a serial denominator, 6.2-6.3 us with the ranks. */
__global__ void moe_route_kernel(int32_t *sel_out, float *w_out, int32_t *rows_out, const unsigned char **wp,
                                 const unsigned char *const *wtab, const float *logits, const float *scale, int E,
                                 int k, bool norm) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    extern __shared__ double moe_ex[]; /* [E] exponentials, then [E] logits as floats */
    float *ls = (float *)(moe_ex + E);
    __shared__ int32_t sel[LM_MOE_MAX_K], cand[1024];
    __shared__ double den_s, chosen_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = blockDim.x;
    const int64_t t = blockIdx.x;
    const float *l = logits + t * E;
    bool nan = false;
    for (int e = tid; e < E; e += nt) {
        const float v = l[e];
        ls[e] = v;
        nan |= v != v;
    }
    if (!__syncthreads_or(nan) && E <= nt) {
        const int kk = LM_MIN(k, 32), wbase = warp * 32, wn = LM_MIN(32, E - wbase);
        if (lane < wn) { /* rank in the warp */
            const float v = ls[tid];
            int r = 0;
            for (int i = 0; i < wn; i++) r += lm_moe_before(ls[wbase + i], wbase + i, v, tid);
            if (r < kk) cand[warp * kk + r] = tid;
        } else if (lane < kk && wn > 0) {
            cand[warp * kk + lane] = -1; /* a warp of fewer than kk experts */
        }
        __syncthreads();
        const int nc = (E + 31) / 32 * kk;
        for (int c = tid; c < nc; c += nt) {
            const int e = cand[c];
            if (e < 0) continue;
            const float v = ls[e];
            int r = 0;
            for (int i = 0; i < nc; i++) {
                const int o = cand[i];
                r += o >= 0 && lm_moe_before(ls[o], o, v, e);
            }
            if (r < k) sel[r] = e;
        }
    } else if (tid < 32) {
        moe_topk_warp(ls, E, k, sel);
    }
    __syncthreads();
    const double m = ls[sel[0]];
    for (int e = tid; e < E; e += nt) moe_ex[e] = exp((double)ls[e] - m);
    __syncthreads();
    if (warp == 0) {
        static_assert(LM_MOE_DEN_LANES == 32, "the denominator's partial sums are a warp's lanes");
        double sum = 0.0;
        for (int e = lane; e < E; e += 32) sum += moe_ex[e];
        sum = lm_warp_sum_d(sum);
        if (lane == 0) {
            double ch = 0.0;
            for (int j = 0; j < k; j++) ch += moe_ex[sel[j]];
            den_s = sum, chosen_s = ch;
        }
    }
    __syncthreads();
    const int64_t TK = (int64_t)gridDim.x * k;
    for (int j = tid; j < k; j += nt) {
        const int e = sel[j];
        double wj = moe_ex[e] / (norm ? chosen_s : den_s);
        if (scale) wj *= scale[e];
        int pos = 0; /* the combine's order: ascending expert */
        for (int i = 0; i < k; i++) pos += sel[i] < e;
        const int64_t p = t * k + pos;
        sel_out[p] = e, w_out[p] = (float)wj, rows_out[t * k + j] = (int32_t)(t * k + j);
        if (wp) wp[p] = wtab[e], wp[TK + p] = wtab[E + e], wp[2 * TK + p] = wtab[2 * (int64_t)E + e];
    }
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

/* Whether every expert matrix is a quantised GEMV operand of one type (the
 * pair buffers x and the gate/up products are 16-byte aligned rows). */
static bool moe_qgemv_ok(const lm_moe_params *p) {
    const lm_dtype wt = p->gate[0].type;
    if (!lm_cuda_qtype(wt)) return false;
    for (int e = 0; e < p->n_experts; e++) {
        const lm_tensor *ts[3] = { &p->gate[e], &p->up[e], &p->down[e] };
        for (int i = 0; i < 3; i++)
            if (ts[i]->type != wt || !lm_qweight_ok(ts[i]->data, wt)) return false;
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

/* y = moe(x), or y += moe(x) (add); then the norm of y (norm not NULL). */
static void moe_run(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                    const lm_moe_params *p, bool add, const lm_norm_out *norm) {
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
     * (2b) [TK] sources and [TK] rows and the chunk slots, (2a) [3][TK]
     * matrices, behind the pair buffers (which start at the scratch's
     * alignment: the GEMVs read them in 16-byte chunks) */
    const size_t n_buf = TK * (2 * (size_t)D + 2 * (size_t)F);
    /* 2b's chunk slots: an expert's chunks are ceil(n / CHUNK) <= 1 + (n - 1) / CHUNK */
    const int used = (int)LM_MIN((int64_t)E, (int64_t)TK);
    const int slots = used + (int)((TK - (size_t)used + LM_MOE_CHUNK - 1) / LM_MOE_CHUNK);
    const size_t n_int = (5 * TK + 3 * (size_t)slots + 1) / 2 * 2; /* keeps the pointers 8-byte aligned */
    float *buf = (float *)lm_cuda_scratch(c, n_buf * sizeof(float) + n_int * sizeof(int32_t) +
                                                 3 * TK * sizeof(const unsigned char *));
    int32_t *route = (int32_t *)(buf + n_buf);
    int32_t *dsel = route, *drows = route + 2 * TK;
    float *dw = (float *)(route + TK);
    const unsigned char **dwp = (const unsigned char **)(route + n_int);
    float *xe = buf, *oe = xe + TK * D, *ge = oe + TK * D, *ue = ge + TK * F;
    /* the fused GEMVs of 2a and 2b gate with the layer's activation */
    const bool silu = p->act == LM_GLU_SILU;
    const int glu = silu ? LM_GEMV_GLU_SILU : p->act == LM_GLU_GELU_TANH ? LM_GEMV_GLU_GELU_TANH : LM_GEMV_GLU_GELU;
    const bool qgemv = moe_qgemv_ok(p) && lm_aligned16(x->data);
    const bool gemv = moe_gemv_ok(p, D, F), pairs = (gemv || qgemv) && T <= LM_MOE_DEVICE_MAX_T; /* 2a */
    /* 2b: its rank table (T*E bytes) within the 48 KB a block may take unasked */
    const bool groups = gemv && !pairs && T <= LM_MOE_GROUP_MAX_T && E <= LM_MOE_GROUP_MAX_E && T * E <= 40 * 1024;
    const unsigned char *const *dtab = pairs || groups ? moe_table(c, p) : NULL;
    lm_cuda_launch_pdl(c, moe_route_kernel, (unsigned)T, moe_route_threads(E),
                       (size_t)E * (sizeof(double) + sizeof(float)), dsel, dw, drows,
                       pairs ? dwp : (const unsigned char **)NULL, pairs ? dtab : NULL,
                       (const float *)router_logits->data,
                       p->expert_scale ? (const float *)p->expert_scale->data : NULL, E, k, p->norm_topk);
    LM_CUDA_LAUNCHED("moe_route_kernel");

    if (pairs && qgemv) { /* 2a over quantised experts */
        lm_qmoe_gemv(c, ge, (const float *)x->data, dwp, k, (int)TK, F, D, p->gate[0].type, glu);
        lm_qmoe_gemv(c, oe, ge, dwp + 2 * TK, k, (int)TK, D, F, p->gate[0].type, LM_GEMV_STORE);
        moe_combine(be, (float *)y->data, oe, drows, dw, T, k, D, true, add, norm);
        return;
    }
    if (pairs) { /* 2a */
        lm_cuda_moe_gemv(c, ge, (const float *)x->data, dwp, k, (int)TK, F, D, p->gate[0].type, glu);
        lm_cuda_moe_gemv(c, oe, ge, dwp + 2 * TK, k, (int)TK, D, F, p->gate[0].type, LM_GEMV_STORE);
        moe_combine(be, (float *)y->data, oe, drows, dw, T, k, D, true, add, norm);
        return;
    }

    if (groups) { /* 2b */
        int32_t *gsrc = route + 3 * TK, *grows = gsrc + TK, *gchunk = grows + TK;
        const unsigned threads = (unsigned)((E + 31) / 32 * 32);
        lm_cuda_launch_pdl(c, moe_group_kernel, 1, threads, (size_t)T * (size_t)E, gsrc, grows, gchunk, slots,
                           (const int32_t *)dsel, (int)T, k, E);
        LM_CUDA_LAUNCHED("moe_group_kernel");
        lm_cuda_moe_group_gemv(c, ge, (const float *)x->data, gchunk, gsrc, dtab, E, slots, F, D, p->gate[0].type,
                               glu);
        lm_cuda_moe_group_gemv(c, oe, ge, gchunk, NULL, dtab + 2 * E, E, slots, D, F, p->gate[0].type,
                               LM_GEMV_STORE);
        moe_combine(be, (float *)y->data, oe, grows, dw, T, k, D, true, add, norm);
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
    if (silu) lm_cuda_silu_mul(be, &g_all, &g_all, &u_all);
    else lm_cuda_gelu_mul(be, &g_all, &g_all, &u_all, p->act == LM_GLU_GELU_TANH);
    for (int e = 0; e < E; e++) {
        int32_t n = start[e + 1] - start[e];
        if (n == 0) continue;
        lm_tensor gt = { LM_F32, n, F, ge + (size_t)start[e] * F };
        lm_tensor ot = { LM_F32, n, D, oe + (size_t)start[e] * D };
        lm_cuda_matmul(be, &ot, &gt, &p->down[e], NULL);
    }
    moe_combine(be, (float *)y->data, oe, dh + TK, (const float *)(dh + 2 * TK), T, k, D, false, add, norm);
    free(start);
}

void lm_cuda_moe(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                 const lm_moe_params *p) {
    moe_run(be, y, x, router_logits, p, false, NULL);
}

void lm_cuda_moe_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                     const lm_moe_params *p, lm_tensor *ws, const lm_norm_out *norm) {
    (void)ws; /* the experts' outputs stay in the backend's scratch */
    moe_run(be, y, x, router_logits, p, true, norm);
}

bool lm_cuda_moe_route(lm_backend *be, const float *logits, const float *scale, int T, int E, int k, bool norm,
                       int32_t *sel, float *w) {
    be = lm_backend_base(be);
    if (!be || be->ops->moe != lm_cuda_moe) return false; /* not the CUDA backend */
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_ASSERT(T > 0 && E > 0 && k >= 1 && k <= E && k <= LM_MOE_MAX_K && c->gmode == LM_G_OFF);
    const size_t TK = (size_t)T * (size_t)k, nl = (size_t)T * (size_t)E;
    float *dl = NULL, *ds = NULL, *dw = NULL;
    int32_t *dsel = NULL, *drows = NULL;
    LM_CUDA_CHECK(cudaMalloc((void **)&dl, nl * sizeof(float)));
    LM_CUDA_CHECK(cudaMalloc((void **)&ds, (size_t)E * sizeof(float)));
    LM_CUDA_CHECK(cudaMalloc((void **)&dw, TK * sizeof(float)));
    LM_CUDA_CHECK(cudaMalloc((void **)&dsel, TK * sizeof(int32_t)));
    LM_CUDA_CHECK(cudaMalloc((void **)&drows, TK * sizeof(int32_t)));
    LM_CUDA_CHECK(cudaMemcpy(dl, logits, nl * sizeof(float), cudaMemcpyHostToDevice));
    if (scale) LM_CUDA_CHECK(cudaMemcpy(ds, scale, (size_t)E * sizeof(float), cudaMemcpyHostToDevice));
    lm_cuda_launch(c, moe_route_kernel, (unsigned)T, moe_route_threads(E), (size_t)E * (sizeof(double) + sizeof(float)),
                   dsel, dw, drows, (const unsigned char **)NULL, (const unsigned char *const *)NULL, (const float *)dl,
                   scale ? (const float *)ds : NULL, E, k, norm);
    LM_CUDA_LAUNCHED("moe_route_kernel");
    LM_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    LM_CUDA_CHECK(cudaMemcpy(sel, dsel, TK * sizeof(int32_t), cudaMemcpyDeviceToHost));
    LM_CUDA_CHECK(cudaMemcpy(w, dw, TK * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(dl), cudaFree(ds), cudaFree(dw), cudaFree(dsel), cudaFree(drows);
    return true;
}
