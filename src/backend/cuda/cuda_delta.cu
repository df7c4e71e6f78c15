/* cuda_delta.cu - the Gated DeltaNet ops on the GPU (Qwen3.5 / Qwen3-Next
 * linear attention): conv1d_state, delta_gates, gated_delta and
 * rms_norm_gated. Semantics are lm_backend.h's and cpu_delta.c's.
 *
 * Sequences. The recurrent ops walk each sequence's tokens in batch order.
 * The host checks that they are consecutive positions (as the CPU backend
 * asserts), groups the token ids by sequence (a counting sort that keeps
 * batch order) and stages [T] pos, [S] state slots, [S+1] group starts and
 * [T] grouped token ids in one lm_cuda_stage. A sequence whose first token
 * has position 0 starts from a zero state whatever its slot holds.
 *
 * conv1d_state: one thread per (sequence, channel), grid (ceil(C/128), S).
 *   The K-1 previous inputs and the K taps sit in registers (K <= 16,
 *   unrolled loops with guards so that nothing is indexed dynamically); the
 *   window is written back to the slot oldest first after the last token.
 * gated_delta: one block per (value head, sequence, group of state
 *   columns), grid (Hv, S, Dv / Dvb), the recurrent form token by token;
 *   columns split while there are fewer than ~2 blocks per multiprocessor
 *   (a decode step). Thread (v, part) of Dvb * P threads
 *   (P = ceil(Dk / 32)) holds column v of the state for rows
 *   d = part + P*i in registers (at most 32), so the state [Dk][Dv] (64 KiB
 *   at 128 x 128) never leaves the register file between tokens. Per token:
 *   q and k to shared memory, their sums of squares in double (warp 0),
 *   normalised; S^T k and S^T q as per-part partial sums reduced through
 *   shared memory; u = beta (v - alpha S^T k), o = alpha S^T q + (q.k) u;
 *   S = alpha S + k u^T. The CPU backend runs several tokens in the chunked
 *   form; both are the same sums in another order (agreement ~1e-6).
 * delta_gates: elementwise, in double as the CPU backend.
 * rms_norm_gated: one block per row of w->cols, sum of squares in double. */
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CONV_MAX_K 16
#define DELTA_MAX_ROWS 32  /* state rows per thread */
#define DELTA_FULL 0xffffffffu
#define DELTA_MAX_THREADS 512 /* Dv * ceil(Dk / 32): 128 x 128 heads take all of it */

/* ---- sequences and their state ---------------------------------------------- */

typedef struct delta_seqs {
    const int32_t *pos, *slot, *start, *tok; /* device: [T], [S], [S+1], [T] */
} delta_seqs;

/* Checks the batch (slots in range, consecutive positions per sequence) and
 * stages what the recurrent kernels need. */
