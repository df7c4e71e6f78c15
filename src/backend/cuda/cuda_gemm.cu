/* cuda_gemm.cu - y[T][O] = x[T][I] W[O][I]^T (+ bias) on the GPU for more
 * than LM_GEMV_MAX_T tokens, and the same for weights stored back to back
 * (one product, its columns placed part by part, or gate/up with the
 * activation); cuda_matmul.cu picks it. x and y are f32; W is bf16, f16 or
 * f32 in its stored layout [O][I].
 *
 * Large T: cuBLAS on tensor cores. To keep f32 parity with the CPU the
 * activations are split as hi = bf16(x), mid, lo (x = hi + mid + lo to
 * ~2^-26 relative) and y = W hi + W mid + W lo, three GEMMs with f32 accumulation
 * (the later two add with beta = 1; a bias is written into y first). Products
 * of bf16 values are exact in f32, so the error is that of the split plus
 * f32 accumulation. LUMEN_CUDA_GEMM=bf16 (read at backend
 * creation) keeps only hi: one GEMM, bf16 activations, for benchmarks. f16
 * weights use the same split in f16, after scaling x by a power of two so
 * that max|x| lands at 2^14 (no f16 overflow whatever the activations); the
 * scale is found on the device and undone through alpha (cuBLAS device
 * pointer mode), so nothing waits for the host. f32 weights use
 * cublasSgemm (default math: no TF32). */
#include "cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* ---- GEMM (cuBLAS) ------------------------------------------------------------------ */

#define LM_GEMM_STACK_BYTES ((size_t)64 << 20) /* most scratch for a product's terms side by side */
#define LM_GEMM_CHUNK_MAX_T 256 /* products of at most this many tokens go through the scratch in row chunks */

/* V consecutive floats (V = 4: one 16-byte access; p aligned). */
template <int V>
static __device__ __forceinline__ void lm_ldv(float (&v)[V], const float *p) {
    if constexpr (V == 4) {
        const float4 q = *(const float4 *)p;
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = p[i];
    }
}
template <int V>
static __device__ __forceinline__ void lm_stv(float *p, const float (&v)[V]) {
    if constexpr (V == 4) *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else
#pragma unroll
        for (int i = 0; i < V; i++) p[i] = v[i];
}

/* The sums of a product's terms at offsets [at, at + V) of the first term:
 * terms one after another (stride tstride), added as (hi + mid) + lo. */
template <int V>
static __device__ __forceinline__ void lm_terms_at(float (&v)[V], const float *p, int terms, int64_t tstride,
                                                   int64_t at) {
    lm_ldv<V>(v, p + at);
    if (terms == 3) {
        float m[V], l[V];
        lm_ldv<V>(m, p + tstride + at);
        lm_ldv<V>(l, p + 2 * tstride + at);
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = (v[i] + m[i]) + l[i];
    }
}

/* Columns [c0, c0 + C) of the product (terms [T][C] in p) to where o says
 * (not glu), V columns a thread; blockIdx.y is the token. Bias + sum, as the
 * bias-filled y plus the terms was; with acc, y + (bias + sum). The parts
 * are walked with constant indices so that o stays in parameter space. */
template <int V>
__global__ void lm_gemm_scatter_kernel(lm_gemm_out o, const float *p, int terms, int64_t T, int64_t c0, int64_t C) {
    const int64_t t = blockIdx.y, step = (int64_t)gridDim.x * blockDim.x * V;
    const float *row = p + t * C;
    int64_t off = 0; /* first column of part k */
#pragma unroll
    for (int k = 0; k < LM_GEMV_MAXM; k++) {
        if (k < o.n) {
            const int64_t lo = off > c0 ? off : c0, hi = off + o.O[k] < c0 + C ? off + o.O[k] : c0 + C;
            float *y = o.y[k] + t * o.O[k] - off; /* y[j]: column j of the product */
            const float *b = o.bias[k];
            for (int64_t j = lo + ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V; j < hi; j += step) {
                float v[V], e[V];
                lm_terms_at<V>(v, row, terms, T * C, j - c0);
                if (b) {
                    lm_ldv<V>(e, b + j - off);
#pragma unroll
                    for (int i = 0; i < V; i++) v[i] = e[i] + v[i];
                }
                if (o.acc) {
                    lm_ldv<V>(e, y + j);
#pragma unroll
                    for (int i = 0; i < V; i++) v[i] = e[i] + v[i];
                }
                lm_stv<V>(y + j, v);
            }
            off += o.O[k];
        }
    }
}

