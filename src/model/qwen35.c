/* qwen35.c - Qwen3.5 (qwen3_5_text, and the text part of multimodal qwen3_5
 * checkpoints), Qwen3.5-MoE (qwen3_5_moe_text, qwen3_5_moe) and Qwen3-Next
 * (qwen3_next): hybrid decoders of Gated DeltaNet (linear attention) layers
 * and gated full-attention layers.
 *
 * Each layer, with n() the zero-centred RMSNorm x / rms(x) * (1 + w):
 *   h = x + mixer(n(x));   x' = h + ffn(n(h))
 * Full-attention mixer (every full_attention_interval-th layer):
 *   q, gate = Wq n, Wgate n;  k, v = Wk n, Wv n
 *   q, k = rope(n_q(q)), rope(n_k(k))  on the first partial_rotary_factor * Dh dims
 *   out = Wo (attention(q, k, v) * sigmoid(gate))
 * Gated DeltaNet mixer:
 *   q|k|v = silu(causal_conv(Wqkv n)),  z = Wz n
 *   beta = sigmoid(Wb n),  g = -exp(A_log) * softplus(Wa n + dt_bias)
 *   o = delta_rule(l2norm(q), l2norm(k), v, g, beta)   (state per sequence)
 *   out = Wout (rmsnorm(o) * w * silu(z))  per value head
 * ffn: SwiGLU (Qwen3.5), or routed experts plus a shared expert scaled by
 * sigmoid(Wsg n) (Qwen3-Next and Qwen3.5-MoE, lm_moe.h). Qwen3.5-MoE is
 * Qwen3.5's layers with Qwen3-Next's sparse block on every layer (its
 * config has no decoder_sparse_step, mlp_only_layers or norm_topk_prob:
 * the router always renormalises the top k).
 *
 * The two checkpoint formats differ only in how some projections are laid
 * out, and that is resolved at load: q_proj's per-head [q; gate] rows, and
 * Qwen3-Next's in_proj_qkvz / in_proj_ba grouped per key head, are re-ordered
 * into contiguous matrices (host copies in the stored type, owned by the
 * model), so there is one forward pass. Multimodal Qwen3.5 keeps the text
 * weights under model.language_model.*; its vision tower is ignored (text
 * positions make its multimodal rope the plain one).
 *
 * Caches: the KV pool holds the full-attention layers only (kv_layer maps a
 * layer to its pool layer); each linear layer owns one recurrent-state tensor
 * per sequence: its conv window [K-1][C] followed by its delta state
 * [Hv][Dk][Dv]. The MTP head (mtp.*) is bound when present and exposed by
 * lm_qwen35_mtp_head; it is not part of the forward pass but has a forward
 * of its own (lm_qwen35_mtp_forward) built from the same blocks, its
 * attention layers in a KV pool of their own (kv_layer = its MTP layer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_arch.h"
#include "lm_blocks.h"
#include "lm_qwen35.h"

/* ---- config --------------------------------------------------------------- */

static bool has_partial_rotary(json_t *root) {
    if (json_object_get(root, "partial_rotary_factor")) return true;
    json_t *p = json_object_get(root, "rope_parameters");
    if (!json_is_object(p)) p = json_object_get(root, "rope_scaling");
    return json_is_object(p) && json_object_get(p, "partial_rotary_factor");
}

/* layer_types (new and legacy spellings), else full_attention_interval. */
static int parse_layer_types(lm_model_config *c, lm_hybrid_config *h, json_t *root, const char *label, lm_err *e) {
    json_t *lt = json_object_get(root, "layer_types");
    if (!json_is_array(lt)) {
        int every = 4;
        lm_json_int(root, "full_attention_interval", &every);
        if (every < 1) return lm_errf(e, "%s: full_attention_interval must be >= 1", label);
        for (int l = 0; l < c->n_layers; l++) h->layer_linear[l] = (l + 1) % every != 0;
        return 0;
    }
    if ((int)json_array_size(lt) != c->n_layers)
        return lm_errf(e, "%s: layer_types has %zu entries for %d layers", label, json_array_size(lt), c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)l));
        if (s && (!strcmp(s, "linear_attention") || !strcmp(s, "linear"))) h->layer_linear[l] = true;
        else if (!s || (strcmp(s, "full_attention") && strcmp(s, "attention")))
            return lm_errf(e, "%s: layer_types[%d] is \"%s\", expected linear_attention or full_attention", label, l,
                           s ? s : "(not a string)");
    }
    return 0;
}

/* Qwen3.5-MoE: the text config's type, or a multimodal config without one. */
static bool is_q35_moe_type(const char *t) { return !strcmp(t, "qwen3_5_moe_text") || !strcmp(t, "qwen3_5_moe"); }

static int q35_parse_config(lm_model_config *c, json_t *root, const char *label, lm_err *e) {
    if (c->act != LM_ACT_SILU) return lm_errf(e, "%s: %s models use silu", label, c->model_type);
    if (lm_json_bool(root, "attention_bias", false))
        return lm_errf(e, "%s: attention_bias is not supported for %s", label, c->model_type);
    lm_hybrid_config *h = lm_xcalloc(1, sizeof *h + (size_t)c->n_layers * sizeof(bool));
    c->hybrid = h;
    c->qk_norm = true;
    /* transformers' defaults for these configs (Qwen3NextConfig, Qwen3_5TextConfig) */
    if (!has_partial_rotary(root)) c->rope.partial_factor = 0.25;
    h->lin_k_heads = 16, h->lin_v_heads = 32, h->lin_k_dim = 128, h->lin_v_dim = 128, h->conv_kernel = 4;
    lm_json_int(root, "linear_num_key_heads", &h->lin_k_heads);
    lm_json_int(root, "linear_num_value_heads", &h->lin_v_heads);
    lm_json_int(root, "linear_key_head_dim", &h->lin_k_dim);
    lm_json_int(root, "linear_value_head_dim", &h->lin_v_dim);
    lm_json_int(root, "linear_conv_kernel_dim", &h->conv_kernel);
    if (h->lin_k_heads < 1 || h->lin_v_heads < 1 || h->lin_v_heads % h->lin_k_heads)
        return lm_errf(e, "%s: linear_num_value_heads %d must be a positive multiple of linear_num_key_heads %d", label,
                       h->lin_v_heads, h->lin_k_heads);
    if (h->lin_k_dim < 1 || h->lin_v_dim < 1 || h->lin_k_dim > 1024 || h->lin_v_dim > 1024)
        return lm_errf(e, "%s: linear head dims %d / %d out of range [1, 1024]", label, h->lin_k_dim, h->lin_v_dim);
    if (h->conv_kernel < 1 || h->conv_kernel > 16)
        return lm_errf(e, "%s: linear_conv_kernel_dim %d out of range [1, 16]", label, h->conv_kernel);
    h->attn_out_gate = lm_json_bool(root, "attn_output_gate", true);
    lm_json_int(root, "mtp_num_hidden_layers", &h->mtp_layers);
    if (h->mtp_layers < 0 || h->mtp_layers > 64)
        return lm_errf(e, "%s: mtp_num_hidden_layers %d out of range [0, 64]", label, h->mtp_layers);
    if (parse_layer_types(c, h, root, label, e)) return -1;
    /* Qwen3-Next: sparse layers per decoder_sparse_step / mlp_only_layers */
    if (!strcmp(c->model_type, "qwen3_next")) return lm_config_parse_moe(c, root, label, true, e);
    if (is_q35_moe_type(c->model_type)) {
        /* transformers' Qwen3_5MoeTextConfig drops these keys: every layer
         * is sparse and the top k are renormalised, whatever the file says */
        json_t *r = json_copy(root);
        static const char *const gone[] = { "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob" };
        for (size_t i = 0; i < LM_COUNT(gone); i++) json_object_del(r, gone[i]);
        int rc = lm_config_parse_moe(c, r, label, true, e);
        json_decref(r);
        if (rc == 0 && c->n_experts < 1) rc = lm_errf(e, "%s: %s needs num_experts >= 1", label, c->model_type);
        return rc;
    }
    if (c->d_ff < 1) return lm_errf(e, "%s: missing or non-positive \"intermediate_size\"", label);
    return 0;
}