static delta_seqs delta_stage(lm_cuda *c, const lm_kv_pool *kv, const lm_attn_batch *b) {
    const int T = b->n_tokens, S = b->n_seqs;
    size_t n = 2 * (size_t)T + 2 * (size_t)S + 1;
    int32_t *h = (int32_t *)lm_xcalloc(n, sizeof(int32_t));
    int32_t *pos = h, *slot = h + T, *start = slot + S, *tok = start + S + 1;
    memcpy(pos, b->pos, (size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        LM_ASSERT(b->seq[t] >= 0 && b->seq[t] < S);
        start[b->seq[t] + 1]++;
    }
    for (int s = 0; s < S; s++) { /* a sequence without tokens here may have no slot */
        slot[s] = b->state_slot[s];
        LM_ASSERT(start[s + 1] == 0 || (slot[s] >= 0 && slot[s] < kv->n_state_slots));
    }
    for (int s = 0; s < S; s++) start[s + 1] += start[s];
    int32_t *fill = (int32_t *)lm_xmalloc(((size_t)S + 1) * sizeof(int32_t));
    memcpy(fill, start, ((size_t)S + 1) * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        int s = b->seq[t];
        if (fill[s] > start[s]) LM_ASSERT(b->pos[t] == b->pos[tok[fill[s] - 1]] + 1);
        tok[fill[s]++] = t;
    }
    free(fill);
    const int32_t *d = (const int32_t *)lm_cuda_stage(c, h, n * sizeof(int32_t));
    free(h);
    delta_seqs r = { d, d + T, d + T + S, d + T + 2 * S + 1 };
    return r;
}

/* silu as cpu_delta.c computes it: with e = exp(-|x|), no positive exponent. */
__device__ __forceinline__ float delta_silu(float x) {
    const float e = expf(-fabsf(x));
    return x * ((x >= 0.0f ? 1.0f : e) / (1.0f + e));
}

/* ---- conv1d_state ---------------------------------------------------------------- */

/* One conv output before the activation: tap W (the last) on x, then taps
 * 0 .. W-1 on the window, oldest first; the conv kernel and the fused layer
 * kernel both sum this way, so their bits agree. */
__device__ __forceinline__ float delta_conv_acc(float acc, float wt, float win) { return fmaf(wt, win, acc); }

__global__ void delta_conv_kernel(float *y, const float *x, const float *w, float *state, int64_t slot_floats,
                                  int64_t st_off, delta_seqs q, int64_t C, int K, bool silu) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int s = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int i0 = q.start[s], i1 = q.start[s + 1];
    if (i0 == i1) return;
    const int W = K - 1;
    float *st = state + (int64_t)q.slot[s] * slot_floats + st_off + c;
    const bool zero = q.pos[q.tok[i0]] == 0;
    float wt[CONV_MAX_K], win[CONV_MAX_K];
    const float wlast = w[c * K + K - 1];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; j++) {
        wt[j] = j < W ? w[c * K + j] : 0.0f;
        win[j] = (j < W && !zero) ? st[(int64_t)j * C] : 0.0f;
    }
    for (int i = i0; i < i1; i++) {
        const int64_t t = q.tok[i];
        const float xv = x[t * C + c];
        float acc = wlast * xv;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++)
            if (j < W) acc = delta_conv_acc(acc, wt[j], win[j]);
        y[t * C + c] = silu ? delta_silu(acc) : acc;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++) {
            if (j < W - 1) win[j] = win[j + 1];
            else if (j == W - 1) win[j] = xv;
        }
    }
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
        if (j < W) st[(int64_t)j * C] = win[j];
}

void lm_cuda_conv1d_state(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_kv_pool *kv,
                          lm_state_ref state, const lm_attn_batch *b, bool silu) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int64_t C = x->cols;
    const int K = (int)w->cols;
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(x->rows == b->n_tokens && y->rows == x->rows && y->cols == C && w->rows == C);
    LM_ASSERT(K >= 1 && K <= CONV_MAX_K && y->data != x->data);
    lm_check_state_ref(kv, state, b, (int64_t)(K - 1) * C);
    if (b->n_tokens == 0 || b->n_seqs == 0 || C == 0) return;
    delta_seqs q = delta_stage(c, kv, b);
    dim3 grid((unsigned)((C + 127) / 128), (unsigned)b->n_seqs);
    lm_cuda_launch_pdl(c, delta_conv_kernel, grid, 128, 0, (float *)y->data, (const float *)x->data, (const float *)w->data,
                   kv->state[state.index], kv->state_floats[state.index], state.offset, q, C, K, silu);
    LM_CUDA_LAUNCHED("delta_conv_kernel");
}

/* ---- delta_gates ------------------------------------------------------------------ */

/* softplus as torch computes it (threshold 20: linear above). */
__device__ __forceinline__ double delta_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

/* The log decay and the write strength of one (token, head). */
__device__ __forceinline__ float delta_gate_g(float g, float a_log, float dt_bias) {
    return (float)(-exp((double)a_log) * delta_softplus((double)g + dt_bias));
}
__device__ __forceinline__ float delta_gate_beta(float b) { return (float)(1.0 / (1.0 + exp(-(double)b))); }

__global__ void delta_gates_kernel(float *g, float *beta, const float *a_log, const float *dt_bias, int64_t n,
                                   int64_t H) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t h = i % H;
    g[i] = delta_gate_g(g[i], a_log[h], dt_bias[h]);
    beta[i] = delta_gate_beta(beta[i]);
}

