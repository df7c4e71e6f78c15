/* cuda_attention.h - what the attention kernels of cuda_attention.cu,
 * cuda_attention_tc.cu and cuda_attention_bf16.cu share: the staged batch,
 * the launch arguments and small device helpers;
 * and the staging (cuda_attention_stage.cu), which the KV writes of
 * cuda_attention.cu and cuda_rope_kv.cu share with the attention. */
#ifndef LUMEN_CUDA_ATTENTION_H
#define LUMEN_CUDA_ATTENTION_H

#include "cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define ATT_ROWS 64 /* query rows (token, head) per block of the tiled kernels */
#define ATT_MAX_SPLITS 64
#define ATT_FULL 0xffffffffu /* every lane of a warp (shuffle masks) */

/* The batch on the device: positions, sequences, the flattened block tables
 * (sequence s's at tab + tab_off[s]), plus whatever extra ints the caller
 * packed behind them (att_stage's `extra`). */
typedef struct att_dev {
    const int32_t *pos, *seq, *tab, *tab_off, *extra;
} att_dev;

/* cuda_attention_stage.cu: checks every token's slot and every block a
 * token reads ([lo, pos]; lo = pos for write_only, window > 0 narrows it),
 * then stages pos, seq, the tables and n_extra ints of extra in one copy.
 * att_stage_memo: the same without extra, staged once within a graph pass. */
att_dev att_stage(lm_cuda *c, const lm_kv_pool *kv, const lm_attn_batch *b, int window, bool write_only,
                  const int32_t *extra, size_t n_extra);
att_dev att_stage_memo(lm_cuda *c, const lm_kv_pool *kv, const lm_attn_batch *b, int window, bool write_only);

typedef struct att_args {
    float *out;
    const float *q, *kl, *vl; /* kl, vl: rows in the formats kt, vt (f32: kv_ld floats a row) */
    int64_t q_ld, out_ld, kv_ld;
    int kt, vt;               /* lm_kv_type of K and V */
    int64_t k_rb, v_rb, k_cb, v_cb; /* bytes a row, and where its scales start */
    att_dev d;
    const int32_t *tok;  /* token ids grouped by sequence */
    const int32_t *tiles; /* [n_tiles][4]: first index into tok, count, key lo, key hi */
    int bs, H, gsz, hb, n_sub, Dh, window, n_splits;
    float scale, softcap;
    float *pm, *pl, *pacc; /* partials [T][H][n_splits] (pacc times Dh) when n_splits > 1 */
    int *cnt; /* decode: per (token, blockIdx.y) split counters, the last split merges; NULL: a combine kernel does */
    int stages; /* the tensor-core decode kernel's key tiles a warp keeps in shared memory */
} att_args;

/* ---- KV formats (lm_kv_type.h) on the device ------------------------------------ */

/* Value c of row `row` of a layer's array in format t (rb bytes a row, its
 * scales at byte cb); for LM_KV_Q4R still rotated. */
__device__ __forceinline__ float att_kv_at(int t, const void *base, int64_t rb, int64_t cb, int64_t row, int64_t c) {
    const unsigned char *r = (const unsigned char *)base + row * rb;
    switch (t) {
    case LM_KV_F32: return ((const float *)r)[c];
    case LM_KV_BF16: return __uint_as_float((unsigned)((const unsigned short *)r)[c] << 16);
    case LM_KV_Q8: return __half2float(__ushort_as_half(((const unsigned short *)(r + cb))[c / 32])) * (float)((const signed char *)r)[c];
    default: {
        const unsigned b = r[c / 2];
        const int q = (int)((c & 1) ? b >> 4 : b & 15u) - 8;
        return __half2float(__ushort_as_half(((const unsigned short *)(r + cb))[c / 32])) * (float)q;
    }
    }
}