/* ---- model state -------------------------------------------------------------- */

typedef struct q35_scratch {
    int cap, cap_out;
    lm_tensor x, h, o;                  /* [T][D] */
    lm_tensor q, gate, qn, attn;        /* [T][H*Dh] */
    lm_tensor k, kn, v;                 /* [T][Hkv*Dh] */
    lm_tensor qkv, conv;                /* [T][C] */
    lm_tensor z, core, gated;           /* [T][Hv*Dv] */
    lm_tensor ga, gb;                   /* [T][Hv] */
    lm_tensor fg, fu, fa;               /* [T][F] (F: the widest MLP or shared expert) */
    lm_tensor router, o2, sg;           /* [T][E], [T][D], [T][1] (sparse layers) */
    lm_tensor hs, hn, logits;           /* [n_out][D], [n_out][D], [n_out][V] */
} q35_scratch;

typedef struct q35 {
    lm_q35_layer *layers;    /* [n_layers] */
    lm_qwen35_mtp mtp;       /* n_layers == 0: none */
    bool has_mtp;
    const struct q35_names *nt; /* the checkpoint's tensor names */
    char moe_pat[2][9][96];  /* lm_moe_names patterns: main layers, MTP layers */
    char norm_name[64];      /* the final norm's tensor name (HF layouts) */
    lm_moe_names moe_names[2];
    void **host;             /* re-ordered weight copies (lm_xaligned) */
    int n_host;
    q35_scratch s;
    int32_t *next_pos;       /* [seq_cap] batch check: expected next position per sequence */
    int seq_cap;
} q35;

/* ---- binding -------------------------------------------------------------------- */

/* Tensor names of one checkpoint layout: each is the suffix after the
 * layer's prefix ("model.layers.3." or "blk.3."); NULL where the layout has
 * no such tensor. */
typedef struct q35_names {
    const char *in_norm, *post_norm;
    const char *q, *k, *v, *o, *q_norm, *k_norm;           /* full attention */
    const char *qkv, *z, *b, *a, *qkvz, *ba;               /* Gated DeltaNet input projections */
    const char *conv, *a_log, *dt_bias, *norm, *out;
    const char *gate, *up, *down;                          /* dense MLP */
    const char *sh_gate, *sh_up, *sh_down, *sh_router;     /* Qwen3-Next's shared expert */
    const char *moe[9]; /* lm_moe_names order: router, per-expert gate/up/down, fused, stacked */
    /* llama.cpp's converter stores the (1 + w) norms as 1 + w (and the
     * linear-attention norm, a plain w, as it is): adding norm_offset gives
     * back the w that the forward's (1 + w) norms take */
    float norm_offset;
    /* the converter stores A_log as A = -exp(A_log); the delta-rule gates
     * take A_log, so it is read back as log(-A) */
    bool a_negexp;
} q35_names;

static const q35_names k_hf_names = {
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight", "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight",
    "linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.norm.weight",
    "linear_attn.out_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
    "mlp.shared_expert_gate.weight",
    { "%d.mlp.gate.weight", "%d.mlp.experts.%d.gate_proj.weight", "%d.mlp.experts.%d.up_proj.weight",
      "%d.mlp.experts.%d.down_proj.weight", "%d.mlp.experts.gate_up_proj", "%d.mlp.experts.down_proj", NULL, NULL,
      NULL },
    0.0f, false,
};

/* mlx-lm's checkpoints (mlx-community): Qwen3.5 and Qwen3.5-MoE with the
 * text model under language_model.model. (the head language_model.lm_head),
 * Qwen3-Next under model. as in its HF folders; every RMSNorm but the gated
 * one stored as 1 + w (mlx-lm's sanitize adds the 1 that transformers'
 * norms add at run time), conv1d as [C][K][1] (the same bytes as
 * [C][1][K]: that shape is how a checkpoint is known to be mlx-lm's, as
 * mlx-lm itself tells), experts as switch_mlp stacks, Qwen3-Next's fused
 * projections as they are. */
static const q35_names k_mlx_names = {
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight", "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight",
    "linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.norm.weight",
    "linear_attn.out_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight",
    "mlp.shared_expert_gate.weight",
    { "%d.mlp.gate.weight", NULL, NULL, NULL, NULL, NULL, "%d.mlp.switch_mlp.gate_proj.weight",
      "%d.mlp.switch_mlp.up_proj.weight", "%d.mlp.switch_mlp.down_proj.weight" },
    -1.0f, false,
};

/* llama.cpp's converter (Qwen3NextModel, Qwen3_5TextModel): Qwen3-Next's
 * fused in_proj_qkvz is split into attn_qkv (q|k|v) and attn_gate (z);
 * its in_proj_ba stays fused (ssm_ba); experts are stacked [E][..][..]. */
static const q35_names k_gguf_names = {
    "attn_norm.weight", "post_attention_norm.weight",
    "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q_norm.weight", "attn_k_norm.weight",
    "attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight", NULL, "ssm_ba.weight",
    "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight", "ssm_out.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
    "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight",
    { "%d.ffn_gate_inp.weight", NULL, NULL, NULL, "%d.ffn_gate_up_exps.weight", "%d.ffn_down_exps.weight",
      "%d.ffn_gate_exps.weight", "%d.ffn_up_exps.weight",
      "%d.ffn_down_exps.weight" },
    -1.0f, true,
};

/* "<pfx><layer>.<suffix>", e.g. model.layers.3.linear_attn.A_log */
static const char *lname(char *buf, size_t n, const char *pfx, int layer, const char *suffix) {
    snprintf(buf, n, "%s%d.%s", pfx, layer, suffix);
    return buf;
}

