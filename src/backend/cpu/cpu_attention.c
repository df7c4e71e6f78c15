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
/* Queries (tokens x heads) of one item at most, and the floats their
 * accumulators may fill (one token of LM_ATT_HEADS widest heads fits): wide
 * heads get fewer tokens. */
#define LM_ATT_TILE_Q 64
/* Keys of one softmax segment: a token's keys are cut at multiples of this
 * and the segments merged, so that a long decode splits over threads with
 * the very arithmetic of the serial walk. */
#define LM_ATT_SEG 512
/* Partial states a split decode may keep (floats of accumulators). */
#define LM_ATT_SPLIT_MAX_FLOATS ((size_t)16 << 20)
#define LM_ATT_ACC_FLOATS 8192
_Static_assert(LM_ATT_HEADS * LM_ATT_MAX_DH <= LM_ATT_ACC_FLOATS, "one token of an item always fits");

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
    int tile;             /* batch tokens an item takes (lm_att_tile) */
    int n_seg;            /* split decode: segments a token's item is cut into, at most */
    const int32_t *seg0;  /* split decode: [T] first segment of each token's keys */
    float *part_acc, *part_m;
    double *part_l;
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
    /* vectorised and exact: bf16 widening; whole scale groups of a quantised row */
    lm_to_f32_fn widen = t == LM_KV_BF16 ? a->k->to_f32[LM_BF16] : NULL;
    lm_kv_to_f32_fn groups = c0 % LM_KV_GROUP == 0 && Dh % LM_KV_GROUP == 0 ? a->k->kv_to_f32[t] : NULL;
    for (int j = 0; j < n; j++) {
        const char *r = l + (row + j) * (int64_t)rb;
        if (widen) widen(r + 2 * c0, buf + j * Dh, Dh);
        else if (groups) groups(r, c0, Dh, a->width, buf + j * Dh);
        else lm_kv_decode(t, r, c0, Dh, a->width, buf + j * Dh);
    }
    *ld = Dh;
    return buf;
}

/* Output of token t, head h: the merged accumulator over its denominator,
 * turned back when V is stored rotated. */
static void lm_att_out(const lm_att *a, int t, int h, const float *acc, double l) {
    const int Dh = a->p->head_dim;
    float *o = a->out + t * a->out_cols + (int64_t)h * Dh;
    float inv = (float)(1.0 / l);
    for (int c = 0; c < Dh; c++) o[c] = acc[c] * inv;
    if (a->kv->v_type == LM_KV_Q4R)
        for (int c = 0; c < Dh; c += a->kv->rot) lm_kv_unrotate(o + c, a->kv->rot);
}

/* The online softmax state of one (token, query head): the segment being
 * walked (acc, m, l: unnormalised output, maximum, denominator), the
 * segments before it merged (tacc, tm, tl), and the query row. */
typedef struct lm_att_q {
    float *acc, *tacc;
    const float *q;
    float m, tm;
    double l, tl;
} lm_att_q;

/* A softmax over keys A and one over keys B, merged into one over both: the
 * same arithmetic in the serial walk and in the split decode, so a token's
 * output never depends on which of the two ran it. */
static void lm_att_merge(float *tm, double *tl, float *tacc, float m, double l, const float *acc, int Dh) {
    if (m == -INFINITY) return; /* no key of this segment */
    if (*tm == -INFINITY) {
        memcpy(tacc, acc, (size_t)Dh * sizeof(float));
        *tm = m, *tl = l;
        return;
    }
    const float mx = *tm > m ? *tm : m, fa = lm_att_exp_cut(*tm - mx), fb = lm_att_exp_cut(m - mx);
    for (int c = 0; c < Dh; c++) tacc[c] = tacc[c] * fa + acc[c] * fb;
    *tl = *tl * fa + l * fb;
    *tm = mx;
}

/* The first key position token t sees: pos - window + 1 on a sliding
 * layer, else 0. */
