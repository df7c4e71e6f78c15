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
 * conv1d_state: one thread per (sequence, channel, 64-token block), grid
 *   (ceil(C/128), S, ceil(longest / 64)), so a long prefill runs its
 *   tokens in parallel. The K-1 previous inputs and the K taps sit in
 *   registers (K <= 16, unrolled loops with guards so that nothing is
 *   indexed dynamically); the first block of a sequence seeds them from the
 *   slot, the others from x, and the first block writes the window back
 *   (oldest first), so only it touches the state.
 * gated_delta: one block per (value head, sequence, group of state
 *   columns), grid (Hv, S, Dv / Dvb), the recurrent form token by token;
 *   columns split while there are fewer than ~2 blocks per multiprocessor
 *   (a decode step). Thread (v, part) of Dvb * P threads
 *   (P = ceil(Dk / 32)) holds column v of the state for rows
 *   32 part .. 32 part + 31 in registers, so the state [Dk][Dv] (64 KiB
 *   at 128 x 128) never leaves the register file between tokens; with
 *   Dk = 128 known at compile time the row loops have no bounds checks and
 *   read q and k from shared memory four floats at a time (ncu, a
 *   Qwen3.5-27B decode step: 9-11 -> 6-8 us a layer). Per token:
 *   q and k to shared memory, their sums of squares in double (warp 0),
 *   normalised; S^T k and S^T q as per-part partial sums reduced through
 *   shared memory; u = beta (v - alpha S^T k), o = alpha S^T q + (q.k) u;
 *   S = alpha S + k u^T. The CPU backend runs several tokens in the chunked
 *   form; both are the same sums in another order (agreement ~1e-6).
 *   gated_delta_gates is the same kernel computing delta_gates' two values
 *   per (token, head) itself (one launch less in the chain of a step).
 * gated_delta, chunked: a sequence with at least lm_cuda.delta_chunk_min
 *   tokens (32) takes delta_chunk_kernel, 64 tokens a step as tile
 *   products in shared memory (cuda_delta_chunk.h has the steps, and
 *   tests/host/cuda_delta_check.cpp runs it on the CPU). The recurrent
 *   kernel costs ~a token's chain of barriers and loads per token, the
 *   chunked one a whole chunk's products whatever its length, so short
 *   runs (decode, speculative drafts) stay recurrent. The crossover,
 *   measured by tools/bench_cuda_delta.c on an H200 (2026-12-03, 27B head
 *   shape): 8 sequences of 16 tokens run 0.67x the recurrent kernel's
 *   speed chunked, of 32 tokens 1.24x, of 64 2.08x; one of 16 0.71x, of
 *   64 1.92x. A batch of both kinds launches
 *   both kernels, each skipping the other's sequences.
 * Both recurrent kernels read their state and staged ids before the PDL
 *   wait, so those loads overlap the kernel before.
 * delta_gates: elementwise, in double as the CPU backend.
 * rms_norm_gated: one block per row of w->cols, sum of squares in double. */
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CONV_MAX_K 16
#define CONV_TT 64 /* tokens of one sequence per conv1d_state block */
#define DELTA_MAX_ROWS 32  /* state rows per thread */
#define DELTA_FULL 0xffffffffu
#define DELTA_MAX_THREADS 512 /* Dv * ceil(Dk / 32): 128 x 128 heads take all of it */

#include "cuda_delta_chunk.h"

/* ---- sequences and their state ---------------------------------------------- */


/* Token counts of the batch's sequences (host side): the most and the
 * fewest of those that have tokens, and how many have at least `thr`. */
typedef struct delta_counts {
    int n_max, n_min, n_long;
} delta_counts;

/* Checks the batch (slots in range, consecutive positions per sequence) and
 * stages what the recurrent kernels need; *cnt gets the counts (thr: see
 * delta_counts). */
