/* cuda_rope_kv.cu - the rope of q and k fused with the KV write, and the
 * per-head norms of q and k fused with both: the optional ops
 * rope_kv_write and norm_rope_kv_write of lm_backend.h, one launch each
 * where the plain ops take three or five (two with a quantised cache side).
 * The KV pool's layout and the plain
 * kv_write are cuda_attention.cu's; the batch is staged by
 * cuda_attention_stage.cu. */
#include "cuda_attention.h"

/* ---- rope of q and k, then the KV write, in one launch ------------------------- */

/* The cache formats a fused kernel writes itself (f32, bf16: value by value,
 * the bits lm_cuda_kv_write gives); with a quantised side (a scale per
 * group of 32) the kernel writes neither and lm_cuda_kv_write_fmt follows
 * it: two launches instead of three (five with the norms). */
static bool att_kv_put_ok(const lm_kv_pool *kv) {
    return (kv->k_type == LM_KV_F32 || kv->k_type == LM_KV_BF16) && (kv->v_type == LM_KV_F32 || kv->v_type == LM_KV_BF16);
}

/* Where the fused kernels write the cache: each side's rows and format
 * (write false: q and k only, the cache after). */
typedef struct att_kv_dst {
    unsigned char *kl, *vl;
    int64_t k_rb, v_rb; /* bytes a row */
    bool k_bf16, v_bf16, write;
} att_kv_dst;

static att_kv_dst att_kv_dst_of(const lm_kv_pool *kv, int layer) {
    att_kv_dst o;
    memset(&o, 0, sizeof o); /* padding too: a graph pass hashes the bytes */
    const int64_t w = lm_kv_layer_width(kv, layer);
    o.write = att_kv_put_ok(kv);
    o.kl = (unsigned char *)kv->k[layer], o.vl = (unsigned char *)kv->v[layer];
    o.k_rb = (int64_t)lm_kv_row_bytes(kv->k_type, w), o.v_rb = (int64_t)lm_kv_row_bytes(kv->v_type, w);
    o.k_bf16 = kv->k_type == LM_KV_BF16, o.v_bf16 = kv->v_type == LM_KV_BF16;
    return o;
}

/* Work items per token: Hq * half pairs of q, then per KV head half pairs
 * of k (rotated, written to k and to the cache) and, when the kernel
 * writes the cache, Dh - rot pass-through columns of k, then Hkv * Dh
 * columns of v. */
typedef struct att_rkv_args {
    float *q, *k;
    const float *v;
    int64_t q_ld, k_ld, v_ld;
    att_kv_dst o;
    const float *freq;
    double attn_factor;
    int Hq, Hkv, Dh, half, rot, bs;
    bool interleaved;
    att_dev d;
} att_rkv_args;

/* Items of one KV head of k, and of one token (att_rkv_args). */
static __host__ __device__ int64_t att_rkv_k_per(const att_rkv_args &a) { return a.half + (a.o.write ? a.Dh - a.rot : 0); }
static __host__ __device__ int64_t att_rkv_per(const att_rkv_args &a) {
    return (int64_t)a.Hq * a.half + (int64_t)a.Hkv * att_rkv_k_per(a) + (a.o.write ? (int64_t)a.Hkv * a.Dh : 0);
}