static inline int32_t lm_att_lo(const lm_attn_params *p, const lm_attn_batch *b, int t) {
    return p->window > 0 ? LM_MAX(0, b->pos[t] - p->window + 1) : 0;
}

/* The heads of item (kv head group g, subgroup sub): *h0 and *nh of the
 * group's n_heads / n_kv_heads, LM_ATT_HEADS at a time. */
static inline void lm_att_heads(const lm_att *a, int g, int sub, int *h0, int *nh) {
    const int gsz = a->p->n_heads / a->p->n_kv_heads;
    *h0 = g * gsz + sub * LM_ATT_HEADS;
    *nh = LM_MIN(LM_ATT_HEADS, gsz - sub * LM_ATT_HEADS);
}

/* Keys [j0, j0 + n) (one KV block, one segment) into the segment states
 * of tokens t0 .. t0+nt-1, heads h0 .. h0+nh-1: token t takes the keys of
 * [lo_t, pos_t] among them. */
static void lm_att_keys(const lm_att *a, int t0, int nt, int nh, lm_att_q *qs, int32_t j0, int n, const float *kr,
                        int64_t ldk, const float *vr, int64_t ldv) {
    const lm_attn_params *p = a->p;
    const lm_cpu_kern *k = a->k;
    const int Dh = p->head_dim;
    float s[LM_ATT_CHUNK];
    for (int tt = 0; tt < nt; tt++) {
        const int32_t pos = a->b->pos[t0 + tt], tlo = lm_att_lo(p, a->b, t0 + tt);
        const int ja = LM_MAX(0, tlo - j0), jb = LM_MIN(n, pos - j0 + 1); /* keys [ja, jb) of the run */
        if (ja >= jb) continue;
        const int nn = jb - ja;
        for (int hh = 0; hh < nh; hh++) {
            lm_att_q *e = &qs[tt * nh + hh];
            k->attn_scores(e->q, kr + ja * ldk, ldk, nn, Dh, p->scale, s);
            if (p->softcap > 0)
                for (int j = 0; j < nn; j++) s[j] = p->softcap * tanhf(s[j] / p->softcap);
            float cmax = s[0];
            for (int j = 1; j < nn; j++) cmax = cmax > s[j] ? cmax : s[j];
            if (cmax > e->m) {
                if (e->m != -INFINITY) {
                    float alpha = lm_att_exp_cut(e->m - cmax);
                    k->scal(e->acc, alpha, Dh);
                    e->l *= alpha;
                }
                e->m = cmax;
            }
            e->l += k->attn_exp(s, nn, e->m);
            k->attn_accum(e->acc, s, vr + ja * ldv, ldv, nn, Dh);
        }
    }
}

/* Where a split decode leaves the segment state of each of its nh heads:
 * acc [nh][Dh], m [nh], l [nh]. */
typedef struct lm_att_part {
    float *acc, *m;
    double *l;
} lm_att_part;

/* Tokens t0 .. t0+nt-1 of one sequence, heads h0 .. h0+nh-1 (all reading
 * the same kv head). The keys are walked in runs that stay inside one KV
 * block (a strided array of rows, decoded once when the cache is not f32)
 * and every (token, head) scores the run while it is in L1: in a prefill,
 * one decoded run serves nt * nh queries. Token t sees keys [lo_t, pos_t].
 * Each LM_ATT_SEG-key segment is a softmax of its own, merged into the
 * result in order (lm_att_merge). With part, only keys of segment `seg`
 * are walked, and their state is stored there instead of the output. */