/* A host buffer (stored type) the model owns until it is freed. */
static uint8_t *host_part(q35 *q, size_t bytes) {
    uint8_t *host = lm_xaligned(bytes);
    q->host = lm_xrealloc(q->host, (size_t)(q->n_host + 1) * sizeof *q->host);
    q->host[q->n_host++] = host;
    return host;
}

/* Row blocks of checkpoint matrix t [rows][cols] re-ordered: part i is rows
 * map[r_i .. r_i + part_rows[i]) (r_i the sum of the parts before), copied
 * in the stored type into host memory the model owns (host[i]), parts[i]
 * shaped to match, for lm_bind_upload_group. */
static void split_rows(const lm_file_tensor *t, q35 *q, int64_t rows, int64_t cols, const int32_t *map, int n_parts,
                       const int64_t *part_rows, lm_tensor *const *parts, const void **host) {
    const size_t rb = lm_dtype_row_bytes(t->type, cols);
    int64_t r = 0;
    for (int i = 0; i < n_parts; i++) {
        uint8_t *h = host_part(q, (size_t)part_rows[i] * rb);
        for (int64_t j = 0; j < part_rows[i]; j++) {
            LM_ASSERT(map[r + j] >= 0 && map[r + j] < rows);
            memcpy(h + (size_t)j * rb, t->data + (size_t)map[r + j] * rb, rb);
        }
        r += part_rows[i];
        *parts[i] = (lm_tensor){ .type = t->type, .rows = part_rows[i], .cols = cols };
        host[i] = h;
    }
}

/* Host copies (stored type, owned by the model) of the column blocks of
 * checkpoint matrix `name` [rows][n_parts * cols], each uploaded on its own:
 * part i is columns [i * cols, (i + 1) * cols) of every row. */
static void bind_split_cols(lm_binder *b, q35 *q, const char *name, int64_t rows, int n_parts, int64_t cols,
                            lm_tensor *const *parts) {
    const lm_file_tensor *t = lm_bind_find_matrix(b, name, rows, n_parts * cols);
    if (!t) return;
    const size_t rb = lm_dtype_row_bytes(t->type, t->shape[1]), pb = lm_dtype_row_bytes(t->type, cols);
    if (pb * (size_t)n_parts != rb) {
        lm_errf(b->e, "%s: %s rows cannot be split into %d column blocks", name, t->type_name, n_parts);
        b->failed = 1;
        return;
    }
    for (int i = 0; i < n_parts; i++) {
        uint8_t *h = host_part(q, (size_t)rows * pb);
        for (int64_t r = 0; r < rows; r++) memcpy(h + (size_t)r * pb, t->data + (size_t)r * rb + (size_t)i * pb, pb);
        *parts[i] = (lm_tensor){ .type = t->type, .rows = rows, .cols = cols };
        lm_bind_upload_group(b, 1, &parts[i], (const void *const[]){ h }, name);
    }
}

/* q (and the output gate), k and v go up as one group, in the order
 * attn_block multiplies them (matmul_n). */
static void bind_attn(lm_binder *b, q35 *q, lm_q35_attn *A, const char *pfx, int l) {
    const lm_model_config *c = &b->m->cfg;
    const q35_names *nt = q->nt;
    const int64_t D = c->d_model, Dh = c->head_dim, QD = (int64_t)c->n_heads * Dh, KD = (int64_t)c->n_kv_heads * Dh;
    char n[192], nq[192], nk[192], nv[192];
    lname(nq, sizeof nq, pfx, l, nt->q);
    lname(nk, sizeof nk, pfx, l, nt->k);
    lname(nv, sizeof nv, pfx, l, nt->v);
    if (c->hybrid->attn_out_gate) {
        /* q_proj rows are [H][q (Dh); gate (Dh)] (the converter keeps them so) */
        const lm_file_tensor *tq = lm_bind_find_matrix(b, nq, 2 * QD, D);
        const lm_file_tensor *tk = tq ? lm_bind_find_matrix(b, nk, KD, D) : NULL;
        const lm_file_tensor *tv = tk ? lm_bind_find_matrix(b, nv, KD, D) : NULL;
        if (tv) {
            int32_t *map = lm_xmalloc((size_t)(2 * QD) * sizeof(int32_t));
            for (int64_t h = 0; h < c->n_heads; h++)
                for (int64_t i = 0; i < Dh; i++) {
                    map[h * Dh + i] = (int32_t)(h * 2 * Dh + i);
                    map[QD + h * Dh + i] = (int32_t)(h * 2 * Dh + Dh + i);
                }
            const void *host[4];
            split_rows(tq, q, 2 * QD, D, map, 2, (const int64_t[]){ QD, QD }, (lm_tensor *const[]){ &A->wq, &A->wgate },
                       host);
            free(map);
            A->wk = (lm_tensor){ .type = tk->type, .rows = KD, .cols = D };
            A->wv = (lm_tensor){ .type = tv->type, .rows = KD, .cols = D };
            lm_bind_upload_group(b, 4, (lm_tensor *const[]){ &A->wq, &A->wk, &A->wv, &A->wgate },
                                 (const void *const[]){ host[0], tk->data, tv->data, host[1] }, nq);
        }
    } else {
        lm_bind_matrix_group(b, 3, (lm_tensor *const[]){ &A->wq, &A->wk, &A->wv },
                             (const char *const[]){ nq, nk, nv }, (const int64_t[]){ QD, KD, KD }, D);
    }
    lm_bind_matrix(b, &A->wo, lname(n, sizeof n, pfx, l, nt->o), D, QD, true, true);
    lm_bind_f32(b, &A->q_norm, lname(n, sizeof n, pfx, l, nt->q_norm), 1, Dh, true, nt->norm_offset);
    lm_bind_f32(b, &A->k_norm, lname(n, sizeof n, pfx, l, nt->k_norm), 1, Dh, true, nt->norm_offset);
}

/* A_log from a file that stores A = -exp(A_log) (q35_names.a_negexp). */
static void a_log_from_a(lm_binder *b, lm_tensor *t, const char *name) {
    if (b->failed) return;
    lm_backend *be = b->m->be;
    const size_t n = (size_t)(t->rows * t->cols);
    float *host = lm_xmalloc(n * sizeof(float));
    be->ops->read(be, host, t->data, n * sizeof(float));
    for (size_t i = 0; i < n && !b->failed; i++) {
        if (!(host[i] < 0)) {
            lm_errf(b->e, "%s: tensor \"%s\" holds %g, expected -exp(A_log) < 0", b->m->path, name, (double)host[i]);
            b->failed = 1;
        }
        host[i] = logf(-host[i]);
    }
    if (!b->failed) be->ops->write(be, t->data, host, n * sizeof(float));
    free(host);
}

/* The four input projections go up as one group, in the order delta_block
 * multiplies them (matmul_n): qkv, z, b, a. Qwen3-Next's Hugging Face
 * in_proj_qkvz and its in_proj_ba (also in the GGUF, as ssm_ba) interleave
 * them per key head and are re-ordered on the host. */
