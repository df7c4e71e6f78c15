/* cuda_gemv.cu - y[T][O] = x[T][I] W[O][I]^T (+ bias) on the GPU for
 * few tokens, with its fused forms (several matrices sharing x, gate/up
 * with the activation, the residual add with the next norm) and the MoE
 * experts' GEMVs; cuda_matmul.cu picks it. x and y are f32; W is bf16, f16
 * or f32 in its stored layout [O][I].
 *
 * Small T (decode, T <= LM_GEMV_MAX_T): a hand-written GEMV that streams the
 * weight once for all T tokens. A block of up to 256 threads owns R
 * consecutive output rows (lm_gemv_rows: 8 at T = 1, 3 and 4, else 4); its threads
 * stride together along the inner dimension in 16-byte chunks (8 bf16/f16 or
 * 4 f32 per chunk), so each warp-wide load is 512 contiguous bytes of one row
 * (fully coalesced) and the R rows give R independent loads per step; the
 * loop takes two steps at a time, so a thread has 2R x 16 B in flight before
 * it waits.
 * Weight loads use the evict-first cache hint (__ldcs): they are read once
 * and should not push x out of L2. Each weight chunk is widened to f32 once
 * and used for all T tokens; x (small and shared by every block: L1/L2
 * hits) takes plain loads, not the read-only path: under PDL the kernel
 * is alive while the kernel before writes x, which that path does not
 * allow, and ptxas moved such loads above the PDL wait (SASS on the H200;
 * the demo hybrid's graph replays then gave other logits than eager runs).
 * Plain loads stay after the wait and see the writes it waited for
 * (cuda_sources_no_readonly_loads keeps the path out of this directory).
 * f32 accumulation, then a warp-shuffle reduction (lm_warp_sums_store: the
 * R x T sums split over the lanes, the bits of a butterfly each) and one
 * pass over shared memory across warps. A row's bits do not depend on T or
 * R: the same chunks a thread, the same order, the same trees. Rows
 * that are not 16-byte aligned (I not a multiple of the chunk, or a view at
 * an odd offset) take the same kernel with element-wise loads.
 *
 * Roofline (per call): bytes = O*I*sizeof(W) + T*I*4 (x) + T*O*4 (y)
 * (+ O*4 bias); flops = 2*T*O*I. For bf16 [4096][4096] at T = 1 that is
 * 33.6 MB: 7.0 us at the H200's 4.8 TB/s, ~8 us at a realistic ~4.2 TB/s
 * copy rate; [14336][4096] is 117 MB (~28 us), the [128256][4096] output
 * head 1.05 GB (~250 us). At T = 8 the kernel does 8 FMAs per 2 weight
 * bytes: 19 TFMA/s at full bandwidth, ~60% of the f32 FMA peak, which is why
 * GEMV stops at T = 8 and cuBLAS takes over. With bf16 activations (or
 * LUMEN_CUDA_GEMV_TC=1) the GEMVs of 5-8 tokens over bf16 rows run the
 * FMAs on tensor cores instead (16-row blocks, see TC in lm_gemv_kernel). */
#include "cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define LM_GEMV_THREADS 256 /* 128 measured 12 % slower on a Llama-8B decode step (H200) */
/* Output rows per block: 8 for one token (16 loads of 16 bytes in
 * flight per thread, so that enough bytes are in flight to cover the memory
 * latency), 4 above (the accumulators of more tokens take the registers:
 * 8 rows spill at T = 2), except 8 at 3 and 4 tokens (WIDE): x is read once
 * a block, so 8 rows halve its L1 traffic (at 4 tokens its f32 values are
 * twice the weights' bytes at 4 rows); the chunks are widened and used a
 * quarter at a time and loaded one a trip to fit 128 registers. H100, bf16
 * Llama-8B shapes at T = 4, % of the copy rate: 80-103 against 72-101 at 4
 * rows; decode at batch 4 within 1 % (648.2 against 640.3 tok/s). At 5-8
 * tokens 6 rows spilled and lost (45-60 % against 57-73 at T = 8). */
__host__ __device__ constexpr bool lm_gemv_wide(int T) { return T == 3 || T == 4; }
__host__ __device__ constexpr int lm_gemv_rows(int T, bool tc = false) {
    return tc ? 16 : T == 1 || lm_gemv_wide(T) ? 8 : 4;
}
/* Fewest tokens for tensor-core tiles (lm_gemv_tc): Llama-8B shape on the
 * H200, batch 1 / 2 / 4 / 8 decode 169 / 319 / 629 / 1,169 tok/s on tiles
 * against 240 / 396 / 668 / 842 on CUDA cores. */
#define LM_GEMV_TC_MIN_T 5
static_assert(LM_NORM_VT % LM_GEMV_THREADS == 0, "the fused norm runs on the GEMV's block");

/* ---- GEMV ------------------------------------------------------------------------ */

template <lm_dtype WT> struct lm_wt;
template <> struct lm_wt<LM_BF16> { static constexpr int bytes = 2; };
template <> struct lm_wt<LM_F16> { static constexpr int bytes = 2; };
template <> struct lm_wt<LM_F32> { static constexpr int bytes = 4; };

