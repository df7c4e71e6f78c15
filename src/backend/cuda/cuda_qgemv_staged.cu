/* cuda_qgemv_staged.cu - the decode GEMV (T <= 8 tokens, int8 activations)
 * over Q4_K and Q6_K rows with the weights streamed into shared memory by
 * bulk copies (cp.async.bulk, sm_90) instead of loads into registers.
 *
 * Why: the slice kernel (cuda_qgemv.cu) holds its weight loads in
 * registers; a block makes one pass of ~9 KB and retires, so the bytes in
 * flight per SM depend on how many blocks are between their loads and
 * their sums. On the H200 it read 4,096x4,096 Q4_K at 37 % of the copy rate
 * and 14,336x4,096 at 52 % (bench_cuda_gemv). Here a block owns a run of
 * consecutive rows (contiguous bytes) and keeps stages of them (~64 KB,
 * as far as two blocks an SM fit) in flight through the copy engine,
 * whatever the arithmetic is doing.
 *
 * Roofline (decode, batch 1): the step reads every weight byte once; the
 * Llama-3.1-8B Q4_K_M file is 4.9 GB of weights, ~1.16 ms at the H200's
 * 4.2 TB/s copy rate (~860 tok/s). Arithmetic per weight byte here: a
 * 64-value unit of Q4_K (36 bytes with its header) costs ~45 instructions
 * for one token (16 dp4a, 12 nibble ops, ~17 for scales and sums), ~1.3 a
 * byte, well under the ~7 a byte the SMs issue at that rate.
 *
 * Work split: a block is a producer warp (lane 0 issues the copies; the
 * warp refills a buffer once every consumer has released it) and 8
 * consumer warps; consumer warp w takes the block's rows w, w + 8, ...,
 * each row whole (lanes stride over its U = I / 64 units of 64 values: a
 * quarter of a 256-value block: Q4_K sub-blocks 2g and 2g + 1; Q6_K half
 * h, l in [16i, 16i + 16) of its four runs), so no block-wide barrier
 * stands between stages. Each block first rounds x to int8 by the largest
 * magnitude of every 32 values, into shared memory in the units' order
 * (conflict-free 16-byte reads). Sums: integer dp4a per 32 (Q4_K) or 16
 * (Q6_K) values, scaled in f32 in a fixed order (per lane over its units,
 * then a warp-shuffle tree), so a row's bits depend neither on T nor on
 * the rows beside it: fused, composed, several-matrix and batched
 * launches agree bit for bit.
 *
 * Modes: plain (+ bias), the residual add, and silu(gate) * up (a stage
 * holds rs gate rows, then rs up rows). The RMSNorm after a residual add
 * is not fused into the last block, as the bf16 GEMV's is: on the H200 that
 * tail cost ~9 us a launch in the 8B decode step (LUMEN_CUDA_SKIP=norm_tail
 * 396 tok/s against 323 with it), the separate rms_norm launch far less. */
#include "cuda_quant.h"

#define LM_SG_MAXST 16             /* stages a block keeps in flight, at most */
#define LM_SG_THREADS 288          /* a producer warp and 8 consumer warps */
#define LM_SG_SMEM (220 * 1024)    /* dynamic shared memory a block may take (sm_90 allows 227 KB) */
#define LM_SG_SM_SMEM (228 * 1024) /* shared memory of an sm_90 SM, 1 KB of it reserved a block */
#define LM_SG_STAGE (32 * 1024)    /* bytes of weights a stage aims at (whole rows, at least one) */
#define LM_SG_STAGE_MIN (16 * 1024) /* ... where that does not fit the shared memory */
#define LM_SG_INFLIGHT (64 * 1024) /* bytes of weights a block aims to keep in flight */

enum { LM_SG_PLAIN = 0, LM_SG_ADD, LM_SG_GLU };