static void lm_att_run(const lm_att *a, int t0, int nt, int h0, int nh, float *accs, int seg,
                       const lm_att_part *part) {
    const lm_attn_params *p = a->p;
    const lm_kv_pool *kv = a->kv;
    const int Dh = p->head_dim, bs = kv->block_size;
    const int64_t goff = (int64_t)(h0 / (p->n_heads / p->n_kv_heads)) * Dh;
    const int32_t *table = a->b->block_tables[a->b->seq[t0]];
    int32_t lo = INT32_MAX, last = -1; /* keys any of the tokens sees */
    for (int tt = 0; tt < nt; tt++) {
        lo = LM_MIN(lo, lm_att_lo(p, a->b, t0 + tt));
        last = LM_MAX(last, a->b->pos[t0 + tt]);
    }
    if (part) {
        lo = LM_MAX(lo, seg * LM_ATT_SEG);
        last = LM_MIN(last, (seg + 1) * LM_ATT_SEG - 1);
    }
    const bool f32 = kv->k_type == LM_KV_F32 && kv->v_type == LM_KV_F32;
    const int chunk = f32 ? LM_ATT_CHUNK : LM_ATT_QROWS;
    /* decoded runs and rotated queries (untouched for f32) */
    float kbuf[LM_ATT_QROWS * LM_ATT_MAX_DH], vbuf[LM_ATT_QROWS * LM_ATT_MAX_DH];
    lm_att_q qs[LM_ATT_TILE_Q];
    for (int i = 0; i < nt * nh; i++) {
        const int tt = i / nh, hh = i % nh;
        lm_att_q *e = &qs[i];
        e->acc = accs + (size_t)i * Dh;
        e->tacc = accs + LM_ATT_ACC_FLOATS + (size_t)i * Dh;
        memset(e->acc, 0, (size_t)Dh * sizeof(float));
        e->m = e->tm = -INFINITY, e->l = e->tl = 0.0;
        e->q = a->q + (t0 + tt) * a->q_cols + (int64_t)(h0 + hh) * Dh;
        if (kv->k_type == LM_KV_Q4R) { /* the rotated query in the third part of accs */
            float *qr = accs + 2 * LM_ATT_ACC_FLOATS + (size_t)i * Dh;
            memcpy(qr, e->q, (size_t)Dh * sizeof(float));
            for (int c = 0; c < Dh; c += kv->rot) lm_kv_rotate(qr + c, kv->rot);
            e->q = qr;
        }
    }
    for (int32_t j0 = lo; j0 <= last;) {
        const int32_t seg_end = (j0 / LM_ATT_SEG + 1) * LM_ATT_SEG;
        const int n = LM_MIN(LM_MIN(bs - j0 % bs, seg_end - j0), LM_MIN(chunk, last - j0 + 1));
        int64_t row = lm_kv_row(kv, table, j0), ldk, ldv;
        const float *kr = lm_att_rows(a, kv->k_type, a->kl, a->kb, row, n, goff, kbuf, &ldk);
        const float *vr = lm_att_rows(a, kv->v_type, a->vl, a->vb, row, n, goff, vbuf, &ldv);
        lm_att_keys(a, t0, nt, nh, qs, j0, n, kr, ldk, vr, ldv);
        j0 += n;
        if (!part && (j0 == seg_end || j0 > last)) /* a segment done: into the result */
            for (int i = 0; i < nt * nh; i++) {
                lm_att_q *e = &qs[i];
                lm_att_merge(&e->tm, &e->tl, e->tacc, e->m, e->l, e->acc, Dh);
                memset(e->acc, 0, (size_t)Dh * sizeof(float));
                e->m = -INFINITY, e->l = 0.0;
            }
    }
    if (part) {
        for (int hh = 0; hh < nh; hh++) {
            memcpy(part->acc + (size_t)hh * Dh, qs[hh].acc, (size_t)Dh * sizeof(float));
            part->m[hh] = qs[hh].m, part->l[hh] = qs[hh].l;
        }
        return;
    }
    for (int i = 0; i < nt * nh; i++)
        lm_att_out(a, t0 + i / nh, h0 + i % nh, qs[i].tacc, qs[i].tl);
}

/* Item i: tile i / per_tile of a->tile tokens (the last tiles, whose
 * tokens see the most keys, first), kv head group and head subgroup
 * i % per_tile. A tile is cut into runs of one sequence; a decode batch
 * (one token a sequence) has runs of 1. */