/* Quarter q of 16 bytes of weights (its 32-bit word q) -> its 4 / sizeof(W) floats. */
template <lm_dtype WT> __device__ __forceinline__ void lm_widen4(const uint4 v, int q, float *f) {
    const unsigned u = q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
    if constexpr (WT == LM_BF16) {
        f[0] = __uint_as_float(u << 16);
        f[1] = __uint_as_float(u & 0xffff0000u);
    } else if constexpr (WT == LM_F16) {
        __half2 hh;
        memcpy(&hh, &u, sizeof hh);
        const float2 ff = __half22float2(hh);
        f[0] = ff.x;
        f[1] = ff.y;
    } else {
        f[0] = __uint_as_float(u);
    }
}

/* 16 bytes of weights -> 16 / sizeof(W) floats. */
template <lm_dtype WT> __device__ __forceinline__ void lm_widen16(const uint4 v, float *f) {
    const unsigned u[4] = { v.x, v.y, v.z, v.w };
    if constexpr (WT == LM_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    } else if constexpr (WT == LM_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h;
            memcpy(&h, &u[i], sizeof h);
            float2 ff = __half22float2(h);
            f[2 * i] = ff.x;
            f[2 * i + 1] = ff.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) f[i] = __uint_as_float(u[i]);
    }
}

/* N (a multiple of 4, 2 or 1) of x's values at xp, rounded to bf16 with
 * bf16 activations over bf16 weights (a.x_bf16). Plain loads (the file's
 * head says why). */
template <lm_dtype WT, int N>
__device__ __forceinline__ void lm_load_x(const float *xp, float *xv, const lm_gemv_args &a) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int j = 0; j < N; j += 4) {
            const float4 q = *(const float4 *)(xp + j);
            xv[j] = q.x, xv[j + 1] = q.y, xv[j + 2] = q.z, xv[j + 3] = q.w;
        }
    } else if constexpr (N == 2) {
        const float2 q = *(const float2 *)xp;
        xv[0] = q.x, xv[1] = q.y;
    } else {
        static_assert(N == 1, "4k, 2 or 1 values");
        xv[0] = *xp;
    }
    if constexpr (WT == LM_BF16) {
        if (a.x_bf16) {
#pragma unroll
            for (int j = 0; j < N; j++) xv[j] = __bfloat162float(__float2bfloat16_rn(xv[j]));
        }
    }
}

/* One weight element -> float (the unaligned path). */
template <lm_dtype WT> __device__ __forceinline__ float lm_widen1(const unsigned char *row, int64_t k) {
    if constexpr (WT == LM_BF16) {
        unsigned short h = __ldcs((const unsigned short *)row + k);
        return __uint_as_float((unsigned)h << 16);
    } else if constexpr (WT == LM_F16) {
        unsigned short h = __ldcs((const unsigned short *)row + k);
        return __half2float(__ushort_as_half(h));
    } else {
        return __ldcs((const float *)row + k);
    }
}

enum { LM_MOE_NONE = 0, LM_MOE_PAIRS, LM_MOE_GROUPS };

/* The activations of the glu modes: the element-wise kernels' own
 * (cuda_internal.h), so fused and unfused agree. */
template <int MODE> __device__ __forceinline__ float lm_glu_act(float g, float u) {
    if constexpr (MODE == LM_GEMV_GLU_SILU) return lm_silu_mul1(g, u);
    else return lm_gelu_mul1(g, u, MODE == LM_GEMV_GLU_GELU_TANH);
}

/* VEC: chunks of 16 bytes (rows and x rows 16-byte aligned); else chunks of
 * one element. Chunk k covers elements [k*EPC, (k+1)*EPC). Each output row's
 * dot product is computed the same way whichever rows share its block, so a
 * fused launch gives the bits of the separate ones. */
/* Two blocks per SM (<= 128 registers): at T >= 5 the compiler would take
 * ~150 and leave one block of 8 warps per SM, too few loads in flight. T = 7
 * would spill at 128 and keeps the compiler's choice. */