static delta_seqs delta_stage(lm_cuda *c, const lm_kv_pool *kv, const lm_attn_batch *b, int thr, delta_counts *cnt) {
    const int T = b->n_tokens, S = b->n_seqs;
    LM_ASSERT(!b->state_out); /* lm_backend_ops.state_out is false: speculation replays instead */
    size_t n = 2 * (size_t)T + 2 * (size_t)S + 1;
    int32_t *h = (int32_t *)lm_xcalloc(n, sizeof(int32_t));
    int32_t *pos = h, *slot = h + T, *start = slot + S, *tok = start + S + 1;
    memcpy(pos, b->pos, (size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) {
        LM_ASSERT(b->seq[t] >= 0 && b->seq[t] < S);
        start[b->seq[t] + 1]++;
    }
    cnt->n_max = 0, cnt->n_min = INT32_MAX, cnt->n_long = 0;
    for (int s = 0; s < S; s++) { /* a sequence without tokens here may have no slot */
        slot[s] = b->state_slot[s];
        LM_ASSERT(start[s + 1] == 0 || (slot[s] >= 0 && slot[s] < kv->n_state_slots));
        if (start[s + 1] == 0) continue;
        cnt->n_max = LM_MAX(cnt->n_max, start[s + 1]);
        cnt->n_min = LM_MIN(cnt->n_min, start[s + 1]);
        cnt->n_long += start[s + 1] >= thr;
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

/* Block (channel group, sequence, z) takes tokens z * CONV_TT .. of its
 * sequence; each output needs only the K-1 inputs before it, which a block
 * past the first reads from x. Only the first block (z = 0) touches the
 * state: it reads the old window and writes the new one, which is its own
 * window when it holds the sequence's last token and otherwise the last K-1
 * inputs (all in x: the sequence is longer than CONV_TT >= K-1). */
__global__ void delta_conv_kernel(float *y, const float *x, const float *w, float *state, int64_t slot_floats,
                                  int64_t st_off, delta_seqs q, int64_t C, int K, bool silu) {
    const int s = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int i0 = q.start[s], i1 = q.start[s + 1];
    const int a0 = i0 + (int)blockIdx.z * CONV_TT;
    if (a0 >= i1) return;
    const int a1 = min(i1, a0 + CONV_TT);
    const bool first = blockIdx.z == 0;
    /* Before the PDL wait (cuda_internal.h): the staged ids, the taps and
     * the window. No kernel that may still run writes them: the window is
     * this op's own state, last written by this layer a forward ago, and
     * the kernels that can overlap this one (the GEMVs launched before it,
     * which start before their own waits) write only their outputs. */
    const int W = K - 1;
    float *st = state + (int64_t)q.slot[s] * slot_floats + st_off + c;
    const bool zero = !first || q.pos[q.tok[i0]] == 0;
    float wt[CONV_MAX_K], win[CONV_MAX_K];
    const float wlast = w[c * K + K - 1];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; j++) {
        wt[j] = j < W ? w[c * K + j] : 0.0f;
        const float old = j < W && first ? st[(int64_t)j * C] : 0.0f; /* read whatever the slot holds: no wait on zero */
        win[j] = zero ? 0.0f : old;
    }
    lm_pdl_wait();
    lm_pdl_trigger();
    if (!first) {
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++)
            if (j < W) win[j] = x[(int64_t)q.tok[a0 - W + j] * C + c];
    }
    for (int i = a0; i < a1; i++) {
        const int64_t t = q.tok[i];
        const float xv = x[t * C + c];
        float acc = wlast * xv;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++)
            if (j < W) acc += wt[j] * win[j];
        y[t * C + c] = silu ? delta_silu(acc) : acc;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; j++) {
            if (j < W - 1) win[j] = win[j + 1];
            else if (j == W - 1) win[j] = xv;
        }
    }
    if (!first) return;
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
        if (j < W) st[(int64_t)j * C] = a1 == i1 ? win[j] : x[(int64_t)q.tok[i1 - W + j] * C + c];
}

