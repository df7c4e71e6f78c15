/* llama.c - the llama-family forward pass (llama, mistral, qwen2, qwen3).
 *
 * Pre-norm decoder: for each layer
 *   h = x + Wo * attn(rope(norm_q(Wq n(x))), rope(norm_k(Wk n(x))), Wv n(x))
 *   x = h + Wdown * (silu(Wgate n(h)) * Wup n(h))
 * with n() RMSNorm, norm_q/norm_k the per-head RMSNorm of qwen3, optional
 * q/k/v(/o) biases, grouped-query attention over the paged KV cache.
 * The attention and MLP sub-blocks, scratch and output head are shared with
 * other architectures (lm_blocks.h). Everything runs through backend ops;
 * this file never touches activations. */
#include <stdlib.h>
#include <string.h>

#include "lm_blocks.h"

typedef struct llama_layer {
    lm_tensor attn_norm; /* [D] f32 */
    lm_attn_layer attn;  /* q/k/v/o projections, biases, q/k norms (lm_blocks.h) */
    lm_tensor ffn_norm;  /* [D] f32 */
    lm_mlp_layer mlp;    /* gate, up [F][D]; down [D][F] */
} llama_layer;

typedef struct llama {
    llama_layer *layers; /* [n_layers] */
    lm_dec_scratch s;
} llama;

static int llama_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    const int T = b->n_tokens;
    const lm_model_config *c = &m->cfg;
    llama *L0 = m->impl;
    lm_dec_scratch *s = &L0->s;
    if (lm_dec_scratch_ensure(m, s, T, b->n_out, c->d_ff, e)) return -1;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;

    lm_tensor x = lm_tensor_rows(&s->x, 0, T), h = lm_tensor_rows(&s->h, 0, T);

    lm_embed_tokens(m, &x, &m->embed, b);
    if (c->n_layers > 0) op->rms_norm(be, &h, &x, &L0->layers[0].attn_norm, c->norm_eps, 0);
    for (int l = 0; l < c->n_layers; l++) { /* each residual add also norms for the next sub-block */
        const llama_layer *L = &L0->layers[l];
        const lm_norm_out ffn_in = { &h, &L->ffn_norm, c->norm_eps, 0 };
        lm_attn_forward(m, s, &L->attn, l, kv, b, &x, &ffn_in);
        const lm_norm_out next_in = { &h, l + 1 < c->n_layers ? &L0->layers[l + 1].attn_norm : NULL, c->norm_eps, 0 };
        lm_mlp_forward(m, s, &L->mlp, &x, &h, next_in.w ? &next_in : NULL);
    }
    lm_head_forward(m, s, b, logits);
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
    const char *attn_norm;
    const lm_attn_names *attn;
    const char *ffn_norm, *gate, *up, *down;
} name_table;

static const name_table k_hf_names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.input_layernorm.weight", &lm_attn_hf_names,
    "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight",
};

static const name_table k_gguf_names = {
    "token_embd.weight", "output_norm.weight", "output.weight",
    "blk.%d.attn_norm.weight", &lm_attn_gguf_names,
    "blk.%d.ffn_norm.weight",
    "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
};

static int llama_bind(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    const name_table *nt = m->weights->gguf ? &k_gguf_names : &k_hf_names;
    int64_t D = c->d_model, V = c->vocab;
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
        lm_attn_bind(&b, &L->attn, nt->attn, l);
        lm_bind_vector(&b, &L->ffn_norm, lm_bind_name(n, sizeof n, nt->ffn_norm, l), D, true);
        lm_mlp_bind(&b, &L->mlp, nt->gate, nt->up, nt->down, l, c->d_ff);
    }
    return b.failed ? -1 : 0;
}

static void llama_free(lm_model *m) {
    llama *ll = m->impl;
    if (!ll) return;
    lm_dec_scratch_release(m->be, &ll->s);
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