static void bind_delta(lm_binder *b, q35 *q, lm_q35_delta *Dl, const char *pfx, int l) {
    const lm_model_config *c = &b->m->cfg;
    const lm_hybrid_config *h = c->hybrid;
    const q35_names *nt = q->nt;
    const int64_t D = c->d_model, Hk = h->lin_k_heads, Hv = h->lin_v_heads, Dk = h->lin_k_dim, Dv = h->lin_v_dim;
    const int64_t KD = Hk * Dk, VD = Hv * Dv, C = 2 * KD + VD, K = h->conv_kernel, r = Hv / Hk;
    const bool next = !strcmp(c->model_type, "qwen3_next");
    char n[192];
    const void *host[4] = { NULL };
    int32_t *map = lm_xmalloc((size_t)(C + VD) * sizeof(int32_t));
    if (next && nt->qkvz) {
        /* in_proj_qkvz rows are [Hk][q (Dk); k (Dk); v (r*Dv); z (r*Dv)] */
        const int64_t G = 2 * Dk + 2 * r * Dv;
        for (int64_t g = 0; g < Hk; g++) {
            for (int64_t i = 0; i < Dk; i++) {
                map[g * Dk + i] = (int32_t)(g * G + i);
                map[KD + g * Dk + i] = (int32_t)(g * G + Dk + i);
            }
            for (int64_t i = 0; i < r * Dv; i++) {
                map[2 * KD + g * r * Dv + i] = (int32_t)(g * G + 2 * Dk + i);
                map[C + g * r * Dv + i] = (int32_t)(g * G + 2 * Dk + r * Dv + i);
            }
        }
        const lm_file_tensor *t = lm_bind_find_matrix(b, lname(n, sizeof n, pfx, l, nt->qkvz), C + VD, D);
        if (t)
            split_rows(t, q, C + VD, D, map, 2, (const int64_t[]){ C, VD },
                       (lm_tensor *const[]){ &Dl->w_qkv, &Dl->w_z }, host);
    } else {
        const lm_file_tensor *tq = lm_bind_find_matrix(b, lname(n, sizeof n, pfx, l, nt->qkv), C, D);
        const lm_file_tensor *tz = tq ? lm_bind_find_matrix(b, lname(n, sizeof n, pfx, l, nt->z), VD, D) : NULL;
        if (tz) {
            Dl->w_qkv = (lm_tensor){ .type = tq->type, .rows = C, .cols = D };
            Dl->w_z = (lm_tensor){ .type = tz->type, .rows = VD, .cols = D };
            host[0] = tq->data, host[1] = tz->data;
        }
    }
    if (next) {
        /* in_proj_ba rows are [Hk][b (r); a (r)] */
        for (int64_t g = 0; g < Hk; g++)
            for (int64_t i = 0; i < r; i++) {
                map[g * r + i] = (int32_t)(g * 2 * r + i);
                map[Hv + g * r + i] = (int32_t)(g * 2 * r + r + i);
            }
        const lm_file_tensor *t = lm_bind_find_matrix(b, lname(n, sizeof n, pfx, l, nt->ba), 2 * Hv, D);
        if (t)
            split_rows(t, q, 2 * Hv, D, map, 2, (const int64_t[]){ Hv, Hv }, (lm_tensor *const[]){ &Dl->w_b, &Dl->w_a },
                       host + 2);
    } else {
        const lm_file_tensor *tb = lm_bind_find_matrix(b, lname(n, sizeof n, pfx, l, nt->b), Hv, D);
        const lm_file_tensor *ta = tb ? lm_bind_find_matrix(b, lname(n, sizeof n, pfx, l, nt->a), Hv, D) : NULL;
        if (ta) {
            Dl->w_b = (lm_tensor){ .type = tb->type, .rows = Hv, .cols = D };
            Dl->w_a = (lm_tensor){ .type = ta->type, .rows = Hv, .cols = D };
            host[2] = tb->data, host[3] = ta->data;
        }
    }
    free(map);
    lm_bind_upload_group(b, 4, (lm_tensor *const[]){ &Dl->w_qkv, &Dl->w_z, &Dl->w_b, &Dl->w_a }, host,
                         lname(n, sizeof n, pfx, l, nt->qkvz && next ? nt->qkvz : nt->qkv));
    lm_bind_f32(b, &Dl->conv, lname(n, sizeof n, pfx, l, nt->conv), C, C * K, true, 0.0f);
    lm_bind_vector(b, &Dl->a_log, lname(n, sizeof n, pfx, l, nt->a_log), Hv, true);
    if (nt->a_negexp) a_log_from_a(b, &Dl->a_log, n);
    lm_bind_vector(b, &Dl->dt_bias, lname(n, sizeof n, pfx, l, nt->dt_bias), Hv, true);
    lm_bind_vector(b, &Dl->norm, lname(n, sizeof n, pfx, l, nt->norm), Dv, true);
    lm_bind_matrix(b, &Dl->w_out, lname(n, sizeof n, pfx, l, nt->out), D, VD, true, true);
}

/* lm_moe_names for layers named "<pfx><layer>." (slot 0: main, 1: MTP). */
static const lm_moe_names *moe_names(q35 *q, int slot, const char *pfx) {
    const char *p[9];
    for (int i = 0; i < 9; i++) {
        p[i] = NULL;
        if (!q->nt->moe[i]) continue;
        snprintf(q->moe_pat[slot][i], sizeof q->moe_pat[slot][i], "%s%s", pfx, q->nt->moe[i]);
        p[i] = q->moe_pat[slot][i];
    }
    q->moe_names[slot] = (lm_moe_names){ p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8] };
    return &q->moe_names[slot];
}

static void bind_ffn(lm_binder *b, q35 *q, lm_q35_layer *L, const char *pfx, int l, int slot) {
    const lm_model_config *c = &b->m->cfg;
    const q35_names *nt = q->nt;
    const int64_t D = c->d_model, F = L->moe ? c->shared_expert_d_ff : c->d_ff;
    char n[192], ng[192], nu[192];
    if (L->moe) {
        lm_moe_bind(b, &L->ffn.moe, moe_names(q, slot, pfx), l);
        if (F == 0) return; /* no shared expert */
        lm_bind_matrix(b, &L->ffn.shared_gate, lname(n, sizeof n, pfx, l, nt->sh_router), 1, D, true, true);
    }
    lname(ng, sizeof ng, pfx, l, L->moe ? nt->sh_gate : nt->gate);
    lname(nu, sizeof nu, pfx, l, L->moe ? nt->sh_up : nt->up);
    lm_bind_matrix_group(b, 2, (lm_tensor *const[]){ &L->ffn.gate, &L->ffn.up }, (const char *const[]){ ng, nu },
                         (const int64_t[]){ F, F }, D);
    lm_bind_matrix(b, &L->ffn.down, lname(n, sizeof n, pfx, l, L->moe ? nt->sh_down : nt->down), D, F, true, true);
}

