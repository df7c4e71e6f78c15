/* cpu_attention.c - kv_write and causal attention over the paged KV pool.
 *
 * Position p of sequence s lives in block block_tables[s][p / bs], slot
 * p % bs, at row (block * bs + slot) of the layer's [n_blocks*bs][width]
 * K and V arrays (width: lm_kv_layer_width, the layer's own); kv head g
 * occupies columns [g*Dh, (g+1)*Dh).
 *
 * attention() computes, for every (token, query head) pair,
 *   out = sum_j softmax_j(cap(scale * q.k_j)) v_j   over j in [lo, pos]
 * with lo = pos - window + 1 for sliding layers (else 0). Work items are a
 * token and up to LM_ATT_HEADS query heads that share one kv head (GQA), so
 * each K/V row fetched serves several heads; items are dealt to threads one
 * at a time through an atomic counter, since with causal masking late tokens
 * cost more than early ones.
 *
 * Softmax is the online (streaming) form, run by run: scores of up to
 * LM_ATT_CHUNK consecutive keys of one KV block go to a stack buffer, the running maximum m is updated,
 * the f32 output accumulator and the running denominator (kept in double) are
 * rescaled by exp(m_old - m_new), then the chunk's exp(s - m) weights are
 * added. Every exponent is <= 0, so nothing overflows, and the result equals
 * the two-pass softmax up to rounding. No scratch beyond the stack is needed
 * whatever the context length.
 *
 * KV formats (lm_kv_type.h): f32 rows are read in place; other formats are
 * decoded a run of at most LM_ATT_QROWS keys at a time (one KV block) into
 * a stack tile that every head of the item then reads, so the cache is
 * never copied wider. A rotated K (Q4R) is scored against the rotated
 * query; a rotated V leaves the output rotated until the end, where it is
 * turned back once per head. */
#include "cpu_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define LM_ATT_CHUNK 128   /* keys scored at once, at most (stack buffer) */
#define LM_ATT_HEADS 4     /* query heads of one kv head handled together */
#define LM_ATT_MAX_DH 1024 /* head width bound for the on-stack accumulators */
#define LM_ATT_QROWS 16    /* keys decoded at once from a non-f32 cache */

/* ---- kv_write ----------------------------------------------------------- */

static void lm_kv_check_slot(const lm_kv_pool *kv, const lm_attn_batch *b, int t) {
    LM_ASSERT(b->seq[t] >= 0 && b->seq[t] < b->n_seqs && b->pos[t] >= 0);
    int32_t blk = b->block_tables[b->seq[t]][b->pos[t] / kv->block_size];
    LM_ASSERT(blk >= 0 && blk < kv->n_blocks);
}

/* Row index of position p in a layer's K or V array. */
static int64_t lm_kv_row(const lm_kv_pool *kv, const int32_t *table, int32_t p) {
    return (int64_t)table[p / kv->block_size] * kv->block_size + p % kv->block_size;
}

void lm_cpu_kv_write(lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k,
                     const lm_tensor *v, const lm_attn_batch *b) {
    (void)be;
    LM_ASSERT(layer >= 0 && layer < kv->n_layers);
    LM_ASSERT(k->type == LM_F32 && v->type == LM_F32 && k->rows == b->n_tokens && v->rows == b->n_tokens);
    const int64_t w = lm_kv_layer_width(kv, layer);
    LM_ASSERT(k->cols == v->cols && k->cols <= w);
    const size_t kb = lm_kv_row_bytes(kv->k_type, w), vb = lm_kv_row_bytes(kv->v_type, w);
    for (int t = 0; t < b->n_tokens; t++) {
        lm_kv_check_slot(kv, b, t);
        int64_t r = lm_kv_row(kv, b->block_tables[b->seq[t]], b->pos[t]);
        lm_kv_encode_row(kv->k_type, (char *)kv->k[layer] + r * kb, (const float *)k->data + t * k->cols, k->cols,
                         w, kv->rot);
        lm_kv_encode_row(kv->v_type, (char *)kv->v[layer] + r * vb, (const float *)v->data + t * v->cols, v->cols,
                         w, kv->rot);
    }
}

/* ---- attention ------------------------------------------------------------ */