void lm_cuda_delta_gates(lm_backend *be, lm_tensor *g, lm_tensor *beta, const lm_tensor *a_log,
                         const lm_tensor *dt_bias) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_ASSERT(g->type == LM_F32 && beta->type == LM_F32 && a_log->type == LM_F32 && dt_bias->type == LM_F32);
    LM_ASSERT(beta->rows == g->rows && beta->cols == g->cols);
    LM_ASSERT(a_log->rows * a_log->cols == g->cols && dt_bias->rows * dt_bias->cols == g->cols);
    const int64_t n = g->rows * g->cols;
    if (n == 0) return;
    lm_cuda_launch_pdl(c, delta_gates_kernel, (unsigned)((n + 255) / 256), 256, 0, (float *)g->data, (float *)beta->data,
                   (const float *)a_log->data, (const float *)dt_bias->data, n, g->cols);
    LM_CUDA_LAUNCHED("delta_gates_kernel");
}

/* ---- gated_delta ------------------------------------------------------------------ */

typedef struct delta_args {
    float *out;
    const float *qkv, *g, *beta;
    int64_t qkv_ld, out_ld;
    float *state;
    int64_t slot_floats, st_off;
    delta_seqs q;
    int Hk, Hv, Dk, Dv, P;
    int Dvb; /* state columns per block: Dv / gridDim.z */
} delta_args;

/* The fused layer's extra inputs (gated_delta_layer): qkv, g and beta are
 * then the raw projections; the kernel convolves the q, k and v channels
 * it reads, computes the gates, and norms each finished output row. */
typedef struct delta_fuse {
    const float *conv_w; /* [C][K] */
    float *conv_state;   /* slot s's window [K-1][C] at conv_state + slot * conv_slot_floats */
    int64_t conv_slot_floats, C;
    int K;
    const float *a_log, *dt_bias;
    float *y;            /* rms_norm_gated's output, [T][Hv * Dv] like out */
    const float *z, *norm_w;
    double eps;
    double *pss;         /* [T][Hv][DELTA_NORM_WARPS] sums of squares, one per 32 columns */
    int *cnt_norm;       /* [T][Hv]: the last block of a row norms it */
    int *cnt_win;        /* [S][Hk]: the last block of a key head writes its q and k windows */
} delta_fuse;

/* rms_norm_gated's block: 128 threads, one column each at Dv <= 128, its
 * warps' sums of squares added in warp order. The fused kernel forms the
 * same four partial sums (zeros past Dv), so the norm's bits agree. */
#define DELTA_NORM_THREADS 128
#define DELTA_NORM_WARPS (DELTA_NORM_THREADS / 32)

/* One gated-norm output: (float)(x * s * w) * silu(z). */
__device__ __forceinline__ float delta_gnorm1(float x, double s, float w, float z) {
    return (float)((double)x * s * w) * delta_silu(z);
}

/* grid (Hv, S, Dv / Dvb), Dvb * P threads: the state's columns are
 * independent (each needs q, k, its own v column and the scalars q.k,
 * alpha, beta), so a head's columns spread over gridDim.z blocks, which
 * puts more multiprocessors on a decode step's state. Shared: q, k [Dk];
 * partials [2][P][Dvb]; u [Dvb]; FUSED adds v [Dvb] and the conv windows
 * [K-1][2 Dk + Dvb] of the channels the block reads (q and k of its key
 * head, its own v columns).
 * FUSED: every block of a key head convolves that head's q and k itself
 * (the same sums, so the same bits), and only the last of them to finish
 * writes their windows back, after all have read the old ones; the v
 * windows and the state columns are each block's own. */
