/* cuda_qgemv_cs.cu - the quantised GEMV for one or two tokens with int8
 * activations, column-stationary: each thread owns one or two slices of
 * the row (cuda_quant.h) and walks many rows, so the activations are read
 * and rounded to int8 once a block, not once every four rows.
 *
 * Why. cuda_qgemv.cu's blocks own 4 rows and read the whole f32 x each: for
 * Q4_K (0.56 bytes a weight) that is 7 x bytes from L2 for every weight
 * byte from memory, and its 4,096-row matrices ran at 33-49 % of the copy
 * rate (ncu, H200, 2026-12-02). Here a block owns LM_QCS rows (16 by
 * default, LUMEN_CUDA_QGEMV_ROWS), so x costs a quarter of the weights'
 * bytes, and each thread keeps its slices' x in registers as int8 (one
 * scale a slice, lm_q_quant_x) for all of them.
 *
 * Layout: threads = the row's slices / S rounded up to a warp (S = 1, or 2
 * above 512 slices; at most 512 threads, so rows up to 1,024 slices: 32k
 * Q4_K values, 16k Q8_0). A thread loads its slices of LM_QCS_U / S rows
 * (weights only: issued before griddepcontrol.wait), then sums each row
 * with dp4a (lm_q_dot_i8), reduces it across its warp with shuffles and
 * leaves the warp's sum in shared memory; after the last row the block sums
 * the warps in order. A row's sum therefore does not depend on the rows
 * beside it, the block's row count or the matrices launched with it:
 * matmul_n, the fused add and the GLU form give the composed ops' bits.
 *
 * Modes as cuda_qgemv.cu (plain with bias, y +=, silu(gate) * up), and
 * y += with the next RMSNorm in the last block to finish (as the bf16
 * GEMV's ADD_NORM: one launch fewer a norm); MoE pairs and more than two
 * tokens stay in cuda_qgemv.cu. */
#include "cuda_quant.h"

#define LM_QCS_MAX_THREADS 512
#define LM_QCS_U 8         /* slice loads a thread issues before the first sum */
#define LM_QCS_MAX_ROWS 64 /* weight rows a block (GLU: gate + up) */

enum { LM_QCS_PLAIN = 0, LM_QCS_ADD, LM_QCS_GLU, LM_QCS_ADD_NORM };

