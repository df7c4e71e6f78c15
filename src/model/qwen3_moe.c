/* qwen3_moe.c - Qwen3-MoE: Qwen3's attention with a sparse expert FFN.
 *
 * Pre-norm decoder: for each layer
 *   h = x + Wo * attn(rope(norm_q(Wq n(x))), rope(norm_k(Wk n(x))), Wv n(x))
 *   x = h + ffn_l(n(h))
 * where ffn_l is the sparse block on the layers the config makes sparse
 * ((l + 1) % decoder_sparse_step == 0 and l not in mlp_only_layers):
 *   p = softmax(Wrouter h), the top num_experts_per_tok experts (renormalised
 *   when norm_topk_prob), out = sum_e p_e * Wdown_e (silu(Wgate_e h) * Wup_e h)
 * and the dense SwiGLU MLP of width intermediate_size elsewhere. Attention,
 * scratch and head come from lm_blocks.h (shared with llama.c), the sparse
 * block from lm_moe.h (the backend's moe op). */
#include <stdlib.h>
#include <string.h>

#include "lm_blocks.h"
#include "lm_moe.h"

typedef struct qmoe_layer {
    lm_tensor attn_norm; /* [D] f32 */
    lm_attn_layer attn;  /* q/k/v/o, q/k norms */
    lm_tensor ffn_norm;  /* [D] f32 */
    lm_moe_layer moe;    /* sparse layers: router [E][D], experts */
    lm_mlp_layer mlp;    /* dense layers: [F][D], [F][D], [D][F] */
} qmoe_layer;

typedef struct qmoe {
    qmoe_layer *layers; /* [n_layers] */
    lm_dec_scratch s;
    lm_tensor router_logits; /* [cap_tokens][E] */
} qmoe;

static int qmoe_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    const int T = b->n_tokens;
    const lm_model_config *c = &m->cfg;
    qmoe *q = m->impl;
    lm_dec_scratch *s = &q->s;
    bool any_dense = false;
    for (int l = 0; l < c->n_layers; l++) any_dense |= !c->layer_moe[l];
    if (lm_dec_scratch_ensure(m, s, T, b->n_out, any_dense ? c->d_ff : 1, e)) return -1;
    if (q->router_logits.rows < T) {
        lm_tensor_release(m->be, &q->router_logits);
        if (lm_tensor_alloc(m->be, &q->router_logits, s->cap_tokens, LM_MAX(c->n_experts, 1)))
            return lm_errf(e, "out of memory for router logits of a %d-token batch", T);
    }
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    lm_tensor x = lm_tensor_rows(&s->x, 0, T), h = lm_tensor_rows(&s->h, 0, T);
    lm_tensor o = lm_tensor_rows(&s->o, 0, T);

    lm_embed_tokens(m, &x, &m->embed, b);
    if (c->n_layers > 0) op->rms_norm(be, &h, &x, &q->layers[0].attn_norm, c->norm_eps, 0);
    for (int l = 0; l < c->n_layers; l++) { /* each residual add also norms for the next sub-block */
        const qmoe_layer *L = &q->layers[l];
        const lm_norm_out ffn_in = { &h, &L->ffn_norm, c->norm_eps, 0 };
        lm_attn_forward(m, s, &L->attn, l, kv, b, &x, &ffn_in);
        const lm_norm_out next_in = { &h, l + 1 < c->n_layers ? &q->layers[l + 1].attn_norm : NULL, c->norm_eps, 0 };
        const lm_norm_out *next = next_in.w ? &next_in : NULL;
        if (c->layer_moe[l]) {
            lm_moe_forward_add(m, &L->moe, &x, &h, &q->router_logits, &o, next);
        } else {
            lm_mlp_forward(m, s, &L->mlp, &x, &h, next);
        }
    }
    lm_head_forward(m, s, b, logits);
    return 0;
}

/* ---- config, weights, registration ---- */

static int qmoe_parse_config(lm_model_config *c, json_t *root, const char *label, lm_err *e) {
    if (c->act != LM_ACT_SILU) return lm_errf(e, "%s: %s models use silu", label, c->model_type);
    bool attn_bias = lm_json_bool(root, "attention_bias", false);
    c->qkv_bias = attn_bias;
    c->o_bias = attn_bias;
    c->qk_norm = true;
    /* transformers' Qwen3MoeConfig defaults norm_topk_prob to false */
    return lm_config_parse_moe(c, root, label, false, e);
}

/* Tensor names of the two layouts; llama.cpp's converter stacks each
 * layer's experts into one tensor per matrix (lm_moe.h). */
typedef struct qmoe_names {
    const char *embed, *out_norm, *lm_head, *attn_norm, *ffn_norm, *gate, *up, *down;
    const lm_attn_names *attn;
    const lm_moe_names *moe;
} qmoe_names;

static const qmoe_names k_hf_names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight", &lm_attn_hf_names,
    &lm_moe_hf_names,
};

static const qmoe_names k_gguf_names = {
    "token_embd.weight", "output_norm.weight", "output.weight", "blk.%d.attn_norm.weight",
    "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
    &lm_attn_gguf_names, &lm_moe_gguf_names,
};

static int qmoe_bind(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    const qmoe_names *nt = m->weights->gguf ? &k_gguf_names : &k_hf_names;
    int64_t D = c->d_model, V = c->vocab;
    qmoe *q = lm_xcalloc(1, sizeof *q);
    m->impl = q;
    q->layers = lm_xcalloc((size_t)c->n_layers, sizeof *q->layers);
    lm_binder b = { m, e, 0 };
    char n[160];
    lm_bind_matrix(&b, &m->embed, nt->embed, V, D, true, c->tie_embeddings);
    lm_bind_vector(&b, &m->out_norm, nt->out_norm, D, true);
    if (c->tie_embeddings) m->lm_head = m->embed;
    else lm_bind_matrix(&b, &m->lm_head, nt->lm_head, V, D, true, true);
    for (int l = 0; l < c->n_layers && !b.failed; l++) {
        qmoe_layer *L = &q->layers[l];
        lm_bind_vector(&b, &L->attn_norm, lm_bind_name(n, sizeof n, nt->attn_norm, l), D, true);
        lm_attn_bind(&b, &L->attn, nt->attn, l);
        lm_bind_vector(&b, &L->ffn_norm, lm_bind_name(n, sizeof n, nt->ffn_norm, l), D, true);
        if (c->layer_moe[l]) lm_moe_bind(&b, &L->moe, nt->moe, l);
        else lm_mlp_bind(&b, &L->mlp, nt->gate, nt->up, nt->down, l, c->d_ff);
    }
    return b.failed ? -1 : 0;
}

static void qmoe_free(lm_model *m) {
    qmoe *q = m->impl;
    if (!q) return;
    lm_dec_scratch_release(m->be, &q->s);
    lm_tensor_release(m->be, &q->router_logits);
    for (int l = 0; l < m->cfg.n_layers; l++) lm_moe_layer_free(&q->layers[l].moe);
    free(q->layers);
    free(q);
    m->impl = NULL;
}

static const char *const k_qmoe_types[] = { "qwen3_moe", NULL };

const lm_arch lm_arch_qwen3_moe = {
    .name = "qwen3_moe",
    .model_types = k_qmoe_types,
    .parse_config = qmoe_parse_config,
    .bind = qmoe_bind,
    .forward = qmoe_forward,
    .free = qmoe_free,
};