/* y[t][j] = act(gate) * up from the product's terms [T][2F] (gate columns
 * first), V columns a thread, blockIdx.y the token, with the element-wise
 * kernels' activations (same bits as silu_mul / gelu_mul on the summed
 * halves). */
template <int GLU, int V>
__global__ void lm_gemm_glu_kernel(float *y, const float *p, int terms, int64_t T, int64_t F) {
    const int64_t t = blockIdx.y;
    const float *row = p + t * 2 * F;
    for (int64_t j = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V; j < F;
         j += (int64_t)gridDim.x * blockDim.x * V) {
        float g[V], u[V], r[V];
        lm_terms_at<V>(g, row, terms, T * 2 * F, j);
        lm_terms_at<V>(u, row, terms, T * 2 * F, F + j);
#pragma unroll
        for (int i = 0; i < V; i++)
            r[i] = GLU == LM_GLU_SILU ? lm_silu_mul1(g[i], u[i]) : lm_gelu_mul1(g[i], u[i], GLU == LM_GLU_GELU_TANH);
        lm_stv<V>(y + t * F + j, r);
    }
}

/* Blocks along a row of `cols` columns for the 2-D kernels above (T rows in
 * blockIdx.y): enough 256-thread blocks to cover the row once. */
static dim3 lm_row_grid(int64_t cols, int64_t T) {
    LM_ASSERT(T >= 1 && T <= 65535);
    return dim3((unsigned)LM_MAX((int64_t)1, LM_MIN((cols + 255) / 256, (int64_t)4096)), (unsigned)T);
}

/* y[t][o] = bias[o] */
__global__ void lm_bias_fill_kernel(float *y, const float *bias, int64_t T, int64_t O) {
    int64_t n = T * O;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = bias[i % O];
}

/* hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid): x = hi + mid +
 * lo to ~2^-26 relative, finer than f32 rounding; mid NULL: hi only. V
 * values a thread a turn (V = 4: x 16-byte and the terms 8-byte aligned, n
 * a multiple of 4; the scalar loop ran at ~2.8 TB/s on the H200). */
template <int V>
__global__ void lm_split_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *mid, __nv_bfloat16 *lo, const float *x,
                                     int64_t n) {
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * V; i < n;
         i += (int64_t)gridDim.x * blockDim.x * V) {
        float v[V];
        lm_ldv<V>(v, x + i);
        __nv_bfloat16 h[V], m[V], l[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            h[k] = __float2bfloat16_rn(v[k]);
            const float r = v[k] - __bfloat162float(h[k]); /* exact in f32 */
            m[k] = __float2bfloat16_rn(r);
            l[k] = __float2bfloat16_rn(r - __bfloat162float(m[k]));
        }
        if constexpr (V == 4) {
            *(uint2 *)(hi + i) = *(const uint2 *)h;
            if (mid) *(uint2 *)(mid + i) = *(const uint2 *)m, *(uint2 *)(lo + i) = *(const uint2 *)l;
        } else {
            hi[i] = h[0];
            if (mid) mid[i] = m[0], lo[i] = l[0];
        }
    }
}

/* amax (as the bits of a non-negative float, which order as unsigned) of |x|. */
__global__ void lm_absmax_kernel(unsigned *amax, const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a = fabsf(x[i]);
        m = a > m ? a : m; /* NaN is skipped; it propagates through the GEMM anyway */
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

/* hi = f16(x s), lo = f16(x s - hi) with s = 2^(14 - ceil(log2 amax)); consts
 * gets { 1/s, 0, 1 } for the GEMMs' alpha and beta (device pointer mode). */
__global__ void lm_split_f16_kernel(__half *hi, __half *lo, float *consts, const unsigned *amax_bits, const float *x,
                                    int64_t n) {
    float amax = __uint_as_float(*amax_bits);
    int e = 0;
    if (amax > 0.0f && amax <= 3.0e38f) (void)frexpf(amax, &e); /* amax = f * 2^e, f in [0.5, 1) */
    e = e < -100 ? -100 : e > 100 ? 100 : e;
    float s = ldexpf(1.0f, 14 - e);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        consts[0] = ldexpf(1.0f, e - 14);
        consts[1] = 0.0f;
        consts[2] = 1.0f;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i] * s; /* exact: a power of two */
        __half h = __float2half_rn(v);
        hi[i] = h;
        if (lo) lo[i] = __float2half_rn(v - __half2float(h));
    }
}