static void lm_att_worker(void *v, int ith, int nth) {
    (void)ith, (void)nth;
    lm_att *a = v;
    const int Hkv = a->p->n_kv_heads, T = a->b->n_tokens;
    const int64_t per_tile = (int64_t)Hkv * a->n_sub, n_tiles = (T + a->tile - 1) / a->tile, n = n_tiles * per_tile;
    float accs[3 * LM_ATT_ACC_FLOATS]; /* segment accumulators, merged ones, rotated queries */
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (i >= n) break;
        const int tile = (int)(n_tiles - 1 - i / per_tile), g = (int)(i % per_tile) / a->n_sub, sub = (int)(i % a->n_sub);
        int h0, nh;
        lm_att_heads(a, g, sub, &h0, &nh);
        const int te = LM_MIN(T, (tile + 1) * a->tile);
        for (int t0 = tile * a->tile; t0 < te;) {
            int nt = 1;
            while (t0 + nt < te && a->b->seq[t0 + nt] == a->b->seq[t0]) nt++;
            lm_att_run(a, t0, nt, h0, nh, accs, 0, NULL);
            t0 += nt;
        }
    }
}

/* ---- split decode: one token's segments on several threads -------------- */

/* The state of (token t, head item gs, segment s) of a split decode. */
static lm_att_part lm_att_part_at(const lm_att *a, int64_t item) {
    const int Dh = a->p->head_dim;
    return (lm_att_part){ a->part_acc + (size_t)item * LM_ATT_HEADS * Dh, a->part_m + item * LM_ATT_HEADS,
                          a->part_l + item * LM_ATT_HEADS };
}

/* Phase 1, item (t, gs, s): segment s of token t's keys. */
static void lm_att_split_worker(void *v, int ith, int nth) {
    (void)ith, (void)nth;
    lm_att *a = v;
    const int64_t per_token = (int64_t)a->p->n_kv_heads * a->n_sub, n = a->b->n_tokens * per_token * a->n_seg;
    float accs[3 * LM_ATT_ACC_FLOATS];
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (i >= n) break;
        const int t = (int)(i / (per_token * a->n_seg)), gs = (int)(i / a->n_seg % per_token),
                  s = (int)(i % a->n_seg);
        int h0, nh;
        lm_att_heads(a, gs / a->n_sub, gs % a->n_sub, &h0, &nh);
        const lm_att_part part = lm_att_part_at(a, i);
        lm_att_run(a, t, 1, h0, nh, accs, a->seg0[t] + s, &part);
    }
}

/* Phase 2, item (t, gs): its segments merged in order, as the serial walk
 * merges them, then normalised into the output. */
static void lm_att_combine_worker(void *v, int ith, int nth) {
    (void)ith, (void)nth;
    lm_att *a = v;
    const int Dh = a->p->head_dim;
    const int64_t per_token = (int64_t)a->p->n_kv_heads * a->n_sub, n = a->b->n_tokens * per_token;
    float tacc[LM_ATT_MAX_DH];
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (i >= n) break;
        const int t = (int)(i / per_token);
        int h0, nh;
        lm_att_heads(a, (int)(i % per_token) / a->n_sub, (int)(i % a->n_sub), &h0, &nh);
        for (int hh = 0; hh < nh; hh++) {
            float tm = -INFINITY;
            double tl = 0.0;
            for (int s = 0; s < a->n_seg; s++) {
                const lm_att_part p = lm_att_part_at(a, i * a->n_seg + s);
                lm_att_merge(&tm, &tl, tacc, p.m[hh], p.l[hh], p.acc + (size_t)hh * Dh, Dh);
            }
            lm_att_out(a, t, h0 + hh, tacc, tl);
        }
    }
}

/* Tokens an item takes: as many as the accumulators allow (nh heads of
 * Dh), fewer while that would leave threads without ~4 items each. */
