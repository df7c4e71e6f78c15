/* cuda_qgemv.cu - y[T][O] = x[T][I] W[O][I]^T (+ bias) for few tokens
 * (T <= LM_GEMV_MAX_T) over GGUF block-quantised weights (lm_cuda_qtype),
 * read as stored; cuda_matmul.cu picks it.
 *
 * Roofline: a decode step reads every weight byte once, so its time is the
 * weights' bytes over the copy bandwidth. Llama-3.1-8B Q4_K_M is ~4.6 GiB
 * (4.9 GB): at the H200's ~4.2 TB/s copy rate ~1.2 ms a token, ~850 tok/s
 * at batch 1, four times fewer bytes than bf16 (16 GB, ~260 tok/s). The
 * arithmetic per weight byte grows by the same factor: Q4_K has 1.8 values
 * a byte against bf16's 0.5, so at 8 tokens the f32 FMAs (8 a value) would
 * need ~60 TFMA/s at full bandwidth, above the H200's f32 rate; batch 1
 * (7.6 TFMA/s) stays memory-bound.
 *
 * Layout, as the bf16 GEMV (cuda_gemv.cu): a block owns LM_QGEMV_ROWS
 * consecutive rows; its threads stride along the row in slices
 * (cuda_quant.h: 16 or 32 values of one block, consecutive threads on
 * consecutive slices, so a warp reads a few whole blocks); each thread
 * loads its slice of every row of the block for two slices before the
 * first FMA (2 x LM_QGEMV_ROWS slices in flight), turns each group of 4
 * codes into f32 once and uses it for all T tokens, summing code * x per
 * scale group and scaling the sum once (cuda_quant.h); x stays f32 and is
 * read with plain 16-byte loads (L1 hits: every block reads it). The sum is
 * f32: per thread in slice order, then a warp-shuffle tree, then the warps
 * in order, so a row's bits do not depend on T or on the rows beside it.
 * PDL as the bf16 GEMV: weights are fetched before griddepcontrol.wait, x
 * only after.
 *
 * Fused forms, up to LM_QGEMV_FUSED_MAX_T tokens: the residual add (y +=)
 * and gate/up with silu (2 gate and 2 up rows a block, silu(gate) * up with
 * the silu_mul op's arithmetic), each row summed as in the plain form, so
 * fused and composed results are equal bit for bit.
 *
 * MoE experts (lm_qmoe_gemv): the bf16 GEMV's pairs form, one token a
 * (token, expert) pair, grid.y the pairs, each pair's matrices from the
 * routing kernel's device list; the gate/up form takes 2 gate and 2 up rows
 * a block and writes silu(gate) * up. A row's sum is the plain form's. */
#include "cuda_quant.h"

#define LM_QGEMV_ROWS 4
#define LM_QGEMV_THREADS 256
static_assert(LM_GEMV_MAX_T <= 8, "lm_qgemv_t has kernels up to 8 tokens");
#define LM_QGEMV_FUSED_MAX_T 4 /* tokens up to which the fused modes are built (compile time, binary size) */

/* Four of x's values times w, added to acc in order. */
static __device__ __forceinline__ float lm_q_dot4(const float (&w)[4], const float4 &x, float acc) {
    acc = fmaf(w[0], x.x, acc);
    acc = fmaf(w[1], x.y, acc);
    acc = fmaf(w[2], x.z, acc);
    return fmaf(w[3], x.w, acc);
}

/* What a launch writes: y (+ bias); y += (the residual add); silu(gate) *
 * up over gate/up rows (2 + 2 a block); the MoE pairs' forms: plain, and
 * act(gate) * up with SiLU (MOE_GLU) or GELU (Gemma 4's experts). */
enum {
    LM_QGEMV_PLAIN = 0,
    LM_QGEMV_ADD,
    LM_QGEMV_GLU,
    LM_QGEMV_MOE,
    LM_QGEMV_MOE_GLU,
    LM_QGEMV_MOE_GELU_TANH,
    LM_QGEMV_MOE_GELU
};

/* At most 128 registers (two blocks of 256 threads an SM) for one token;
 * more tokens keep the compiler's choice: at 128 the Q5_K and Q6_K forms
 * spilled 100-750 bytes a thread from 2 tokens (ptxas -v, sm_90), and the
 * int8 Q6_K form 220 bytes at one. */
