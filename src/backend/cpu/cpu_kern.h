/* cpu_kern.h - the per-ISA kernel table of the CPU backend.
 *
 * The op drivers (blocking, packing, threading) are written once in portable C
 * and call the few inner loops that differ per instruction set through this
 * table. cpu_kern_scalar.c, cpu_kern_avx2.c and cpu_kern_avx512.c each define
 * one table; the AVX files are compiled with their ISA flags (see
 * CMakeLists.txt) and only ever entered after lm_cpu_isa_detect() said the
 * machine has that ISA.
 *
 * Everything computes in f32 with f32 accumulators: activations are never
 * rounded to a narrower type, weights are widened exactly (bf16 by a shift,
 * f16 by F16C or the exact scalar routine, quants by lm_dequant_row).
 * The one exception is the quantised-activation GEMV and GEMM (lm_cpu_qkern
 * below), which round activations to int8 blocks to dot them with quant
 * weights in integer arithmetic; a separate table, so that it can be
 * switched off. */
#ifndef LM_CPU_KERN_H
#define LM_CPU_KERN_H

#include "../lm_backend.h"

#include <math.h>

/* Largest GEMV tile any table declares. */
#define LM_GEMV_MAX_ROWS 4
#define LM_GEMV_MAX_TOKENS 4

/* GEMV tile: for r < nr, t < nt:
 *   y[t*ldy + r] = sum_{i<n} w_r[i] * x[t*ldx + i] + (bias ? bias[r] : 0)
 * where w_r = (const char *)w + r*ldw holds n values of the kernel's dtype.
 * nr <= the table's gemv_rows, nt <= gemv_tokens. */
typedef void (*lm_gemv_fn)(const void *w, size_t ldw, int nr, const float *x, int64_t ldx,
                           int nt, int64_t n, const float *bias, float *y, int64_t ldy);

/* GEMM micro-tile: x points at token 0 of the tile, row stride ldx (rows
 * mt .. mr-1 are not read); wp is the packed weight panel [kc][nr] (outputs
 * fastest, 64-byte aligned, columns beyond nt zero). Updates the mt x nt
 * corner of the tile at y (row stride ldy):
 *   first ? y = bias + x.w (bias NULL: 0) : y += x.w */
typedef void (*lm_gemm_fn)(const float *x, int64_t ldx, const float *wp, int64_t kc, float *y,
                           int64_t ldy, int mt, int nt, const float *bias, bool first);

/* Packs nv <= nr weight rows (w: first row, already at the slice's first
 * column; ldw bytes per row) of kc values into the panel [kc][nr] as f32,
 * zero in columns nv .. nr-1. */
typedef void (*lm_pack_fn)(const void *w, size_t ldw, int nv, int64_t kc, float *wp);

/* Widens n contiguous values to f32. */
typedef void (*lm_to_f32_fn)(const void *src, float *dst, int64_t n);

/* Values [c0, c0 + n) of a w-wide KV row to f32 as lm_kv_decode does, bit
 * for bit; c0 and n multiples of LM_KV_GROUP. */
typedef void (*lm_kv_to_f32_fn)(const void *row, int64_t c0, int64_t n, int64_t w, float *y);

/* exp(x) below this is taken as 0 by attn_exp (and the attention's
 * rescale factors): e^-64 ~ 1.6e-28 is far below a sum whose largest term
 * is 1 (f32 resolves 6e-8), and the smaller values run into subnormals,
 * which Intel cores take through microcode assists: the attention of a
 * 512-token prefill took 1.5 s on one Sapphire Rapids core against 0.2-0.6 s
 * on a Zen 5 core, KV format regardless. */
#define LM_ATT_EXP_CUT (-64.0f)
/* exp(x) for x <= 0, 0 below LM_ATT_EXP_CUT: the scalar form of attn_exp's
 * weights, also the attention's rescale factors. */
static inline float lm_att_exp_cut(float x) { return x >= LM_ATT_EXP_CUT ? expf(x) : 0.0f; }

