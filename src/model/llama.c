/* llama.c - the llama-family forward pass (llama, mistral, qwen2, qwen3).
 *
 * Pre-norm decoder: for each layer
 *   h = x + Wo * attn(rope(norm_q(Wq n(x))), rope(norm_k(Wk n(x))), Wv n(x))
 *   x = h + Wdown * (silu(Wgate n(h)) * Wup n(h))
 * with n() RMSNorm, norm_q/norm_k the per-head RMSNorm of qwen3, optional
 * q/k/v(/o) biases, grouped-query attention over the paged KV cache.
 * Everything runs through backend ops; this file never touches activations. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lm_model.h"
#include "lm_model_internal.h"

/* Activation buffers, grown to the largest batch seen and reused, so the
 * decode loop does not allocate. */
struct lm_scratch {
    int cap_tokens, cap_out;
    lm_tensor x, h, q, k, v, qn, kn, attn, o, gate, up, act; /* [T][...] */
    lm_tensor hs, logits;                                    /* [n_out][D], [n_out][V] */
};

static void release_all(lm_backend *be, lm_scratch *s) {
    lm_tensor *ts[] = { &s->x, &s->h, &s->q, &s->k, &s->v, &s->qn, &s->kn, &s->attn,
                        &s->o, &s->gate, &s->up, &s->act, &s->hs, &s->logits };
    for (size_t i = 0; i < LM_COUNT(ts); i++) lm_tensor_release(be, ts[i]);
}

void lm_model_scratch_free(lm_model *m) {
    if (!m->scratch) return;
    release_all(m->be, m->scratch);
    free(m->scratch);
    m->scratch = NULL;
}

static int ensure_scratch(lm_model *m, int T, int n_out, lm_err *e) {
    lm_scratch *s = m->scratch;
    if (s && s->cap_tokens >= T && s->cap_out >= n_out) return 0;
    if (!s) s = m->scratch = lm_xcalloc(1, sizeof *s);
    release_all(m->be, s);
    const lm_model_config *c = &m->cfg;
    int cap = LM_MAX(T, s->cap_tokens), cap_out = LM_MAX(LM_MAX(n_out, s->cap_out), 1);
    int64_t D = c->d_model, F = c->d_ff, QD = (int64_t)c->n_heads * c->head_dim,
            KD = (int64_t)c->n_kv_heads * c->head_dim;
    struct { lm_tensor *t; int64_t rows, cols; } plan[] = {
        { &s->x, cap, D },   { &s->h, cap, D },     { &s->q, cap, QD },    { &s->k, cap, KD },
        { &s->v, cap, KD },  { &s->qn, cap, QD },   { &s->kn, cap, KD },   { &s->attn, cap, QD },
        { &s->o, cap, D },   { &s->gate, cap, F },  { &s->up, cap, F },    { &s->act, cap, F },
        { &s->hs, cap_out, D }, { &s->logits, cap_out, c->vocab },
    };
    for (size_t i = 0; i < LM_COUNT(plan); i++) {
        if (lm_tensor_alloc(m->be, plan[i].t, plan[i].rows, plan[i].cols)) {
            release_all(m->be, s);
            s->cap_tokens = s->cap_out = 0;
            return lm_errf(e, "out of memory for activations of a %d-token batch", T);
        }
    }
    s->cap_tokens = cap;
    s->cap_out = cap_out;
    return 0;
}

static const lm_tensor *opt(const lm_tensor *t) { return t->data ? t : NULL; }

static int check_batch(const lm_model *m, const lm_batch *b, lm_err *e) {
    if (b->n_tokens <= 0) return lm_errf(e, "empty batch");
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.vocab)
            return lm_errf(e, "token id %d out of range [0, %d)", b->tokens[t], m->cfg.vocab);
        if (b->pos[t] < 0) return lm_errf(e, "negative position %d", b->pos[t]);
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs) return lm_errf(e, "token %d names sequence %d of %d", t, b->seq[t], b->n_seqs);
    }
    if (b->n_out < 0 || b->n_out > b->n_tokens) return lm_errf(e, "%d logit rows for %d tokens", b->n_out, b->n_tokens);
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->n_tokens)
            return lm_errf(e, "logit row %d out of range [0, %d)", b->out_rows[i], b->n_tokens);
    return 0;
}