__global__ void att_rope_kv_kernel(att_rkv_args a, int64_t T) {
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int64_t n_q = (int64_t)a.Hq * a.half, k_per = att_rkv_k_per(a);
    const int64_t n_k = (int64_t)a.Hkv * k_per, per = att_rkv_per(a);
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < T * per;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / per, r = idx % per;
        const int32_t p = a.d.pos[t];
        if (r < n_q) {
            const int h = (int)(r / a.half), i = (int)(r % a.half);
            const int ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
            float *xh = a.q + t * a.q_ld + (int64_t)h * a.Dh;
            lm_rope_pair(&xh[ia], &xh[ib], p, a.freq[i], a.attn_factor);
            continue;
        }
        const int64_t row = (int64_t)a.d.tab[a.d.tab_off[a.d.seq[t]] + p / a.bs] * a.bs + p % a.bs;
        if (r < n_q + n_k) {
            const int h = (int)((r - n_q) / k_per), i = (int)((r - n_q) % k_per);
            float *xh = a.k + t * a.k_ld + (int64_t)h * a.Dh;
            unsigned char *kr = a.o.kl + row * a.o.k_rb;
            const int64_t c0 = (int64_t)h * a.Dh;
            if (i < a.half) {
                const int ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
                lm_rope_pair(&xh[ia], &xh[ib], p, a.freq[i], a.attn_factor);
                if (a.o.write) att_kv_put(kr, a.o.k_bf16, c0 + ia, xh[ia]), att_kv_put(kr, a.o.k_bf16, c0 + ib, xh[ib]);
            } else { /* past the rotated dimensions (only when writing) */
                const int j = a.rot + (i - a.half);
                att_kv_put(kr, a.o.k_bf16, c0 + j, xh[j]);
            }
            continue;
        }
        const int64_t col = r - n_q - n_k;
        att_kv_put(a.o.vl + row * a.o.v_rb, a.o.v_bf16, col, a.v[t * a.v_ld + col]);
    }
}

/* Whether q and k can be rotated in one launch with the KV write: one rope
 * for both, and whole heads in k and v. */
static bool att_one_rope(const lm_rope_params *rq, const lm_rope_params *rk, const lm_tensor *k, const lm_tensor *v) {
    return rq->head_dim == rk->head_dim && rq->rot_dim == rk->rot_dim && rq->interleaved == rk->interleaved &&
           rq->inv_freq == rk->inv_freq && rq->attn_factor == rk->attn_factor && rq->rot_dim > 0 &&
           k->cols == (int64_t)rk->n_heads * rk->head_dim && v->cols == k->cols;
}

void lm_cuda_rope_kv_write(lm_backend *be, lm_tensor *q, lm_tensor *k, const lm_tensor *v, const lm_rope_params *rq,
                           const lm_rope_params *rk, lm_kv_pool *kv, int layer, const lm_attn_batch *b) {
    lm_cuda *c = lm_cuda_of(be);
    if (!att_one_rope(rq, rk, k, v)) {
        lm_cuda_rope(be, q, b->pos, rq);
        lm_cuda_rope(be, k, b->pos, rk);
        lm_cuda_kv_write(be, kv, layer, k, v, b);
        return;
    }
    lm_cuda_use(c);
    const int64_t T = b->n_tokens;
    LM_ASSERT(layer >= 0 && layer < kv->n_layers && k->cols <= lm_kv_layer_width(kv, layer));
    LM_ASSERT(q->type == LM_F32 && k->type == LM_F32 && v->type == LM_F32);
    LM_ASSERT(q->rows == T && k->rows == T && v->rows == T);
    LM_ASSERT((int64_t)rq->n_heads * rq->head_dim <= q->cols && rq->rot_dim % 2 == 0 && rq->rot_dim <= rq->head_dim);
    if (T == 0) return;
    att_rkv_args a;
    memset(&a, 0, sizeof a); /* padding too: a graph pass hashes the bytes */
    a.d = att_stage_memo(c, kv, b, 0, true);
    a.freq = lm_cuda_freq(c, rq->inv_freq, rq->rot_dim / 2);
    a.q = (float *)q->data, a.k = (float *)k->data, a.v = (const float *)v->data;
    a.q_ld = q->cols, a.k_ld = k->cols, a.v_ld = v->cols, a.o = att_kv_dst_of(kv, layer);
    a.attn_factor = rq->attn_factor;
    a.Hq = rq->n_heads, a.Hkv = rk->n_heads, a.Dh = rq->head_dim, a.half = rq->rot_dim / 2, a.rot = rq->rot_dim;
    a.bs = kv->block_size, a.interleaved = rq->interleaved;
    const int64_t n = T * att_rkv_per(a), cap = (int64_t)LM_MAX(c->n_sms, 1) * 8;
    const unsigned blocks = (unsigned)LM_MAX((int64_t)1, LM_MIN((n + 255) / 256, cap));
    if (lm_cuda_skip(c, LM_SKIP_ROPE_KV)) return;
    lm_cuda_launch_pdl(c, att_rope_kv_kernel, blocks, 256, 0, a, T);
    LM_CUDA_LAUNCHED("att_rope_kv_kernel");
    if (!a.o.write) lm_cuda_kv_write_fmt(c, kv, layer, k, v, a.d);
}