template <int T, lm_dtype QT, int KIND, bool I8>
__global__ void __launch_bounds__(LM_QGEMV_THREADS, (T == 1 && !(I8 && QT == LM_Q6_K) ? 2 : 1))
    lm_qgemv_kernel(const lm_gemv_args a) {
    using Q = lm_q<QT>;
    constexpr int R = LM_QGEMV_ROWS;
    constexpr bool MOE = KIND >= LM_QGEMV_MOE;
    constexpr bool GLU = KIND == LM_QGEMV_GLU || KIND >= LM_QGEMV_MOE_GLU;
    static_assert(!MOE || T == 1, "MoE pairs are single rows");
    lm_pdl_trigger();
    bool waited = false;
    auto sync_in = [&]() {
        if (!waited) lm_pdl_wait();
        waited = true;
    };
    int m = 0;
    if constexpr (!MOE && !GLU)
        while (m + 1 < LM_GEMV_MAXM && (int64_t)blockIdx.x >= a.first_block[m + 1]) m++;
    const int64_t I = a.I, O = a.O[m];
    const int n_tok = a.n_tok > 0 ? a.n_tok : T; /* tokens past it: the last one's x, never stored */
    const int64_t o0 = ((int64_t)blockIdx.x - a.first_block[m]) * (GLU ? R / 2 : R);
    const size_t ldw = (size_t)(I / Q::BV) * Q::BB;
    const unsigned char *w0 = a.w[m], *w1 = a.w[GLU ? 1 : m];
    const float *x = a.x;
    if constexpr (MOE) { /* the routing is the kernel before's output: wait for it, then fetch */
        sync_in();
        w0 = a.moe_w[blockIdx.y];
        if constexpr (GLU) w1 = a.moe_w[a.moe_E + blockIdx.y];
        x += (size_t)(GLU ? blockIdx.y / a.moe_k : blockIdx.y) * I;
    }
    const unsigned char *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) { /* tail rows: read, not stored */
        if constexpr (GLU) wr[r] = (r < R / 2 ? w0 : w1) + (size_t)LM_MIN(o0 + r % (R / 2), O - 1) * ldw;
        else wr[r] = w0 + (size_t)LM_MIN(o0 + r, O - 1) * ldw;
    }
    const int64_t n_slices = I / Q::BV * Q::LPB;

    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    using raw = typename Q::raw;
    auto load = [&](raw (&v)[R], int64_t k) {
        const size_t off = (size_t)(k / Q::LPB) * Q::BB;
#pragma unroll
        for (int r = 0; r < R; r++) v[r] = Q::slice(wr[r] + off, (int)(k % Q::LPB));
    };
    /* per scale group: sum (byte - OFF) * x, then acc += scale * sum (-
     * min * sum x, shared by the rows): three instructions a weight (a byte
     * permute, an add, an FMA) plus one FMA a further token */
    auto step = [&](const raw (&v)[R], int64_t k) {
        const int64_t base = k / Q::LPB * Q::BV;
        const int j = (int)(k % Q::LPB);
#pragma unroll
        for (int g = 0; g < Q::Q / Q::QG; g++) {
            float sq[R][T], sx[T];
#pragma unroll
            for (int t = 0; t < T; t++) {
                sx[t] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) sq[r][t] = 0.0f;
            }
#pragma unroll
            for (int qi = 0; qi < Q::QG; qi++) {
                const int q = g * Q::QG + qi;
                const int64_t xo = base + Q::at(j, q);
                float4 xv[T];
#pragma unroll
                for (int t = 0; t < T; t++) {
                    xv[t] = *(const float4 *)(x + (size_t)LM_MIN(t, n_tok - 1) * I + xo);
                    if constexpr (Q::MIN) sx[t] += (xv[t].x + xv[t].y) + (xv[t].z + xv[t].w);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float f[4];
                    lm_q_vals<Q>(v[r], q, f);
#pragma unroll
                    for (int t = 0; t < T; t++) sq[r][t] = lm_q_dot4(f, xv[t], sq[r][t]);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float sc = Q::scale(v[r], g), mn = Q::minv(v[r], g);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    acc[r][t] = fmaf(sc, sq[r][t], acc[r][t]);
                    if constexpr (Q::MIN) acc[r][t] = fmaf(-mn, sx[t], acc[r][t]);
                }
            }
        }
    };

    /* int8 activations (cuda_quant.h): per token the slice's x rounded to
     * s8 once (one scale a slice, shared by the R rows), then per scale
     * group an integer dp4a sum scaled once: about a third of the f32
     * form's instructions a weight. */
    auto step_i8 = [&](const raw (&v)[R], int64_t k) {
        const int64_t base = k / Q::LPB * Q::BV;
        const int j = (int)(k % Q::LPB);
#pragma unroll
        for (int t = 0; t < T; t++) {
            const lm_q_x8<Q> x8 = lm_q_quant_x<Q>(x + (size_t)LM_MIN(t, n_tok - 1) * I + base, j);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][t] = lm_q_dot_i8<Q>(v[r], x8, acc[r][t]);
        }
    };
    auto run = [&](const raw (&v)[R], int64_t k) {
        if constexpr (I8) step_i8(v, k);
        else step(v, k);
    };

    const int64_t stride = blockDim.x;
    int64_t k = threadIdx.x;
    for (; k + stride < n_slices; k += 2 * stride) { /* two slices a trip: 2R loads before the first FMA */
        raw va[R], vb[R];
        load(va, k);
        load(vb, k + stride);
        sync_in();
        run(va, k);
        run(vb, k + stride);
    }
    if (k < n_slices) {
        raw va[R];
        load(va, k);
        sync_in();
        run(va, k);
    }
    sync_in(); /* before y is written */

    __shared__ float part[LM_QGEMV_THREADS / 32][R * T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    lm_warp_sums_store<R, T>(acc, part[warp], lane); /* the bits of a butterfly per value */
    __syncthreads();
    constexpr int n_out = GLU ? R / 2 * T : R * T;
    for (int i = threadIdx.x; i < n_out; i += blockDim.x) {
        const int r = i / T, t = i % T;
        const int64_t o = o0 + r;
        if (o >= O || t >= n_tok) continue;
        float s = 0.0f;
        for (int wi = 0; wi < n_warps; wi++) s += part[wi][i];
        float *yo = (MOE ? a.y[0] + (size_t)blockIdx.y * O : a.y[m]) + (size_t)t * O + o;
        if constexpr (GLU) {
            float u = 0.0f;
            for (int wi = 0; wi < n_warps; wi++) u += part[wi][i + R / 2 * T];
            /* the silu_mul / gelu_mul ops' arithmetic: fused and composed agree */
            if constexpr (KIND == LM_QGEMV_MOE_GELU_TANH || KIND == LM_QGEMV_MOE_GELU)
                *yo = lm_gelu_mul1(s, u, KIND == LM_QGEMV_MOE_GELU_TANH);
            else
                *yo = lm_silu_mul1(s, u);
        } else if constexpr (KIND == LM_QGEMV_ADD) {
            *yo += s; /* the add op's: y + (x W^T) */
        } else {
            *yo = s + (a.bias[m] ? a.bias[m][o] : 0.0f);
        }
    }
}