template <bool FUSED>
__global__ void __launch_bounds__(DELTA_MAX_THREADS, 1) delta_rule_kernel(delta_args a, delta_fuse f) {
    extern __shared__ float delta_smem[];
    lm_pdl_trigger();
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    const int h = blockIdx.x, s = blockIdx.y;
    const int i0 = a.q.start[s], i1 = a.q.start[s + 1];
    if (i0 == i1) return; /* block-uniform */
    const int Dk = a.Dk, Dv = a.Dv, Dvb = a.Dvb, P = a.P, nth = blockDim.x;
    const int tid = threadIdx.x, vb = tid % Dvb, v = blockIdx.z * Dvb + vb, lane = tid & 31;
    /* threads past Dvb * P (the block is a whole number of warps) own no state */
    const int part = tid < Dvb * P ? tid / Dvb : DELTA_MAX_ROWS * P + Dk;
    float *sq = delta_smem, *sk = sq + Dk, *rk = sk + Dk, *rq = rk + P * Dvb, *su = rq + P * Dvb;
    float *sv = su + Dvb, *win = sv + Dvb; /* FUSED only */
    __shared__ float fac[3]; /* q factor, k factor, q.k */

    const int hk = h / (a.Hv / a.Hk);
    const int64_t qo = (int64_t)hk * Dk, ko = (int64_t)a.Hk * Dk + qo, vo = 2 * (int64_t)a.Hk * Dk + (int64_t)h * Dv;
    const double qscale = 1.0 / sqrt((double)Dk);
    float *S = a.state + (int64_t)a.q.slot[s] * a.slot_floats + a.st_off + (int64_t)h * Dk * Dv;
    const bool zero = a.q.pos[a.q.tok[i0]] == 0;

    /* FUSED: channel ch of the block (q [0, Dk), k [Dk, 2 Dk), v [2 Dk, n_ch)) is qkv column col(ch) */
    const int n_ch = 2 * Dk + Dvb, W = FUSED ? f.K - 1 : 0;
    auto col = [&](int ch) -> int64_t {
        return ch < Dk ? qo + ch : ch < 2 * Dk ? ko + (ch - Dk) : vo + (int64_t)blockIdx.z * Dvb + (ch - 2 * Dk);
    };
    float *cst = nullptr;
    if constexpr (FUSED) {
        cst = f.conv_state + (int64_t)a.q.slot[s] * f.conv_slot_floats;
        for (int ch = tid; ch < n_ch; ch += nth)
            for (int j = 0; j < W; j++) win[j * n_ch + ch] = zero ? 0.0f : cst[(int64_t)j * f.C + col(ch)];
    }

    float st[DELTA_MAX_ROWS];
#pragma unroll
    for (int i = 0; i < DELTA_MAX_ROWS; i++) {
        const int d = part + P * i;
        st[i] = (d < Dk && !zero) ? S[(int64_t)d * Dv + v] : 0.0f;
    }

    for (int it = i0; it < i1; it++) {
        const int64_t t = a.q.tok[it];
        const float *row = a.qkv + t * a.qkv_ld;
        __syncthreads(); /* the previous token is done with sq, sk, su, sv */
        if constexpr (FUSED) { /* conv1d_state of the block's channels, then silu */
            for (int ch = tid; ch < n_ch; ch += nth) {
                const int64_t cc = col(ch);
                const float *wr = f.conv_w + cc * f.K;
                const float xv = row[cc];
                float acc = wr[W] * xv;
                for (int j = 0; j < W; j++) acc = delta_conv_acc(acc, wr[j], win[j * n_ch + ch]);
                for (int j = 0; j + 1 < W; j++) win[j * n_ch + ch] = win[(j + 1) * n_ch + ch];
                if (W > 0) win[(W - 1) * n_ch + ch] = xv;
                const float y = delta_silu(acc);
                if (ch < Dk) sq[ch] = y;
                else if (ch < 2 * Dk) sk[ch - Dk] = y;
                else sv[ch - 2 * Dk] = y;
            }
        } else {
            for (int d = tid; d < Dk; d += nth) {
                sq[d] = row[qo + d];
                sk[d] = row[ko + d];
            }
        }
        __syncthreads();
        if (tid < 32) { /* L2 norms in double, as lm_l2norm */
            double ssq = 0.0, ssk = 0.0;
            for (int d = lane; d < Dk; d += 32) {
                ssq += (double)sq[d] * sq[d];
                ssk += (double)sk[d] * sk[d];
            }
            ssq = lm_warp_sum_d(ssq);
            ssk = lm_warp_sum_d(ssk);
            if (lane == 0) {
                fac[0] = (float)(qscale / sqrt(ssq + 1e-6));
                fac[1] = (float)(1.0 / sqrt(ssk + 1e-6));
            }
        }
        __syncthreads();
        for (int d = tid; d < Dk; d += nth) {
            sq[d] *= fac[0];
            sk[d] *= fac[1];
        }
        __syncthreads();
        float pk = 0.0f, pq = 0.0f;
#pragma unroll
        for (int i = 0; i < DELTA_MAX_ROWS; i++) {
            const int d = part + P * i;
            if (d < Dk) {
                pk += st[i] * sk[d];
                pq += st[i] * sq[d];
            }
        }
        if (part < P) {
            rk[part * Dvb + vb] = pk;
            rq[part * Dvb + vb] = pq;
        }
        if (tid < 32) {
            float qk = 0.0f;
            for (int d = lane; d < Dk; d += 32) qk += sq[d] * sk[d];
            for (int o = 16; o > 0; o >>= 1) qk += __shfl_xor_sync(DELTA_FULL, qk, o);
            if (lane == 0) fac[2] = qk;
        }
        const int64_t gi = t * a.Hv + h;
        float gl = a.g[gi], beta = a.beta[gi];
        if constexpr (FUSED) gl = delta_gate_g(gl, f.a_log[h], f.dt_bias[h]), beta = delta_gate_beta(beta);
        const float alpha = (float)exp((double)gl);
        __syncthreads();
        float o = 0.0f;
        if (part == 0) {
            float skv = 0.0f, sqv = 0.0f;
            for (int pp = 0; pp < P; pp++) {
                skv += rk[pp * Dvb + vb];
                sqv += rq[pp * Dvb + vb];
            }
            const float u = beta * ((FUSED ? sv[vb] : row[vo + v]) - alpha * skv);
            su[vb] = u;
            o = alpha * sqv + fac[2] * u;
            a.out[t * a.out_ld + (int64_t)h * Dv + v] = o;
        }
        if constexpr (FUSED) { /* rms_norm_gated of the row once all its columns are out */
            const int64_t rix = t * a.Hv + h;
            if (tid < (Dvb + 31) / 32 * 32) { /* the warps holding part 0 */
                const double ss = lm_warp_sum_d(part == 0 ? (double)o * o : 0.0);
                if (lane == 0) f.pss[rix * DELTA_NORM_WARPS + (blockIdx.z * Dvb) / 32 + tid / 32] = ss;
            }
            if (lm_last_block(f.cnt_norm + rix, (int)gridDim.z)) {
                double tot = 0.0;
                for (int w = 0; w < DELTA_NORM_WARPS; w++) tot += w * 32 < Dv ? __ldcg(f.pss + rix * DELTA_NORM_WARPS + w) : 0.0;
                const double sc = 1.0 / sqrt(tot / (double)Dv + f.eps);
                const int64_t ro = t * a.out_ld + (int64_t)h * Dv;
                for (int i = tid; i < Dv; i += nth)
                    f.y[ro + i] = delta_gnorm1(__ldcg(a.out + ro + i), sc, f.norm_w[i], f.z[ro + i]);
            }
        }
        __syncthreads();
        const float uv = su[vb];
#pragma unroll
        for (int i = 0; i < DELTA_MAX_ROWS; i++) {
            const int d = part + P * i;
            if (d < Dk) st[i] = alpha * st[i] + sk[d] * uv;
        }
    }
#pragma unroll
    for (int i = 0; i < DELTA_MAX_ROWS; i++) {
        const int d = part + P * i;
        if (d < Dk) S[(int64_t)d * Dv + v] = st[i];
    }
    if constexpr (FUSED) {
        for (int ch = 2 * Dk + tid; ch < n_ch; ch += nth) /* own v columns */
            for (int j = 0; j < W; j++) cst[(int64_t)j * f.C + col(ch)] = win[j * n_ch + ch];
        if (lm_last_block(f.cnt_win + (int64_t)s * a.Hk + hk, (a.Hv / a.Hk) * (int)gridDim.z))
            for (int ch = tid; ch < 2 * Dk; ch += nth)
                for (int j = 0; j < W; j++) cst[(int64_t)j * f.C + col(ch)] = win[j * n_ch + ch];
    }
}