/* n consecutive values from c (c and n within one scale group). */
template <int N>
__device__ __forceinline__ void att_kv_span(int t, const void *base, int64_t rb, int64_t cb, int64_t row, int64_t c,
                                            float (&y)[N]) {
    const unsigned char *r = (const unsigned char *)base + row * rb;
    if (t == LM_KV_F32) {
#pragma unroll
        for (int i = 0; i < N; i++) y[i] = ((const float *)r)[c + i];
    } else if (t == LM_KV_BF16) {
#pragma unroll
        for (int i = 0; i < N; i++) y[i] = __uint_as_float((unsigned)((const unsigned short *)r)[c + i] << 16);
    } else {
        const float d = __half2float(__ushort_as_half(((const unsigned short *)(r + cb))[c / 32]));
        if (t == LM_KV_Q8) {
#pragma unroll
            for (int i = 0; i < N; i++) y[i] = d * (float)((const signed char *)r)[c + i];
        } else {
#pragma unroll
            for (int i = 0; i < N; i++) {
                const unsigned b = r[(c + i) / 2];
                y[i] = d * (float)((int)(((c + i) & 1) ? b >> 4 : b & 15u) - 8);
            }
        }
    }
}

/* A lane's N consecutive values (from c, inside one scale group) of a row in
 * format KT as they lie in memory, and their widening to f32 apart from the
 * load. The decode kernel loads keys ahead of their use: widening at the
 * load would wait on it there and serialise the loads; a raw word waits
 * only where it is widened. KT = LM_KV_Q4 also reads LM_KV_Q4R rows (the
 * rotation is undone outside). ATT_KV_ANY: the format is known only at run
 * time (rare K/V mixes), widened at the load by att_kv_span. */
#define ATT_KV_ANY (-1)
template <int KT, int N> struct att_kv_raw {
    static constexpr int BYTES = KT == LM_KV_F32 ? 4 * N : KT == LM_KV_BF16 ? 2 * N : KT == LM_KV_Q8 ? N : N / 2;
    static constexpr int NW = BYTES < 4 ? 1 : BYTES / 4;
    unsigned w[NW];
    unsigned short s; /* the group's f16 scale (q8, q4) */

    /* rows and c put every load on a multiple of its size: rows are padded
     * to 16 bytes (f32 and bf16 rows are whole heads), c a multiple of N */
    __device__ __forceinline__ void load(int, const void *base, int64_t rb, int64_t cb, int64_t row, int64_t c) {
        const unsigned char *r = (const unsigned char *)base + row * rb, *p = r + c * BYTES / N;
        if constexpr (BYTES >= 16) {
#pragma unroll
            for (int i = 0; i < BYTES / 16; i++) {
                const uint4 v = ((const uint4 *)p)[i];
                w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
            }
        } else if constexpr (BYTES == 8) {
            const uint2 v = *(const uint2 *)p;
            w[0] = v.x, w[1] = v.y;
        } else if constexpr (BYTES == 4) {
            w[0] = *(const unsigned *)p;
        } else if constexpr (BYTES == 2) {
            w[0] = *(const unsigned short *)p;
        } else {
            w[0] = *p;
        }
        if constexpr (KT == LM_KV_Q8 || KT == LM_KV_Q4) s = ((const unsigned short *)(r + cb))[c / 32];
    }
    /* the same products as att_kv_span: results equal bit for bit */
    __device__ __forceinline__ void widen(float (&y)[N]) const {
        if constexpr (KT == LM_KV_F32) {
#pragma unroll
            for (int i = 0; i < N; i++) y[i] = __uint_as_float(w[i]);
        } else if constexpr (KT == LM_KV_BF16) {
#pragma unroll
            for (int i = 0; i < N; i++) y[i] = __uint_as_float(i & 1 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16);
        } else {
            const float d = __half2float(__ushort_as_half(s));
#pragma unroll
            for (int i = 0; i < N; i++) {
                if constexpr (KT == LM_KV_Q8) y[i] = d * (float)(signed char)(w[i / 4] >> (8 * (i % 4)));
                else y[i] = d * (float)((int)((w[i / 8] >> (4 * (i % 8))) & 15u) - 8);
            }
        }
    }
};
template <int N> struct att_kv_raw<ATT_KV_ANY, N> {
    float y[N];
    __device__ __forceinline__ void load(int t, const void *base, int64_t rb, int64_t cb, int64_t row, int64_t c) {
        att_kv_span<N>(t, base, rb, cb, row, c, y);
    }
    __device__ __forceinline__ void widen(float (&o)[N]) const {
#pragma unroll
        for (int i = 0; i < N; i++) o[i] = y[i];
    }
};