/* Threads of a block for rows of n_slices slices: the fewest (a power of
 * two, 32 to LM_QGEMV_THREADS) that leave a thread at most c->gemv_chunks
 * slices of a row, as the bf16 GEMV sizes its blocks. Rows of 4,096 Q4_K
 * values (128 slices) get 64 threads. */
static int lm_qgemv_threads(const lm_cuda *c, int64_t n_slices) {
    int threads = 32;
    while (threads < LM_QGEMV_THREADS && threads * (int64_t)c->gemv_chunks < n_slices) threads *= 2;
    return threads;
}

/* The fused modes (ADD, GLU) are built up to LM_QGEMV_FUSED_MAX_T tokens
 * (lm_qgemv_fused says so to the callers, which compose above). */
template <int T, lm_dtype QT, bool I8> static void lm_qgemv_launch(lm_cuda *c, const lm_gemv_args *a, int mode) {
    using Q = lm_q<QT>;
    const int64_t blocks = a->first_block[LM_GEMV_MAXM];
    LM_ASSERT(blocks > 0 && blocks <= 0x7fffffff);
    const int threads = lm_qgemv_threads(c, a->I / Q::BV * Q::LPB);
    if constexpr (T <= LM_QGEMV_FUSED_MAX_T && Q::FULL) {
        if (mode == LM_GEMV_ADD) {
            lm_cuda_launch_pdl(c, lm_qgemv_kernel<T, QT, LM_QGEMV_ADD, I8>, (unsigned)blocks, threads, 0, *a);
            LM_CUDA_LAUNCHED("qgemv add");
            return;
        }
        if (mode == LM_GEMV_GLU_SILU) {
            lm_cuda_launch_pdl(c, lm_qgemv_kernel<T, QT, LM_QGEMV_GLU, I8>, (unsigned)blocks, threads, 0, *a);
            LM_CUDA_LAUNCHED("qgemv glu");
            return;
        }
    }
    LM_ASSERT(mode == LM_GEMV_STORE);
    lm_cuda_launch_pdl(c, lm_qgemv_kernel<T, QT, LM_QGEMV_PLAIN, I8>, (unsigned)blocks, threads, 0, *a);
    LM_CUDA_LAUNCHED("qgemv");
}