/* The rule's arguments and launch shape (shared by the plain and fused forms). */
static delta_args delta_rule_args(lm_cuda *c, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                                  const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b,
                                  const lm_delta_params *p, delta_seqs q) {
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim;
    const int P = (Dk + DELTA_MAX_ROWS - 1) / DELTA_MAX_ROWS;
    LM_ASSERT((int64_t)(Dv * P + 31) / 32 * 32 <= DELTA_MAX_THREADS); /* a thread per (column, row part) */
    delta_args a;
    memset(&a, 0, sizeof a); /* padding too: a graph pass hashes the bytes */
    a.out = (float *)out->data;
    a.qkv = (const float *)qkv->data, a.g = (const float *)g->data, a.beta = (const float *)beta->data;
    a.qkv_ld = qkv->cols, a.out_ld = out->cols;
    a.state = kv->state[p->state.index];
    a.slot_floats = kv->state_floats[p->state.index], a.st_off = p->state.offset;
    a.q = q;
    a.Hk = Hk, a.Hv = Hv, a.Dk = Dk, a.Dv = Dv, a.P = P;
    /* split the columns while there are fewer than ~2 blocks per
     * multiprocessor, in whole warps' worth of columns */
    int n_cg = 1;
    while (Dv % (64 * n_cg) == 0 && (int64_t)Hv * b->n_seqs * n_cg < 2 * (int64_t)LM_MAX(c->n_sms, 1)) n_cg *= 2;
    a.Dvb = Dv / n_cg;
    return a;
}