int lm_model_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    if (check_batch(m, b, e)) return -1;
    const int T = b->n_tokens;
    if (ensure_scratch(m, T, b->n_out, e)) return -1;
    const lm_model_config *c = &m->cfg;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    lm_scratch *s = m->scratch;

    lm_tensor x = lm_tensor_rows(&s->x, 0, T), h = lm_tensor_rows(&s->h, 0, T);
    lm_tensor q = lm_tensor_rows(&s->q, 0, T), k = lm_tensor_rows(&s->k, 0, T);
    lm_tensor v = lm_tensor_rows(&s->v, 0, T), qn = lm_tensor_rows(&s->qn, 0, T);
    lm_tensor kn = lm_tensor_rows(&s->kn, 0, T), attn = lm_tensor_rows(&s->attn, 0, T);
    lm_tensor o = lm_tensor_rows(&s->o, 0, T), gate = lm_tensor_rows(&s->gate, 0, T);
    lm_tensor up = lm_tensor_rows(&s->up, 0, T), act = lm_tensor_rows(&s->act, 0, T);

    lm_attn_batch ab = { T, b->pos, b->seq, b->n_seqs, b->block_tables };
    lm_rope_params rq = { c->n_heads, c->head_dim, m->rot_dim, c->rope.interleaved, m->inv_freq, m->rope_attn_factor };
    lm_rope_params rk = rq;
    rk.n_heads = c->n_kv_heads;
    lm_attn_params ap = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), 0, 0 };

    op->get_rows(be, &x, &m->embed, b->tokens);
    for (int l = 0; l < c->n_layers; l++) {
        const lm_layer *L = &m->layers[l];
        op->rms_norm(be, &h, &x, &L->attn_norm, c->norm_eps, 0);
        op->matmul(be, &q, &h, &L->wq, opt(&L->bq));
        op->matmul(be, &k, &h, &L->wk, opt(&L->bk));
        op->matmul(be, &v, &h, &L->wv, opt(&L->bv));
        lm_tensor *qr = &q, *kr = &k;
        if (c->qk_norm) {
            op->rms_norm(be, &qn, &q, &L->q_norm, c->norm_eps, 0);
            op->rms_norm(be, &kn, &k, &L->k_norm, c->norm_eps, 0);
            qr = &qn;
            kr = &kn;
        }
        op->rope(be, qr, b->pos, &rq);
        op->rope(be, kr, b->pos, &rk);
        op->kv_write(be, kv, l, kr, &v, &ab);
        ap.window = c->layer_sliding[l] ? c->sliding_window : 0;
        op->attention(be, &attn, qr, kv, l, &ab, &ap);
        op->matmul(be, &o, &attn, &L->wo, opt(&L->bo));
        op->add(be, &x, &o);

        op->rms_norm(be, &h, &x, &L->ffn_norm, c->norm_eps, 0);
        op->matmul(be, &gate, &h, &L->w_gate, NULL);
        op->matmul(be, &up, &h, &L->w_up, NULL);
        op->silu_mul(be, &act, &gate, &up);
        op->matmul(be, &o, &act, &L->w_down, NULL);
        op->add(be, &x, &o);
    }
    if (b->n_out == 0) return 0;
    lm_tensor hs = lm_tensor_rows(&s->hs, 0, b->n_out), hn = lm_tensor_rows(&s->h, 0, b->n_out);
    lm_tensor lg = lm_tensor_rows(&s->logits, 0, b->n_out);
    op->gather_rows(be, &hs, &x, b->out_rows, b->n_out);
    op->rms_norm(be, &hn, &hs, &m->out_norm, c->norm_eps, 0);
    op->matmul(be, &lg, &hn, &m->lm_head, NULL);
    op->read(be, logits, lg.data, (size_t)b->n_out * (size_t)c->vocab * sizeof(float));
    return 0;
}
