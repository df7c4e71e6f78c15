/* cuda_dequant.cu - GGUF block-quantised weights widened on the GPU: rows to
 * f32 (get_rows of a quantised embedding table) or to bf16 (the operand of
 * a prefill product), and the matmul of more than LM_GEMV_MAX_T tokens over
 * quantised weights built on the latter.
 *
 * Prefill (lm_qgemm): the weight is widened to bf16 into a grow-only
 * workspace (lm_cuda_dequant_ws, at most LM_DEQUANT_WS_BYTES: larger
 * matrices go in row chunks) and multiplied by the bf16 tensor-core path of
 * cuda_gemm.cu (activations split in three terms in the exact mode,
 * lm_cuda_backend_quant_exact; else rounded to bf16). Fewer tokens take
 * cuda_mmq.cu (cuda_matmul.cu picks).
 * The widening costs one read of the quantised weight and a write and read
 * of its bf16 form, small against the product's flops at hundreds of tokens.
 * bf16 holds 8 significant bits, so a widened value is the block value
 * rounded (relative error <= 2^-9): the product is not the GEMV's
 * (exact f32 values) bit for bit, but close to it against the
 * quantisation's own error. */
#include "cuda_quant.h"

#include <cuda_bf16.h>

#define LM_DEQUANT_THREADS 256
#define LM_DEQUANT_WS_BYTES ((size_t)128 << 20) /* bf16 rows widened at once */

/* out row i (I values, f32 or bf16) = row src_i of w, src_i = ids[i] when
 * ids, else row0 + i; a thread a slice (cuda_quant.h). Indices in 32 bits
 * where they fit (a 64-bit division is a slow call); quads that land side by
 * side go out as one 16-byte store (bf16: 8 values). */
template <lm_dtype QT, bool BF16>
__global__ void lm_dequant_kernel(void *out, const unsigned char *w, int64_t I, const int32_t *ids, int64_t row0,
                                  int64_t n_rows) {
    using Q = lm_q<QT>;
    const int64_t per_row = I / Q::BV * Q::LPB, total = n_rows * per_row;
    const bool narrow = total <= (int64_t)0xffffffffu;
    const size_t ldw = (size_t)(I / Q::BV) * Q::BB;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r, k;
        if (narrow) {
            const unsigned u = (unsigned)i, pr = (unsigned)per_row, ru = u / pr;
            r = ru, k = u - ru * pr;
        } else {
            r = i / per_row, k = i % per_row;
        }
        const int64_t src = ids ? (int64_t)ids[r] : row0 + r;
        const int64_t b = k / Q::LPB;
        const int j = (int)(k % Q::LPB);
        const typename Q::raw v = Q::slice(w + (size_t)src * ldw + (size_t)b * Q::BB, j);
        const size_t base = (size_t)r * I + (size_t)b * Q::BV;
#pragma unroll
        for (int q = 0; q < Q::Q; q += 2) {
            float f[8];
            lm_q_quad<Q>(v, q, *(float(*)[4])f);
            const int at = Q::at(j, q);
            const bool pair = q + 1 < Q::Q && Q::at(j, q + 1) == at + 4 && at % 8 == 0;
            if (q + 1 < Q::Q) lm_q_quad<Q>(v, q + 1, *(float(*)[4])(f + 4));
            if constexpr (BF16) {
                uint32_t u[4];
#pragma unroll
                for (int e = 0; e < 4; e++) u[e] = lm_bf16x2_bits(f[2 * e], f[2 * e + 1]);
                __nv_bfloat16 *o = (__nv_bfloat16 *)out + base;
                /* explicit vector stores: plain ones came out as 4-byte pieces */
                if (pair) {
                    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(o + at), "r"(u[0]), "r"(u[1]),
                                 "r"(u[2]), "r"(u[3])
                                 : "memory");
                } else {
                    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(o + at), "r"(u[0]), "r"(u[1]) : "memory");
                    if (q + 1 < Q::Q)
                        asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(o + Q::at(j, q + 1)), "r"(u[2]),
                                     "r"(u[3])
                                     : "memory");
                }
            } else {
                float *o = (float *)out + base;
                *(float4 *)(o + at) = make_float4(f[0], f[1], f[2], f[3]);
                if (q + 1 < Q::Q) *(float4 *)(o + Q::at(j, q + 1)) = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    }
}

/* One type's launch (lm_dequant_go picks the type). */
template <lm_dtype QT, bool BF16>
static void lm_dequant_one(lm_cuda *c, unsigned g, void *out, const unsigned char *w, int64_t I, const int32_t *ids,
                           int64_t row0, int64_t n) {
    lm_cuda_launch(c, lm_dequant_kernel<QT, BF16>, g, LM_DEQUANT_THREADS, 0, out, w, I, ids, row0, n);
}

/* n rows of w (any lm_cuda_qtype; ids or row0 as the kernel) widened into
 * out, bf16 or f32. */
