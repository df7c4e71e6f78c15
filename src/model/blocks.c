/* blocks.c - decoder sub-blocks shared by architectures (see lm_blocks.h). */
#include <math.h>

#include "lm_blocks.h"

/* ---- scratch ---- */

void lm_dec_scratch_release(lm_backend *be, lm_dec_scratch *s) {
    lm_tensor *ts[] = { &s->x, &s->h, &s->q, &s->k, &s->v, &s->qn, &s->kn, &s->attn,
                        &s->o, &s->gate, &s->up, &s->act, &s->hs, &s->logits };
    for (size_t i = 0; i < LM_COUNT(ts); i++) lm_tensor_release(be, ts[i]);
    s->cap_tokens = s->cap_out = 0;
    s->ff = 0;
}

int lm_dec_scratch_ensure(lm_model *m, lm_dec_scratch *s, int T, int n_out, int64_t ff, lm_err *e) {
    if (s->cap_tokens >= T && s->cap_out >= n_out && s->ff >= ff) return 0;
    int cap = LM_MAX(T, s->cap_tokens), cap_out = LM_MAX(LM_MAX(n_out, s->cap_out), 1);
    ff = LM_MAX(LM_MAX(ff, s->ff), 1);
    lm_dec_scratch_release(m->be, s);
    const lm_model_config *c = &m->cfg;
    int64_t D = c->d_model, QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    struct { lm_tensor *t; int64_t rows, cols; } plan[] = {
        { &s->x, cap, D },   { &s->h, cap, D },     { &s->q, cap, QD },    { &s->k, cap, KD },
        { &s->v, cap, KD },  { &s->qn, cap, QD },   { &s->kn, cap, KD },   { &s->attn, cap, QD },
        { &s->o, cap, D },   { &s->gate, cap, ff }, { &s->up, cap, ff },   { &s->act, cap, ff },
        { &s->hs, cap_out, D }, { &s->logits, cap_out, c->vocab },
    };
    for (size_t i = 0; i < LM_COUNT(plan); i++) {
        if (lm_tensor_alloc(m->be, plan[i].t, plan[i].rows, plan[i].cols)) {
            lm_dec_scratch_release(m->be, s);
            return lm_errf(e, "out of memory for activations of a %d-token batch", T);
        }
    }
    s->cap_tokens = cap;
    s->cap_out = cap_out;
    s->ff = ff;
    return 0;
}

static const lm_tensor *opt(const lm_tensor *t) { return t->data ? t : NULL; }

/* ---- attention ---- */

const lm_attn_names lm_attn_hf_names = {
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias",   "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias",   "model.layers.%d.self_attn.o_proj.bias",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
};

const lm_attn_names lm_attn_gguf_names = {
    "blk.%d.attn_q.weight",      "blk.%d.attn_k.weight",      "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.attn_q.bias",        "blk.%d.attn_k.bias",
    "blk.%d.attn_v.bias",        "blk.%d.attn_output.bias",   "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight",
};

void lm_attn_bind(lm_binder *b, lm_attn_layer *L, const lm_attn_names *nt, int l) {
    const lm_model_config *c = &b->m->cfg;
    int64_t D = c->d_model, QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    char n[160], nq[160], nk[160], nv[160];
    lm_bind_matrix_group(b, 3, (lm_tensor *const[]){ &L->wq, &L->wk, &L->wv },
                         (const char *const[]){ lm_bind_name(nq, sizeof nq, nt->wq, l),
                                                lm_bind_name(nk, sizeof nk, nt->wk, l),
                                                lm_bind_name(nv, sizeof nv, nt->wv, l) },
                         (const int64_t[]){ QD, KD, KD }, D);
    lm_bind_matrix(b, &L->wo, lm_bind_name(n, sizeof n, nt->wo, l), D, QD, true, true);
    lm_bind_vector(b, &L->bq, lm_bind_name(n, sizeof n, nt->bq, l), QD, c->qkv_bias);
    lm_bind_vector(b, &L->bk, lm_bind_name(n, sizeof n, nt->bk, l), KD, c->qkv_bias);
    lm_bind_vector(b, &L->bv, lm_bind_name(n, sizeof n, nt->bv, l), KD, c->qkv_bias);
    lm_bind_vector(b, &L->bo, lm_bind_name(n, sizeof n, nt->bo, l), D, c->o_bias);
    lm_bind_vector(b, &L->q_norm, lm_bind_name(n, sizeof n, nt->q_norm, l), c->head_dim, c->qk_norm);
    lm_bind_vector(b, &L->k_norm, lm_bind_name(n, sizeof n, nt->k_norm, l), c->head_dim, c->qk_norm);
}