typedef struct lm_sgemv_args {
    const unsigned char *w[LM_GEMV_MAXM]; /* GLU: gate w[0], up w[1] */
    const float *bias[LM_GEMV_MAXM];
    float *y[LM_GEMV_MAXM];
    int64_t O[LM_GEMV_MAXM];
    int first_block[LM_GEMV_MAXM + 1];
    const float *x;
    int I, n_tok, U, rs, rpb, nst, row_bytes, stage_bytes;
    int off_bar, off_xq, off_dx, off_sx;
} lm_sgemv_args;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
static __device__ __forceinline__ unsigned lm_sg_saddr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void lm_sg_bar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(lm_sg_saddr(bar)), "r"(count) : "memory");
}
static __device__ __forceinline__ void lm_sg_bar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(lm_sg_saddr(bar)) : "memory");
}
/* One arrival that also expects `bytes` from bulk copies. */
static __device__ __forceinline__ void lm_sg_bar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lm_sg_saddr(bar)), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void lm_sg_bar_wait(uint64_t *bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred p;\n"
                 "LM_SG_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra LM_SG_WAIT_%=;\n}" ::"r"(lm_sg_saddr(bar)),
                 "r"(parity)
                 : "memory");
}
/* bytes (a multiple of 16, both addresses 16-byte aligned) from global to
 * shared memory, completing on bar. */
static __device__ __forceinline__ void lm_sg_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     lm_sg_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(lm_sg_saddr(bar))
                 : "memory");
}
#endif

/* N words from a 2-byte aligned shared-memory address (Q6_K blocks are 210
 * bytes): aligned words joined by a funnel shift; reads up to 4 bytes past
 * p + 4N (a stage buffer has 16 spare bytes). */
template <int N> static __device__ __forceinline__ void lm_sg_words(const unsigned char *p, unsigned (&out)[N]) {
    const unsigned *b = (const unsigned *)((uintptr_t)p & ~(uintptr_t)3);
    const unsigned sh = ((unsigned)(uintptr_t)p & 2u) * 8u;
    unsigned w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) w[i] = b[i];
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

/* Where x's 16 values [32b + 16 half, + 16) go: unit u, chunk k (the k-th
 * 16-byte read of the unit), in the order the unit's codes come. */
template <lm_dtype QT> static __device__ __forceinline__ void lm_sg_place(int b, int half, int &u, int &k) {
    if constexpr (QT == LM_Q4_K) { /* unit u: sub-blocks 2u (low nibbles), 2u + 1 (high) */
        u = b >> 1, k = 2 * (b & 1) + half;
    } else { /* Q6_K unit 4s + 2h + i: run m = values 128h + 32m + 16i .. of block s */
        u = 4 * (b >> 3) + 2 * ((b & 7) >> 2) + half, k = b & 3;
    }
}

/* One unit of a Q4_K row (blk: its 256-value block in shared memory, g:
 * the sub-block pair) for T tokens: acc[t] += the unit's dot product. */
template <int T>
static __device__ __forceinline__ void lm_sg_unit_q4k(const unsigned char *blk, int u, const uint4 *xq, const float *dx,
                                                      const float *sx, int U, int NB, float (&acc)[T]) {
    const int g = u & 3;
    const uint4 h = *(const uint4 *)blk, qa = *(const uint4 *)(blk + 16 + 32 * g),
                qb = *(const uint4 *)(blk + 32 + 32 * g);
    float d0, o0, d1, o1;
    lm_q_k_head(h, g, d0, o0, d1, o1);
    const unsigned q[8] = { qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w };
    unsigned lo[8], hi[8];
#pragma unroll
    for (int e = 0; e < 8; e++) lo[e] = q[e] & 0x0f0f0f0fu, hi[e] = (q[e] >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 *xt = xq + (size_t)t * 4 * U + u;
        const uint4 x0 = xt[0], x1 = xt[U], x2 = xt[2 * U], x3 = xt[3 * U];
        const int xl[8] = { (int)x0.x, (int)x0.y, (int)x0.z, (int)x0.w, (int)x1.x, (int)x1.y, (int)x1.z, (int)x1.w };
        const int xh[8] = { (int)x2.x, (int)x2.y, (int)x2.z, (int)x2.w, (int)x3.x, (int)x3.y, (int)x3.z, (int)x3.w };
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) s0 = lm_q_dp4a_us(lo[e], xl[e], s0), s1 = lm_q_dp4a_us(hi[e], xh[e], s1);
        const float2 d = *(const float2 *)(dx + (size_t)t * NB + 2 * u), m = *(const float2 *)(sx + (size_t)t * NB + 2 * u);
        float a = acc[t];
        a = fmaf(d0 * d.x, lm_q_i2f(s0), a);
        a = fmaf(d1 * d.y, lm_q_i2f(s1), a);
        a = fmaf(-o0, m.x, a);
        acc[t] = fmaf(-o1, m.y, a);
    }
}

