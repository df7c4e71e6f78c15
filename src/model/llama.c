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

#include "lm_arch.h"

typedef struct llama_layer {
    lm_tensor attn_norm;            /* [D] f32 */
    lm_tensor wq, wk, wv, wo;       /* [H*Dh][D], [Hkv*Dh][D], [Hkv*Dh][D], [D][H*Dh] */
    lm_tensor bq, bk, bv, bo;       /* biases, f32; data NULL when absent */
    lm_tensor q_norm, k_norm;       /* [Dh] f32 (qwen3); data NULL when absent */
    lm_tensor ffn_norm;             /* [D] f32 */
    lm_tensor w_gate, w_up, w_down; /* [F][D], [F][D], [D][F] */
} llama_layer;

/* Activation buffers, grown to the largest batch seen and reused, so the
 * decode loop does not allocate. */
typedef struct llama_scratch {
    int cap_tokens, cap_out;
    lm_tensor x, h, q, k, v, qn, kn, attn, o, gate, up, act; /* [T][...] */
    lm_tensor hs, logits;                                    /* [n_out][D], [n_out][V] */
} llama_scratch;

typedef struct llama {
    llama_layer *layers; /* [n_layers] */
    llama_scratch s;
} llama;

static void release_all(lm_backend *be, llama_scratch *s) {
    lm_tensor *ts[] = { &s->x, &s->h, &s->q, &s->k, &s->v, &s->qn, &s->kn, &s->attn,
                        &s->o, &s->gate, &s->up, &s->act, &s->hs, &s->logits };
    for (size_t i = 0; i < LM_COUNT(ts); i++) lm_tensor_release(be, ts[i]);
}

static int ensure_scratch(lm_model *m, int T, int n_out, lm_err *e) {
    llama_scratch *s = &((llama *)m->impl)->s;
    if (s->cap_tokens >= T && s->cap_out >= n_out) return 0;
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

static int llama_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    const int T = b->n_tokens;
    if (ensure_scratch(m, T, b->n_out, e)) return -1;
    const lm_model_config *c = &m->cfg;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    llama *L0 = m->impl;
    llama_scratch *s = &L0->s;

    lm_tensor x = lm_tensor_rows(&s->x, 0, T), h = lm_tensor_rows(&s->h, 0, T);
    lm_tensor q = lm_tensor_rows(&s->q, 0, T), k = lm_tensor_rows(&s->k, 0, T);
    lm_tensor v = lm_tensor_rows(&s->v, 0, T), qn = lm_tensor_rows(&s->qn, 0, T);
    lm_tensor kn = lm_tensor_rows(&s->kn, 0, T), attn = lm_tensor_rows(&s->attn, 0, T);
    lm_tensor o = lm_tensor_rows(&s->o, 0, T), gate = lm_tensor_rows(&s->gate, 0, T);
    lm_tensor up = lm_tensor_rows(&s->up, 0, T), act = lm_tensor_rows(&s->act, 0, T);

    lm_attn_batch ab = { T, b->pos, b->seq, b->n_seqs, b->block_tables, b->state_slot };
    lm_rope_params rq = { c->n_heads, c->head_dim, m->rot_dim, c->rope.interleaved, m->inv_freq, m->rope_attn_factor };
    lm_rope_params rk = rq;
    rk.n_heads = c->n_kv_heads;
    lm_attn_params ap = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), 0, 0 };

    op->get_rows(be, &x, &m->embed, b->tokens);
    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *L = &L0->layers[l];
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

/* ---- config, weights, registration ---- */

static int llama_parse_config(lm_model_config *c, json_t *root, const char *label, lm_err *e) {
    if (c->act != LM_ACT_SILU) return lm_errf(e, "%s: %s models use silu", label, c->model_type);
    if (!c->d_ff) return lm_errf(e, "%s: missing \"intermediate_size\"", label);
    bool attn_bias = lm_json_bool(root, "attention_bias", false);
    if (!strcmp(c->model_type, "qwen2")) {
        c->qkv_bias = true; /* Qwen2 always has q/k/v bias and never o bias */
    } else {
        c->qkv_bias = attn_bias;
        c->o_bias = attn_bias;
    }
    c->mlp_bias = lm_json_bool(root, "mlp_bias", false);
    if (c->mlp_bias) return lm_errf(e, "%s: mlp_bias is not supported", label);
    c->qk_norm = !strcmp(c->model_type, "qwen3");
    return 0;
}