template <bool FUSED>
static void delta_rule_launch(lm_cuda *c, const delta_args *a, const delta_fuse *f, int n_seqs) {
    size_t smem = (2 * (size_t)a->Dk + 2 * (size_t)a->P * a->Dvb + (size_t)a->Dvb) * sizeof(float);
    if (FUSED) smem += ((size_t)a->Dvb + (size_t)(f->K - 1) * (2 * (size_t)a->Dk + a->Dvb)) * sizeof(float);
    LM_ASSERT(smem <= 48 * 1024);
    const unsigned threads = (unsigned)((a->Dvb * a->P + 31) / 32 * 32);
    lm_cuda_launch_pdl(c, delta_rule_kernel<FUSED>, dim3((unsigned)a->Hv, (unsigned)n_seqs, (unsigned)(a->Dv / a->Dvb)),
                       threads, smem, *a, *f);
    LM_CUDA_LAUNCHED("delta_rule_kernel");
}

void lm_cuda_gated_delta(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                         const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b, const lm_delta_params *p) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    lm_check_gated_delta(out, qkv, g, beta, kv, b, p);
    if (b->n_tokens == 0 || b->n_seqs == 0) return;
    const delta_args a = delta_rule_args(c, out, qkv, g, beta, kv, b, p, delta_stage(c, kv, b));
    delta_fuse f;
    memset(&f, 0, sizeof f);
    delta_rule_launch<false>(c, &a, &f, b->n_seqs);
}

/* ---- rms_norm_gated ---------------------------------------------------------------- */

/* One block per row of n: y = (float)(x * s * w) * silu(z), s = 1/sqrt(mean x^2 + eps). */
__global__ void delta_gnorm_kernel(float *y, const float *x, const float *z, const float *w, int64_t n, double eps) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    __shared__ double red[32];
    const int64_t r = blockIdx.x;
    const float *xr = x + r * n, *zr = z + r * n;
    float *yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = lm_warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (unsigned i = 0; i < blockDim.x / 32; i++) t += red[i];
        red[0] = t;
    }
    __syncthreads();
    const double s = 1.0 / sqrt(red[0] / (double)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = delta_gnorm1(xr[i], s, w[i], zr[i]);
}

void lm_cuda_rms_norm_gated(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *z,
                            const lm_tensor *w, float eps) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && z->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(w->rows == 1 && w->cols > 0 && x->cols % w->cols == 0);
    LM_ASSERT(y->rows == x->rows && y->cols == x->cols && z->rows == x->rows && z->cols == x->cols);
    const int64_t rows = x->rows * (x->cols / w->cols);
    if (rows == 0) return;
    LM_ASSERT(rows <= INT32_MAX);
    lm_cuda_launch_pdl(c, delta_gnorm_kernel, (unsigned)rows, DELTA_NORM_THREADS, 0, (float *)y->data, (const float *)x->data,
                   (const float *)z->data, (const float *)w->data, w->cols, (double)eps);
    LM_CUDA_LAUNCHED("delta_gnorm_kernel");
}