template <int T, lm_dtype WT, bool VEC, int MODE, int MOE = LM_MOE_NONE, bool TC = false>
__global__ void __launch_bounds__(LM_GEMV_THREADS, (T == 7 && !TC ? 1 : 2)) lm_gemv_kernel(const lm_gemv_args a) {
    constexpr int R = lm_gemv_rows(T, TC);
    constexpr bool WIDE = !TC && lm_gemv_wide(T);
    static_assert(!WIDE || MOE == LM_MOE_NONE, "the experts' GEMVs take 1 or LM_MOE_CHUNK tokens");
    constexpr bool GLU = MODE >= LM_GEMV_GLU_SILU;
    static_assert(MOE != LM_MOE_PAIRS || (T == 1 && (MODE == LM_GEMV_STORE || GLU)), "MoE pairs are single rows");
    static_assert(MOE != LM_MOE_GROUPS || (VEC && (MODE == LM_GEMV_STORE || GLU)), "MoE groups: 16-byte chunks");
    static_assert(!TC || (WT == LM_BF16 && VEC && !MOE && T <= 8), "tensor-core tiles: bf16 rows, up to 8 tokens");
    lm_pdl_trigger();
    /* launched early (PDL): weights are constant and may be fetched at once;
     * x (and y) only after the kernels before have finished */
    bool waited = false;
    auto sync_in = [&]() {
        if (!waited) lm_pdl_wait();
        waited = true;
    };
    constexpr int EPC = VEC ? 16 / lm_wt<WT>::bytes : 1;
    const int64_t I = a.I;
    const float *x = MOE == LM_MOE_PAIRS ? a.x + (size_t)(GLU ? blockIdx.y / a.moe_k : blockIdx.y) * I : a.x;
    const int64_t n_chunks = I / EPC;
    int m = 0;
    if constexpr (!GLU)
        while (m + 1 < LM_GEMV_MAXM && (int64_t)blockIdx.x >= a.first_block[m + 1]) m++;
    const int64_t O = a.O[m];
    /* row groups a block takes one after another (MoE groups: the chunk's
     * setup, three dependent loads, is paid once for RB of them) */
    constexpr int RB = MOE == LM_MOE_GROUPS ? LM_MOE_ROW_GROUPS : 1, RG = GLU ? R / 2 : R;
    const int64_t o_first = ((int64_t)blockIdx.x - a.first_block[m]) * RB * RG;
    const size_t ldw = (size_t)I * lm_wt<WT>::bytes;
    const unsigned char *w0 = a.w[GLU ? 0 : m], *w1 = a.w[1];
    if constexpr (MOE == LM_MOE_PAIRS) { /* the routing is the kernel before's output: wait for it, then fetch */
        sync_in();
        w0 = a.moe_w[blockIdx.y];
        if constexpr (GLU) w1 = a.moe_w[a.moe_E + blockIdx.y];
    }
    /* MoE groups: the chunk's expert, first row and token count (n_tok),
     * and each token's x row (past n_tok: the last token's, never read: the
     * FMAs, reductions and stores stop at n_tok) */
    int64_t r0 = 0;
    int n_tok = T;
    const float *xrow[MOE == LM_MOE_GROUPS ? T : 1];
    if constexpr (MOE == LM_MOE_GROUPS) {
        sync_in();
        const int32_t *ch = a.moe_chunk + 3 * (size_t)blockIdx.y;
        n_tok = ch[2];
        if (n_tok == 0) return; /* an unused slot: the whole block */
        const int e = ch[0];
        r0 = ch[1];
        w0 = a.moe_w[e];
        if constexpr (GLU) w1 = a.moe_w[a.moe_E + e];
#pragma unroll
        for (int t = 0; t < T; t++) {
            const int64_t g = r0 + LM_MIN(t, n_tok - 1);
            xrow[t] = a.x + (size_t)(a.moe_src ? a.moe_src[g] : g) * I;
        }
    }
    /* Tensor cores (TC): the block's 16 rows are one m16 tile against the
     * tokens as one n8 tile (mma m16n8k16, bf16 in, f32 accumulation). x is
     * split into three bf16 terms (hi, mid, lo as lm_split_bf16_kernel) and
     * the tile multiplied by each, so products are exact and the sum is f32
     * as on CUDA cores (not the same bits: opt-in, lm_gemv_tc); with bf16
     * activations (a.x_bf16) hi alone, one mma.
     * Warp w takes a contiguous run of 32-element chunks; lane (g, c) =
     * (lane / 4, lane % 4) loads 16 bytes of tile rows g and g + 8 at
     * element 8c of the chunk and token g's 8 x values there. The mma's k
     * slots are a permutation of the chunk's elements, the same for W and x,
     * so the dot product is unchanged: elements 8c..8c+3 fill slots {2c,
     * 2c+1, 2c+8, 2c+9} of the first k16 step, 8c+4..8c+7 those of the
     * second. The tensor cores idle while the loads stream, where 8 tokens
     * take 8 f32 FMAs a weight on CUDA cores (Llama-8B batch 8: 1,147 tok/s
     * against 845 on the H200). */
    for (int rg = 0; rg < RB; rg++) {
        const int64_t o0 = o_first + (int64_t)rg * RG;
        if (RB > 1 && o0 >= O) break; /* block-uniform */
        __shared__ float part[LM_GEMV_THREADS / 32][R * T];
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
        if constexpr (TC) {
            const int g = lane >> 2, c = lane & 3;
            /* tile rows g and g + 8 (GLU: gate row g and up row g) */
            const unsigned char *pa = w0 + (size_t)LM_MIN(o0 + g, O - 1) * ldw;
            const unsigned char *pb = (GLU ? w1 : w0) + (size_t)LM_MIN(o0 + g + (GLU ? 0 : 8), O - 1) * ldw;
            const float *xr = x + (size_t)LM_MIN(g, T - 1) * I; /* token g (past T: zeros) */
            const int64_t n32 = (I + 31) / 32;
            float dt[3][4] = {}; /* one accumulator a term: three mma chains instead of one */
            auto mma = [&](float (&d)[4], const uint4 &va, const uint4 &vb, bool second, unsigned b0, unsigned b1) {
                const unsigned a0 = second ? va.z : va.x, a1 = second ? vb.z : vb.x;
                const unsigned a2 = second ? va.w : va.y, a3 = second ? vb.w : vb.y;
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            };
            auto pack = [](__nv_bfloat16 lo_k, __nv_bfloat16 hi_k) {
                return (unsigned)__bfloat16_as_ushort(lo_k) | ((unsigned)__bfloat16_as_ushort(hi_k) << 16);
            };
            auto step = [&](const uint4 &va, const uint4 &vb, int64_t kc) {
                const int64_t e = kc * 32 + c * 8;
                float xv[8];
                if (g < T && e < I) {
                    const float4 p = *(const float4 *)(xr + e), q = *(const float4 *)(xr + e + 4);
                    xv[0] = p.x, xv[1] = p.y, xv[2] = p.z, xv[3] = p.w, xv[4] = q.x, xv[5] = q.y, xv[6] = q.z, xv[7] = q.w;
                } else {
    #pragma unroll
                    for (int j = 0; j < 8; j++) xv[j] = 0.0f;
                }
                unsigned th[4], tm[4], tl[4]; /* pairs (2j, 2j + 1) of each term */
    #pragma unroll
                for (int j = 0; j < 4; j++) {
                    __nv_bfloat16 h[2], md[2], l[2];
    #pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const float v = xv[2 * j + u];
                        h[u] = __float2bfloat16_rn(v);
                        const float r = v - __bfloat162float(h[u]);
                        md[u] = __float2bfloat16_rn(r);
                        l[u] = __float2bfloat16_rn(r - __bfloat162float(md[u]));
                    }
                    th[j] = pack(h[0], h[1]), tm[j] = pack(md[0], md[1]), tl[j] = pack(l[0], l[1]);
                }
                if (!a.x_bf16) { /* bf16 activations: hi is x, the other terms zero */
                    mma(dt[0], va, vb, false, tl[0], tl[1]), mma(dt[1], va, vb, false, tm[0], tm[1]);
                    mma(dt[0], va, vb, true, tl[2], tl[3]), mma(dt[1], va, vb, true, tm[2], tm[3]);
                }
                mma(dt[2], va, vb, false, th[0], th[1]);
                mma(dt[2], va, vb, true, th[2], th[3]);
            };
            auto ld = [&](const unsigned char *p, int64_t kc) {
                const int64_t e = kc * 32 + c * 8;
                return e < I ? __ldcs((const uint4 *)(p + e * 2)) : make_uint4(0u, 0u, 0u, 0u); /* a partial last chunk */
            };
            constexpr int U = 8; /* chunks a warp has in flight: 2 x 8 loads of 16 bytes a lane */
            const int64_t per = (n32 + n_warps - 1) / n_warps, k_end = LM_MIN(n32, (warp + 1) * per);
            for (int64_t k0 = warp * per; k0 < k_end; k0 += U) {
                uint4 va[U], vb[U];
    #pragma unroll
                for (int u = 0; u < U; u++) {
                    const bool in = k0 + u < k_end;
                    va[u] = in ? ld(pa, k0 + u) : make_uint4(0u, 0u, 0u, 0u);
                    vb[u] = in ? ld(pb, k0 + u) : make_uint4(0u, 0u, 0u, 0u);
                }
                sync_in();
    #pragma unroll
                for (int u = 0; u < U; u++)
                    if (k0 + u < k_end) step(va[u], vb[u], k0 + u); /* warp-uniform */
            }
            sync_in(); /* before y is written (and read, in ADD mode) */
            float d[4]; /* small terms first */
    #pragma unroll
            for (int i = 0; i < 4; i++) d[i] = (dt[0][i] + dt[1][i]) + dt[2][i];
            const int t0 = 2 * c; /* d: rows g, g + 8 x tokens 2c, 2c + 1 */
            if (t0 < T) part[warp][g * T + t0] = d[0], part[warp][(g + 8) * T + t0] = d[2];
            if (t0 + 1 < T) part[warp][g * T + t0 + 1] = d[1], part[warp][(g + 8) * T + t0 + 1] = d[3];
        } else {
            const unsigned char *wr[R];
    #pragma unroll
            for (int r = 0; r < R; r++) { /* tail rows: read, not stored */
                if constexpr (GLU) wr[r] = (r < R / 2 ? w0 : w1) + (size_t)LM_MIN(o0 + r % (R / 2), O - 1) * ldw;
                else wr[r] = w0 + (size_t)LM_MIN(o0 + r, O - 1) * ldw;
            }

            float acc[R][T];
    #pragma unroll
            for (int r = 0; r < R; r++)
    #pragma unroll
                for (int t = 0; t < T; t++) acc[r][t] = 0.0f;

            /* chunk k of token t's x */
            auto load_x = [&](float (&xv)[EPC], int t, int64_t k) {
                const float *xp;
                if constexpr (MOE == LM_MOE_GROUPS) xp = xrow[t] + k * EPC;
                else xp = x + (size_t)t * I + k * EPC;
                lm_load_x<WT, EPC>(xp, xv, a);
            };
            /* acc += W[rows][chunk k] . x[t][chunk k] for every token */
            auto step = [&](const float (&wf)[R][EPC], int64_t k) {
    #pragma unroll
                for (int t = 0; t < T; t++) {
                    if (MOE == LM_MOE_GROUPS && t >= n_tok) break; /* a chunk's absent tokens: no work (block-uniform) */
                    float xv[EPC];
                    load_x(xv, t, k);
    #pragma unroll
                    for (int r = 0; r < R; r++)
    #pragma unroll
                        for (int j = 0; j < EPC; j++) acc[r][t] = fmaf(wf[r][j], xv[j], acc[r][t]);
                }
            };
            /* the same from raw 16-byte chunks: one or two tokens widen each row's
             * chunk as they use it (fewer live registers; the same FMAs in the same
             * order), more tokens widen all rows first and share them */
            auto step16 = [&](const uint4 (&v)[R], int64_t k) {
                if constexpr (T <= 2) {
                    float xv[T][EPC];
    #pragma unroll
                    for (int t = 0; t < T; t++) load_x(xv[t], t, k);
    #pragma unroll
                    for (int r = 0; r < R; r++) {
                        float wf[EPC];
                        lm_widen16<WT>(v[r], wf);
    #pragma unroll
                        for (int t = 0; t < T; t++)
    #pragma unroll
                            for (int j = 0; j < EPC; j++) acc[r][t] = fmaf(wf[j], xv[t][j], acc[r][t]);
                    }
                } else {
                    float wf[R][EPC];
    #pragma unroll
                    for (int r = 0; r < R; r++) lm_widen16<WT>(v[r], wf[r]);
                    step(wf, k);
                }
            };
            /* WIDE: each quarter of the chunk widened for all rows, then used
             * by every token (the FMAs of a (row, token) in the order above) */
            auto step16w = [&](const uint4 (&v)[R], int64_t k) {
                constexpr int E = EPC >= 4 ? EPC / 4 : 1; /* (1 too for the element-wise form, which never calls it) */
    #pragma unroll
                for (int q = 0; q < 4; q++) {
                    float wf[R][E];
    #pragma unroll
                    for (int r = 0; r < R; r++) lm_widen4<WT>(v[r], q, wf[r]);
    #pragma unroll
                    for (int t = 0; t < T; t++) {
                        float xv[E];
                        lm_load_x<WT, E>(x + (size_t)t * I + k * EPC + q * E, xv, a);
    #pragma unroll
                        for (int r = 0; r < R; r++)
    #pragma unroll
                            for (int j = 0; j < E; j++) acc[r][t] = fmaf(wf[r][j], xv[j], acc[r][t]);
                    }
                }
            };
            auto load16 = [&](uint4 (&v)[R], int64_t k) {
    #pragma unroll
                for (int r = 0; r < R; r++) v[r] = __ldcs((const uint4 *)wr[r] + k);
            };
            auto load1 = [&](float (&wf)[R][EPC], int64_t k) {
    #pragma unroll
                for (int r = 0; r < R; r++) wf[r][0] = lm_widen1<WT>(wr[r], k);
            };

            const int64_t stride = blockDim.x;
            int64_t k = threadIdx.x;
            if constexpr (WIDE && VEC) { /* a chunk a trip: R loads issued before the first FMA */
                for (; k < n_chunks; k += stride) {
                    uint4 va[R];
                    load16(va, k);
                    sync_in();
                    step16w(va, k);
                }
            } else {
                /* two chunks per trip: 2 * R loads issued before the first FMA */
                for (; k + stride < n_chunks; k += 2 * stride) {
                    if constexpr (VEC) {
                        uint4 va[R], vb[R];
                        load16(va, k);
                        load16(vb, k + stride);
                        sync_in();
                        step16(va, k);
                        step16(vb, k + stride);
                    } else {
                        float wa[R][EPC], wb[R][EPC];
                        load1(wa, k);
                        load1(wb, k + stride);
                        sync_in();
                        step(wa, k);
                        step(wb, k + stride);
                    }
                }
                if (k < n_chunks) {
                    if constexpr (VEC) {
                        uint4 va[R];
                        load16(va, k);
                        sync_in();
                        step16(va, k);
                    } else {
                        float wa[R][EPC];
                        load1(wa, k);
                        sync_in();
                        step(wa, k);
                    }
                }
            }
            sync_in(); /* before y is written (and read, in ADD mode) */

            /* reduce: within each warp by shuffles (the work split, the
             * bits of a butterfly per value), then across warps in shared
             * memory; a MoE chunk's absent tokens sum zeros, never stored */
            lm_warp_sums_store<R, T>(acc, part[warp], lane);
        }
        __syncthreads();
        constexpr int n_out = GLU ? R / 2 * T : R * T;
        for (int i = threadIdx.x; i < n_out; i += blockDim.x) {
            int r = i / T, t = i % T;
            int64_t o = o0 + r;
            if (o >= O || t >= n_tok) continue;
            float s = 0.0f;
            for (int wi = 0; wi < n_warps; wi++) s += part[wi][i];
            float *yo = (MOE == LM_MOE_PAIRS  ? a.y[0] + (size_t)blockIdx.y * O
                         : MOE == LM_MOE_GROUPS ? a.y[0] + (size_t)r0 * O
                                                : a.y[m]) +
                        (size_t)t * O + o;
            if constexpr (GLU) {
                float u = 0.0f;
                for (int wi = 0; wi < n_warps; wi++) u += part[wi][i + R / 2 * T];
                *yo = lm_glu_act<MODE>(s, u);
            } else if constexpr (MODE == LM_GEMV_ADD || MODE == LM_GEMV_ADD_NORM) {
                *yo += s;
            } else {
                *yo = s + (a.bias[m] ? a.bias[m][o] : 0.0f);
            }
        }
        if (RB > 1) __syncthreads(); /* the next row group rewrites part */
    }
    if constexpr (MODE == LM_GEMV_ADD_NORM) {
        if (!lm_last_block(a.counter, (int)gridDim.x)) return;
        for (int t = 0; t < T; t++) lm_norm_row_op(a.norm_y + (size_t)t * O, a.y[0] + (size_t)t * O, a.norm_w, O, a.eps, a.w_offset);
    }
}