/* One unit of a Q6_K row: half h = (u >> 1) & 1, l in [16i, 16i + 16) with
 * i = u & 1, its four runs m (values 128h + 32m + 16i ..), each with its own
 * 8-bit scale; codes - 32 as signed bytes. */
template <int T>
static __device__ __forceinline__ void lm_sg_unit_q6k(const unsigned char *blk, int u, const uint4 *xq, const float *dx,
                                                      int U, int NB, float (&acc)[T]) {
    const int h = (u >> 1) & 1, i = u & 1;
    unsigned qa[4], qb[4], qh[4], sw[2];
    lm_sg_words<4>(blk + 64 * h + 16 * i, qa);
    lm_sg_words<4>(blk + 64 * h + 32 + 16 * i, qb);
    lm_sg_words<4>(blk + 128 + 32 * h + 16 * i, qh);
    lm_sg_words<2>(blk + 192 + 8 * h, sw);
    const float d = lm_q_f16(*(const unsigned short *)(blk + 208));
    float ds[4];
    int c[4][4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int k = i + 2 * m;
        ds[m] = d * (float)(signed char)(sw[k >> 2] >> (8 * (k & 3)));
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const unsigned src = (m & 1) ? qb[e] : qa[e];
            const unsigned lo4 = (m < 2 ? src : src >> 4) & 0x0f0f0f0fu;
            c[m][e] = (int)__vsub4(lo4 | (((qh[e] >> (2 * m)) & 0x03030303u) << 4), 0x20202020u);
        }
    }
    const int blk_pair = u >> 1; /* 2s + h: x sub-blocks 8s + 4h .. 8s + 4h + 3 */
#pragma unroll
    for (int t = 0; t < T; t++) {
        const uint4 *xt = xq + (size_t)t * 4 * U + u;
        const float4 dv = *(const float4 *)(dx + (size_t)t * NB + 4 * blk_pair);
        const float dm[4] = { dv.x, dv.y, dv.z, dv.w };
        float v = 0.0f;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const uint4 xv = xt[(size_t)m * U];
            int s = __dp4a(c[m][0], (int)xv.x, 0);
            s = __dp4a(c[m][1], (int)xv.y, s);
            s = __dp4a(c[m][2], (int)xv.z, s);
            s = __dp4a(c[m][3], (int)xv.w, s);
            v = m == 0 ? (ds[0] * dm[0]) * lm_q_i2f(s) : fmaf(ds[m] * dm[m], lm_q_i2f(s), v);
        }
        acc[t] += v;
    }
}