typedef struct lm_att {
    const lm_cpu_kern *k;
    float *out;
    const float *q;
    const lm_kv_pool *kv;
    const char *kl, *vl;  /* this layer's K and V rows */
    int64_t width;        /* values a row (the layer's own) */
    size_t kb, vb;        /* bytes a row */
    const lm_attn_batch *b;
    const lm_attn_params *p;
    int64_t q_cols, out_cols;
    int n_sub;            /* head subgroups per kv head */
    atomic_llong next;
} lm_att;

/* Rows [j0, j0 + n) (inside one block) of kv head columns [c0, c0 + Dh) of
 * a layer's array in format t: a pointer into the pool and its row stride
 * (f32), or decoded into buf [n][Dh] (stride Dh). */
static const float *lm_att_rows(const lm_att *a, lm_kv_type t, const char *l, size_t rb, int64_t row, int n,
                                int64_t c0, float *buf, int64_t *ld) {
    const int Dh = a->p->head_dim;
    if (t == LM_KV_F32) {
        *ld = a->width;
        return (const float *)(l + row * (int64_t)rb) + c0;
    }
    for (int j = 0; j < n; j++) lm_kv_decode(t, l + (row + j) * (int64_t)rb, c0, Dh, a->width, buf + j * Dh);
    *ld = Dh;
    return buf;
}

/* Query heads h0 .. h0+nh-1 (all reading the same kv head) of token t. The
 * keys are walked in runs that stay inside one KV block, so each run is a
 * strided array of rows; every head of the subgroup scores the run while it
 * is in L1. */
static void lm_att_item(const lm_att *a, int t, int h0, int nh) {
    const lm_attn_params *p = a->p;
    const lm_cpu_kern *k = a->k;
    const lm_kv_pool *kv = a->kv;
    const int Dh = p->head_dim, bs = kv->block_size;
    const int64_t goff = (int64_t)(h0 / (p->n_heads / p->n_kv_heads)) * Dh;
    const int32_t *table = a->b->block_tables[a->b->seq[t]];
    const int32_t pos = a->b->pos[t];
    const int32_t lo = p->window > 0 ? LM_MAX(0, pos - p->window + 1) : 0;
    const bool f32 = kv->k_type == LM_KV_F32 && kv->v_type == LM_KV_F32;
    const int chunk = f32 ? LM_ATT_CHUNK : LM_ATT_QROWS;
    float acc[LM_ATT_HEADS][LM_ATT_MAX_DH], m[LM_ATT_HEADS], s[LM_ATT_CHUNK];
    /* decoded runs and rotated queries (untouched for f32) */
    float kbuf[LM_ATT_QROWS * LM_ATT_MAX_DH], vbuf[LM_ATT_QROWS * LM_ATT_MAX_DH], qrot[LM_ATT_HEADS][LM_ATT_MAX_DH];
    const float *qh[LM_ATT_HEADS];
    double l[LM_ATT_HEADS];
    for (int hh = 0; hh < nh; hh++) {
        memset(acc[hh], 0, (size_t)Dh * sizeof(float));
        m[hh] = -INFINITY;
        l[hh] = 0.0;
        qh[hh] = a->q + t * a->q_cols + (int64_t)(h0 + hh) * Dh;
        if (kv->k_type == LM_KV_Q4R) {
            memcpy(qrot[hh], qh[hh], (size_t)Dh * sizeof(float));
            for (int i = 0; i < Dh; i += kv->rot) lm_kv_rotate(qrot[hh] + i, kv->rot);
            qh[hh] = qrot[hh];
        }
    }
    for (int32_t j0 = lo; j0 <= pos;) {
        int n = LM_MIN(bs - j0 % bs, LM_MIN(chunk, pos - j0 + 1));
        int64_t row = lm_kv_row(kv, table, j0), ldk, ldv;
        const float *kr = lm_att_rows(a, kv->k_type, a->kl, a->kb, row, n, goff, kbuf, &ldk);
        const float *vr = lm_att_rows(a, kv->v_type, a->vl, a->vb, row, n, goff, vbuf, &ldv);
        for (int hh = 0; hh < nh; hh++) {
            k->attn_scores(qh[hh], kr, ldk, n, Dh, p->scale, s);
            if (p->softcap > 0)
                for (int j = 0; j < n; j++) s[j] = p->softcap * tanhf(s[j] / p->softcap);
            float cmax = s[0];
            for (int j = 1; j < n; j++) cmax = cmax > s[j] ? cmax : s[j];
            if (cmax > m[hh]) {
                if (m[hh] != -INFINITY) {
                    float alpha = expf(m[hh] - cmax);
                    k->scal(acc[hh], alpha, Dh);
                    l[hh] *= alpha;
                }
                m[hh] = cmax;
            }
            l[hh] += k->attn_exp(s, n, m[hh]);
            k->attn_accum(acc[hh], s, vr, ldv, n, Dh);
        }
        j0 += n;
    }
    for (int hh = 0; hh < nh; hh++) {
        float *o = a->out + t * a->out_cols + (int64_t)(h0 + hh) * Dh;
        float inv = (float)(1.0 / l[hh]);
        for (int i = 0; i < Dh; i++) o[i] = acc[hh][i] * inv;
        if (kv->v_type == LM_KV_Q4R)
            for (int i = 0; i < Dh; i += kv->rot) lm_kv_unrotate(o + i, kv->rot);
    }
}