/* int8 activations (dp4a) for the FULL types unless the backend keeps the
 * exact f32 arithmetic (LUMEN_CUDA_QUANT_EXACT=1, lm_cuda_backend_quant_exact). */
template <int T, lm_dtype QT> static void lm_qgemv_go(lm_cuda *c, const lm_gemv_args *a, int mode) {
    if constexpr (lm_q<QT>::FULL) {
        if (!c->quant_exact) {
            lm_qgemv_launch<T, QT, true>(c, a, mode);
            return;
        }
    }
    lm_qgemv_launch<T, QT, false>(c, a, mode);
}

/* Kernels for 1, 2, 4 and 8 tokens; 3 runs as 4 and 5-7 as 8 with the
 * extra tokens masked (n_tok): half the kernels (each adds ~100 KB of
 * machine code to every binary), for FMAs on a repeated x row. */
template <lm_dtype QT> static void lm_qgemv_t(lm_cuda *c, int T, const lm_gemv_args *a, int mode) {
    LM_ASSERT(T >= 1 && T <= 8);
    lm_gemv_args m = *a;
    m.n_tok = T;
    if constexpr (!lm_q<QT>::FULL) { /* one token, or up to 8 masked */
        if (T == 1) lm_qgemv_go<1, QT>(c, &m, mode);
        else lm_qgemv_go<8, QT>(c, &m, mode);
    } else if (T <= 2) {
        T == 1 ? lm_qgemv_go<1, QT>(c, &m, mode) : lm_qgemv_go<2, QT>(c, &m, mode);
    } else if (T <= 4) {
        lm_qgemv_go<4, QT>(c, &m, mode);
    } else {
        lm_qgemv_go<8, QT>(c, &m, mode);
    }
}

/* Whether a fused mode (residual add, silu gate/up) is built for T tokens of type wt. */
bool lm_qgemv_fused(int64_t T, lm_dtype wt) {
    const bool full = wt == LM_Q8_0 || wt == LM_Q4_0 || wt == LM_Q4_K || wt == LM_Q5_K || wt == LM_Q6_K || wt == LM_IQ4_XS;
    return full && T >= 1 && T <= LM_QGEMV_FUSED_MAX_T;
}

/* Whether the quantised kernels read w: at the alignment its type's loads
 * need (16 bytes for Q4_K / Q5_K, 8 for IQ4_XS, 4 for FP8_B128 and Q2_K, 2 for the rest; always so
 * for uploaded weights and row views of them). */
bool lm_qweight_ok(const void *w, lm_dtype wt) {
    const uintptr_t need = wt == LM_Q4_K || wt == LM_Q5_K ? 16 : wt == LM_IQ4_XS ? 8 : wt == LM_FP8_B128 || wt == LM_Q2_K ? 4 : 2;
    return lm_cuda_qtype(wt) && ((uintptr_t)w % need) == 0;
}

/* Whether the quantised GEMV takes x and w: x rows 16-byte aligned (I is
 * a multiple of the block, so every x row is when x is) and w readable
 * (anything else takes the widening path). */
bool lm_qgemv_ok(const float *x, const void *w, lm_dtype wt) { return lm_aligned16(x) && lm_qweight_ok(w, wt); }

/* A plain args block for n quantised matrices of T tokens over x [T][I]. */
lm_gemv_args lm_qgemv_args0(const float *x, int64_t I) {
    lm_gemv_args a = lm_gemv_args0(x, I, 1, false);
    a.rows = LM_QGEMV_ROWS; /* before any matrix is added */
    return a;
}