typedef struct lm_cpu_kern {
    lm_cpu_isa isa;
    /* GEMV (few tokens): per dtype, NULL where the driver must first widen the
     * weight rows to f32 and then use gemv[LM_F32]. */
    int gemv_rows, gemv_tokens;
    lm_gemv_fn gemv[LM_DTYPE_COUNT];
    /* Row widening (get_rows, GEMM packing); NULL: lm_dequant_row. */
    lm_to_f32_fn to_f32[LM_DTYPE_COUNT];
    /* GEMM (many tokens): micro-tile of mr tokens x nr outputs, cache blocking
     * kc (a multiple of 256, so quant rows split on block boundaries), and the
     * token count from which GEMM beats the GEMV tiles. */
    int mr, nr, kc, gemm_min_tokens;
    lm_gemm_fn gemm;
    /* Panel packers per dtype; pack[LM_F32] is always set and also packs
     * rows that the driver first widened with lm_dequant_row. */
    lm_pack_fn pack[LM_DTYPE_COUNT];
    /* Attention over a run of n keys/values stored as rows (stride ld floats):
     * scores s[j] = scale * (q . k_j); attn_exp turns them into exp(s[j] - m)
     * (0 below LM_ATT_EXP_CUT) and returns their sum; attn_accum adds
     * sum_j p[j] * v_j into o. */
    void (*attn_scores)(const float *q, const float *k, int64_t ldk, int n, int dh, float scale,
                        float *s);
    float (*attn_exp)(float *s, int n, float m);
    void (*attn_accum)(float *o, const float *p, const float *v, int64_t ldv, int n, int dh);
    void (*scal)(float *y, float a, int64_t n); /* y *= a */
    /* Quantised KV rows to f32 per format (NULL: lm_kv_decode). */
    lm_kv_to_f32_fn kv_to_f32[LM_KV_TYPE_COUNT];
    /* y = silu(g) * u over n values, every value by the same arithmetic
     * (masked tails), so a value does not depend on where a batch cut it;
     * NULL: the portable loop with libm's expf. */
    void (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
} lm_cpu_kern;

/* ---- quantised-activation GEMV (cpu_qdot_*.c) --------------------------
 *
 * For decode on quantised weights: each activation row is rounded once per
 * matmul to int8 blocks of 32 ("q8x": q = round(x / d), d = max|x| / 127),
 * then dotted with the weight blocks in integer arithmetic, the block scales
 * applied in f32. One token's q8x row of n values (n % 32 == 0) is laid out
 * as int8 q[n], then float d[n/32], then int16 s[n/16] (sums of q over each
 * 16 values, for the offsets/mins of the weight codes); rows of a batch are
 * ldq bytes apart (lm_q8x_row_bytes). */
#define LM_Q8X_BLOCK 32

size_t lm_q8x_row_bytes(int64_t n);
static inline const float *lm_q8x_d(const void *row, int64_t n) {
    return (const float *)((const int8_t *)row + n);
}
static inline const int16_t *lm_q8x_s(const void *row, int64_t n) {
    return (const int16_t *)((const int8_t *)row + n + n / 8);
}
/* Quantises n floats (n % 32 == 0) into one q8x row at dst. Portable. */
void lm_q8x_quantize(const float *x, int64_t n, void *dst);

/* Like lm_gemv_fn, with the activations given as nt q8x rows ldq bytes
 * apart; nr <= LM_GEMV_MAX_ROWS, nt <= LM_GEMV_MAX_TOKENS. */
typedef void (*lm_qgemv_fn)(const void *w, size_t ldw, int nr, const void *xq, size_t ldq, int nt,
                            int64_t n, const float *bias, float *y, int64_t ldy);

/* int8 GEMM micro-tile (prefill): panel holds nb blocks of LM_QP_ROWS
 * weight rows of type qt (codes up to the table's qgemm_max_code) as
 * cpu_qblock.h lays them out;
 * xq points at token 0's q8x codes of the panel's first block (rows ldq
 * bytes apart) and xf at its block factors, 4 floats per block (d, d * s0,
 * d * s1, d * (s0 + s1), with s0, s1 the sums of the halves' codes; tokens
 * ldf floats apart). Updates the mt x nv corner of the tile at y (row stride
 * ldy): first ? y = bias + x.w (bias NULL: 0) : y += x.w.
 * mt <= qgemm_mr, nv <= LM_QP_ROWS. */
struct lm_qblock_type;
typedef void (*lm_qgemm_fn)(const uint8_t *panel, int nb, const struct lm_qblock_type *qt, const int8_t *xq, size_t ldq,
                            const float *xf, int64_t ldf, int mt, int nv, float *y, int64_t ldy,
                            const float *bias, bool first);

typedef struct lm_cpu_qkern {
    const char *name;
    lm_qgemv_fn qgemv[LM_DTYPE_COUNT]; /* NULL: no int8 path for this dtype */
    /* int8 GEMM tile (NULL: prefill widens the weights to f32) and its
     * token count; the types it takes are those of lm_qblock_types. */
    lm_qgemm_fn qgemm;
    int qgemm_mr;
    int qgemm_max_code; /* the widest codes it takes (lm_qblock_type.max_code) */
    /* lm_qpanel_pack, byte for byte, for this ISA (NULL: the portable one) */
    void (*qpanel_pack)(lm_dtype t, const void *w, size_t ldw, int nv, int64_t b0, int nb, uint8_t *panel);
    /* lm_q8x_quantize, bit for bit, for this ISA (NULL: the portable one) */
    void (*q8x_quantize)(const float *x, int64_t n, void *dst);
} lm_cpu_qkern;

extern const lm_cpu_qkern lm_cpu_qkern_scalar; /* the reference */
extern const lm_cpu_qkern lm_cpu_qkern_avx2;
extern const lm_cpu_qkern lm_cpu_qkern_vnni; /* AVX-512 VNNI + VL */
/* The int8 GEMM tile for AVX-512 VNNI (cpu_qgemm_vnni.c). */
void lm_qgemm_vnni(const uint8_t *panel, int nb, const struct lm_qblock_type *qt, const int8_t *xq, size_t ldq,
                   const float *xf, int64_t ldf, int mt, int nv, float *y, int64_t ldy,
                   const float *bias, bool first);
#define LM_QGEMM_VNNI_MR 4
/* The int8 GEMM tile for AVX2 (cpu_qgemm_avx2.c). */
void lm_qgemm_avx2(const uint8_t *panel, int nb, const struct lm_qblock_type *qt, const int8_t *xq, size_t ldq,
                   const float *xf, int64_t ldf, int mt, int nv, float *y, int64_t ldy,
                   const float *bias, bool first);
#define LM_QGEMM_AVX2_MR 4
#define LM_QGEMM_AVX2_MAX_CODE 63 /* two vpmaddubsw steps in 16 bits */
void lm_q8x_quantize_avx2(const float *x, int64_t n, void *dst);
void lm_q8x_quantize_avx512(const float *x, int64_t n, void *dst);
/* Best int8 table for an ISA level (VNNI checked separately). */
const lm_cpu_qkern *lm_cpu_qkern_for(lm_cpu_isa isa);
bool lm_cpu_has_avx512_vnni(void);

/* FP8_B128 rows to f32, bit-identical to lm_dequant_row, and the FP8 GEMV
 * (cpu_fp8_avx2.c; the AVX2 and AVX-512 tables' to_f32 and gemv entries). */
void lm_cpu_fp8_to_f32_avx2(const void *src, float *dst, int64_t n);
void lm_cpu_fp8_gemv_avx2(const void *w, size_t ldw, int nr, const float *x, int64_t ldx, int nt, int64_t n,
                          const float *bias, float *y, int64_t ldy);
/* A4_* / A8_* rows to f32, bit-identical to lm_dequant_row (cpu_affine_avx2.c). */
void lm_cpu_a4_bf16_to_f32_avx2(const void *src, float *dst, int64_t n);
void lm_cpu_a4_f16_to_f32_avx2(const void *src, float *dst, int64_t n);
void lm_cpu_a8_bf16_to_f32_avx2(const void *src, float *dst, int64_t n);
void lm_cpu_a8_f16_to_f32_avx2(const void *src, float *dst, int64_t n);

/* Q8 and Q4 / Q4R KV rows to f32, bit-identical to lm_kv_decode (cpu_kv_avx2.c). */
void lm_cpu_kv_q8_to_f32_avx2(const void *row, int64_t c0, int64_t n, int64_t w, float *y);
void lm_cpu_kv_q4_to_f32_avx2(const void *row, int64_t c0, int64_t n, int64_t w, float *y);

extern const lm_cpu_kern lm_cpu_kern_scalar;
extern const lm_cpu_kern lm_cpu_kern_avx2;
extern const lm_cpu_kern lm_cpu_kern_avx512;

#endif