template <int T, lm_dtype QT, int KIND, int S>
__global__ void __launch_bounds__(LM_QCS_MAX_THREADS) lm_qcs_kernel(const lm_gemv_args a) {
    using Q = lm_q<QT>;
    constexpr bool GLU = KIND == LM_QCS_GLU;
    /* rows a trip: LM_QCS_U slices in flight, half for the wide raw forms
     * (Q5_K, Q6_K: 40-52 bytes of registers a slice), which spilled at 8
     * under the 128-register bound (ptxas -v, sm_90) */
    constexpr int U = (sizeof(typename Q::raw) <= 32 ? LM_QCS_U : LM_QCS_U / 2) / S;
    lm_pdl_trigger();
    int m = 0;
    if constexpr (!GLU)
        while (m + 1 < LM_GEMV_MAXM && (int64_t)blockIdx.x >= a.first_block[m + 1]) m++;
    const int64_t I = a.I, O = a.O[m];
    const int out_rows = GLU ? a.rows / 2 : a.rows;
    const int64_t o0 = ((int64_t)blockIdx.x - a.first_block[m]) * out_rows;
    const int nout = (int)LM_MIN((int64_t)out_rows, O - o0);
    const int nrow = GLU ? 2 * nout : nout; /* weight rows: GLU's gate rows, then its up rows */
    const size_t ldw = (size_t)(I / Q::BV) * Q::BB;
    const int64_t n_slices = I / Q::BV * Q::LPB;
    const int n_tok = a.n_tok > 0 ? a.n_tok : T;
    auto row_ptr = [&](int i) -> const unsigned char * {
        if constexpr (GLU) return (i < nout ? a.w[0] + (size_t)(o0 + i) * ldw : a.w[1] + (size_t)(o0 + i - nout) * ldw);
        else return a.w[m] + (size_t)(o0 + i) * ldw;
    };
    int64_t ks[S];
    bool own[S];
#pragma unroll
    for (int s = 0; s < S; s++) {
        ks[s] = threadIdx.x + (int64_t)s * blockDim.x;
        own[s] = ks[s] < n_slices;
        if (!own[s]) ks[s] = 0; /* read, never summed */
    }
    using raw = typename Q::raw;
    auto load = [&](raw (&v)[U][S], int r0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const unsigned char *wr = row_ptr(LM_MIN(r0 + u, nrow - 1));
#pragma unroll
            for (int s = 0; s < S; s++) v[u][s] = Q::slice(wr + (size_t)(ks[s] / Q::LPB) * Q::BB, (int)(ks[s] % Q::LPB));
        }
    };
    raw v[U][S];
    load(v, 0); /* weights before the wait: they do not depend on the kernel before */
    lm_pdl_wait();
    lm_q_x8<Q> x8[T][S];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int s = 0; s < S; s++)
            x8[t][s] = lm_q_quant_x<Q>(a.x + (size_t)LM_MIN(t, n_tok - 1) * I + ks[s] / Q::LPB * Q::BV,
                                       (int)(ks[s] % Q::LPB));

    __shared__ float part[LM_QCS_MAX_THREADS / 32][LM_QCS_MAX_ROWS][T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    for (int r0 = 0; r0 < nrow; r0 += U) {
        if (r0 > 0) load(v, r0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (r0 + u >= nrow) continue; /* the same for the whole block */
#pragma unroll
            for (int t = 0; t < T; t++) {
                float acc = 0.0f;
#pragma unroll
                for (int s = 0; s < S; s++)
                    if (own[s]) acc = lm_q_dot_i8<Q>(v[u][s], x8[t][s], acc);
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
                if (lane == 0) part[warp][r0 + u][t] = acc;
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nout * T; i += blockDim.x) {
        const int r = i / T, t = i % T;
        if (t >= n_tok) continue;
        float s = 0.0f;
        for (int w = 0; w < n_warps; w++) s += part[w][r][t];
        float *yo = a.y[m] + (size_t)t * O + o0 + r;
        if constexpr (GLU) {
            float u = 0.0f;
            for (int w = 0; w < n_warps; w++) u += part[w][nout + r][t];
            *yo = lm_silu_mul1(s, u); /* the silu_mul op's arithmetic */
        } else if constexpr (KIND == LM_QCS_ADD || KIND == LM_QCS_ADD_NORM) {
            *yo += s;
        } else {
            *yo = s + (a.bias[m] ? a.bias[m][o0 + r] : 0.0f);
        }
    }
    if constexpr (KIND == LM_QCS_ADD_NORM) { /* the last block norms the finished rows (the rms_norm op's bits) */
        if (!lm_last_block(a.counter, (int)gridDim.x)) return;
        for (int t = 0; t < n_tok; t++)
            lm_norm_row_op(a.norm_y + (size_t)t * O, a.y[0] + (size_t)t * O, a.norm_w, O, a.eps, a.w_offset);
    }
}

template <int T, lm_dtype QT, int S> static void lm_qcs_launch(lm_cuda *c, const lm_gemv_args *a, int kind, int threads) {
    const int64_t blocks = a->first_block[LM_GEMV_MAXM];
    LM_ASSERT(blocks > 0 && blocks <= 0x7fffffff);
    switch (kind) {
    case LM_QCS_ADD: lm_cuda_launch_pdl(c, lm_qcs_kernel<T, QT, LM_QCS_ADD, S>, (unsigned)blocks, threads, 0, *a); break;
    case LM_QCS_GLU: lm_cuda_launch_pdl(c, lm_qcs_kernel<T, QT, LM_QCS_GLU, S>, (unsigned)blocks, threads, 0, *a); break;
    case LM_QCS_ADD_NORM:
        lm_cuda_launch_pdl(c, lm_qcs_kernel<T, QT, LM_QCS_ADD_NORM, S>, (unsigned)blocks, threads, 0, *a);
        break;
    default: lm_cuda_launch_pdl(c, lm_qcs_kernel<T, QT, LM_QCS_PLAIN, S>, (unsigned)blocks, threads, 0, *a);
    }
    LM_CUDA_LAUNCHED("qgemv cs");
}

template <lm_dtype QT> static bool lm_qcs_type(lm_cuda *c, int T, const lm_gemv_args *a, int kind) {
    using Q = lm_q<QT>;
    const int64_t n_slices = a->I / Q::BV * Q::LPB;
    const int S = n_slices <= LM_QCS_MAX_THREADS ? 1 : 2;
    if (n_slices > 2 * LM_QCS_MAX_THREADS) return false;
    const int threads = (int)((n_slices + S - 1) / S + 31) / 32 * 32;
    if (S == 1) T == 1 ? lm_qcs_launch<1, QT, 1>(c, a, kind, threads) : lm_qcs_launch<2, QT, 1>(c, a, kind, threads);
    else T == 1 ? lm_qcs_launch<1, QT, 2>(c, a, kind, threads) : lm_qcs_launch<2, QT, 2>(c, a, kind, threads);
    return true;
}

/* Runs a (whose first_block counts lm_qcs_rows(c) rows a block) for T <= 2
 * tokens in mode LM_GEMV_STORE, LM_GEMV_ADD, LM_GEMV_ADD_NORM (a's norm
 * fields and counter set) or LM_GEMV_GLU_SILU, every
 * matrix of type wt; false (nothing launched) when this kernel does not
 * take the type or the row length. */
bool lm_qcs_run(lm_cuda *c, int T, const lm_gemv_args *a, lm_dtype wt, int mode) {
    if (T < 1 || T > 2) return false;
    const int kind = mode == LM_GEMV_ADD        ? LM_QCS_ADD
                     : mode == LM_GEMV_ADD_NORM ? LM_QCS_ADD_NORM
                     : mode == LM_GEMV_GLU_SILU ? LM_QCS_GLU
                                                : LM_QCS_PLAIN;
    switch (wt) {
    case LM_Q8_0: return lm_qcs_type<LM_Q8_0>(c, T, a, kind);
    case LM_Q4_0: return lm_qcs_type<LM_Q4_0>(c, T, a, kind);
    case LM_Q4_K: return lm_qcs_type<LM_Q4_K>(c, T, a, kind);
    case LM_Q5_K: return lm_qcs_type<LM_Q5_K>(c, T, a, kind);
    case LM_Q6_K: return lm_qcs_type<LM_Q6_K>(c, T, a, kind);
    case LM_IQ4_XS: return lm_qcs_type<LM_IQ4_XS>(c, T, a, kind);
    default: return false;
    }
}

/* Whether lm_qcs_run takes T tokens of rows of I values of type wt. */
bool lm_qcs_takes(const lm_cuda *c, int64_t T, lm_dtype wt, int64_t I) {
    if (c->quant_exact || c->qgemv_rows <= 0 || T < 1 || T > 2) return false;
    if (wt != LM_Q8_0 && wt != LM_Q4_0 && wt != LM_Q4_K && wt != LM_Q5_K && wt != LM_Q6_K && wt != LM_IQ4_XS)
        return false;
    const int64_t blk = lm_dtype_block(wt), lpb = blk == 32 ? 2 : 8;
    return I % blk == 0 && I / blk * lpb <= 2 * LM_QCS_MAX_THREADS;
}