/* Column c of a cache row in f32 or bf16 (the formats written value by
 * value; the quantised ones need a whole scale group: lm_cuda_kv_write_fmt).
 * bf16: rounded to nearest even with NaNs kept quiet, as lm_f32_to_bf16 on
 * the CPU. */
__device__ __forceinline__ void att_kv_put(unsigned char *row, bool bf16, int64_t c, float x) {
    if (!bf16) {
        ((float *)row)[c] = x;
        return;
    }
    const unsigned u = __float_as_uint(x);
    ((unsigned short *)row)[c] =
        (unsigned short)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* cuda_kv_format.cu: kv_write into rows of non-f32 formats (d staged for
 * the T tokens), and the rotation of LM_KV_Q4R on activation rows: y = R x
 * (or R^T x when inverse) per rot-wide piece of the first cols columns. */
void lm_cuda_kv_write_fmt(lm_cuda *c, lm_kv_pool *kv, int layer, const lm_tensor *k, const lm_tensor *v, att_dev d);
void lm_cuda_kv_rotate(lm_cuda *c, float *y, int64_t y_ld, const float *x, int64_t x_ld, int T, int64_t cols, int rot,
                       bool inverse);

/* 16 bytes global -> shared by cp.async, zeros when !ok (then nothing is
 * read; base, a valid global address, stands in for src). */
__device__ __forceinline__ void att_cp16(void *dst, const void *src, const void *base, bool ok) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(ok ? src : base), "r"(n) : "memory");
}

/* The max and the sum over the 4 lanes of an mma row (lanes 4g .. 4g + 3). */
__device__ __forceinline__ float att_max4(float x) {
    x = fmaxf(x, __shfl_xor_sync(ATT_FULL, x, 1));
    return fmaxf(x, __shfl_xor_sync(ATT_FULL, x, 2));
}

__device__ __forceinline__ float att_sum4(float x) {
    x += __shfl_xor_sync(ATT_FULL, x, 1);
    return x + __shfl_xor_sync(ATT_FULL, x, 2);
}

/* Row r of a tiled-attention block (tile = its record, hg its kv head, sub
 * its head subgroup): the token, query head, position and lowest key it
 * reads; token -1 for a row past the tile's tokens or the group's heads. */
__device__ __forceinline__ void att_tile_row(const att_args &a, int4 tile, int hg, int sub, int r, int *tok,
                                             int *head, int *pos, int *lo) {
    const int ti = r / a.hb, hh = sub * a.hb + r % a.hb;
    *tok = -1, *head = -1, *pos = -1, *lo = 0;
    if (ti < tile.y && hh < a.gsz) {
        *tok = a.tok[tile.x + ti];
        *head = hg * a.gsz + hh;
        *pos = a.d.pos[*tok];
        *lo = a.window > 0 ? max(0, *pos - a.window + 1) : 0;
    }
}

/* Split blockIdx.z's keys of a tile [k_lo, k_hi]: the tile's key range
 * cut into n_splits runs of a whole multiple of 32 keys (the last shorter,
 * or empty). */
__device__ __forceinline__ void att_tile_split(const att_args &a, int4 tile, int *k_lo, int *k_hi) {
    const int range = tile.w - tile.z + 1;
    const int chunk = ((range + a.n_splits - 1) / a.n_splits + 31) / 32 * 32;
    *k_lo = tile.z + (int)blockIdx.z * chunk;
    *k_hi = min(tile.w, *k_lo + chunk - 1);
}