/* ---- per-head norms of q and k, their rope, then the KV write ------------------- */

/* One warp per (token, head): q heads, then KV heads (each also copies its
 * v head to the cache). The warp norms the head with lm_norm_row_warp, as
 * lm_rms_norm_warp_kernel does (the same bits), rotates the pairs in shared
 * memory with lm_rope_pair as att_rope_kv_kernel does, and writes qn (or kn
 * and the K row). Two launches fewer than rms_norm, rms_norm,
 * rope_kv_write on a decode step of every layer with q/k norms. */
typedef struct att_nrkv_args {
    const float *q, *k, *v, *wq, *wk;
    float *qn, *kn;
    int64_t q_ld, k_ld, v_ld, qn_ld, kn_ld;
    att_kv_dst o;
    const float *freq;
    double attn_factor, eps, w_off;
    int Hq, Hkv, Dh, half, bs;
    bool interleaved;
    att_dev d;
} att_nrkv_args;

#define ATT_NRKV_THREADS 256

__global__ void __launch_bounds__(ATT_NRKV_THREADS) att_norm_rope_kv_kernel(att_nrkv_args a, int64_t T) {
    extern __shared__ float att_nrkv_smem[];
    lm_pdl_wait(); /* PDL: see cuda_internal.h */
    lm_pdl_trigger();
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5, n_w = ATT_NRKV_THREADS / 32;
    float *sh = att_nrkv_smem + (size_t)wib * a.Dh;
    const int units = a.Hq + a.Hkv, Dh = a.Dh;
    for (int64_t u = (int64_t)blockIdx.x * n_w + wib; u < T * units; u += (int64_t)gridDim.x * n_w) {
        const int64_t t = u / units;
        int h = (int)(u % units);
        const bool is_q = h < a.Hq;
        if (!is_q) h -= a.Hq;
        const float *x = is_q ? a.q + t * a.q_ld + (int64_t)h * Dh : a.k + t * a.k_ld + (int64_t)h * Dh;
        float *y = is_q ? a.qn + t * a.qn_ld + (int64_t)h * Dh : a.kn + t * a.kn_ld + (int64_t)h * Dh;
        lm_norm_row_warp(sh, x, is_q ? a.wq : a.wk, Dh, a.eps, a.w_off);
        __syncwarp();
        const int32_t p = a.d.pos[t];
        for (int i = lane; i < a.half; i += 32) {
            const int ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
            lm_rope_pair(&sh[ia], &sh[ib], p, a.freq[i], a.attn_factor);
        }
        __syncwarp();
        if (is_q || !a.o.write) {
            for (int i = lane; i < Dh; i += 32) y[i] = sh[i];
        } else {
            const int64_t row = (int64_t)a.d.tab[a.d.tab_off[a.d.seq[t]] + p / a.bs] * a.bs + p % a.bs;
            unsigned char *kr = a.o.kl + row * a.o.k_rb, *vr = a.o.vl + row * a.o.v_rb;
            const float *vx = a.v + t * a.v_ld + (int64_t)h * Dh;
            const int64_t c0 = (int64_t)h * Dh;
            for (int i = lane; i < Dh; i += 32) {
                y[i] = sh[i];
                att_kv_put(kr, a.o.k_bf16, c0 + i, sh[i]);
                att_kv_put(vr, a.o.v_bf16, c0 + i, vx[i]);
            }
        }
        __syncwarp(); /* the head is written before the next one fills sh */
    }
}