template <int T, lm_dtype QT, int KIND>
__global__ void __launch_bounds__(LM_SG_THREADS, T == 1 ? 3 : 1) lm_sgemv_kernel(const lm_sgemv_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr bool GLU = KIND == LM_SG_GLU;
    constexpr int BB = QT == LM_Q4_K ? 144 : 210, NCW = LM_SG_THREADS / 32 - 1;
    lm_pdl_trigger();
    const int tid = threadIdx.x, nt = blockDim.x, warp = tid >> 5, lane = tid & 31;
    int m = 0;
    if constexpr (!GLU)
        while (m + 1 < LM_GEMV_MAXM && (int)blockIdx.x >= a.first_block[m + 1]) m++;
    const int64_t O = a.O[m], r0 = (int64_t)((int)blockIdx.x - a.first_block[m]) * a.rpb;
    const int nrows = (int)LM_MIN((int64_t)a.rpb, O - r0), rs = a.rs, nst = (nrows + rs - 1) / rs;
    const size_t rb = (size_t)a.row_bytes;
    uint64_t *full = (uint64_t *)(sm + a.off_bar), *empty = full + LM_SG_MAXST;
    const unsigned char *wg = a.w[m] + (size_t)r0 * rb, *wu = GLU ? a.w[1] + (size_t)r0 * rb : nullptr;
    auto issue = [&](int j) { /* stage j's rows (GLU: gate rows, then up rows) into buffer j % a.nst */
        const int st = j % a.nst, n = LM_MIN(rs, nrows - j * rs);
        unsigned char *dst = sm + (size_t)st * a.stage_bytes;
        const unsigned bytes = (unsigned)((size_t)n * rb);
        lm_sg_bar_expect(&full[st], GLU ? 2 * bytes : bytes);
        lm_sg_copy(dst, wg + (size_t)j * rs * rb, bytes, &full[st]);
        if constexpr (GLU) lm_sg_copy(dst + (size_t)rs * rb, wu + (size_t)j * rs * rb, bytes, &full[st]);
    };
    if (tid == 0) { /* weights are never written by the kernels before: fetch before the wait */
        for (int s = 0; s < a.nst; s++) lm_sg_bar_init(&full[s], 1), lm_sg_bar_init(&empty[s], NCW);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        for (int j = 0; j < LM_MIN(a.nst, nst); j++) issue(j);
    }
    lm_pdl_wait();

    /* x rounded to int8 per 32 values: a thread takes 16 of them, its
     * neighbour lane the other 16 (the pair shares the scale and the sum) */
    const int I = a.I, NB = I / 32, U = a.U, n_tok = a.n_tok > 0 ? a.n_tok : T;
    uint4 *xq = (uint4 *)(sm + a.off_xq);
    float *dx = (float *)(sm + a.off_dx), *sx = (float *)(sm + a.off_sx);
    const int items = T * NB * 2;
    for (int base = 0; base < items; base += nt) {
        const int it = base + tid;
        const bool ok = it < items;
        const int t = ok ? it / (2 * NB) : 0, b = ok ? (it % (2 * NB)) >> 1 : 0, half = it & 1;
        float4 v[4] = {};
        float amax = 0.0f;
        if (ok) {
            const float4 *xp = (const float4 *)(a.x + (size_t)LM_MIN(t, n_tok - 1) * I + 32 * b + 16 * half);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[k] = xp[k];
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w))));
            }
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        const float inv = amax > 0.0f ? __fdividef(127.0f, amax) : 0.0f;
        uint4 q;
        q.x = (unsigned)lm_q_pack_s8(v[0].x, v[0].y, v[0].z, v[0].w, inv);
        q.y = (unsigned)lm_q_pack_s8(v[1].x, v[1].y, v[1].z, v[1].w, inv);
        q.z = (unsigned)lm_q_pack_s8(v[2].x, v[2].y, v[2].z, v[2].w, inv);
        q.w = (unsigned)lm_q_pack_s8(v[3].x, v[3].y, v[3].z, v[3].w, inv);
        int isum = __dp4a((int)q.x, 0x01010101, 0);
        isum = __dp4a((int)q.y, 0x01010101, isum);
        isum = __dp4a((int)q.z, 0x01010101, isum);
        isum = __dp4a((int)q.w, 0x01010101, isum);
        isum += __shfl_xor_sync(0xffffffffu, isum, 1);
        if (ok) {
            int u, k;
            lm_sg_place<QT>(b, half, u, k);
            xq[((size_t)t * 4 + k) * U + u] = q;
            if (half == 0) {
                const float d = amax * (1.0f / 127.0f);
                dx[(size_t)t * NB + b] = d;
                sx[(size_t)t * NB + b] = d * (float)isum;
            }
        }
    }
    __syncthreads(); /* x ready; the barriers' init seen by every thread */

    if (warp == 0) { /* the producer: refills a buffer once every consumer warp has released it */
        for (int j = a.nst; j < nst; j++) {
            const int st = j % a.nst;
            lm_sg_bar_wait(&empty[st], (unsigned)(j / a.nst - 1) & 1u);
            if (lane == 0) issue(j);
        }
        __syncwarp();
    } else { /* consumer warp cw: rows g = cw, cw + NCW, ... of the block, stage by stage, each row whole */
        const int cw = warp - 1;
        for (int j = 0; j < nst; j++) {
            const int st = j % a.nst, n = LM_MIN(rs, nrows - j * rs);
            lm_sg_bar_wait(&full[st], (unsigned)(j / a.nst) & 1u);
            const unsigned char *buf = sm + (size_t)st * a.stage_bytes;
            for (int r = ((cw - j * rs) % NCW + NCW) % NCW; r < n; r += NCW) {
                float acc[T], accu[T];
#pragma unroll
                for (int t = 0; t < T; t++) acc[t] = 0.0f, accu[t] = 0.0f;
                const unsigned char *row = buf + (size_t)r * rb, *rowu = buf + (size_t)(rs + r) * rb;
                for (int u = lane; u < U; u += 32) {
                    const size_t bo = (size_t)(u >> 2) * BB;
                    if constexpr (QT == LM_Q4_K) lm_sg_unit_q4k<T>(row + bo, u, xq, dx, sx, U, NB, acc);
                    else lm_sg_unit_q6k<T>(row + bo, u, xq, dx, U, NB, acc);
                    if constexpr (GLU) {
                        if constexpr (QT == LM_Q4_K) lm_sg_unit_q4k<T>(rowu + bo, u, xq, dx, sx, U, NB, accu);
                        else lm_sg_unit_q6k<T>(rowu + bo, u, xq, dx, U, NB, accu);
                    }
                }
                float mine = 0.0f, mineu = 0.0f; /* lane t keeps token t's sums */
#pragma unroll
                for (int t = 0; t < T; t++) {
                    float v = acc[t], vu = accu[t];
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        v += __shfl_xor_sync(0xffffffffu, v, off);
                        if constexpr (GLU) vu += __shfl_xor_sync(0xffffffffu, vu, off);
                    }
                    if (lane == t) mine = v, mineu = vu;
                }
                if (lane < n_tok) {
                    const int64_t o = r0 + (int64_t)j * rs + r;
                    float *yo = a.y[m] + (size_t)lane * O + o;
                    if constexpr (GLU) *yo = lm_silu_mul1(mine, mineu);
                    else if constexpr (KIND == LM_SG_ADD) *yo += mine;
                    else *yo = mine + (a.bias[m] ? a.bias[m][o] : 0.0f);
                }
            }
            __syncwarp();
            if (lane == 0) lm_sg_bar_arrive(&empty[st]);
        }
    }