template <int T, lm_dtype WT, bool VEC, int MODE, bool TC = false>
static void lm_gemv_go(lm_cuda *c, const lm_gemv_args *a, unsigned blocks, int threads) {
    lm_cuda_launch_pdl(c, lm_gemv_kernel<T, WT, VEC, MODE, LM_MOE_NONE, TC>, blocks, threads, 0, *a);
}

/* Threads of a GEMV block over rows of `chunks` chunks: the fewest, a power
 * of two from 32 to LM_GEMV_THREADS (the fused norm's block size must
 * divide LM_NORM_VT), that leave no thread more than c->gemv_chunks
 * (LM_GEMV_CHUNKS_MAX) chunks a row. Rows of 4,096 bf16 and wider keep 256
 * threads; narrower rows get fewer threads with more loads in flight each. The
 * Qwen3-30B-A3B shape (rows of 2,048 and 768) at batch 1 / 8 / 32 on the
 * H200, tok/s: a thread a chunk 273 / 717 / 888, at most 2 chunks 292 / 813
 * / 1,306 (one run); at most 2, 3 and 4 in another: 297 / 817 / 1,311,
 * 302 / 819 / 1,403 and 278 / 823 / 1,549 (the 4's 64 threads on rows of
 * 2,048 lost at batch 1). A row's bits depend on this count, which depends
 * on its width only, so every form of a GEMV (pairs, groups, plain) agrees. */