/* ---- fused matmul forms, composed from plain ops where a backend lacks them ---- */

void lm_op_matmul_n(lm_backend *be, int n, lm_tensor *const *y, const lm_tensor *x, const lm_tensor *const *w,
                    const lm_tensor *const *bias) {
    if (be->ops->matmul_n) {
        be->ops->matmul_n(be, n, y, x, w, bias);
        return;
    }
    for (int i = 0; i < n; i++) be->ops->matmul(be, y[i], x, w[i], bias ? bias[i] : NULL);
}

void lm_op_matmul_glu(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *wg, const lm_tensor *wu,
                      lm_glu act, lm_tensor *gate_ws, lm_tensor *up_ws) {
    if (be->ops->matmul_glu) {
        be->ops->matmul_glu(be, y, x, wg, wu, act, gate_ws, up_ws);
        return;
    }
    be->ops->matmul(be, gate_ws, x, wg, NULL);
    be->ops->matmul(be, up_ws, x, wu, NULL);
    if (act == LM_GLU_SILU) be->ops->silu_mul(be, y, gate_ws, up_ws);
    else be->ops->gelu_mul(be, y, gate_ws, up_ws, act == LM_GLU_GELU_TANH);
}

void lm_op_matmul_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *w, lm_tensor *ws,
                      const lm_norm_out *norm) {
    if (be->ops->matmul_add) {
        be->ops->matmul_add(be, y, x, w, ws, norm);
        return;
    }
    be->ops->matmul(be, ws, x, w, NULL);
    lm_op_add_norm(be, y, ws, norm);
}

void lm_op_moe_add(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_tensor *router_logits,
                   const lm_moe_params *p, lm_tensor *ws, const lm_norm_out *norm) {
    if (be->ops->moe_add) {
        be->ops->moe_add(be, y, x, router_logits, p, ws, norm);
        return;
    }
    be->ops->moe(be, ws, x, router_logits, p);
    lm_op_add_norm(be, y, ws, norm);
}

void lm_op_add_norm(lm_backend *be, lm_tensor *y, const lm_tensor *x, const lm_norm_out *norm) {
    be->ops->add(be, y, x);
    if (norm) be->ops->rms_norm(be, norm->y, y, norm->w, norm->eps, norm->w_offset);
}

void lm_op_rope_kv_write(lm_backend *be, lm_tensor *q, lm_tensor *k, const lm_tensor *v, const lm_rope_params *rq,
                         const lm_rope_params *rk, lm_kv_pool *kv, int layer, const lm_attn_batch *b) {
    if (be->ops->rope_kv_write) {
        be->ops->rope_kv_write(be, q, k, v, rq, rk, kv, layer, b);
        return;
    }
    be->ops->rope(be, q, b->pos, rq);
    be->ops->rope(be, k, b->pos, rk);
    be->ops->kv_write(be, kv, layer, k, v, b);
}

void lm_op_norm_rope_kv_write(lm_backend *be, lm_tensor *qn, const lm_tensor *q, lm_tensor *kn, const lm_tensor *k,
                              const lm_tensor *v, const lm_tensor *wq, const lm_tensor *wk, float eps, float w_offset,
                              const lm_rope_params *rq, const lm_rope_params *rk, lm_kv_pool *kv, int layer,
                              const lm_attn_batch *b) {
    if (be->ops->norm_rope_kv_write) {
        be->ops->norm_rope_kv_write(be, qn, q, kn, k, v, wq, wk, eps, w_offset, rq, rk, kv, layer, b);
        return;
    }
    be->ops->rms_norm(be, qn, q, wq, eps, w_offset);
    be->ops->rms_norm(be, kn, k, wk, eps, w_offset);
    lm_op_rope_kv_write(be, qn, kn, v, rq, rk, kv, layer, b);
}