void lm_cuda_conv1d_state(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_kv_pool *kv,
                          lm_state_ref state, const lm_attn_batch *b, bool silu) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int64_t C = x->cols;
    const int K = (int)w->cols;
    LM_ASSERT(x->type == LM_F32 && y->type == LM_F32 && w->type == LM_F32);
    LM_ASSERT(x->rows == b->n_tokens && y->rows == x->rows && y->cols == C && w->rows == C);
    LM_ASSERT(K >= 1 && K <= CONV_MAX_K && K - 1 <= CONV_TT && y->data != x->data);
    lm_check_state_ref(kv, state, b, (int64_t)(K - 1) * C);
    if (b->n_tokens == 0 || b->n_seqs == 0 || C == 0) return;
    delta_counts cnt;
    delta_seqs q = delta_stage(c, kv, b, 1, &cnt);
    dim3 grid((unsigned)((C + 127) / 128), (unsigned)b->n_seqs, (unsigned)((cnt.n_max + CONV_TT - 1) / CONV_TT));
    if (lm_cuda_skip(c, LM_SKIP_CONV)) return;
    lm_cuda_launch_pdl(c, delta_conv_kernel, grid, 128, 0, (float *)y->data, (const float *)x->data, (const float *)w->data,
                   kv->state[state.index], kv->state_floats[state.index], state.offset, q, C, K, silu);
    LM_CUDA_LAUNCHED("delta_conv_kernel");
}

/* ---- delta_gates ------------------------------------------------------------------ */


__global__ void delta_gates_kernel(float *g, float *beta, const float *a_log, const float *dt_bias, int64_t n,
                                   int64_t H) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t h = i % H;
    delta_gate_pair(g[i], beta[i], a_log[h], dt_bias[h], &g[i], &beta[i]);
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
    if (lm_cuda_skip(c, LM_SKIP_GATES)) return;
    lm_cuda_launch_pdl(c, delta_gates_kernel, (unsigned)((n + 255) / 256), 256, 0, (float *)g->data, (float *)beta->data,
                   (const float *)a_log->data, (const float *)dt_bias->data, n, g->cols);
    LM_CUDA_LAUNCHED("delta_gates_kernel");
}

/* ---- gated_delta ------------------------------------------------------------------ */


/* grid (Hv, S, Dv / Dvb), Dvb * P threads: the state's columns are
 * independent (each needs q, k, its own v column and the scalars q.k,
 * alpha, beta), so a head's columns spread over gridDim.z blocks, which
 * puts more multiprocessors on a decode step's state. Thread (v, part)
 * holds rows part * 32 .. part * 32 + 31 of column v. DK: Dk when known at
 * compile time (128, every Qwen3.5 / Qwen3-Next size; Dvb a multiple of 32,
 * so no thread idles): the row loops then carry no bounds checks and read q
 * and k four floats at a time; 0 for any Dk. Shared: q, k [Dk];
 * partials [2][P][Dvb]; u [Dvb]. */