static int lm_gemv_threads(const lm_cuda *c, int64_t chunks) {
    int threads = 32;
    while (threads < LM_GEMV_THREADS && threads * (int64_t)c->gemv_chunks < chunks) threads *= 2;
    return threads;
}

/* Fused modes exist for 16-byte chunks of bf16/f16 weights only (the
 * callers fall back to separate ops otherwise): fewer kernels to build. */
template <int T, lm_dtype WT>
static void lm_gemv_launch(lm_cuda *c, const lm_gemv_args *a, int mode, bool vec) {
    const bool tc = a->rows == lm_gemv_rows(T, true); /* lm_gemv_args0 chose tensor-core tiles */
    const int threads = tc ? lm_gemv_threads(c, (a->I + 31) / 32 * 32) /* a warp a 32-element chunk */
                           : lm_gemv_threads(c, vec ? a->I / (16 / lm_wt<WT>::bytes) : a->I);
    int64_t blocks = a->first_block[LM_GEMV_MAXM];
    LM_ASSERT(blocks > 0 && blocks <= 0x7fffffff);
    const unsigned nb = (unsigned)blocks;
    if (c->skip) { /* LUMEN_CUDA_SKIP (timing only) */
        const bool several = a->first_block[1] < blocks, add = mode == LM_GEMV_ADD || mode == LM_GEMV_ADD_NORM;
        if ((mode == LM_GEMV_STORE && several && lm_cuda_skip(c, LM_SKIP_GEMV_N)) ||
            (mode >= LM_GEMV_GLU_SILU && lm_cuda_skip(c, LM_SKIP_GEMV_GLU)) ||
            (add && lm_cuda_skip(c, a->I > a->O[0] ? LM_SKIP_GEMV_DOWN : LM_SKIP_GEMV_ADD)))
            return;
        if (mode == LM_GEMV_ADD_NORM && lm_cuda_skip(c, LM_SKIP_NORM_TAIL)) mode = LM_GEMV_ADD;
    }
    if constexpr (WT == LM_BF16 && T >= LM_GEMV_TC_MIN_T) {
        if (tc) {
            LM_ASSERT(vec);
            switch (mode) {
            case LM_GEMV_STORE: lm_gemv_go<T, WT, true, LM_GEMV_STORE, true>(c, a, nb, threads); break;
            case LM_GEMV_ADD: lm_gemv_go<T, WT, true, LM_GEMV_ADD, true>(c, a, nb, threads); break;
            case LM_GEMV_ADD_NORM: lm_gemv_go<T, WT, true, LM_GEMV_ADD_NORM, true>(c, a, nb, threads); break;
            case LM_GEMV_GLU_SILU: lm_gemv_go<T, WT, true, LM_GEMV_GLU_SILU, true>(c, a, nb, threads); break;
            case LM_GEMV_GLU_GELU_TANH: lm_gemv_go<T, WT, true, LM_GEMV_GLU_GELU_TANH, true>(c, a, nb, threads); break;
            default: lm_gemv_go<T, WT, true, LM_GEMV_GLU_GELU, true>(c, a, nb, threads); break;
            }
            LM_CUDA_LAUNCHED("gemv");
            return;
        }
    }
    LM_ASSERT(!tc);
    if (!vec) {
        LM_ASSERT(mode == LM_GEMV_STORE);
        lm_gemv_go<T, WT, false, LM_GEMV_STORE>(c, a, nb, threads);
    } else if constexpr (WT == LM_F32) {
        LM_ASSERT(mode == LM_GEMV_STORE);
        lm_gemv_go<T, WT, true, LM_GEMV_STORE>(c, a, nb, threads);
    } else {
        switch (mode) {
        case LM_GEMV_STORE: lm_gemv_go<T, WT, true, LM_GEMV_STORE>(c, a, nb, threads); break;
        case LM_GEMV_ADD: lm_gemv_go<T, WT, true, LM_GEMV_ADD>(c, a, nb, threads); break;
        case LM_GEMV_ADD_NORM: lm_gemv_go<T, WT, true, LM_GEMV_ADD_NORM>(c, a, nb, threads); break;
        case LM_GEMV_GLU_SILU: lm_gemv_go<T, WT, true, LM_GEMV_GLU_SILU>(c, a, nb, threads); break;
        case LM_GEMV_GLU_GELU_TANH: lm_gemv_go<T, WT, true, LM_GEMV_GLU_GELU_TANH>(c, a, nb, threads); break;
        default: lm_gemv_go<T, WT, true, LM_GEMV_GLU_GELU>(c, a, nb, threads); break;
        }
    }
    LM_CUDA_LAUNCHED("gemv");
}