/* Runs a (built by lm_qgemv_args0, then lm_gemv_add per matrix or
 * lm_gemv_set_glu) for T tokens in mode LM_GEMV_STORE, LM_GEMV_ADD or
 * LM_GEMV_GLU_SILU (the last two when lm_qgemv_fused(T)); every matrix of
 * type wt, lm_qgemv_ok. */
void lm_qgemv_run(lm_cuda *c, int T, const lm_gemv_args *a, lm_dtype wt, int mode) {
    const bool several = a->first_block[1] < a->first_block[LM_GEMV_MAXM], add = mode == LM_GEMV_ADD;
    if ((mode == LM_GEMV_STORE && several && lm_cuda_skip(c, LM_SKIP_GEMV_N)) ||
        (mode == LM_GEMV_GLU_SILU && lm_cuda_skip(c, LM_SKIP_GEMV_GLU)) ||
        (add && lm_cuda_skip(c, a->I > a->O[0] ? LM_SKIP_GEMV_DOWN : LM_SKIP_GEMV_ADD)))
        return; /* timing only (LUMEN_CUDA_SKIP), as the bf16 GEMV */
    if (lm_sgemv_takes(c, a, wt)) { /* Q4_K / Q6_K on sm_90: rows streamed through shared memory */
        lm_sgemv_run(c, T, a, wt, mode);
        return;
    }
    LM_ASSERT(a->rows == LM_QGEMV_ROWS && (mode == LM_GEMV_STORE || lm_qgemv_fused(T, wt)));
    switch (wt) {
    case LM_Q8_0: lm_qgemv_t<LM_Q8_0>(c, T, a, mode); break;
    case LM_Q4_0: lm_qgemv_t<LM_Q4_0>(c, T, a, mode); break;
    case LM_Q4_1: lm_qgemv_t<LM_Q4_1>(c, T, a, mode); break;
    case LM_Q5_0: lm_qgemv_t<LM_Q5_0>(c, T, a, mode); break;
    case LM_Q5_1: lm_qgemv_t<LM_Q5_1>(c, T, a, mode); break;
    case LM_IQ4_NL: lm_qgemv_t<LM_IQ4_NL>(c, T, a, mode); break;
    case LM_Q4_K: lm_qgemv_t<LM_Q4_K>(c, T, a, mode); break;
    case LM_Q5_K: lm_qgemv_t<LM_Q5_K>(c, T, a, mode); break;
    case LM_Q6_K: lm_qgemv_t<LM_Q6_K>(c, T, a, mode); break;
    case LM_IQ4_XS: lm_qgemv_t<LM_IQ4_XS>(c, T, a, mode); break;
    case LM_Q2_K: lm_qgemv_t<LM_Q2_K>(c, T, a, mode); break;
    case LM_Q3_K: lm_qgemv_t<LM_Q3_K>(c, T, a, mode); break;
    case LM_FP8_B128: lm_qgemv_t<LM_FP8_B128>(c, T, a, mode); break;
    case LM_A4_BF16: lm_qgemv_t<LM_A4_BF16>(c, T, a, mode); break;
    case LM_A4_F16: lm_qgemv_t<LM_A4_F16>(c, T, a, mode); break;
    case LM_A8_BF16: lm_qgemv_t<LM_A8_BF16>(c, T, a, mode); break;
    case LM_A8_F16: lm_qgemv_t<LM_A8_F16>(c, T, a, mode); break;
    default: LM_ASSERT(!"qgemv: weight type");
    }
}

void lm_qgemv(lm_cuda *c, int T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias, int64_t O,
              int64_t I) {
    lm_gemv_args a = lm_qgemv_args0(x, I);
    lm_gemv_add(&a, 0, y, w, bias, O);
    lm_qgemv_run(c, T, &a, wt, LM_GEMV_STORE);
}