unsigned lm_grid_1d(lm_cuda *c, int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    int64_t cap = (int64_t)(c->n_sms > 0 ? c->n_sms : 64) * 16;
    return (unsigned)LM_MAX((int64_t)1, LM_MIN(b, cap));
}

static size_t lm_al256(size_t v) { return (v + 255) & ~(size_t)255; }

/* Whether columns [c0, c0 + C) of o's product can go 4 at a time: every
 * part boundary and row a multiple of 4 floats, every pointer 16-byte
 * aligned. */
static bool lm_gemm_vec4(const lm_gemm_out *o, int64_t c0, int64_t C) {
    bool ok = c0 % 4 == 0 && C % 4 == 0;
    for (int k = 0; k < o->n; k++)
        ok = ok && o->O[k] % 4 == 0 && lm_aligned16(o->y[k]) && (!o->bias[k] || lm_aligned16(o->bias[k]));
    return ok;
}

template <int GLU>
static void lm_gemm_glu_go(lm_cuda *c, const lm_gemm_out *o, const float *prod, int terms, int64_t T) {
    const int64_t F = o->O[0];
    if (F % 4 == 0 && lm_aligned16(o->y[0]))
        lm_cuda_launch(c, lm_gemm_glu_kernel<GLU, 4>, lm_row_grid(F / 4, T), 256, 0, o->y[0], prod, terms, T, F);
    else lm_cuda_launch(c, lm_gemm_glu_kernel<GLU, 1>, lm_row_grid(F, T), 256, 0, o->y[0], prod, terms, T, F);
}

static void lm_gemm_glu_launch(lm_cuda *c, const lm_gemm_out *o, const float *prod, int terms, int64_t T) {
    if (o->glu == LM_GLU_SILU + 1) lm_gemm_glu_go<LM_GLU_SILU>(c, o, prod, terms, T);
    else if (o->glu == LM_GLU_GELU_TANH + 1) lm_gemm_glu_go<LM_GLU_GELU_TANH>(c, o, prod, terms, T);
    else lm_gemm_glu_go<LM_GLU_GELU>(c, o, prod, terms, T);
}

static int lm_gemm_terms(const lm_cuda *c) { return c->gemm_mode == LM_CUDA_GEMM_SPLIT ? 3 : 1; }

/* Columns of o's product: the rows of its stacked weights. */
static int64_t lm_gemm_cols(const lm_gemm_out *o) {
    int64_t O = 0;
    for (int i = 0; i < o->n; i++) O += o->O[i];
    return O;
}

/* Whether one product can take the stacked bf16 weights of o: its terms
 * side by side in the scratch, and a token a row of blocks (lm_row_grid; a
 * single part without glu can always go in row chunks or straight into y). */
bool lm_gemm_stackable(const lm_cuda *c, int64_t T, const lm_gemm_out *o) {
    return T <= 65535 && (size_t)lm_gemm_terms(c) * T * lm_gemm_cols(o) * sizeof(float) <= LM_GEMM_STACK_BYTES;
}

/* y = x W^T for more than LM_GEMV_MAX_T tokens, out as o says; W is [sum
 * O][I] (o->n > 1 or glu: bf16 only, lm_gemm_stackable). */