template <lm_dtype WT> static void lm_gemv_t(lm_cuda *c, int T, const lm_gemv_args *a, int mode, bool vec) {
    switch (T) {
    case 1: lm_gemv_launch<1, WT>(c, a, mode, vec); break;
    case 2: lm_gemv_launch<2, WT>(c, a, mode, vec); break;
    case 3: lm_gemv_launch<3, WT>(c, a, mode, vec); break;
    case 4: lm_gemv_launch<4, WT>(c, a, mode, vec); break;
    case 5: lm_gemv_launch<5, WT>(c, a, mode, vec); break;
    case 6: lm_gemv_launch<6, WT>(c, a, mode, vec); break;
    case 7: lm_gemv_launch<7, WT>(c, a, mode, vec); break;
    case 8: lm_gemv_launch<8, WT>(c, a, mode, vec); break;
    default: LM_ASSERT(!"gemv: T out of range");
    }
}


/* Whether x and every weight allow 16-byte chunks. */
bool lm_gemv_vec(const lm_gemv_args *a, int n, lm_dtype wt) {
    const int epc = wt == LM_F32 ? 4 : 8;
    bool vec = a->I % epc == 0 && lm_aligned16(a->x);
    for (int i = 0; i < n; i++) vec = vec && lm_aligned16(a->w[i]);
    return vec;
}