#endif
}

/* ---- host side ------------------------------------------------------------------ */

typedef struct lm_sg_plan {
    int U, rs, nst, row_bytes, stage_bytes, off_bar, off_xq, off_dx, off_sx;
    size_t smem;
} lm_sg_plan;

static int lm_sg_block_bytes(lm_dtype wt) { return wt == LM_Q4_K ? 144 : 210; }

/* The shape of a launch for rows of I values of type wt, T tokens: rows a
 * stage (~stage bytes of weights), stages in flight (~inflight bytes, at
 * most nst_max, down to two while the block would take more than budget
 * bytes of shared memory); false when it does not fit at all. */
static bool lm_sg_make_plan(lm_dtype wt, int64_t I, int T, bool glu, int nst_max, int stage, int inflight,
                            size_t budget, lm_sg_plan *p) {
    memset(p, 0, sizeof *p);
    if (I <= 0 || I % 256 != 0 || I > (1 << 20)) return false;
    p->U = (int)(I / 64);
    p->row_bytes = (int)(I / 256) * lm_sg_block_bytes(wt);
    if (p->row_bytes % 16 != 0) return false;
    const int mats = glu ? 2 : 1;
    p->rs = LM_MAX(1, stage / (p->row_bytes * mats));
    p->stage_bytes = (p->rs * p->row_bytes * mats + 16 + 127) / 128 * 128; /* 16 spare bytes: lm_sg_words */
    const size_t fixed = 2 * LM_SG_MAXST * 8 + (size_t)T * I + 2 * (size_t)T * (I / 32) * 4;
    p->nst = LM_MIN(LM_MIN(nst_max, LM_SG_MAXST), LM_MAX(2, (inflight + p->stage_bytes - 1) / p->stage_bytes));
    while (p->nst > 2 && (size_t)p->nst * p->stage_bytes + fixed > LM_MIN(budget, (size_t)LM_SG_SMEM)) p->nst--;
    p->off_bar = p->nst * p->stage_bytes;
    p->off_xq = p->off_bar + 2 * LM_SG_MAXST * 8;
    p->off_dx = p->off_xq + T * (int)I;
    p->off_sx = p->off_dx + T * (int)(I / 32) * 4;
    p->smem = (size_t)p->off_sx + (size_t)T * (I / 32) * 4;
    return p->smem <= LM_SG_SMEM;
}

