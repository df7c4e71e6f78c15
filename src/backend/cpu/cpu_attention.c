/* cpu_attention.c - kv_write and causal attention over the paged KV pool.
 *
 * Position p of sequence s lives in block block_tables[s][p / bs], slot
 * p % bs, at row (block * bs + slot) of the layer's [n_blocks*bs][kv_width]
 * K and V arrays; kv head g occupies columns [g*Dh, (g+1)*Dh).
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
 * whatever the context length. */
#include "cpu_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define LM_ATT_CHUNK 128   /* keys scored at once, at most (stack buffer) */
#define LM_ATT_HEADS 4     /* query heads of one kv head handled together */
#define LM_ATT_MAX_DH 1024 /* head width bound for the on-stack accumulators */

/* ---- kv_write ----------------------------------------------------------- */

static void lm_kv_check_slot(const lm_kv_pool *kv, const lm_attn_batch *b, int t) {
    LM_ASSERT(b->seq[t] >= 0 && b->seq[t] < b->n_seqs && b->pos[t] >= 0);
    int32_t blk = b->block_tables[b->seq[t]][b->pos[t] / kv->block_size];
    LM_ASSERT(blk >= 0 && blk < kv->n_blocks);
}

/* Offset, in floats, of position p's row in a layer's K or V array. */
static int64_t lm_kv_off(const lm_kv_pool *kv, const int32_t *table, int32_t p) {
    int64_t blk = table[p / kv->block_size];
    return (blk * kv->block_size + p % kv->block_size) * kv->kv_width;
}

void lm_cpu_kv_write(lm_backend *be, lm_kv_pool *kv, int layer, const lm_tensor *k,
                     const lm_tensor *v, const lm_attn_batch *b) {
    (void)be;
    LM_ASSERT(layer >= 0 && layer < kv->n_layers);
    LM_ASSERT(k->type == LM_F32 && v->type == LM_F32 && k->rows == b->n_tokens && v->rows == b->n_tokens);
    LM_ASSERT(k->cols == v->cols && k->cols <= kv->kv_width);
    size_t bytes = (size_t)k->cols * sizeof(float);
    for (int t = 0; t < b->n_tokens; t++) {
        lm_kv_check_slot(kv, b, t);
        const int32_t *table = b->block_tables[b->seq[t]];
        int64_t off = lm_kv_off(kv, table, b->pos[t]);
        memcpy(kv->k[layer] + off, (const float *)k->data + t * k->cols, bytes);
        memcpy(kv->v[layer] + off, (const float *)v->data + t * v->cols, bytes);
    }
}

/* ---- attention ------------------------------------------------------------ */

typedef struct lm_att {
    const lm_cpu_kern *k;
    float *out;
    const float *q;
    const lm_kv_pool *kv;
    const float *kl, *vl; /* this layer's K and V */
    const lm_attn_batch *b;
    const lm_attn_params *p;
    int64_t q_cols, out_cols;
    int n_sub;            /* head subgroups per kv head */
    atomic_llong next;
} lm_att;

/* Query heads h0 .. h0+nh-1 (all reading the same kv head) of token t. The
 * keys are walked in runs that stay inside one KV block, so each run is a
 * strided array of rows; every head of the subgroup scores the run while it
 * is in L1. */
static void lm_att_item(const lm_att *a, int t, int h0, int nh) {
    const lm_attn_params *p = a->p;
    const lm_cpu_kern *k = a->k;
    const int Dh = p->head_dim, bs = a->kv->block_size;
    const int64_t goff = (int64_t)(h0 / (p->n_heads / p->n_kv_heads)) * Dh, ld = a->kv->kv_width;
    const int32_t *table = a->b->block_tables[a->b->seq[t]];
    const int32_t pos = a->b->pos[t];
    const int32_t lo = p->window > 0 ? LM_MAX(0, pos - p->window + 1) : 0;
    float acc[LM_ATT_HEADS][LM_ATT_MAX_DH], m[LM_ATT_HEADS], s[LM_ATT_CHUNK];
    double l[LM_ATT_HEADS];
    for (int hh = 0; hh < nh; hh++) {
        memset(acc[hh], 0, (size_t)Dh * sizeof(float));
        m[hh] = -INFINITY;
        l[hh] = 0.0;
    }
    for (int32_t j0 = lo; j0 <= pos;) {
        int n = LM_MIN(bs - j0 % bs, LM_MIN(LM_ATT_CHUNK, pos - j0 + 1));
        int64_t off = lm_kv_off(a->kv, table, j0) + goff;
        for (int hh = 0; hh < nh; hh++) {
            const float *qv = a->q + t * a->q_cols + (int64_t)(h0 + hh) * Dh;
            k->attn_scores(qv, a->kl + off, ld, n, Dh, p->scale, s);
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
            k->attn_accum(acc[hh], s, a->vl + off, ld, n, Dh);
        }
        j0 += n;
    }
    for (int hh = 0; hh < nh; hh++) {
        float *o = a->out + t * a->out_cols + (int64_t)(h0 + hh) * Dh;
        float inv = (float)(1.0 / l[hh]);
        for (int i = 0; i < Dh; i++) o[i] = acc[hh][i] * inv;
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
    LM_ASSERT((int64_t)Hkv * Dh <= kv->kv_width && layer >= 0 && layer < kv->n_layers);
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
        .b = b, .p = p, .q_cols = q->cols, .out_cols = out->cols,
        .n_sub = (H / Hkv + LM_ATT_HEADS - 1) / LM_ATT_HEADS,
    };
    atomic_init(&a.next, 0);
    if (c->n_threads == 1 || (int64_t)b->n_tokens * Hkv * a.n_sub == 1) lm_att_worker(&a, 0, 1);
    else lm_pool_run(c->pool, lm_att_worker, &a);
}