/* Layer l named "<pfx><l>.*"; slot picks the MoE name table (0 main, 1 MTP). */
static void bind_layer(lm_binder *b, q35 *q, lm_q35_layer *L, const char *pfx, int l, int slot) {
    const int64_t D = b->m->cfg.d_model;
    char n[192];
    lm_bind_f32(b, &L->in_norm, lname(n, sizeof n, pfx, l, q->nt->in_norm), 1, D, true, q->nt->norm_offset);
    lm_bind_f32(b, &L->post_norm, lname(n, sizeof n, pfx, l, q->nt->post_norm), 1, D, true, q->nt->norm_offset);
    if (L->linear) bind_delta(b, q, &L->delta, pfx, l);
    else bind_attn(b, q, &L->attn, pfx, l);
    bind_ffn(b, q, L, pfx, l, slot);
}

/* The MTP head's names: the checkpoint's mtp.*, or llama.cpp's nextn
 * layers after the last block of a GGUF (mtp.layers.i as blk.<layers + i>,
 * fc and the head's norms as blk.<layers>.nextn.*). */
typedef struct mtp_names {
    const char *fc, *norm_emb, *norm_hid, *norm, *layer_pfx, *moe_router;
    int layer0; /* the name index of MTP layer 0 */
} mtp_names;

static const mtp_names k_mtp_hf = { "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight",
                                    "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight", "mtp.layers.",
                                    "mlp.gate.weight", 0 };
static const mtp_names k_mtp_gguf = { "nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
                                      "nextn.shared_head_norm.weight", "blk.", "ffn_gate_inp.weight", -1 };

/* Whether the checkpoint has an MTP head, under the names of its format. */
static bool has_mtp(lm_binder *b) {
    char name[192];
    if (!b->m->weights->gguf) return lm_bind_has(b, k_mtp_hf.fc);
    return lm_bind_has(b, lname(name, sizeof name, "blk.", b->m->cfg.n_layers, k_mtp_gguf.fc));
}

/* The MTP head: its layers are full-attention decoder layers. Its weights are
 * not read by a decode step, so m->weight_bytes is left as it was. */
static void bind_mtp(lm_binder *b, q35 *q) {
    const lm_model_config *c = &b->m->cfg;
    const int64_t D = c->d_model;
    const bool gguf = b->m->weights->gguf != NULL;
    const mtp_names *mn = gguf ? &k_mtp_gguf : &k_mtp_hf;
    const int l0 = gguf ? c->n_layers : 0;
    lm_qwen35_mtp *M = &q->mtp;
    int n = c->hybrid->mtp_layers;
    char name[192];
    if (n == 0) /* config silent: count the layers the checkpoint has */
        while (n < 64 && lm_bind_has(b, lname(name, sizeof name, mn->layer_pfx, l0 + n, q->nt->in_norm))) n++;
    size_t bytes = b->m->weight_bytes;
    M->n_layers = n;
    M->layers = lm_xcalloc((size_t)LM_MAX(n, 1), sizeof *M->layers);
#define HEAD_NAME(s) (gguf ? lname(name, sizeof name, "blk.", l0, s) : s)
    bind_split_cols(b, q, HEAD_NAME(mn->fc), D, 2, D, (lm_tensor *const[]){ &M->fc_emb, &M->fc_hidden });
    lm_bind_f32(b, &M->pre_fc_norm_embedding, HEAD_NAME(mn->norm_emb), 1, D, true, q->nt->norm_offset);
    lm_bind_f32(b, &M->pre_fc_norm_hidden, HEAD_NAME(mn->norm_hid), 1, D, true, q->nt->norm_offset);
    lm_bind_f32(b, &M->norm, HEAD_NAME(mn->norm), 1, D, true, q->nt->norm_offset);
#undef HEAD_NAME
    for (int l = 0; l < n && !b->failed; l++) {
        /* full attention; sparse when the checkpoint has a router for it (Qwen3-Next) */
        M->layers[l].moe = c->n_experts > 0 && lm_bind_has(b, lname(name, sizeof name, mn->layer_pfx, l0 + l, mn->moe_router));
        M->layers[l].kv_layer = l; /* in the MTP's own KV pool */
        bind_layer(b, q, &M->layers[l], mn->layer_pfx, l0 + l, 1);
    }
    b->m->weight_bytes = bytes;
    q->has_mtp = !b->failed;
}

/* Whether the first linear layer's conv1d is [C][K][1] with K > 1: mlx-lm's
 * layout (transformers' is [C][1][K]). */
static bool mlx_conv(lm_binder *b, const char *base) {
    const lm_hybrid_config *h = b->m->cfg.hybrid;
    for (int l = 0; l < b->m->cfg.n_layers; l++) {
        if (!h->layer_linear[l]) continue;
        char name[192];
        snprintf(name, sizeof name, "%slayers.%d.linear_attn.conv1d.weight", base, l);
        const lm_file_tensor *t = lm_weights_find(b->m->weights, name, NULL);
        return t && t->n_dims == 3 && t->shape[2] == 1 && t->shape[1] > 1;
    }
    return false;
}

static int q35_bind(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    const lm_hybrid_config *h = c->hybrid;
    q35 *q = lm_xcalloc(1, sizeof *q);
    m->impl = q;
    q->layers = lm_xcalloc((size_t)c->n_layers, sizeof *q->layers);
    lm_binder b = { m, e, 0 };
    char n[192], pfx[64];
    const char *embed = "token_embd.weight", *norm = "output_norm.weight", *head = "output.weight";
    q->nt = m->weights->gguf ? &k_gguf_names : &k_hf_names;
    snprintf(pfx, sizeof pfx, "blk.");
    if (!m->weights->gguf) {
        /* multimodal Qwen3.5 (Qwen3_5ForConditionalGeneration) nests the text
         * model; mlx-lm saves it under language_model.model. */
        const bool mm = lm_bind_has(&b, "model.language_model.embed_tokens.weight");
        const bool mlx_q35 = !mm && lm_bind_has(&b, "language_model.model.embed_tokens.weight");
        const char *base = mm ? "model.language_model." : mlx_q35 ? "language_model.model." : "model.";
        if (mlx_q35 || mlx_conv(&b, base)) q->nt = &k_mlx_names;
        snprintf(pfx, sizeof pfx, "%slayers.", base);
        snprintf(n, sizeof n, "%sembed_tokens.weight", base);
        embed = n;
        snprintf(q->norm_name, sizeof q->norm_name, "%snorm.weight", base);
        norm = q->norm_name;
        head = mlx_q35 ? "language_model.lm_head.weight" : "lm_head.weight";
    }
    lm_bind_matrix(&b, &m->embed, embed, c->vocab, c->d_model, true, c->tie_embeddings);
    lm_bind_f32(&b, &m->out_norm, norm, 1, c->d_model, true, q->nt->norm_offset);
    if (c->tie_embeddings) m->lm_head = m->embed;
    else lm_bind_matrix(&b, &m->lm_head, head, c->vocab, c->d_model, true, true);
    int n_kv = 0, n_state = 0;
    for (int l = 0; l < c->n_layers && !b.failed; l++) {
        lm_q35_layer *L = &q->layers[l];
        L->linear = h->layer_linear[l];
        L->moe = c->layer_moe && c->layer_moe[l];
        if (L->linear) L->state = n_state++;
        else L->kv_layer = n_kv++;
        bind_layer(&b, q, L, pfx, l, 0);
    }
    if (!b.failed && has_mtp(&b)) bind_mtp(&b, q);
    if (b.failed) return -1;
    if (n_state > 64) return lm_errf(e, "%s: %d linear-attention layers, at most 64 supported", m->path, n_state);
    m->n_kv_layers = LM_MAX(n_kv, 1); /* the pool needs a layer even when every layer is linear */
    m->kv_width = (int64_t)c->n_kv_heads * c->head_dim;
    return 0;
}