/* Whether the staged kernel takes these matrices: the same answer for
 * every T and mode (a matrix's bits must not depend on the batch), so the
 * test is the largest case, 8 tokens of gate/up with two stages. */
bool lm_sgemv_takes(const lm_cuda *c, const lm_gemv_args *a, lm_dtype wt) {
    if (!c->qstaged || c->quant_exact || (wt != LM_Q4_K && wt != LM_Q6_K)) return false;
    lm_sg_plan p;
    if (!lm_sg_make_plan(wt, a->I, 8, true, 2, LM_SG_STAGE_MIN, LM_SG_INFLIGHT, LM_SG_SMEM, &p)) return false;
    for (int m = 0; m < LM_GEMV_MAXM; m++)
        if (a->w[m] && ((uintptr_t)a->w[m] & 15u) != 0) return false;
    return true;
}

template <int T, lm_dtype QT, int KIND> static void lm_sg_attr() {
    LM_CUDA_CHECK(cudaFuncSetAttribute(lm_sgemv_kernel<T, QT, KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       LM_SG_SMEM));
}
template <lm_dtype QT> static void lm_sg_attrs() {
    lm_sg_attr<1, QT, LM_SG_PLAIN>(), lm_sg_attr<2, QT, LM_SG_PLAIN>(), lm_sg_attr<4, QT, LM_SG_PLAIN>();
    lm_sg_attr<8, QT, LM_SG_PLAIN>();
    lm_sg_attr<1, QT, LM_SG_ADD>(), lm_sg_attr<2, QT, LM_SG_ADD>(), lm_sg_attr<4, QT, LM_SG_ADD>();
    lm_sg_attr<1, QT, LM_SG_GLU>(), lm_sg_attr<2, QT, LM_SG_GLU>(), lm_sg_attr<4, QT, LM_SG_GLU>();
}

/* Once a backend, outside any graph capture: the kernels may take more
 * than the default 48 KB of shared memory. */
void lm_sgemv_init(lm_cuda *c) {
    if (!c->qstaged_ok) return; /* lm_cuda_backend_qstaged may turn it on later */
    lm_sg_attrs<LM_Q4_K>();
    lm_sg_attrs<LM_Q6_K>();
}

template <int T, lm_dtype QT> static void lm_sg_launch(lm_cuda *c, const lm_sgemv_args *s, unsigned grid, int threads,
                                                       size_t smem, int kind) {
    if constexpr (T <= 4) {
        if (kind == LM_SG_ADD) {
            lm_cuda_launch_pdl(c, lm_sgemv_kernel<T, QT, LM_SG_ADD>, grid, threads, smem, *s);
            LM_CUDA_LAUNCHED("qgemv staged add");
            return;
        }
        if (kind == LM_SG_GLU) {
            lm_cuda_launch_pdl(c, lm_sgemv_kernel<T, QT, LM_SG_GLU>, grid, threads, smem, *s);
            LM_CUDA_LAUNCHED("qgemv staged glu");
            return;
        }
    }
    LM_ASSERT(kind == LM_SG_PLAIN);
    lm_cuda_launch_pdl(c, lm_sgemv_kernel<T, QT, LM_SG_PLAIN>, grid, threads, smem, *s);
    LM_CUDA_LAUNCHED("qgemv staged");
}

template <lm_dtype QT> static void lm_sg_launch_t(lm_cuda *c, int T, const lm_sgemv_args *s, unsigned grid,
                                                  int threads, size_t smem, int kind) {
    if (T == 1) lm_sg_launch<1, QT>(c, s, grid, threads, smem, kind);
    else if (T == 2) lm_sg_launch<2, QT>(c, s, grid, threads, smem, kind);
    else if (T <= 4) lm_sg_launch<4, QT>(c, s, grid, threads, smem, kind);
    else lm_sg_launch<8, QT>(c, s, grid, threads, smem, kind);
}

/* a (lm_qgemv_args0 + lm_gemv_add / lm_gemv_set_glu; lm_sgemv_takes) for
 * n_tok <= 8 tokens in mode LM_GEMV_STORE, ADD or GLU_SILU (the last two
 * for T <= 4). */