template <bool BF16>
static void lm_dequant_go(lm_cuda *c, void *out, const void *w, lm_dtype wt, int64_t I, const int32_t *ids,
                          int64_t row0, int64_t n) {
    const unsigned char *wb = (const unsigned char *)w;
    const int64_t slices = n * (I / lm_dtype_block(wt)) * (lm_dtype_block(wt) == 32 ? 2 : 8);
    const unsigned g = lm_grid_1d(c, slices, LM_DEQUANT_THREADS);
    switch (wt) {
    case LM_Q8_0: lm_dequant_one<LM_Q8_0, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q4_0: lm_dequant_one<LM_Q4_0, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q4_1: lm_dequant_one<LM_Q4_1, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q5_0: lm_dequant_one<LM_Q5_0, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q5_1: lm_dequant_one<LM_Q5_1, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_IQ4_NL: lm_dequant_one<LM_IQ4_NL, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q4_K: lm_dequant_one<LM_Q4_K, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q5_K: lm_dequant_one<LM_Q5_K, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q6_K: lm_dequant_one<LM_Q6_K, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_IQ4_XS: lm_dequant_one<LM_IQ4_XS, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q2_K: lm_dequant_one<LM_Q2_K, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_Q3_K: lm_dequant_one<LM_Q3_K, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_FP8_B128: lm_dequant_one<LM_FP8_B128, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_A4_BF16: lm_dequant_one<LM_A4_BF16, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_A4_F16: lm_dequant_one<LM_A4_F16, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_A8_BF16: lm_dequant_one<LM_A8_BF16, BF16>(c, g, out, wb, I, ids, row0, n); break;
    case LM_A8_F16: lm_dequant_one<LM_A8_F16, BF16>(c, g, out, wb, I, ids, row0, n); break;
    default: LM_ASSERT(!"dequant: weight type");
    }
    LM_CUDA_LAUNCHED("dequant");
}

/* n rows of the quantised [.][I] matrix w (rows ids[i] on the device, or
 * row0 + i) widened to f32 into out [n][I]; out 16-byte aligned. */
void lm_cuda_dequant_f32(lm_cuda *c, float *out, const void *w, lm_dtype wt, int64_t I, const int32_t *ids,
                         int64_t row0, int64_t n) {
    LM_ASSERT(lm_cuda_qtype(wt) && I % lm_dtype_block(wt) == 0 && lm_aligned16(out));
    if (n > 0 && I > 0) lm_dequant_go<false>(c, out, w, wt, I, ids, row0, n);
}

/* y[t][c0 + j] = p[t][j] (+ bias[c0 + j]) for j < C: a row chunk's product
 * into its columns of y [T][O]. */
__global__ void lm_qgemm_place_kernel(float *y, const float *p, int64_t T, int64_t O, int64_t c0, int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < T * C; i += (int64_t)gridDim.x * blockDim.x)
        y[(i / C) * O + c0 + i % C] = p[i];
}

/* y = x W^T (+ bias) for T > LM_GEMV_MAX_T tokens (or operands the GEMV
 * does not take) over a quantised W [O][I]: rows widened to bf16, then
 * cuda_gemm.cu's bf16 product, straight into y when the whole matrix fits
 * the workspace, else in row chunks through a [T][chunk] product that a
 * kernel places into y's columns. */
static void lm_qgemm_widened(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt,
                             const float *bias, int64_t O, int64_t I) {
    LM_ASSERT(lm_cuda_qtype(wt) && I % lm_dtype_block(wt) == 0);
    const size_t row_bytes = (size_t)I * 2, qrow = lm_dtype_row_bytes(wt, I);
    int64_t chunk = (int64_t)(LM_DEQUANT_WS_BYTES / row_bytes) / 16 * 16;
    if (chunk < 16) chunk = 16;
    if (chunk >= O) {
        __nv_bfloat16 *wb = (__nv_bfloat16 *)lm_cuda_dequant_ws(c, (size_t)O * row_bytes);
        lm_dequant_go<true>(c, wb, w, wt, I, NULL, 0, O);
        lm_gemm1(c, T, y, x, wb, LM_BF16, bias, O, I, false);
        return;
    }
    const size_t wbytes = (size_t)chunk * row_bytes;
    unsigned char *ws = (unsigned char *)lm_cuda_dequant_ws(c, wbytes + (size_t)T * chunk * sizeof(float));
    __nv_bfloat16 *wb = (__nv_bfloat16 *)ws;
    float *p = (float *)(ws + wbytes);
    for (int64_t r0 = 0; r0 < O; r0 += chunk) {
        const int64_t n = LM_MIN(chunk, O - r0);
        lm_dequant_go<true>(c, wb, (const unsigned char *)w + (size_t)r0 * qrow, wt, I, NULL, 0, n);
        lm_gemm1(c, T, p, x, wb, LM_BF16, bias ? bias + r0 : NULL, n, I, false);
        lm_cuda_launch(c, lm_qgemm_place_kernel, lm_grid_1d(c, T * n, 256), 256, 0, y, (const float *)p, T, O, r0, n);
        LM_CUDA_LAUNCHED("qgemm_place");
    }
}

/* lm_qgemm_widened with x as three bf16 terms in the exact mode, else
 * rounded to bf16 (one product instead of three: 2.6x the 4k prefill of a
 * Llama-8B Q4_K_M on the H200). The default mode rounds x coarser still in
 * the GEMV and cuda_mmq.cu (int8 a 32 values), so bf16 loses nothing it
 * keeps elsewhere. */
void lm_qgemm(lm_cuda *c, int64_t T, float *y, const float *x, const void *w, lm_dtype wt, const float *bias,
              int64_t O, int64_t I) {
    const int mode = c->gemm_mode;
    if (!c->quant_exact) c->gemm_mode = LM_CUDA_GEMM_BF16;
    lm_qgemm_widened(c, T, y, x, w, wt, bias, O, I);
    c->gemm_mode = mode;
}