static void lm_att_worker(void *v, int ith, int nth) {
    (void)ith, (void)nth;
    lm_att *a = v;
    const int Hkv = a->p->n_kv_heads, gsz = a->p->n_heads / Hkv;
    const int64_t per_token = (int64_t)Hkv * a->n_sub, n = a->b->n_tokens * per_token;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (i >= n) break;
        int t = (int)(i / per_token), g = (int)(i % per_token) / a->n_sub, sub = (int)(i % a->n_sub);
        int h0 = g * gsz + sub * LM_ATT_HEADS;
        lm_att_item(a, t, h0, LM_MIN(LM_ATT_HEADS, gsz - sub * LM_ATT_HEADS));
    }
}

void lm_cpu_attention(lm_backend *be, lm_tensor *out, const lm_tensor *q, const lm_kv_pool *kv,
                      int layer, const lm_attn_batch *b, const lm_attn_params *p) {
    lm_cpu *c = lm_cpu_get(be);
    const int H = p->n_heads, Hkv = p->n_kv_heads, Dh = p->head_dim;
    LM_ASSERT(H > 0 && Hkv > 0 && H % Hkv == 0 && Dh > 0 && Dh <= LM_ATT_MAX_DH);
    LM_ASSERT(layer >= 0 && layer < kv->n_layers);
    const int64_t w = lm_kv_layer_width(kv, layer);
    LM_ASSERT((int64_t)Hkv * Dh <= w);
    LM_ASSERT(!(lm_kv_quantised(kv->k_type) || lm_kv_quantised(kv->v_type)) || w % LM_KV_GROUP == 0);
    if (kv->k_type == LM_KV_Q4R || kv->v_type == LM_KV_Q4R)
        LM_ASSERT(kv->rot >= 2 && kv->rot <= LM_KV_MAX_ROT && Dh % kv->rot == 0);
    LM_ASSERT(q->type == LM_F32 && out->type == LM_F32 && q->rows == b->n_tokens && out->rows == b->n_tokens);
    LM_ASSERT(q->cols >= (int64_t)H * Dh && out->cols >= (int64_t)H * Dh && out->data != q->data);
    for (int t = 0; t < b->n_tokens; t++) {
        lm_kv_check_slot(kv, b, t);
        /* Every block the token reads must exist: check the first and last. */
        const int32_t *table = b->block_tables[b->seq[t]];
        int32_t lo = p->window > 0 ? LM_MAX(0, b->pos[t] - p->window + 1) : 0;
        for (int32_t i = lo / kv->block_size; i <= b->pos[t] / kv->block_size; i++)
            LM_ASSERT(table[i] >= 0 && table[i] < kv->n_blocks);
    }
    lm_att a = {
        .k = c->k, .out = out->data, .q = q->data, .kv = kv, .kl = kv->k[layer], .vl = kv->v[layer],
        .width = w, .kb = lm_kv_row_bytes(kv->k_type, w), .vb = lm_kv_row_bytes(kv->v_type, w),
        .b = b, .p = p, .q_cols = q->cols, .out_cols = out->cols,
        .n_sub = (H / Hkv + LM_ATT_HEADS - 1) / LM_ATT_HEADS,
    };
    atomic_init(&a.next, 0);
    if (c->n_threads == 1 || (int64_t)b->n_tokens * Hkv * a.n_sub == 1) lm_att_worker(&a, 0, 1);
    else lm_pool_run(c->pool, lm_att_worker, &a);
}