/* ---- bf16 tensor-core pieces (the tiled bf16 kernel, the decode kernel) --------- */

/* d += a b on bf16 tensor cores (m16n8k16, f32 accumulation). */
__device__ __forceinline__ void att_bf_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 b16 matrices from shared memory (lane l gives row l % 8 of
 * matrix l / 8); .trans hands each lane a column pair instead of a row pair. */
__device__ __forceinline__ void att_bf_ldsm4(uint32_t (&r)[4], const __nv_bfloat16 *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void att_bf_ldsm4t(uint32_t (&r)[4], const __nv_bfloat16 *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* The three terms of two values as bf16x2 operands (lo in the low halves). */
__device__ __forceinline__ void att_bf_pack3(uint32_t (&h)[3], float lo, float hi) {
#pragma unroll
    for (int i = 0; i < 3; i++) {
        h[i] = lm_bf16x2_bits(lo, hi);
        lo -= __bfloat162float(__float2bfloat16_rn(lo));
        hi -= __bfloat162float(__float2bfloat16_rn(hi));
    }
}

/* An 8x8 b16 matrix transposed across the warp: lane (g, c) gives row g,
 * columns 2c and 2c + 1, and gets the same of the transpose. */
__device__ __forceinline__ uint32_t att_bf_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* The decode kernel on bf16 tensor cores (cuda_attention_decode_tc.cu), for
 * bf16, q8 and q4 (q4r) caches with K and V alike, heads 64, 128 or 256
 * wide, up to 8 query heads a kv head; results as the CUDA-core decode
 * kernel's (to ~1e-6). lm_att_decode_tc_blocks: its blocks an SM for this
 * layer's cache, or 0 where it does not apply (also tensor cores off, or
 * LUMEN_CUDA_ATT_DEC_TC=0); lm_att_decode_tc_launch then runs it on grid
 * (T, Hkv, n_splits). */
int lm_att_decode_tc_blocks(const lm_cuda *c, const lm_kv_pool *kv, int layer, int Dh, int gsz);
void lm_att_decode_tc_launch(lm_cuda *c, dim3 grid, att_args *a);

/* The tiled attention on tensor cores (cuda_attention_tc.cu), results as
 * the CUDA-core kernel's (to ~1e-6). lm_att_tc_rows: the query rows a block
 * takes (64 or 128; the host cuts its tiles so), or 0 where the kernel does
 * not apply: tensor cores off or absent, a head wider than 256, or rows that
 * 16-byte loads cannot read. K and V in f32, or both in bf16. lm_att_tc_launch
 * then runs it on a grid of tiles cut so. */
int lm_att_tc_rows(const lm_cuda *c, int Dh, int64_t q_ld, int64_t kv_ld, const void *q, const void *kl,
                   const void *vl);
void lm_att_tc_launch(lm_cuda *c, dim3 grid, const att_args *a);
/* The same over a bf16 cache on bf16 tensor cores (cuda_attention_bf16.cu):
 * q and the softmax weights in three bf16 terms (exact, to ~1e-6 as the
 * TF32 kernel), or rounded to bf16 with bf16 activations (one mma a
 * product). lm_att_bf16_rows: 64, or 0 where it does not apply (another
 * format, a head wider than 128 or not a multiple of 8, rows 16-byte loads
 * cannot read, LUMEN_CUDA_ATT_BF16=0); kv_ld: the cache row's width in
 * values. */
int lm_att_bf16_rows(const lm_cuda *c, int Dh, int64_t q_ld, int64_t kv_ld, int kt, int vt, const void *q,
                     const void *kl, const void *vl);
void lm_att_bf16_launch(lm_cuda *c, dim3 grid, const att_args *a);

#endif