void lm_gemv_run(lm_cuda *c, int T, const lm_gemv_args *a, lm_dtype wt, int mode, bool vec) {
    lm_gemv_args b;
    switch (wt) {
    case LM_BF16:
        b = *a;
        b.x_bf16 = c->gemm_mode == LM_CUDA_GEMM_BF16;
        lm_gemv_t<LM_BF16>(c, T, &b, mode, vec);
        break;
    case LM_F16: lm_gemv_t<LM_F16>(c, T, a, mode, vec); break;
    case LM_F32: lm_gemv_t<LM_F32>(c, T, a, mode, vec); break;
    default: LM_ASSERT(!"gemv: weight type");
    }
}

/* Whether a GEMV of T tokens over bf16 rows takes tensor-core tiles (16
 * rows a block): from LM_GEMV_TC_MIN_T tokens, where the CUDA-core form is
 * bound by its FMAs (sm_80+), with bf16 activations or LUMEN_CUDA_GEMV_TC=1.
 * A token's bits then depend on how many share its batch (the CUDA-core
 * GEMV gives the same bits for 1 to 8): with exact activations the
 * exactness tests forbid that by default; with bf16 ones the products are
 * the same and only the order of the sums differs, as between GEMV and
 * GEMM. The caller has checked 16-byte chunks. */
bool lm_gemv_tc(const lm_cuda *c, int64_t T, lm_dtype wt) {
    const bool on = c->gemv_tc < 0 ? c->gemm_mode == LM_CUDA_GEMM_BF16 : c->gemv_tc == 1;
    return on && c->gemv_tc_ok && wt == LM_BF16 && T >= LM_GEMV_TC_MIN_T;
}

/* A plain args block: no matrices yet (first_block past every block). */
lm_gemv_args lm_gemv_args0(const float *x, int64_t I, int64_t T, bool tc) {
    lm_gemv_args a;
    memset(&a, 0, sizeof a); /* every byte set: a graph pass hashes them */
    a.x = x, a.I = I, a.rows = lm_gemv_rows((int)T, tc);
    for (int i = 0; i <= LM_GEMV_MAXM; i++) a.first_block[i] = 0;
    return a;
}

/* Appends matrix i (a->rows rows per block) to a. */
void lm_gemv_add(lm_gemv_args *a, int i, float *y, const void *w, const float *bias, int64_t O) {
    a->y[i] = y, a->w[i] = (const unsigned char *)w, a->bias[i] = bias, a->O[i] = O;
    const int64_t end = a->first_block[i] + (O + a->rows - 1) / a->rows;
    for (int j = i + 1; j <= LM_GEMV_MAXM; j++) a->first_block[j] = end;
}

/* The GLU modes' one output y [T][F] from gate wg and up wu: R / 2 rows of each a block. */
void lm_gemv_set_glu(lm_gemv_args *a, float *y, const void *wg, const void *wu, int64_t F) {
    a->y[0] = y, a->w[0] = (const unsigned char *)wg, a->w[1] = (const unsigned char *)wu, a->O[0] = F;
    for (int j = 1; j <= LM_GEMV_MAXM; j++) a->first_block[j] = (F + a->rows / 2 - 1) / (a->rows / 2);
}