void lm_op_gated_delta_gates(lm_backend *be, lm_tensor *out, const lm_tensor *qkv, lm_tensor *g, lm_tensor *beta,
                             const lm_tensor *a_log, const lm_tensor *dt_bias, lm_kv_pool *kv,
                             const lm_attn_batch *b, const lm_delta_params *p) {
    if (be->ops->gated_delta_gates) {
        be->ops->gated_delta_gates(be, out, qkv, g, beta, a_log, dt_bias, kv, b, p);
        return;
    }
    be->ops->delta_gates(be, g, beta, a_log, dt_bias);
    be->ops->gated_delta(be, out, qkv, g, beta, kv, b, p);
}

void lm_attn_forward(lm_model *m, lm_dec_scratch *s, const lm_attn_layer *L, int layer, lm_kv_pool *kv,
                     const lm_batch *b, lm_tensor *residual, const lm_norm_out *post) {
    const int T = b->n_tokens;
    const lm_model_config *c = &m->cfg;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    lm_tensor h = lm_tensor_rows(&s->h, 0, T), q = lm_tensor_rows(&s->q, 0, T), k = lm_tensor_rows(&s->k, 0, T);
    lm_tensor v = lm_tensor_rows(&s->v, 0, T), qn = lm_tensor_rows(&s->qn, 0, T);
    lm_tensor kn = lm_tensor_rows(&s->kn, 0, T), attn = lm_tensor_rows(&s->attn, 0, T);
    lm_tensor o = lm_tensor_rows(&s->o, 0, T);

    lm_attn_batch ab = { T, b->pos, b->seq, b->n_seqs, b->block_tables, b->state_slot, NULL };
    lm_rope_params rq = { c->n_heads, c->head_dim, m->rot_dim, c->rope.interleaved, m->inv_freq, m->rope_attn_factor };
    lm_rope_params rk = rq;
    rk.n_heads = c->n_kv_heads;
    lm_attn_params ap = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), 0, 0 };
    ap.window = c->layer_sliding[layer] ? c->sliding_window : 0;

    {
        lm_tensor *ys[3] = { &q, &k, &v };
        const lm_tensor *ws[3] = { &L->wq, &L->wk, &L->wv }, *bs[3] = { opt(&L->bq), opt(&L->bk), opt(&L->bv) };
        lm_op_matmul_n(be, 3, ys, &h, ws, bs);
    }
    lm_tensor *qr = &q;
    if (c->qk_norm) {
        lm_op_norm_rope_kv_write(be, &qn, &q, &kn, &k, &v, &L->q_norm, &L->k_norm, c->norm_eps, 0, &rq, &rk, kv, layer,
                                 &ab);
        qr = &qn;
    } else {
        lm_op_rope_kv_write(be, &q, &k, &v, &rq, &rk, kv, layer, &ab);
    }
    op->attention(be, &attn, qr, kv, layer, &ab, &ap);
    if (!L->bo.data) {
        lm_op_matmul_add(be, residual, &attn, &L->wo, &o, post);
    } else {
        op->matmul(be, &o, &attn, &L->wo, &L->bo);
        lm_op_add_norm(be, residual, &o, post);
    }
}

/* ---- dense MLP ---- */

void lm_mlp_bind(lm_binder *b, lm_mlp_layer *L, const char *gate, const char *up, const char *down, int l,
                 int64_t F) {
    int64_t D = b->m->cfg.d_model;
    char n[160], ng[160], nu[160];
    lm_bind_matrix_group(b, 2, (lm_tensor *const[]){ &L->gate, &L->up },
                         (const char *const[]){ lm_bind_name(ng, sizeof ng, gate, l), lm_bind_name(nu, sizeof nu, up, l) },
                         (const int64_t[]){ F, F }, D);
    lm_bind_matrix(b, &L->down, lm_bind_name(n, sizeof n, down, l), D, F, true, true);
}