/* ---- scratch ------------------------------------------------------------------- */

#define Q35_MAX_BUFS 32

/* Every buffer with its shape for a capacity of cap tokens and cap_out logit
 * rows; returns how many. */
typedef struct q35_buf {
    lm_tensor *t;
    int64_t rows, cols;
} q35_buf;

static size_t scratch_plan(const lm_model *m, q35_scratch *s, int cap, int cap_out, q35_buf *p) {
    const lm_model_config *c = &m->cfg;
    const lm_hybrid_config *h = c->hybrid;
    const int64_t D = c->d_model, QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t Hv = h->lin_v_heads, VD = Hv * h->lin_v_dim, C = 2 * (int64_t)h->lin_k_heads * h->lin_k_dim + VD;
    const int64_t F = LM_MAX(c->d_ff, c->shared_expert_d_ff), E = LM_MAX(c->n_experts, 1);
    const q35_buf plan[] = {
        { &s->x, cap, D },     { &s->h, cap, D },     { &s->o, cap, D },
        { &s->q, cap, QD },    { &s->gate, cap, QD }, { &s->qn, cap, QD },   { &s->attn, cap, QD },
        { &s->k, cap, KD },    { &s->kn, cap, KD },   { &s->v, cap, KD },
        { &s->qkv, cap, C },   { &s->conv, cap, C },
        { &s->z, cap, VD },    { &s->core, cap, VD }, { &s->gated, cap, VD },
        { &s->ga, cap, Hv },   { &s->gb, cap, Hv },
        { &s->fg, cap, F },    { &s->fu, cap, F },    { &s->fa, cap, F },
        { &s->router, cap, E }, { &s->o2, cap, D },   { &s->sg, cap, 1 },
        { &s->hs, cap_out, D }, { &s->hn, cap_out, D }, { &s->logits, cap_out, c->vocab },
    };
    LM_ASSERT(LM_COUNT(plan) <= Q35_MAX_BUFS);
    memcpy(p, plan, sizeof plan);
    return LM_COUNT(plan);
}

static void scratch_release(const lm_model *m, q35_scratch *s) {
    q35_buf p[Q35_MAX_BUFS];
    size_t n = scratch_plan(m, s, 0, 0, p);
    for (size_t i = 0; i < n; i++) lm_tensor_release(m->be, p[i].t);
    s->cap = s->cap_out = 0;
}

static int scratch_ensure(lm_model *m, q35_scratch *s, int T, int n_out, lm_err *e) {
    if (s->cap >= T && s->cap_out >= n_out) return 0;
    int cap = LM_MAX(T, s->cap), cap_out = LM_MAX(LM_MAX(n_out, s->cap_out), 1);
    scratch_release(m, s);
    q35_buf p[Q35_MAX_BUFS];
    size_t n = scratch_plan(m, s, cap, cap_out, p);
    for (size_t i = 0; i < n; i++)
        if (lm_tensor_alloc(m->be, p[i].t, p[i].rows, p[i].cols)) {
            scratch_release(m, s);
            return lm_errf(e, "out of memory for activations of a %d-token batch", T);
        }
    s->cap = cap;
    s->cap_out = cap_out;
    return 0;
}

/* ---- forward ------------------------------------------------------------------- */

typedef struct q35_step {
    lm_model *m;
    q35_scratch *s;
    lm_kv_pool *kv;
    const lm_attn_batch *ab;
    const int32_t *pos;
    int T;
} q35_step;

static lm_tensor rows(const lm_tensor *t, int T) { return lm_tensor_rows(t, 0, T); }

/* x += gated full attention of h, then post (the norm of the new x). */
static void attn_block(const q35_step *st, const lm_q35_layer *L, lm_tensor *x, const lm_tensor *h,
                       const lm_norm_out *post) {
    lm_model *m = st->m;
    const lm_model_config *c = &m->cfg;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    q35_scratch *s = st->s;
    const int T = st->T;
    lm_tensor q = rows(&s->q, T), gate = rows(&s->gate, T), qn = rows(&s->qn, T), attn = rows(&s->attn, T);
    lm_tensor k = rows(&s->k, T), kn = rows(&s->kn, T), v = rows(&s->v, T);
    const lm_q35_attn *A = &L->attn;
    const bool gated = c->hybrid->attn_out_gate;
    {
        lm_tensor *ys[4] = { &q, &k, &v, &gate };
        const lm_tensor *ws[4] = { &A->wq, &A->wk, &A->wv, &A->wgate };
        lm_op_matmul_n(be, gated ? 4 : 3, ys, h, ws, NULL);
    }
    lm_rope_params rq = { c->n_heads, c->head_dim, m->rot_dim, c->rope.interleaved, m->inv_freq, m->rope_attn_factor };
    lm_rope_params rk = rq;
    rk.n_heads = c->n_kv_heads;
    lm_op_norm_rope_kv_write(be, &qn, &q, &kn, &k, &v, &A->q_norm, &A->k_norm, c->norm_eps, 1.0f, &rq, &rk, st->kv,
                             L->kv_layer, st->ab);
    lm_attn_params ap = { c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), 0, 0 };
    op->attention(be, &attn, &qn, st->kv, L->kv_layer, st->ab, &ap);
    if (gated) op->sigmoid_mul(be, &attn, &attn, &gate);
    lm_tensor ws = rows(&s->o, T);
    lm_op_matmul_add(be, x, &attn, &A->wo, &ws, post);
}