template <int MINB, int DK>
__global__ void __launch_bounds__(DELTA_MAX_THREADS, MINB) delta_rule_kernel(delta_args a) {
    extern __shared__ __align__(16) float delta_smem[];
    lm_pdl_trigger();
    const int h = blockIdx.x, s = blockIdx.y;
    const int i0 = a.q.start[s], i1 = a.q.start[s + 1];
    if (i0 == i1 || i1 - i0 >= a.rec_max) return; /* block-uniform */
    constexpr int R = DELTA_MAX_ROWS;
    const int Dk = DK > 0 ? DK : a.Dk, P = DK > 0 ? DK / R : a.P;
    const int Dv = a.Dv, Dvb = a.Dvb, nth = blockDim.x;
    const int tid = threadIdx.x, vb = tid % Dvb, v = blockIdx.z * Dvb + vb, lane = tid & 31;
    /* threads past Dvb * P (the block is a whole number of warps) own no state */
    const int part = tid < Dvb * P ? tid / Dvb : P, r0 = part * R;
    float *sq = delta_smem, *sk = sq + Dk, *rk = sk + Dk, *rq = rk + P * Dvb, *su = rq + P * Dvb;
    __shared__ float fac[5]; /* q factor, k factor, q.k, alpha, beta */
    /* the gates' thread: warp 1 when there is one, away from warp 0's norms */
    const int gate_tid = nth > 32 ? 32 : 0;

    const int hk = a.v_tiled ? h % a.Hk : h / (a.Hv / a.Hk);
    const int64_t qo = (int64_t)hk * Dk, ko = (int64_t)a.Hk * Dk + qo, vo = 2 * (int64_t)a.Hk * Dk + (int64_t)h * Dv;
    const double qscale = 1.0 / sqrt((double)Dk);
    float *S = a.state + (int64_t)a.q.slot[s] * a.slot_floats + a.st_off + (int64_t)h * Dk * Dv;

    /* The state and the staged ids before the PDL wait (cuda_internal.h):
     * the state is this op's own, last written by this layer a forward ago
     * (or by a copy, which no kernel overlaps), and the kernels that may
     * still run (the convolution, or GEMVs that start before their waits)
     * write only their outputs. */
    float st[R];
    const bool zero = a.q.pos[a.q.tok[i0]] == 0;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int d = r0 + i;
        st[i] = ((DK > 0 || d < Dk) && !zero) ? S[(int64_t)d * Dv + v] : 0.0f;
    }
    lm_pdl_wait();

    for (int it = i0; it < i1; it++) {
        const int64_t t = a.q.tok[it];
        const float *row = a.qkv + t * a.qkv_ld;
        const int64_t gi = t * a.Hv + h;
        const float vv = part == 0 ? row[vo + v] : 0.0f; /* loaded now, used after three barriers */
        __syncthreads(); /* the previous token is done with sq, sk, su, fac */
        for (int d = tid; d < Dk; d += nth) {
            sq[d] = row[qo + d];
            sk[d] = row[ko + d];
        }
        if (tid == gate_tid) {
            float g = a.g[gi], beta = a.beta[gi];
            if (a.a_log) delta_gate_pair(g, beta, a.a_log[h], a.dt_bias[h], &g, &beta);
            fac[3] = (float)exp((double)g);
            fac[4] = beta;
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
        if constexpr (DK > 0) {
            const float4 *k4 = reinterpret_cast<const float4 *>(sk + r0), *q4 = reinterpret_cast<const float4 *>(sq + r0);
#pragma unroll
            for (int j = 0; j < R / 4; j++) {
                const float4 kk = k4[j], qq = q4[j];
                pk += st[4 * j] * kk.x, pq += st[4 * j] * qq.x;
                pk += st[4 * j + 1] * kk.y, pq += st[4 * j + 1] * qq.y;
                pk += st[4 * j + 2] * kk.z, pq += st[4 * j + 2] * qq.z;
                pk += st[4 * j + 3] * kk.w, pq += st[4 * j + 3] * qq.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int d = r0 + i;
                if (d < Dk) {
                    pk += st[i] * sk[d];
                    pq += st[i] * sq[d];
                }
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
        __syncthreads();
        const float alpha = fac[3];
        if (part == 0) {
            float skv = 0.0f, sqv = 0.0f;
            for (int pp = 0; pp < P; pp++) {
                skv += rk[pp * Dvb + vb];
                sqv += rq[pp * Dvb + vb];
            }
            const float u = fac[4] * (vv - alpha * skv);
            su[vb] = u;
            a.out[t * a.out_ld + (int64_t)h * Dv + v] = alpha * sqv + fac[2] * u;
        }
        __syncthreads();
        const float uv = su[vb];
        if constexpr (DK > 0) {
            const float4 *k4 = reinterpret_cast<const float4 *>(sk + r0);
#pragma unroll
            for (int j = 0; j < R / 4; j++) {
                const float4 kk = k4[j];
                st[4 * j] = alpha * st[4 * j] + kk.x * uv;
                st[4 * j + 1] = alpha * st[4 * j + 1] + kk.y * uv;
                st[4 * j + 2] = alpha * st[4 * j + 2] + kk.z * uv;
                st[4 * j + 3] = alpha * st[4 * j + 3] + kk.w * uv;
            }
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int d = r0 + i;
                if (d < Dk) st[i] = alpha * st[i] + sk[d] * uv;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int d = r0 + i;
        if (DK > 0 || d < Dk) S[(int64_t)d * Dv + v] = st[i];
    }
}

/* Columns per block of the chunked kernel: Dv split over nz blocks, the
 * split that minimises waves x a block's work per chunk in FMAs (M1 does
 * not shrink with the columns, the rest does), within the opt-in shared
 * memory. Qwen3.5-27B on an H200: 64 (96 blocks) for one sequence, 128
 * for eight. Returns 0 if no split fits. */
static int dch_columns(const lm_cuda *c, int DkP, int Dv, int64_t n_heads_seqs) {
    const int ct_max = DkP <= 128 ? 2 : 1;
    const double m1 = 4352.0 * DkP, per_col = 192.0 * DkP + 4096.0;
    int best = 0;
    double best_cost = 0.0;
    for (int nz = 1; nz <= 64; nz *= 2) {
        const int Dvb = ((Dv + nz - 1) / nz + 3) / 4 * 4;
        if (Dvb > 64 * ct_max) continue;
        const size_t smem = dch_smem_bytes(DkP, Dvb);
        if (smem + DCH_STATIC_SMEM > (size_t)c->smem_optin) continue;
        /* one block a multiprocessor: ~150 registers a thread (ptxas) */
        const int64_t blocks = n_heads_seqs * ((Dv + Dvb - 1) / Dvb), sms = LM_MAX(c->n_sms, 1);
        const int64_t waves = (blocks + sms - 1) / sms;
        const double cost = (double)waves * (m1 + per_col * Dvb);
        if (!best || cost < best_cost) best = Dvb, best_cost = cost;
        if (Dvb <= 16) break;
    }
    return best;
}

/* gated_delta; with a_log and dt_bias, g and beta are the raw projections
 * and the kernel applies delta_gates itself (g and beta are left as they
 * were). Sequences with at least c->delta_chunk_min tokens take the chunked
 * kernel, the others the recurrent one; a batch of both launches both (they
 * touch disjoint sequences' outputs and state). */
static void delta_rule(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                       const lm_tensor *beta, const lm_tensor *a_log, const lm_tensor *dt_bias, lm_kv_pool *kv,
                       const lm_attn_batch *b, const lm_delta_params *p) {
    lm_cuda *c = lm_cuda_of(be);
    lm_cuda_use(c);
    const int Hk = p->n_k_heads, Hv = p->n_v_heads, Dk = p->k_dim, Dv = p->v_dim;
    lm_check_gated_delta(out, qkv, g, beta, kv, b, p);
    const int P = (Dk + DELTA_MAX_ROWS - 1) / DELTA_MAX_ROWS;
    if (b->n_tokens == 0 || b->n_seqs == 0) return;
    delta_args a;
    memset(&a, 0, sizeof a); /* padding too: a graph pass hashes the bytes */
    a.out = (float *)out->data;
    a.qkv = (const float *)qkv->data, a.g = (const float *)g->data, a.beta = (const float *)beta->data;
    if (a_log) a.a_log = (const float *)a_log->data, a.dt_bias = (const float *)dt_bias->data;
    a.qkv_ld = qkv->cols, a.out_ld = out->cols;
    a.state = kv->state[p->state.index];
    a.slot_floats = kv->state_floats[p->state.index], a.st_off = p->state.offset;
    /* the chunked kernel takes heads up to 256 wide, where its narrowest
     * column group fits the shared memory (dch_columns tries down to 16) */
    const int DkP = (Dk + 3) / 4 * 4;
    const bool chunk_ok = c->delta_chunk_min > 0 && Dk <= 256 && Dv <= 256 &&
                          dch_smem_bytes(DkP, LM_MIN(16, (Dv + 3) / 4 * 4)) + DCH_STATIC_SMEM <= (size_t)c->smem_optin;
    a.rec_max = chunk_ok ? c->delta_chunk_min : INT32_MAX;
    delta_counts cnt;
    a.q = delta_stage(c, kv, b, a.rec_max, &cnt);
    a.Hk = Hk, a.Hv = Hv, a.Dk = Dk, a.Dv = Dv, a.P = P, a.v_tiled = p->v_tiled;
    if (lm_cuda_skip(c, LM_SKIP_DELTA_RULE)) return;
    if (cnt.n_min < a.rec_max) { /* the recurrent kernel */
        LM_ASSERT((int64_t)(Dv * P + 31) / 32 * 32 <= DELTA_MAX_THREADS); /* a thread per (column, row part) */
        /* split the columns while there are fewer than ~2 blocks per
         * multiprocessor, in whole warps' worth of columns */
        int n_cg = 1;
        while (Dv % (64 * n_cg) == 0 && (int64_t)Hv * b->n_seqs * n_cg < 2 * (int64_t)LM_MAX(c->n_sms, 1)) n_cg *= 2;
        a.Dvb = Dv / n_cg;
        const size_t smem = (2 * (size_t)Dk + 2 * (size_t)P * a.Dvb + (size_t)a.Dvb) * sizeof(float);
        LM_ASSERT(smem <= 48 * 1024);
        const unsigned threads = (unsigned)((a.Dvb * P + 31) / 32 * 32);
        /* Many blocks (batched decode): two a multiprocessor, on half the
         * registers (a few state rows spill to local memory) for twice the
         * warps in flight; few (one sequence): one, all rows in registers, the
         * shorter chain */
        const dim3 grid((unsigned)Hv, (unsigned)b->n_seqs, (unsigned)n_cg);
        const bool many = (int64_t)Hv * b->n_seqs * n_cg >= 4 * (int64_t)LM_MAX(c->n_sms, 1);
        if (Dk == 128 && a.Dvb % 32 == 0) {
            if (many) lm_cuda_launch_pdl(c, delta_rule_kernel<2, 128>, grid, threads, smem, a);
            else lm_cuda_launch_pdl(c, delta_rule_kernel<1, 128>, grid, threads, smem, a);
        } else if (many) lm_cuda_launch_pdl(c, delta_rule_kernel<2, 0>, grid, threads, smem, a);
        else lm_cuda_launch_pdl(c, delta_rule_kernel<1, 0>, grid, threads, smem, a);
        LM_CUDA_LAUNCHED("delta_rule_kernel");
    }
    if (cnt.n_max >= a.rec_max) { /* the chunked kernel */
        a.DkP = DkP;
        a.Dvb = dch_columns(c, a.DkP, Dv, (int64_t)Hv * cnt.n_long);
        LM_ASSERT(a.Dvb > 0);
        const size_t smem = dch_smem_bytes(a.DkP, a.Dvb);
        const dim3 grid((unsigned)Hv, (unsigned)b->n_seqs, (unsigned)((Dv + a.Dvb - 1) / a.Dvb));
        if (a.DkP <= 128) {
            LM_CUDA_CHECK(cudaFuncSetAttribute(delta_chunk_kernel<2, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
            lm_cuda_launch_pdl(c, delta_chunk_kernel<2, 2>, grid, DCH_THREADS, smem, a);
        } else {
            LM_ASSERT(a.Dvb <= 64);
            LM_CUDA_CHECK(cudaFuncSetAttribute(delta_chunk_kernel<1, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
            lm_cuda_launch_pdl(c, delta_chunk_kernel<1, 4>, grid, DCH_THREADS, smem, a);
        }
        LM_CUDA_LAUNCHED("delta_chunk_kernel");
    }
}

void lm_cuda_gated_delta(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, const lm_tensor *g,
                         const lm_tensor *beta, lm_kv_pool *kv, const lm_attn_batch *b, const lm_delta_params *p) {
    delta_rule(be, out, qkv, g, beta, NULL, NULL, kv, b, p);
}

void lm_cuda_gated_delta_gates(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, lm_tensor *a, lm_tensor *b_raw,
                               const lm_tensor *a_log, const lm_tensor *dt_bias, lm_kv_pool *kv,
                               const lm_attn_batch *b, const lm_delta_params *p) {
    LM_ASSERT(a_log->type == LM_F32 && dt_bias->type == LM_F32);
    LM_ASSERT(a_log->rows * a_log->cols == p->n_v_heads && dt_bias->rows * dt_bias->cols == p->n_v_heads);
    delta_rule(be, out, qkv, a, b_raw, a_log, dt_bias, kv, b, p);
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
        yr[i] = (float)((double)xr[i] * s * w[i]) * delta_silu(zr[i]);
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
    if (lm_cuda_skip(c, LM_SKIP_GNORM)) return;
    lm_cuda_launch_pdl(c, delta_gnorm_kernel, (unsigned)rows, 128, 0, (float *)y->data, (const float *)x->data,
                   (const float *)z->data, (const float *)w->data, w->cols, (double)eps);
    LM_CUDA_LAUNCHED("delta_gnorm_kernel");
}