void lm_mlp_forward(lm_model *m, lm_dec_scratch *s, const lm_mlp_layer *L, lm_tensor *out, const lm_tensor *h,
                    const lm_norm_out *post) {
    const int64_t T = h->rows, F = L->gate.rows;
    LM_ASSERT(F <= s->ff && T <= s->cap_tokens);
    lm_tensor gate = { LM_F32, T, F, s->gate.data }, up = { LM_F32, T, F, s->up.data };
    lm_tensor act = { LM_F32, T, F, s->act.data };
    lm_op_matmul_glu(m->be, &act, h, &L->gate, &L->up, LM_GLU_SILU, &gate, &up);
    lm_tensor ws = lm_tensor_rows(&s->o, 0, T);
    LM_ASSERT(ws.data != out->data);
    lm_op_matmul_add(m->be, out, &act, &L->down, &ws, post);
}

/* ---- input ---- */

void lm_embed_tokens(lm_model *m, lm_tensor *x, const lm_tensor *table, const lm_batch *b) {
    if (b->tokens) m->be->ops->get_rows(m->be, x, table, b->tokens);
    else m->be->ops->get_rows_argmax(m->be, x, table);
}

/* ---- output ---- */

void lm_hidden_out(lm_model *m, const lm_tensor *x, lm_tensor *ws, const lm_tensor *norm, float w_offset,
                   const lm_batch *b) {
    if (b->n_hidden == 0) return;
    const struct lm_backend_ops *op = m->be->ops;
    const size_t D = (size_t)m->cfg.d_model;
    LM_ASSERT(x->rows == b->n_tokens && ws->rows >= x->rows && x->cols == (int64_t)D);
    lm_tensor hn = lm_tensor_rows(ws, 0, x->rows);
    op->rms_norm(m->be, &hn, x, norm, m->cfg.norm_eps, w_offset);
    for (int i = 0; i < b->n_hidden;) {
        int end = i + 1;
        while (end < b->n_hidden && b->hidden_rows[end] == b->hidden_rows[end - 1] + 1) end++;
        op->read(m->be, b->hidden_out + (size_t)i * D, (const float *)hn.data + (size_t)b->hidden_rows[i] * D,
                 (size_t)(end - i) * D * sizeof(float));
        i = end;
    }
}

void lm_head_forward(lm_model *m, lm_dec_scratch *s, const lm_batch *b, float *logits) {
    lm_tensor x = lm_tensor_rows(&s->x, 0, b->n_tokens);
    lm_tensor ws = lm_tensor_rows(&s->h, 0, b->n_tokens);
    lm_hidden_out(m, &x, &ws, &m->out_norm, 0, b);
    if (b->n_out == 0) return;
    const lm_model_config *c = &m->cfg;
    const struct lm_backend_ops *op = m->be->ops;
    lm_tensor hs = lm_tensor_rows(&s->hs, 0, b->n_out), hn = lm_tensor_rows(&s->h, 0, b->n_out);
    lm_tensor lg = lm_tensor_rows(&s->logits, 0, b->n_out);
    op->gather_rows(m->be, &hs, &x, b->out_rows, b->n_out);
    op->rms_norm(m->be, &hn, &hs, &m->out_norm, c->norm_eps, 0);
    op->matmul(m->be, &lg, &hn, &m->lm_head, NULL);
    lm_logits_out(m, b, &lg, logits);
}

void lm_logits_out(lm_model *m, const lm_batch *b, const lm_tensor *lg, float *logits) {
    const struct lm_backend_ops *op = m->be->ops;
    const size_t V = (size_t)m->cfg.vocab, row = V * sizeof(float);
    if (b->out_argmax && b->argmax_masked) /* issued by lm_model_argmax_masked */
        m->masked_lg = *lg, m->masked_ids = b->out_argmax;
    else if (b->out_argmax && b->argmax_later) op->argmax_rows_later(m->be, b->out_argmax, lg);
    else if (b->out_argmax) op->argmax_rows(m->be, b->out_argmax, lg);
    if (!logits) return;
    if (!b->out_argmax) {
        op->read(m->be, logits, lg->data, (size_t)b->n_out * row);
        return;
    }
    for (int r = 0; b->out_logits && r < b->n_out;) { /* runs of wanted rows, one copy each */
        if (!b->out_logits[r]) {
            r++;
            continue;
        }
        int end = r;
        while (end < b->n_out && b->out_logits[end]) end++;
        op->read(m->be, logits + (size_t)r * V, (const float *)lg->data + (size_t)r * V, (size_t)(end - r) * row);
        r = end;
    }
}