static int lm_att_tile(int T, int64_t per_tile, int nh, int Dh, int threads) {
    int most = LM_MIN(LM_ATT_TILE_Q / nh, LM_ATT_ACC_FLOATS / (nh * Dh));
    int64_t fair = (int64_t)T * per_tile / (4 * (int64_t)threads);
    return (int)LM_MAX(1, LM_MIN((int64_t)most, fair));
}

/* A batch of single tokens whose (token, head) items would leave threads
 * idle while some token has several segments of keys (a long decode):
 * each segment becomes an item of its own, then the segments of each
 * token are merged. False (nothing done) when not worth it or the partial
 * states would not fit LM_ATT_SPLIT_MAX_FLOATS. */
static bool lm_att_split(lm_cpu *c, lm_att *a) {
    const lm_attn_params *p = a->p;
    const int T = a->b->n_tokens;
    const int64_t per_token = (int64_t)p->n_kv_heads * a->n_sub;
    if (c->n_threads == 1 || T * per_token >= 2 * (int64_t)c->n_threads) return false;
    int n_seg = 1;
    for (int t = 0; t < T; t++)
        n_seg = LM_MAX(n_seg, a->b->pos[t] / LM_ATT_SEG - lm_att_lo(p, a->b, t) / LM_ATT_SEG + 1);
    const int64_t parts = T * per_token * n_seg;
    if (n_seg == 1 || (size_t)parts * LM_ATT_HEADS * (size_t)p->head_dim > LM_ATT_SPLIT_MAX_FLOATS) return false;
    const size_t acc_b = (size_t)parts * LM_ATT_HEADS * (size_t)p->head_dim * sizeof(float),
                 l_b = (size_t)parts * LM_ATT_HEADS * sizeof(double), m_b = (size_t)parts * LM_ATT_HEADS * sizeof(float);
    char *buf = lm_cpu_att_parts(c, acc_b + l_b + m_b + (size_t)T * sizeof(int32_t));
    a->part_acc = (float *)buf;
    a->part_l = (double *)(buf + acc_b);
    a->part_m = (float *)(buf + acc_b + l_b);
    int32_t *seg0 = (int32_t *)(buf + acc_b + l_b + m_b);
    for (int t = 0; t < T; t++) seg0[t] = lm_att_lo(p, a->b, t) / LM_ATT_SEG;
    a->seg0 = seg0;
    a->n_seg = n_seg;
    atomic_init(&a->next, 0);
    lm_pool_run(c->pool, lm_att_split_worker, a);
    atomic_init(&a->next, 0);
    lm_pool_run(c->pool, lm_att_combine_worker, a);
    return true;
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
        for (int32_t i = lm_att_lo(p, b, t) / kv->block_size; i <= b->pos[t] / kv->block_size; i++)
            LM_ASSERT(table[i] >= 0 && table[i] < kv->n_blocks);
    }
    lm_att a = {
        .k = c->k, .out = out->data, .q = q->data, .kv = kv, .kl = kv->k[layer], .vl = kv->v[layer],
        .width = w, .kb = lm_kv_row_bytes(kv->k_type, w), .vb = lm_kv_row_bytes(kv->v_type, w),
        .b = b, .p = p, .q_cols = q->cols, .out_cols = out->cols,
        .n_sub = (H / Hkv + LM_ATT_HEADS - 1) / LM_ATT_HEADS,
    };
    a.tile = lm_att_tile(b->n_tokens, (int64_t)Hkv * a.n_sub, LM_MIN(H / Hkv, LM_ATT_HEADS), Dh, c->n_threads);
    if (a.tile == 1 && lm_att_split(c, &a)) return;
    atomic_init(&a.next, 0);
    if (c->n_threads == 1 || (int64_t)b->n_tokens * Hkv * a.n_sub == 1) lm_att_worker(&a, 0, 1);
    else lm_pool_run(c->pool, lm_att_worker, &a);
}