typedef struct name_table {
    const char *embed, *out_norm, *lm_head;
    const char *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *q_norm, *k_norm;
    const char *ffn_norm, *gate, *up, *down;
} name_table;

static const name_table k_hf_names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias", "model.layers.%d.self_attn.o_proj.bias",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
};

static const name_table k_gguf_names = {
    "token_embd.weight", "output_norm.weight", "output.weight",
    "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_output.bias",
    "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight",
    "blk.%d.ffn_norm.weight",
    "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
};

static int llama_bind(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    const name_table *nt = m->src.gguf ? &k_gguf_names : &k_hf_names;
    int64_t D = c->d_model, F = c->d_ff, V = c->vocab;
    int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    llama *ll = lm_xcalloc(1, sizeof *ll);
    m->impl = ll;
    ll->layers = lm_xcalloc((size_t)c->n_layers, sizeof *ll->layers);
    lm_binder b = { m, e, 0 };
    char n[160];
    lm_bind_matrix(&b, &m->embed, nt->embed, V, D, true, c->tie_embeddings);
    lm_bind_vector(&b, &m->out_norm, nt->out_norm, D, true);
    if (c->tie_embeddings) m->lm_head = m->embed;
    else lm_bind_matrix(&b, &m->lm_head, nt->lm_head, V, D, true, true);
    for (int l = 0; l < c->n_layers && !b.failed; l++) {
        llama_layer *L = &ll->layers[l];
        lm_bind_vector(&b, &L->attn_norm, lm_bind_name(n, sizeof n, nt->attn_norm, l), D, true);
        lm_bind_matrix(&b, &L->wq, lm_bind_name(n, sizeof n, nt->wq, l), QD, D, true, true);
        lm_bind_matrix(&b, &L->wk, lm_bind_name(n, sizeof n, nt->wk, l), KD, D, true, true);
        lm_bind_matrix(&b, &L->wv, lm_bind_name(n, sizeof n, nt->wv, l), KD, D, true, true);
        lm_bind_matrix(&b, &L->wo, lm_bind_name(n, sizeof n, nt->wo, l), D, QD, true, true);
        lm_bind_vector(&b, &L->bq, lm_bind_name(n, sizeof n, nt->bq, l), QD, c->qkv_bias);
        lm_bind_vector(&b, &L->bk, lm_bind_name(n, sizeof n, nt->bk, l), KD, c->qkv_bias);
        lm_bind_vector(&b, &L->bv, lm_bind_name(n, sizeof n, nt->bv, l), KD, c->qkv_bias);
        lm_bind_vector(&b, &L->bo, lm_bind_name(n, sizeof n, nt->bo, l), D, c->o_bias);
        lm_bind_vector(&b, &L->q_norm, lm_bind_name(n, sizeof n, nt->q_norm, l), c->head_dim, c->qk_norm);
        lm_bind_vector(&b, &L->k_norm, lm_bind_name(n, sizeof n, nt->k_norm, l), c->head_dim, c->qk_norm);
        lm_bind_vector(&b, &L->ffn_norm, lm_bind_name(n, sizeof n, nt->ffn_norm, l), D, true);
        lm_bind_matrix(&b, &L->w_gate, lm_bind_name(n, sizeof n, nt->gate, l), F, D, true, true);
        lm_bind_matrix(&b, &L->w_up, lm_bind_name(n, sizeof n, nt->up, l), F, D, true, true);
        lm_bind_matrix(&b, &L->w_down, lm_bind_name(n, sizeof n, nt->down, l), D, F, true, true);
    }
    return b.failed ? -1 : 0;
}

static void llama_free(lm_model *m) {
    llama *ll = m->impl;
    if (!ll) return;
    release_all(m->be, &ll->s);
    free(ll->layers);
    free(ll);
    m->impl = NULL;
}

static const char *const k_llama_types[] = { "llama", "mistral", "qwen2", "qwen3", NULL };

const lm_arch lm_arch_llama = {
    .name = "llama",
    .model_types = k_llama_types,
    .parse_config = llama_parse_config,
    .bind = llama_bind,
    .forward = llama_forward,
    .free = llama_free,
};
