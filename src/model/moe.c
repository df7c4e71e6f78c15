/* moe.c - mixture-of-experts config fields, expert binding (per-expert or
 * fused checkpoint layouts) and the sparse block's forward (lm_moe.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_blocks.h"
#include "lm_moe.h"

/* ---- config ---- */

int lm_config_parse_moe(lm_model_config *c, json_t *root, const char *label, bool norm_topk_default,
                        lm_err *e) {
    c->n_experts = 0;
    if (!lm_json_int(root, "num_experts", &c->n_experts)) lm_json_int(root, "num_local_experts", &c->n_experts);
    if (c->n_experts < 0) return lm_errf(e, "%s: num_experts = %d, must be >= 0", label, c->n_experts);
    c->norm_topk_prob = lm_json_bool(root, "norm_topk_prob", norm_topk_default);
    c->decoder_sparse_step = 1;
    lm_json_int(root, "decoder_sparse_step", &c->decoder_sparse_step);
    if (c->decoder_sparse_step < 1)
        return lm_errf(e, "%s: decoder_sparse_step = %d, must be >= 1", label, c->decoder_sparse_step);
    c->shared_expert_d_ff = 0;
    lm_json_int(root, "shared_expert_intermediate_size", &c->shared_expert_d_ff);
    if (c->shared_expert_d_ff < 0)
        return lm_errf(e, "%s: shared_expert_intermediate_size = %d, must be >= 0", label, c->shared_expert_d_ff);
    c->layer_moe = lm_xcalloc((size_t)c->n_layers, sizeof(bool));
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = c->n_experts > 0 && (l + 1) % c->decoder_sparse_step == 0;
    json_t *only = json_object_get(root, "mlp_only_layers");
    if (only && !json_is_null(only)) {
        if (!json_is_array(only)) return lm_errf(e, "%s: mlp_only_layers must be a list of layer indices", label);
        size_t i;
        json_t *v;
        json_array_foreach(only, i, v) {
            json_int_t l = json_is_integer(v) ? json_integer_value(v) : -1;
            if (l < 0 || l >= c->n_layers)
                return lm_errf(e, "%s: mlp_only_layers[%zu] is not a layer index in [0, %d)", label, i, c->n_layers);
            c->layer_moe[l] = false;
        }
    }
    bool any_sparse = false, any_dense = false;
    for (int l = 0; l < c->n_layers; l++) {
        any_sparse |= c->layer_moe[l];
        any_dense |= !c->layer_moe[l];
    }
    if (any_sparse) {
        if (!lm_json_int(root, "num_experts_per_tok", &c->n_experts_per_tok) || c->n_experts_per_tok < 1 ||
            c->n_experts_per_tok > c->n_experts)
            return lm_errf(e, "%s: num_experts_per_tok must be an integer in [1, num_experts = %d]", label,
                           c->n_experts);
        if (!lm_json_int(root, "moe_intermediate_size", &c->moe_d_ff) || c->moe_d_ff < 1)
            return lm_errf(e, "%s: missing or non-positive \"moe_intermediate_size\"", label);
    }
    if (any_dense && c->d_ff < 1)
        return lm_errf(e, "%s: dense MLP layers need a positive \"intermediate_size\"", label);
    return 0;
}

/* ---- binding ---- */

const lm_moe_names lm_moe_hf_names = {
    .router = "model.layers.%d.mlp.gate.weight",
    .gate = "model.layers.%d.mlp.experts.%d.gate_proj.weight",
    .up = "model.layers.%d.mlp.experts.%d.up_proj.weight",
    .down = "model.layers.%d.mlp.experts.%d.down_proj.weight",
    .gate_up = "model.layers.%d.mlp.experts.gate_up_proj",
    .down_fused = "model.layers.%d.mlp.experts.down_proj",
    /* mlx-lm's checkpoints (mlx-community): switch_mlp stacks, quantised as stacks */
    .gate_exps = "model.layers.%d.mlp.switch_mlp.gate_proj.weight",
    .up_exps = "model.layers.%d.mlp.switch_mlp.up_proj.weight",
    .down_exps = "model.layers.%d.mlp.switch_mlp.down_proj.weight",
};