template <lm_dtype QT, bool I8>
static void lm_qmoe_launch(lm_cuda *c, const lm_gemv_args *a, unsigned pairs, int mode) {
    using Q = lm_q<QT>;
    const int threads = lm_qgemv_threads(c, a->I / Q::BV * Q::LPB);
    const dim3 grid((unsigned)a->first_block[LM_GEMV_MAXM], pairs);
    switch (mode) {
    case LM_GEMV_GLU_SILU:
        lm_cuda_launch_pdl(c, lm_qgemv_kernel<1, QT, LM_QGEMV_MOE_GLU, I8>, grid, threads, 0, *a);
        break;
    case LM_GEMV_GLU_GELU_TANH:
        lm_cuda_launch_pdl(c, lm_qgemv_kernel<1, QT, LM_QGEMV_MOE_GELU_TANH, I8>, grid, threads, 0, *a);
        break;
    case LM_GEMV_GLU_GELU:
        lm_cuda_launch_pdl(c, lm_qgemv_kernel<1, QT, LM_QGEMV_MOE_GELU, I8>, grid, threads, 0, *a);
        break;
    default:
        LM_ASSERT(mode == LM_GEMV_STORE);
        lm_cuda_launch_pdl(c, lm_qgemv_kernel<1, QT, LM_QGEMV_MOE, I8>, grid, threads, 0, *a);
    }
    LM_CUDA_LAUNCHED("qmoe gemv");
}

template <lm_dtype QT> static void lm_qmoe_go(lm_cuda *c, const lm_gemv_args *a, unsigned pairs, int mode) {
    if constexpr (lm_q<QT>::FULL) {
        if (!c->quant_exact) {
            lm_qmoe_launch<QT, true>(c, a, pairs, mode);
            return;
        }
    }
    lm_qmoe_launch<QT, false>(c, a, pairs, mode);
}

/* The experts' GEMVs of a MoE layer over quantised matrices, for `pairs`
 * (token, expert) pairs listed on the device (wp), as lm_cuda_moe_gemv:
 * a GLU mode: y[p] = act(gate_p x[p / k]) * up_p x[p / k]; else y[p] = W_p x[p].
 * x rows 16-byte aligned and every matrix lm_qgemv_ok (the caller checks). */
void lm_qmoe_gemv(lm_cuda *c, float *y, const float *x, const unsigned char *const *wp, int k, int pairs, int64_t O,
                  int64_t I, lm_dtype wt, int mode) {
    LM_ASSERT(pairs >= 1 && pairs <= 65535 && lm_aligned16(x));
    lm_gemv_args a = lm_qgemv_args0(x, I);
    a.moe_k = k, a.moe_w = wp, a.moe_E = pairs;
    if (mode >= LM_GEMV_GLU_SILU) lm_gemv_set_glu(&a, y, NULL, NULL, O); /* the matrices come from wp */
    else lm_gemv_add(&a, 0, y, NULL, NULL, O);
    switch (wt) {
    case LM_Q8_0: lm_qmoe_go<LM_Q8_0>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q4_0: lm_qmoe_go<LM_Q4_0>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q4_1: lm_qmoe_go<LM_Q4_1>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q5_0: lm_qmoe_go<LM_Q5_0>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q5_1: lm_qmoe_go<LM_Q5_1>(c, &a, (unsigned)pairs, mode); break;
    case LM_IQ4_NL: lm_qmoe_go<LM_IQ4_NL>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q4_K: lm_qmoe_go<LM_Q4_K>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q5_K: lm_qmoe_go<LM_Q5_K>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q6_K: lm_qmoe_go<LM_Q6_K>(c, &a, (unsigned)pairs, mode); break;
    case LM_IQ4_XS: lm_qmoe_go<LM_IQ4_XS>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q2_K: lm_qmoe_go<LM_Q2_K>(c, &a, (unsigned)pairs, mode); break;
    case LM_Q3_K: lm_qmoe_go<LM_Q3_K>(c, &a, (unsigned)pairs, mode); break;
    case LM_FP8_B128: lm_qmoe_go<LM_FP8_B128>(c, &a, (unsigned)pairs, mode); break;
    case LM_A4_BF16: lm_qmoe_go<LM_A4_BF16>(c, &a, (unsigned)pairs, mode); break;
    case LM_A4_F16: lm_qmoe_go<LM_A4_F16>(c, &a, (unsigned)pairs, mode); break;
    case LM_A8_BF16: lm_qmoe_go<LM_A8_BF16>(c, &a, (unsigned)pairs, mode); break;
    case LM_A8_F16: lm_qmoe_go<LM_A8_F16>(c, &a, (unsigned)pairs, mode); break;
    default: LM_ASSERT(!"qmoe gemv: weight type");
    }
}