/* ---- the layer, fused -------------------------------------------------------------- */

/* conv1d_state + delta_gates + gated_delta + rms_norm_gated in one launch
 * (delta_rule_kernel<true>) when the norm's row fits its 128-thread order
 * (Dv <= 128) and the per-row and per-key-head counters fit; else the four
 * kernels. The bits are the four kernels' (shared arithmetic, the norm's
 * summation order). Saves three launches a layer, which at batch 1 cost
 * about as much as the recurrence itself. */
void lm_cuda_gated_delta_layer(lm_backend *be, lm_tensor *y, const lm_tensor *qkv, const lm_tensor *z, lm_tensor *g,
                               lm_tensor *beta, lm_tensor *conv, lm_tensor *core, lm_kv_pool *kv,
                               const lm_attn_batch *b, const lm_delta_layer *d) {
    lm_cuda *c = lm_cuda_of(be);
    const lm_delta_params *p = &d->p;
    const int T = b->n_tokens, S = b->n_seqs, K = (int)d->conv_w->cols;
    const bool fuse = c->fused && p->v_dim <= DELTA_NORM_THREADS && d->norm_w->cols == p->v_dim && K >= 1 &&
                      K <= CONV_MAX_K && (int64_t)T * p->n_v_heads + (int64_t)S * p->n_k_heads <= LM_CUDA_COUNTERS - 1;
    if (!fuse) {
        lm_cuda_conv1d_state(be, conv, qkv, d->conv_w, kv, d->conv_state, b, true);
        lm_cuda_delta_gates(be, g, beta, d->a_log, d->dt_bias);
        lm_cuda_gated_delta(be, core, conv, g, beta, kv, b, p);
        lm_cuda_rms_norm_gated(be, y, core, z, d->norm_w, d->norm_eps);
        return;
    }
    lm_cuda_use(c);
    const int64_t C = qkv->cols, O = (int64_t)p->n_v_heads * p->v_dim;
    /* the four ops' contracts */
    LM_ASSERT(qkv->type == LM_F32 && d->conv_w->type == LM_F32 && d->conv_w->rows == C && qkv->rows == T);
    LM_ASSERT(conv->rows == T && conv->cols == C && conv->type == LM_F32);
    lm_check_state_ref(kv, d->conv_state, b, (int64_t)(K - 1) * C);
    LM_ASSERT(d->a_log->type == LM_F32 && d->dt_bias->type == LM_F32);
    LM_ASSERT(d->a_log->rows * d->a_log->cols == p->n_v_heads && d->dt_bias->rows * d->dt_bias->cols == p->n_v_heads);
    LM_ASSERT(g->rows == T && g->cols == p->n_v_heads && beta->rows == T && beta->cols == g->cols);
    lm_check_gated_delta(core, conv, g, beta, kv, b, p);
    LM_ASSERT(y->type == LM_F32 && z->type == LM_F32 && d->norm_w->type == LM_F32 && d->norm_w->rows == 1);
    LM_ASSERT(y->rows == T && y->cols == O && z->rows == T && z->cols == O && core->cols == O);
    if (T == 0 || S == 0) return;
    const delta_args a = delta_rule_args(c, core, qkv, g, beta, kv, b, p, delta_stage(c, kv, b));
    delta_fuse f;
    memset(&f, 0, sizeof f); /* padding too: a graph pass hashes the bytes */
    f.conv_w = (const float *)d->conv_w->data;
    f.conv_state = kv->state[d->conv_state.index] + d->conv_state.offset;
    f.conv_slot_floats = kv->state_floats[d->conv_state.index], f.C = C, f.K = K;
    f.a_log = (const float *)d->a_log->data, f.dt_bias = (const float *)d->dt_bias->data;
    f.y = (float *)y->data, f.z = (const float *)z->data, f.norm_w = (const float *)d->norm_w->data;
    f.eps = (double)d->norm_eps;
    f.pss = (double *)lm_cuda_scratch(c, (size_t)T * p->n_v_heads * DELTA_NORM_WARPS * sizeof(double));
    f.cnt_norm = c->counters + 1, f.cnt_win = f.cnt_norm + (int64_t)T * p->n_v_heads;
    delta_rule_launch<true>(c, &a, &f, S);
}