const lm_moe_names lm_moe_gguf_names = {
    .router = "blk.%d.ffn_gate_inp.weight",
    .gate_up = "blk.%d.ffn_gate_up_exps.weight",
    .down_fused = "blk.%d.ffn_down_exps.weight",
    .gate_exps = "blk.%d.ffn_gate_exps.weight",
    .up_exps = "blk.%d.ffn_up_exps.weight",
    .down_exps = "blk.%d.ffn_down_exps.weight",
};

/* Binds the stacked tensor `name` of shape [E][R][C] as one [E*R][C] matrix
 * (checked like lm_bind_matrix, expected vs actual naming the file) and
 * returns it; views are cut by the caller. */
static lm_tensor bind_stack(lm_binder *b, const char *name, int64_t E, int64_t R, int64_t C) {
    lm_tensor t = { 0 };
    if (b->failed) return t;
    const char *file = NULL;
    const lm_file_tensor *ft = lm_weights_find(b->m->weights, name, &file);
    LM_ASSERT(ft); /* the caller checked presence */
    if (ft->n_dims != 3 || ft->shape[0] != E || ft->shape[1] != R || ft->shape[2] != C) {
        char got[128];
        size_t k = (size_t)snprintf(got, sizeof got, "[");
        for (int i = 0; i < ft->n_dims && k < sizeof got; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", i ? ", " : "", (long long)ft->shape[i]);
        if (k < sizeof got) snprintf(got + k, sizeof got - k, "]");
        lm_errf(b->e, "%s: tensor \"%s\" has shape %s, expected [%lld, %lld, %lld]", file, name, got, (long long)E,
                (long long)R, (long long)C);
        b->failed = 1;
        return t;
    }
    if (ft->type == LM_DTYPE_COUNT || ft->type == LM_I32 || C % lm_dtype_block(ft->type)) {
        lm_errf(b->e, "%s: tensor \"%s\" has type %s, which lumen cannot compute with at width %lld", file, name,
                ft->type_name, (long long)C);
        b->failed = 1;
        return t;
    }
    t = (lm_tensor){ .type = ft->type, .rows = E * R, .cols = C };
    if (b->m->be->ops->upload_weight(b->m->be, &t, ft->data, b->e)) {
        lm_err_prefix(b->e, "%s", name);
        b->failed = 1;
        return (lm_tensor){ 0 };
    }
    b->m->weight_bytes += ft->nbytes;
    return t;
}

/* Rows [r0, r0 + n) of a bound weight matrix, as a matrix of its own. */
static lm_tensor row_view(const lm_tensor *t, int64_t r0, int64_t n) {
    return (lm_tensor){ .type = t->type, .rows = n, .cols = t->cols,
                        .data = (char *)t->data + lm_dtype_row_bytes(t->type, t->cols) * (size_t)r0 };
}

void lm_moe_bind(lm_binder *b, lm_moe_layer *L, const lm_moe_names *nt, int l) {
    lm_model *m = b->m;
    const lm_model_config *c = &m->cfg;
    const int64_t E = c->n_experts, D = c->d_model, F = c->moe_d_ff;
    char n[192];
    lm_bind_matrix(b, &L->router, lm_bind_name(n, sizeof n, nt->router, l), E, D, true, true);
    L->gate = lm_xcalloc((size_t)E, sizeof *L->gate);
    L->up = lm_xcalloc((size_t)E, sizeof *L->up);
    L->down = lm_xcalloc((size_t)E, sizeof *L->down);
    size_t before = m->weight_bytes;
    char n2[192], n3[192];
    /* stacked per matrix (a GGUF, an MLX checkpoint), unless gate and up are
     * fused (newer llama.cpp files) or the layout has per-expert tensors
     * and no stack (a Hugging Face checkpoint) */
    const bool fused = nt->gate_up && lm_bind_has(b, lm_bind_name(n, sizeof n, nt->gate_up, l));
    const bool stacked = nt->gate_exps && !fused &&
                         (!nt->gate || lm_bind_has(b, lm_bind_name(n, sizeof n, nt->gate_exps, l)));
    if (stacked) { /* one tensor per matrix, every expert */
        snprintf(n, sizeof n, nt->gate_exps, l);
        snprintf(n2, sizeof n2, nt->up_exps, l);
        snprintf(n3, sizeof n3, nt->down_exps, l);
        const char *missing = !lm_bind_has(b, n) ? n : !lm_bind_has(b, n2) ? n2 : !lm_bind_has(b, n3) ? n3 : NULL;
        if (missing && !b->failed) {
            lm_errf(b->e, "%s: missing tensor \"%s\"", m->path, missing);
            b->failed = 1;
        }
        lm_tensor g = bind_stack(b, n, E, F, D), u = bind_stack(b, n2, E, F, D), dn = bind_stack(b, n3, E, D, F);
        for (int64_t x = 0; x < E && !b->failed; x++) {
            L->gate[x] = row_view(&g, x * F, F);
            L->up[x] = row_view(&u, x * F, F);
            L->down[x] = row_view(&dn, x * D, D);
        }
    } else {
        snprintf(n, sizeof n, nt->gate_up, l);
        snprintf(n2, sizeof n2, nt->down_fused, l);
        bool has_gu = lm_bind_has(b, n), has_dn = lm_bind_has(b, n2);
        if (has_gu || has_dn) {
            if (!has_gu || !has_dn) {
                const char *file = NULL;
                lm_weights_find(m->weights, has_gu ? n : n2, &file);
                lm_errf(b->e, "%s: fused experts \"%s\" without \"%s\"", file, has_gu ? n : n2, has_gu ? n2 : n);
                b->failed = 1;
                return;
            }
            lm_tensor gu = bind_stack(b, n, E, 2 * F, D), dn = bind_stack(b, n2, E, D, F);
            for (int64_t x = 0; x < E && !b->failed; x++) {
                L->gate[x] = row_view(&gu, x * 2 * F, F);
                L->up[x] = row_view(&gu, x * 2 * F + F, F);
                L->down[x] = row_view(&dn, x * D, D);
            }
        } else if (!nt->gate) { /* a layout with fused experts only */
            if (!b->failed) lm_errf(b->e, "%s: missing tensor \"%s\"", m->path, n);
            b->failed = 1;
        } else {
            for (int x = 0; x < E && !b->failed; x++) {
                snprintf(n, sizeof n, nt->gate, l, x);
                lm_bind_matrix(b, &L->gate[x], n, F, D, true, true);
                snprintf(n, sizeof n, nt->up, l, x);
                lm_bind_matrix(b, &L->up[x], n, F, D, true, true);
                snprintf(n, sizeof n, nt->down, l, x);
                lm_bind_matrix(b, &L->down[x], n, D, F, true, true);
            }
        }
    }
    /* A decoded token reads only its top_k experts: count that share. */
    size_t experts = m->weight_bytes - before;
    m->weight_bytes = before + experts / (size_t)E * (size_t)c->n_experts_per_tok;
}

void lm_moe_layer_free(lm_moe_layer *L) {
    free(L->gate);
    free(L->up);
    free(L->down);
    L->gate = L->up = L->down = NULL;
}

/* ---- forward ---- */

/* The router's logits for h and the op's parameters. */
static lm_moe_params moe_route_in(lm_model *m, const lm_moe_layer *L, const lm_tensor *h, const lm_tensor *logits,
                                  lm_tensor *lg) {
    const lm_model_config *c = &m->cfg;
    LM_ASSERT(logits->rows >= h->rows && logits->cols == c->n_experts);
    *lg = lm_tensor_rows(logits, 0, h->rows);
    m->be->ops->matmul(m->be, lg, h, &L->router, NULL);
    return (lm_moe_params){ .n_experts = c->n_experts, .top_k = c->n_experts_per_tok, .norm_topk = c->norm_topk_prob,
                            .gate = L->gate, .up = L->up, .down = L->down, .expert_scale = NULL };
}

void lm_moe_forward(lm_model *m, const lm_moe_layer *L, lm_tensor *out, const lm_tensor *h,
                    const lm_tensor *logits) {
    lm_tensor lg;
    const lm_moe_params p = moe_route_in(m, L, h, logits, &lg);
    m->be->ops->moe(m->be, out, h, &lg, &p);
}

void lm_moe_forward_add(lm_model *m, const lm_moe_layer *L, lm_tensor *x, const lm_tensor *h,
                        const lm_tensor *logits, lm_tensor *ws, const lm_norm_out *norm) {
    lm_tensor lg;
    const lm_moe_params p = moe_route_in(m, L, h, logits, &lg);
    lm_op_moe_add(m->be, x, h, &lg, &p, ws, norm);
}