/* x += Gated DeltaNet of h, then post; updates the layer's recurrent state. */
static void delta_block(const q35_step *st, const lm_q35_layer *L, lm_tensor *x, const lm_tensor *h,
                        const lm_norm_out *post) {
    const lm_model_config *c = &st->m->cfg;
    const lm_hybrid_config *hc = c->hybrid;
    lm_backend *be = st->m->be;
    const struct lm_backend_ops *op = be->ops;
    q35_scratch *s = st->s;
    const int T = st->T;
    lm_tensor qkv = rows(&s->qkv, T), conv = rows(&s->conv, T), z = rows(&s->z, T);
    lm_tensor core = rows(&s->core, T), gated = rows(&s->gated, T), ga = rows(&s->ga, T), gb = rows(&s->gb, T);
    const lm_q35_delta *Dl = &L->delta;
    const int64_t C = qkv.cols;
    {
        lm_tensor *ys[4] = { &qkv, &z, &gb, &ga };
        const lm_tensor *ws[4] = { &Dl->w_qkv, &Dl->w_z, &Dl->w_b, &Dl->w_a };
        lm_op_matmul_n(be, 4, ys, h, ws, NULL);
    }
    op->conv1d_state(be, &conv, &qkv, &Dl->conv, st->kv, (lm_state_ref){ L->state, 0 }, st->ab, true);
    lm_delta_params dp = { hc->lin_k_heads, hc->lin_v_heads, hc->lin_k_dim, hc->lin_v_dim,
                           { L->state, (int64_t)(hc->conv_kernel - 1) * C }, hc->v_tiled };
    lm_op_gated_delta_gates(be, &core, &conv, &ga, &gb, &Dl->a_log, &Dl->dt_bias, st->kv, st->ab, &dp);
    op->rms_norm_gated(be, &gated, &core, &z, &Dl->norm, c->norm_eps);
    lm_tensor ws = rows(&s->o, T);
    lm_op_matmul_add(be, x, &gated, &Dl->w_out, &ws, post);
}

/* The SwiGLU activations of f (the layer's MLP or shared expert) for h:
 * the input of its down projection. */
static lm_tensor mlp_act(const q35_step *st, const lm_q35_ffn *f, const lm_tensor *h) {
    q35_scratch *s = st->s;
    const int64_t F = f->gate.rows;
    lm_tensor fg = rows(&s->fg, st->T), fu = rows(&s->fu, st->T), fa = rows(&s->fa, st->T);
    fg.cols = fu.cols = fa.cols = F; /* views of the widest buffers: rows of F */
    lm_op_matmul_glu(st->m->be, &fa, h, &f->gate, &f->up, LM_GLU_SILU, &fg, &fu);
    return fa;
}

/* x += feed-forward of h (the MLP, or routed experts + sigmoid-gated shared
 * expert), then post (may be NULL). */
static void ffn_block(const q35_step *st, const lm_q35_layer *L, lm_tensor *x, const lm_tensor *h,
                      const lm_norm_out *post) {
    lm_backend *be = st->m->be;
    const struct lm_backend_ops *op = be->ops;
    q35_scratch *s = st->s;
    lm_tensor o = rows(&s->o, st->T);
    if (!L->moe) {
        lm_tensor fa = mlp_act(st, &L->ffn, h);
        lm_op_matmul_add(be, x, &fa, &L->ffn.down, &o, post);
        return;
    }
    if (!L->ffn.gate.data) {
        lm_moe_forward_add(st->m, &L->ffn.moe, x, h, &s->router, &o, post);
        return;
    }
    /* the shared expert's output joins the routed ones before the residual add */
    lm_moe_forward(st->m, &L->ffn.moe, &o, h, &s->router);
    lm_tensor o2 = rows(&s->o2, st->T), sg = rows(&s->sg, st->T);
    lm_tensor fa = mlp_act(st, &L->ffn, h);
    op->matmul(be, &o2, &fa, &L->ffn.down, NULL);
    op->matmul(be, &sg, h, &L->ffn.shared_gate, NULL);
    op->sigmoid_mul(be, &o2, &o2, &sg);
    op->add(be, &o, &o2);
    lm_op_add_norm(be, x, &o, post);
}

/* The recurrent layers read each sequence's tokens in batch order as
 * consecutive positions; a batch that breaks this is refused. */
static int check_batch(q35 *q, const lm_batch *b, lm_err *e) {
    if (b->n_seqs > q->seq_cap) {
        q->seq_cap = LM_MAX(b->n_seqs, 2 * q->seq_cap);
        q->next_pos = lm_xrealloc(q->next_pos, (size_t)q->seq_cap * sizeof(int32_t));
    }
    for (int s = 0; s < b->n_seqs; s++) q->next_pos[s] = -1;
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t *np = &q->next_pos[b->seq[t]];
        if (*np >= 0 && b->pos[t] != *np)
            return lm_errf(e, "sequence %d: position %d follows %d in the batch; a hybrid model needs each "
                              "sequence's tokens in order", b->seq[t], b->pos[t], *np - 1);
        *np = b->pos[t] + 1;
    }
    return 0;
}

/* x += mixer(n(x)); x += ffn(n(x)) for each of the n layers, h = n(x) as
 * scratch: each residual add also norms x for the next sub-block. */
static void layers_run(const q35_step *st, const lm_q35_layer *layers, int n, lm_tensor *x, lm_tensor *h) {
    const lm_model_config *c = &st->m->cfg;
    lm_backend *be = st->m->be;
    if (n > 0) be->ops->rms_norm(be, h, x, &layers[0].in_norm, c->norm_eps, 1.0f);
    for (int l = 0; l < n; l++) {
        const lm_q35_layer *L = &layers[l];
        const lm_norm_out post = { h, &L->post_norm, c->norm_eps, 1.0f };
        if (L->linear) delta_block(st, L, x, h, &post);
        else attn_block(st, L, x, h, &post);
        const lm_norm_out next = { h, l + 1 < n ? &layers[l + 1].in_norm : NULL, c->norm_eps, 1.0f };
        ffn_block(st, L, x, h, next.w ? &next : NULL);
    }
}

/* The batch's logit rows of x: norm(x) into hidden_out [n_out][D] (host, may
 * be NULL), lm_head(norm(x)) into logits [n_out][V] (host, may be NULL). */
static void head(lm_model *m, q35_scratch *s, const lm_tensor *x, const lm_tensor *norm, const lm_batch *b,
                 float *logits, float *hidden_out) {
    const lm_model_config *c = &m->cfg;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    lm_tensor ws = lm_tensor_rows(&s->h, 0, x->rows);
    lm_hidden_out(m, x, &ws, norm, 1.0f, b);
    if (b->n_out == 0) return;
    lm_tensor hs = lm_tensor_rows(&s->hs, 0, b->n_out), hn = lm_tensor_rows(&s->hn, 0, b->n_out);
    lm_tensor lg = lm_tensor_rows(&s->logits, 0, b->n_out);
    op->gather_rows(be, &hs, x, b->out_rows, b->n_out);
    op->rms_norm(be, &hn, &hs, norm, c->norm_eps, 1.0f);
    if (hidden_out) op->read(be, hidden_out, hn.data, (size_t)b->n_out * (size_t)c->d_model * sizeof(float));
    if (!logits && !b->out_argmax) return;
    op->matmul(be, &lg, &hn, &m->lm_head, NULL);
    lm_logits_out(m, b, &lg, logits);
}