void lm_sgemv_run(lm_cuda *c, int n_tok, const lm_gemv_args *a, lm_dtype wt, int mode) {
    LM_ASSERT(n_tok >= 1 && n_tok <= 8);
    const int T = n_tok == 1 ? 1 : n_tok == 2 ? 2 : n_tok <= 4 ? 4 : 8;
    const int kind = mode == LM_GEMV_ADD ? LM_SG_ADD : mode == LM_GEMV_GLU_SILU ? LM_SG_GLU : LM_SG_PLAIN;
    LM_ASSERT(mode == LM_GEMV_STORE || T <= 4);
    const bool glu = kind == LM_SG_GLU;
    /* two blocks an SM (H200, 8B Q4_K_M shapes, T = 1: three were 25-45 %
     * slower on the 14,336-wide and 4,096-row ones, 5 % faster on 4,096 x
     * 4,096; one was slower on all but one), each with whole stages of
     * rows; the stages a block needs, no more, so that small matrices get
     * small blocks; and no more stages than leave room for the SM's other
     * block (three 32 KiB stages of 14,336-wide Q4_K rows left one: the
     * down projection in two waves) */
    int per_sm = 2;
    if (c->qstaged_blocks > 0) per_sm = c->qstaged_blocks;
    const size_t budget = c->qstaged_fill ? (size_t)LM_SG_SMEM : (size_t)(LM_SG_SM_SMEM / per_sm - 1024);
    lm_sg_plan p;
    int stage = c->qstaged_stage_kb > 0 ? c->qstaged_stage_kb * 1024 : LM_SG_STAGE;
    int inflight = c->qstaged_inflight_kb > 0 ? c->qstaged_inflight_kb * 1024 : LM_SG_INFLIGHT;
    if (!lm_sg_make_plan(wt, a->I, T, glu, LM_SG_MAXST, stage, inflight, budget, &p)) { /* x too wide for this stage */
        stage = LM_SG_STAGE_MIN, inflight = LM_SG_INFLIGHT;
        LM_ASSERT(lm_sg_make_plan(wt, a->I, T, glu, LM_SG_MAXST, stage, inflight, budget, &p));
    }
    lm_sgemv_args s;
    memset(&s, 0, sizeof s); /* every byte set: a graph pass hashes them */
    int64_t total = 0;
    int n = 0;
    for (int m = 0; m < (glu ? 1 : LM_GEMV_MAXM); m++)
        if (a->O[m] > 0) total += a->O[m], n = m + 1;
    LM_ASSERT(n >= 1 && total > 0);
    const int64_t target = (int64_t)LM_MAX(c->n_sms, 1) * per_sm;
    const int64_t rpb = LM_MAX((int64_t)1, (total + target - 1) / target); /* a block's last stage may be partial */
    const int64_t stages = (rpb + p.rs - 1) / p.rs;
    if (stages < p.nst) { /* fewer, evener stages: less shared memory, more blocks an SM */
        const int rs = (int)((rpb + stages - 1) / stages);
        LM_ASSERT(lm_sg_make_plan(wt, a->I, T, glu, (int)stages, stage, inflight, budget, &p));
        p.rs = rs; /* no more rows a stage than planned: the stage buffers still fit */
    }
    s.first_block[0] = 0;
    for (int m = 0; m < LM_GEMV_MAXM; m++) {
        const int64_t O = m < n ? a->O[m] : 0;
        s.w[m] = a->w[m], s.bias[m] = a->bias[m], s.y[m] = a->y[m], s.O[m] = O;
        s.first_block[m + 1] = s.first_block[m] + (int)((O + rpb - 1) / rpb);
    }
    if (glu) s.w[1] = a->w[1];
    s.x = a->x;
    s.I = (int)a->I, s.n_tok = n_tok, s.U = p.U, s.rs = p.rs, s.rpb = (int)rpb;
    s.nst = p.nst, s.row_bytes = p.row_bytes, s.stage_bytes = p.stage_bytes;
    s.off_bar = p.off_bar, s.off_xq = p.off_xq, s.off_dx = p.off_dx, s.off_sx = p.off_sx;
    const unsigned grid = (unsigned)s.first_block[LM_GEMV_MAXM];
    if (wt == LM_Q4_K) lm_sg_launch_t<LM_Q4_K>(c, T, &s, grid, LM_SG_THREADS, p.smem, kind);
    else lm_sg_launch_t<LM_Q6_K>(c, T, &s, grid, LM_SG_THREADS, p.smem, kind);
}
