/* cuda_attention_combine.h - the warp reductions and the merge of split
 * partials that the decode kernels (cuda_attention.cu,
 * cuda_attention_decode_tc.cu) share: each kernel's last split to finish
 * merges its heads in place, saving a launch. */
#ifndef LUMEN_CUDA_ATTENTION_COMBINE_H
#define LUMEN_CUDA_ATTENTION_COMBINE_H

#include "cuda_attention.h"

static __device__ __forceinline__ float att_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(ATT_FULL, x, o));
    return x;
}

static __device__ __forceinline__ float att_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATT_FULL, x, o);
    return x;
}

/* Merges the ns splits of heads h0 .. h0 + G - 1 (G <= ATT_COMB_HEADS) of
 * token t into out, with the whole block. First each head's split weights
 * e^{m_s - M} and 1 / L, one warp a head, a lane a split (warp max and a
 * fixed-order warp sum, into shared memory); then the columns, a thread
 * ATT_COMB_COLS of them with ATT_COMB_SPLITS splits' loads in flight, each
 * summed over the splits in split order. The bits depend on neither G nor
 * the block size. A split that saw no key of the row has m = -inf and l = 0
 * and weighs nothing. Partials are read through L2: in the decode kernel
 * other blocks wrote them during the same launch. Latency is what this
 * costs (a few KB), hence the batched loads. */
#define ATT_COMB_HEADS 8
#define ATT_COMB_COLS 4
#define ATT_COMB_SPLITS 8
static __device__ void att_combine_heads(float *out, int64_t out_ld, const float *pm, const float *pl, const float *pacc,
                                  int H, int Dh, int ns, int t, int h0, int G) {
    __shared__ float f[ATT_COMB_HEADS][ATT_MAX_SPLITS], inv[ATT_COMB_HEADS];
    const int lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    for (int i = threadIdx.x >> 5; i < G; i += n_warps) {
        const int64_t base = ((int64_t)t * H + h0 + i) * ns;
        float ms[ATT_MAX_SPLITS / 32], ls[ATT_MAX_SPLITS / 32], M = -INFINITY;
#pragma unroll
        for (int k = 0; k < ATT_MAX_SPLITS / 32; k++) {
            const int s = lane + 32 * k;
            ms[k] = s < ns ? __ldcg(pm + base + s) : -INFINITY;
            ls[k] = s < ns ? __ldcg(pl + base + s) : 0.0f;
            M = fmaxf(M, ms[k]);
        }
        M = att_warp_max(M);
        float L = 0.0f;
#pragma unroll
        for (int k = 0; k < ATT_MAX_SPLITS / 32; k++) {
            const float fk = ms[k] != -INFINITY ? expf(ms[k] - M) : 0.0f;
            if (lane + 32 * k < ns) f[i][lane + 32 * k] = fk;
            L += ls[k] * fk;
        }
        L = att_warp_sum(L);
        if (lane == 0) inv[i] = 1.0f / L;
    }
    __syncthreads();
    const int n = G * Dh;
    for (int e0 = threadIdx.x; e0 < n; e0 += ATT_COMB_COLS * blockDim.x) {
        float x[ATT_COMB_COLS];
        const float *pa[ATT_COMB_COLS];
#pragma unroll
        for (int j = 0; j < ATT_COMB_COLS; j++) {
            const int e = min(e0 + j * (int)blockDim.x, n - 1);
            x[j] = 0.0f;
            pa[j] = pacc + (((int64_t)t * H + h0 + e / Dh) * ns) * Dh + e % Dh;
        }
        for (int s0 = 0; s0 < ns; s0 += ATT_COMB_SPLITS) {
            float v[ATT_COMB_COLS][ATT_COMB_SPLITS];
#pragma unroll
            for (int j = 0; j < ATT_COMB_COLS; j++)
#pragma unroll
                for (int k = 0; k < ATT_COMB_SPLITS; k++)
                    v[j][k] = s0 + k < ns ? __ldcg(pa[j] + (int64_t)(s0 + k) * Dh) : 0.0f;
#pragma unroll
            for (int j = 0; j < ATT_COMB_COLS; j++) {
                const int i = min(e0 + j * (int)blockDim.x, n - 1) / Dh;
#pragma unroll
                for (int k = 0; k < ATT_COMB_SPLITS; k++)
                    if (s0 + k < ns) x[j] += v[j][k] * f[i][s0 + k];
            }
        }
#pragma unroll
        for (int j = 0; j < ATT_COMB_COLS; j++) {
            const int e = e0 + j * (int)blockDim.x;
            if (e < n) out[(int64_t)t * out_ld + (int64_t)(h0 + e / Dh) * Dh + e % Dh] = x[j] * inv[e / Dh];
        }
    }
}

/* The end of a decode block (both decode kernels): column d of head h0 + i
 * from the block's nw warps' online-softmax states (m and l at
 * sm[w * ms + i] and sl[w * ms + i], the accumulator at
 * acc[w * as + i * Dh + d]), written to out (one split) or as the split's
 * partials; then the last split of (t, blockIdx.y) to finish merges the
 * group's heads, which saves the combine kernel's launch. */
static __device__ __forceinline__ void att_decode_finish(const att_args &a, int t, int z, int h0, int G, int Dh, int nw,
                                                         const float *sm, const float *sl, int ms, const float *acc,
                                                         int64_t as) {
    for (int e = threadIdx.x; e < G * Dh; e += blockDim.x) {
        const int i = e / Dh, d = e % Dh, h = h0 + i;
        float M = -INFINITY, L = 0.0f, x = 0.0f;
        for (int w = 0; w < nw; w++) M = fmaxf(M, sm[w * ms + i]);
        for (int w = 0; w < nw; w++) {
            if (sm[w * ms + i] == -INFINITY) continue; /* a warp that saw no key */
            const float f = expf(sm[w * ms + i] - M);
            L += sl[w * ms + i] * f;
            x += acc[w * as + (int64_t)i * Dh + d] * f;
        }
        if (a.n_splits == 1) {
            a.out[(int64_t)t * a.out_ld + (int64_t)h * Dh + d] = x / L;
        } else {
            const int64_t idx = ((int64_t)t * a.H + h) * a.n_splits + z;
            if (d == 0) a.pm[idx] = M, a.pl[idx] = L;
            a.pacc[idx * Dh + d] = x;
        }
    }
    if (a.n_splits == 1 || !a.cnt || !lm_last_block(a.cnt + (int64_t)t * gridDim.y + blockIdx.y, a.n_splits)) return;
    att_combine_heads(a.out, a.out_ld, a.pm, a.pl, a.pacc, a.H, Dh, a.n_splits, t, h0, G);
}

#endif