static int q35_run(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, float *hidden_out, lm_err *e) {
    q35 *q = m->impl;
    const lm_model_config *c = &m->cfg;
    const int T = b->n_tokens;
    if (check_batch(q, b, e) || scratch_ensure(m, &q->s, T, b->n_out, e)) return -1;
    q35_scratch *s = &q->s;
    lm_attn_batch ab = { T, b->pos, b->seq, b->n_seqs, b->block_tables, b->state_slot, b->state_out };
    q35_step st = { m, s, kv, &ab, b->pos, T };
    lm_tensor x = rows(&s->x, T), h = rows(&s->h, T);
    lm_embed_tokens(m, &x, &m->embed, b);
    layers_run(&st, q->layers, c->n_layers, &x, &h);
    head(m, s, &x, &m->out_norm, b, logits, hidden_out);
    return 0;
}

static int q35_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    return q35_run(m, kv, b, logits, NULL, e);
}

static bool is_q35(const lm_model *m);

int lm_qwen35_forward_hidden(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, float *hidden_out,
                             lm_err *e) {
    if (!is_q35(m)) return lm_errf(e, "%s is not a qwen3_5 / qwen3_next model", m->cfg.model_type);
    if (lm_model_check_batch(m, kv, b, e)) return -1;
    return q35_run(m, kv, b, logits, hidden_out, e);
}

/* The MTP head over b (lm_qwen35_mtp_forward), its out rows' final hidden
 * states (after mtp.norm) into hidden_out when not NULL. */
static int mtp_run(lm_model *m, lm_kv_pool *mtp_kv, const lm_batch *b, const float *hidden, float *logits,
                   float *hidden_out, lm_err *e) {
    const lm_qwen35_mtp *M = lm_qwen35_mtp_head(m);
    if (!M) return lm_errf(e, "%s: the model has no MTP head", m->path);
    if (mtp_kv->n_layers < M->n_layers || mtp_kv->kv_width < m->kv_width)
        return lm_errf(e, "MTP KV pool of %d layers of width %lld; the head needs %d of %lld", mtp_kv->n_layers,
                       (long long)mtp_kv->kv_width, M->n_layers, (long long)m->kv_width);
    if (lm_model_check_batch(m, mtp_kv, b, e)) return -1;
    if (!b->tokens || b->argmax_later) return lm_errf(e, "the MTP head takes its tokens from the host");
    q35 *q = m->impl;
    const lm_model_config *c = &m->cfg;
    const int T = b->n_tokens;
    if (scratch_ensure(m, &q->s, T, b->n_out, e)) return -1;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    q35_scratch *s = &q->s;
    lm_attn_batch ab = { T, b->pos, b->seq, b->n_seqs, b->block_tables, NULL, NULL };
    q35_step st = { m, s, mtp_kv, &ab, b->pos, T };
    lm_tensor x = rows(&s->x, T), h = rows(&s->h, T), o = rows(&s->o, T);
    /* x = fc [n_e(embed(next)) ; n_h(hidden)] = fc_emb n_e(...) + fc_hidden n_h(...) */
    op->get_rows(be, &x, &m->embed, b->tokens);
    op->rms_norm(be, &h, &x, &M->pre_fc_norm_embedding, c->norm_eps, 1.0f);
    op->write(be, o.data, hidden, (size_t)T * (size_t)c->d_model * sizeof(float));
    op->rms_norm(be, &x, &o, &M->pre_fc_norm_hidden, c->norm_eps, 1.0f);
    op->matmul(be, &o, &x, &M->fc_hidden, NULL);
    op->matmul(be, &x, &h, &M->fc_emb, NULL);
    op->add(be, &x, &o);
    layers_run(&st, M->layers, M->n_layers, &x, &h);
    head(m, s, &x, &M->norm, b, logits, hidden_out);
    return 0;
}

int lm_qwen35_mtp_forward(lm_model *m, lm_kv_pool *mtp_kv, const lm_batch *b, const float *hidden, float *logits,
                          lm_err *e) {
    return mtp_run(m, mtp_kv, b, hidden, logits, NULL, e);
}

/* ---- the draft hook (lm_arch.h): the MTP head, chained through its own
 * hidden state beyond the first guess ---- */

static int q35_draft_layers(const lm_model *m) {
    const lm_qwen35_mtp *M = lm_qwen35_mtp_head(m);
    return M ? M->n_layers : 0;
}

static int q35_draft_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, const float *hidden, float *hidden_out,
                             lm_err *e) {
    return mtp_run(m, kv, b, hidden, NULL, hidden_out, e);
}

static const lm_draft k_q35_draft = { .kv_layers = q35_draft_layers, .forward = q35_draft_forward };

/* ---- state, lifetime, registration ------------------------------------------------ */

/* One state tensor per linear layer: conv window [K-1][C], then [Hv][Dk][Dv]. */
static int q35_state_spec(const lm_model *m, int64_t *floats, int max) {
    const lm_model_config *c = &m->cfg;
    const lm_hybrid_config *h = c->hybrid;
    const int64_t VD = (int64_t)h->lin_v_heads * h->lin_v_dim, C = 2 * (int64_t)h->lin_k_heads * h->lin_k_dim + VD;
    const int64_t per = (int64_t)(h->conv_kernel - 1) * C + VD * h->lin_k_dim;
    int n = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (h->layer_linear[l]) {
            if (n < max) floats[n] = per;
            n++;
        }
    return n;
}

static void q35_free(lm_model *m) {
    q35 *q = m->impl;
    if (!q) return;
    scratch_release(m, &q->s);
    for (int l = 0; l < m->cfg.n_layers; l++) lm_moe_layer_free(&q->layers[l].ffn.moe);
    for (int l = 0; l < q->mtp.n_layers; l++) lm_moe_layer_free(&q->mtp.layers[l].ffn.moe);
    for (int i = 0; i < q->n_host; i++) lm_afree(q->host[i]);
    free(q->host);
    free(q->mtp.layers);
    free(q->layers);
    free(q->next_pos);
    free(q);
    m->impl = NULL;
}

static const char *const k_q35_types[] = { "qwen3_5_text", "qwen3_5", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe",
                                           NULL };

const lm_arch lm_arch_qwen35 = {
    .name = "qwen35",
    .model_types = k_q35_types,
    .parse_config = q35_parse_config,
    .bind = q35_bind,
    .forward = q35_forward,
    .free = q35_free,
    .state_spec = q35_state_spec,
    .state_per_pos = true,
    .draft = &k_q35_draft,
};

static bool is_q35(const lm_model *m) { return m && m->arch == &lm_arch_qwen35 && m->impl; }

const lm_qwen35_mtp *lm_qwen35_mtp_head(const lm_model *m) {
    if (!is_q35(m)) return NULL;
    const q35 *q = m->impl;
    return q && q->has_mtp ? &q->mtp : NULL;
}