void lm_cuda_norm_rope_kv_write(lm_backend *be, lm_tensor *qn, const lm_tensor *q, lm_tensor *kn, const lm_tensor *k,
                                const lm_tensor *v, const lm_tensor *wq, const lm_tensor *wk, float eps,
                                float w_offset, const lm_rope_params *rq, const lm_rope_params *rk, lm_kv_pool *kv,
                                int layer, const lm_attn_batch *b) {
    lm_cuda *c = lm_cuda_of(be);
    const int Dh = rq->head_dim;
    /* one kernel: as rope_kv_write's, plus whole heads in q and per-head norm weights */
    const bool one = att_one_rope(rq, rk, k, v) && Dh <= 1024 && wq->rows == 1 && wq->cols == Dh && wk->rows == 1 &&
                     wk->cols == Dh && q->cols == (int64_t)rq->n_heads * Dh && qn->cols == q->cols &&
                     kn->cols == k->cols;
    if (!one || lm_cuda_skip(c, LM_SKIP_NORM) || lm_cuda_skip(c, LM_SKIP_ROPE_KV)) {
        lm_cuda_rms_norm(be, qn, q, wq, eps, w_offset);
        lm_cuda_rms_norm(be, kn, k, wk, eps, w_offset);
        lm_cuda_rope_kv_write(be, qn, kn, v, rq, rk, kv, layer, b);
        return;
    }
    lm_cuda_use(c);
    const int64_t T = b->n_tokens;
    LM_ASSERT(layer >= 0 && layer < kv->n_layers && k->cols <= lm_kv_layer_width(kv, layer));
    LM_ASSERT(q->type == LM_F32 && k->type == LM_F32 && v->type == LM_F32 && qn->type == LM_F32 &&
              kn->type == LM_F32 && wq->type == LM_F32 && wk->type == LM_F32);
    LM_ASSERT(q->rows == T && k->rows == T && v->rows == T && qn->rows == T && kn->rows == T);
    LM_ASSERT(rq->rot_dim % 2 == 0 && rq->rot_dim <= Dh);
    if (T == 0) return;
    att_nrkv_args a;
    memset(&a, 0, sizeof a); /* padding too: a graph pass hashes the bytes */
    a.d = att_stage_memo(c, kv, b, 0, true);
    a.freq = lm_cuda_freq(c, rq->inv_freq, rq->rot_dim / 2);
    a.q = (const float *)q->data, a.k = (const float *)k->data, a.v = (const float *)v->data;
    a.wq = (const float *)wq->data, a.wk = (const float *)wk->data;
    a.qn = (float *)qn->data, a.kn = (float *)kn->data;
    a.q_ld = q->cols, a.k_ld = k->cols, a.v_ld = v->cols, a.qn_ld = qn->cols, a.kn_ld = kn->cols;
    a.o = att_kv_dst_of(kv, layer);
    a.attn_factor = rq->attn_factor, a.eps = eps, a.w_off = w_offset;
    a.Hq = rq->n_heads, a.Hkv = rk->n_heads, a.Dh = Dh, a.half = rq->rot_dim / 2, a.bs = kv->block_size;
    a.interleaved = rq->interleaved;
    const int64_t warps = T * (a.Hq + a.Hkv), per_block = ATT_NRKV_THREADS / 32;
    const int64_t blocks = LM_MAX((int64_t)1, LM_MIN((warps + per_block - 1) / per_block, (int64_t)LM_MAX(c->n_sms, 1) * 8));
    lm_cuda_launch_pdl(c, att_norm_rope_kv_kernel, (unsigned)blocks, ATT_NRKV_THREADS,
                       (size_t)per_block * Dh * sizeof(float), a, T);
    LM_CUDA_LAUNCHED("att_norm_rope_kv_kernel");
    if (!a.o.write) lm_cuda_kv_write_fmt(c, kv, layer, kn, v, a.d);
}