void lm_gemm(lm_cuda *c, int64_t T, const float *x, const void *w, lm_dtype wt, int64_t I, const lm_gemm_out *o) {
    const int64_t O = lm_gemm_cols(o);
    LM_ASSERT(T <= 0x7fffffff && O <= 0x7fffffff && I <= 0x7fffffff && (T * 3) <= 0x7fffffff);
    const bool single = o->n == 1 && !o->glu;
    LM_ASSERT(single || (wt == LM_BF16 && lm_gemm_stackable(c, T, o)));
    LM_ASSERT(!o->acc || (single && !o->bias[0]));
    const int m = (int)O, n = (int)T, k = (int)I;
    const float one = 1.0f, zero = 0.0f;
    float *y = o->y[0];
    const float *bias = o->bias[0];
    /* LUMEN_CUDA_SKIP (timing only): the products, or the kernels around them */
    const bool run_gemm = !lm_cuda_skip(c, LM_SKIP_GEMM), run_split = !lm_cuda_skip(c, LM_SKIP_GEMM_SPLIT);
    const bool split = c->gemm_mode == LM_CUDA_GEMM_SPLIT;
    const int terms = lm_gemm_terms(c);
    /* bf16 weights: the terms' products side by side in the scratch, then one
     * kernel sums and places them: all at once (stack), in row chunks of W
     * (chunk rows; a single part of few tokens: one read of W instead of
     * one a term), or (neither) straight into y, a product a term */
    const bool stack = wt == LM_BF16 && (terms > 1 || !single) && lm_gemm_stackable(c, T, o);
    int64_t chunk = 0;
    if (wt == LM_BF16 && single && split && !stack && T <= LM_GEMM_CHUNK_MAX_T)
        chunk = LM_MAX((int64_t)16, (int64_t)(LM_GEMM_STACK_BYTES / ((size_t)terms * T * sizeof(float))) / 16 * 16);
    /* straight into y: beta 1 adds to the bias it was filled with, or to
     * what it held (acc) */
    const float *beta_direct = bias || o->acc ? &one : &zero;
    if (bias && !stack && !chunk && run_split) {
        lm_cuda_launch(c, lm_bias_fill_kernel, lm_grid_1d(c, T * O, 256), 256, 0, y, bias, T, O);
        LM_CUDA_LAUNCHED("bias_fill");
    }
    /* cuBLAS calls and copies below: hashed by this description in a graph
     * pass (the kernels hash themselves), issued when `issue` */
    struct {
        int64_t T, O, I, chunk;
        const void *y, *x, *w, *bias, *ws;
        int wt, mode, stack;
    } desc;
    memset(&desc, 0, sizeof desc);
    desc.T = T, desc.O = O, desc.I = I, desc.chunk = chunk, desc.y = y, desc.x = x, desc.w = w, desc.bias = bias;
    desc.wt = (int)wt, desc.mode = c->gemm_mode, desc.stack = stack;
    if (wt == LM_F32) {
        if (!lm_cuda_gate(c, &desc, sizeof desc) || !run_gemm) return;
        /* column-major view: y^T (O x T) = W^T' (O x I) * x^T (I x T) */
        LM_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const float *)w, k, x, k,
                                    beta_direct, y, m));
        return;
    }
    const int64_t nx = T * I;
    /* hi, mid, lo back to back (3T rows of I) when that keeps 256-byte
     * alignment, then the scratch for the products */
    const size_t part = (size_t)nx * 2 % 256 == 0 ? (size_t)nx * 2 : lm_al256((size_t)nx * 2);
    const size_t scratch = stack ? (size_t)terms * T * O * sizeof(float)
                                 : (size_t)terms * T * (size_t)chunk * sizeof(float);
    unsigned char *ws = (unsigned char *)lm_cuda_matmul_ws(c, 256 + 3 * part + scratch);
    void *hi = ws + 256, *lo = split ? ws + 256 + part : NULL;
    float *prod = (float *)(ws + 256 + 3 * part);
    const unsigned th = 256, grid = lm_grid_1d(c, nx, 256);
    desc.ws = ws;
    const bool issue = lm_cuda_gate(c, &desc, sizeof desc) && run_gemm;
    if (wt == LM_BF16) {
        /* three terms: two left ~1e-4 between the cached (GEMV) and full
         * (GEMM) logits of hybrid and Gemma 4 fixtures on the H200 */
        void *lo3 = split ? ws + 256 + 2 * part : NULL;
        if (run_split) {
            if (nx % 4 == 0 && lm_aligned16(x) && part % 8 == 0)
                lm_cuda_launch(c, lm_split_bf16_kernel<4>, lm_grid_1d(c, nx / 4, 256), th, 0, (__nv_bfloat16 *)hi,
                               (__nv_bfloat16 *)lo, (__nv_bfloat16 *)lo3, x, nx);
            else
                lm_cuda_launch(c, lm_split_bf16_kernel<1>, grid, th, 0, (__nv_bfloat16 *)hi, (__nv_bfloat16 *)lo,
                               (__nv_bfloat16 *)lo3, x, nx);
            LM_CUDA_LAUNCHED("split_bf16");
        }
        const bool packed = part == (size_t)nx * 2; /* the terms are one [terms T][I] operand */
        if (stack || chunk) {
            for (int64_t r0 = 0; r0 < O; r0 += stack ? O : chunk) {
                const int64_t R = stack ? O : LM_MIN(chunk, O - r0);
                const void *wr = (const unsigned char *)w + (size_t)r0 * (size_t)I * 2;
                /* product terms [terms][T][R] (column-major R x terms T) */
                for (int t = 0; issue && t < (packed ? 1 : terms); t++)
                    LM_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)R, packed ? terms * n : n, k,
                                                 &one, wr, CUDA_R_16BF, k, (unsigned char *)hi + (size_t)t * part,
                                                 CUDA_R_16BF, k, &zero, prod + (size_t)t * T * R, CUDA_R_32F, (int)R,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                if (!run_split) continue;
                if (o->glu) lm_gemm_glu_launch(c, o, prod, terms, T);
                else if (lm_gemm_vec4(o, r0, R))
                    lm_cuda_launch(c, lm_gemm_scatter_kernel<4>, lm_row_grid(R / 4, T), 256, 0, *o,
                                   (const float *)prod, terms, T, r0, R);
                else
                    lm_cuda_launch(c, lm_gemm_scatter_kernel<1>, lm_row_grid(R, T), 256, 0, *o, (const float *)prod,
                                   terms, T, r0, R);
                LM_CUDA_LAUNCHED(o->glu ? "gemm_glu" : "gemm_scatter");
            }
            return;
        }
        if (!issue) return;
        LM_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF, k, hi,
                                     CUDA_R_16BF, k, beta_direct, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
        for (int term = 0; split && term < 2; term++)
            LM_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF, k,
                                         term ? lo3 : lo, CUDA_R_16BF, k, &one, y, CUDA_R_32F, m,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    LM_ASSERT(wt == LM_F16);
    /* ws[0..3]: amax bits; ws[16..27]: consts {1/s, 0, 1} */
    unsigned *amax = (unsigned *)ws;
    float *consts = (float *)(ws + 16);
    if (run_split) {
        if (issue) LM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof *amax, c->stream));
        lm_cuda_launch(c, lm_absmax_kernel, grid, th, 0, amax, x, nx);
        LM_CUDA_LAUNCHED("absmax");
        lm_cuda_launch(c, lm_split_f16_kernel, grid, th, 0, (__half *)hi, (__half *)lo, consts, amax, x, nx);
        LM_CUDA_LAUNCHED("split_f16");
    }
    if (!issue) return;
    LM_CUBLAS_CHECK(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_DEVICE));
    cublasStatus_t st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, consts, w, CUDA_R_16F, k, hi,
                                     CUDA_R_16F, k, bias || o->acc ? consts + 2 : consts + 1, y, CUDA_R_32F, m,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS && split)
        st = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, consts, w, CUDA_R_16F, k, lo, CUDA_R_16F, k,
                          consts + 2, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    LM_CUBLAS_CHECK(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST)); /* the handle is shared */
    LM_CUBLAS_CHECK(st);
}

/* An lm_gemm_out of n parts, every other field zero (padding too: a graph
 * pass hashes kernel arguments as bytes). */
lm_gemm_out lm_gemm_out0(int n) {
    lm_gemm_out o;
    memset(&o, 0, sizeof o);
    o.n = n;
    return o;
}

/* y (+)= x W^T (+ bias) into one output: lm_gemm's common case. */
void lm_gemm1(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias,
                     int64_t O, int64_t I, bool acc) {
    lm_gemm_out o = lm_gemm_out0(1);
    o.y[0] = y, o.bias[0] = bias, o.O[0] = O, o.acc = acc;
    lm_gemm(c, T, x, w, wt, I, &o);
}