void lm_gemv(lm_cuda *c, int T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias,
                    int64_t O, int64_t I) {
    lm_gemv_args a = lm_gemv_args0(x, I, T, false);
    a.w[0] = (const unsigned char *)w;
    const bool vec = lm_gemv_vec(&a, 1, wt);
    a.rows = lm_gemv_rows(T, vec && lm_gemv_tc(c, T, wt)); /* before the blocks are counted */
    lm_gemv_add(&a, 0, y, w, bias, O);
    lm_gemv_run(c, T, &a, wt, LM_GEMV_STORE, vec);
}

/* One MoE launch of weight type WT in GLU mode `mode` (or STORE). */
template <int T, int MOE, lm_dtype WT>
static void lm_moe_go(lm_cuda *c, const lm_gemv_args *a, dim3 grid, int threads, int mode) {
    switch (mode) {
    case LM_GEMV_GLU_SILU:
        lm_cuda_launch_pdl(c, lm_gemv_kernel<T, WT, true, LM_GEMV_GLU_SILU, MOE>, grid, threads, 0, *a);
        break;
    case LM_GEMV_GLU_GELU_TANH:
        lm_cuda_launch_pdl(c, lm_gemv_kernel<T, WT, true, LM_GEMV_GLU_GELU_TANH, MOE>, grid, threads, 0, *a);
        break;
    case LM_GEMV_GLU_GELU:
        lm_cuda_launch_pdl(c, lm_gemv_kernel<T, WT, true, LM_GEMV_GLU_GELU, MOE>, grid, threads, 0, *a);
        break;
    default:
        LM_ASSERT(mode == LM_GEMV_STORE);
        lm_cuda_launch_pdl(c, lm_gemv_kernel<T, WT, true, LM_GEMV_STORE, MOE>, grid, threads, 0, *a);
    }
}

/* What both MoE forms launch: x, one output y [.][O] (GLU modes: act(gate)
 * * up, act the mode's SiLU or GELU), the experts' matrices from wtab (E of
 * each kind); grid_y pairs or chunk slots. */
template <int T, int MOE>
static void lm_moe_launch(lm_cuda *c, lm_gemv_args *a, float *y, const unsigned char *const *wtab, int E, int64_t O,
                          lm_dtype wt, int mode, unsigned grid_y) {
    const bool glu = mode >= LM_GEMV_GLU_SILU;
    LM_ASSERT((wt == LM_BF16 || wt == LM_F16) && a->I % 8 == 0 && grid_y >= 1 && grid_y <= 65535);
    if (glu) lm_gemv_set_glu(a, y, NULL, NULL, O); /* the matrices come from wtab */
    else lm_gemv_add(a, 0, y, NULL, NULL, O);
    a->moe_w = wtab, a->moe_E = E;
    const int threads = lm_gemv_threads(c, a->I / 8);
    /* MoE groups: a block takes LM_MOE_ROW_GROUPS groups of rows */
    const int64_t rb = MOE == LM_MOE_GROUPS ? LM_MOE_ROW_GROUPS : 1, row_groups = a->first_block[LM_GEMV_MAXM];
    const dim3 grid((unsigned)((row_groups + rb - 1) / rb), grid_y);
    a->x_bf16 = wt == LM_BF16 && c->gemm_mode == LM_CUDA_GEMM_BF16;
    if (wt == LM_BF16) lm_moe_go<T, MOE, LM_BF16>(c, a, grid, threads, mode);
    else lm_moe_go<T, MOE, LM_F16>(c, a, grid, threads, mode);
    LM_CUDA_LAUNCHED(MOE == LM_MOE_GROUPS ? "moe group gemv" : "moe gemv");
}

/* The experts' GEMVs of a MoE layer for `pairs` (token, expert) pairs whose
 * matrices the routing kernel listed on the device (wp): a GLU mode: y[p] =
 * act(gate_p x[p / k]) * up_p x[p / k] (wp = the pairs' gate then up
 * matrices [O][I]); else y[p] = W_p x[p] (wp = the pairs' matrices). One
 * launch, nothing read back: a graph records it. */
void lm_cuda_moe_gemv(lm_cuda *c, float *y, const float *x, const unsigned char *const *wp, int k, int pairs,
                      int64_t O, int64_t I, lm_dtype wt, int mode) {
    lm_gemv_args a = lm_gemv_args0(x, I, 1, false);
    a.moe_k = k;
    lm_moe_launch<1, LM_MOE_PAIRS>(c, &a, y, wp, pairs, O, wt, mode, (unsigned)pairs);
}

/* The experts' GEMVs of a MoE layer on pairs grouped by expert on the
 * device (cuda_moe.cu): grid.y = `slots` chunks of up to LM_MOE_CHUNK
 * tokens of one expert, each (expert, first row, tokens) in chunk; a GLU
 * mode: y row r = act(gate_e x[src[r]]) * up_e x[src[r]]; else y row r = W_e x row
 * r. A token's dot products are those of the one-token GEMV (same chunks,
 * same order), so the grouping gives the pairs' bits. */
void lm_cuda_moe_group_gemv(lm_cuda *c, float *y, const float *x, const int32_t *chunk, const int32_t *src,
                            const unsigned char *const *wtab, int E, int slots, int64_t O, int64_t I, lm_dtype wt,
                            int mode) {
    lm_gemv_args a = lm_gemv_args0(x, I, LM_MOE_CHUNK, false);
    a.moe_chunk = chunk, a.moe_src = src;
    lm_moe_launch<LM_MOE_CHUNK, LM_MOE_GROUPS>(c, &a, y, wtab, E, O, wt, mode, (unsigned)slots);
}
