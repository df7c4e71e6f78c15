/* load.c - build an lm_model from a Hugging Face folder or a GGUF file.
 *
 * The checkpoint's tensor names are data (two name tables below); every tensor
 * is checked for presence, dtype and shape, with expected vs actual in the
 * error. Matrices stay in the mapped file in their stored type; small vectors
 * (norms, biases) are converted to f32 because every op reads them as f32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"
#include "lm_gguf_config.h"
#include "lm_model.h"
#include "lm_model_internal.h"

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

static const char *fmt_name(char *buf, size_t n, const char *pattern, int layer) {
    snprintf(buf, n, pattern, layer);
    return buf;
}

static void shape_str(char *buf, size_t n, const lm_file_tensor *t) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Finds `name` and checks it is a rows x cols matrix (cols == 0: a vector of
 * `rows`) of a type lumen computes with. */
static const lm_file_tensor *find_checked(lm_model *m, const char *name, int64_t rows, int64_t cols,
                                          bool required, lm_err *e, int *failed) {
    const char *file = NULL;
    const lm_file_tensor *t = lm_weights_find(&m->src, name, &file);
    const char *where = file ? file : m->path;
    if (!t) {
        if (required) {
            /* name the file a reader would look in: the only weight file, else the folder */
            if (m->src.gguf) where = m->src.gguf->file.path;
            else if (m->src.n_files == 1) where = m->src.st[0].file.path;
            lm_errf(e, "%s: missing tensor \"%s\"", where, name);
            *failed = 1;
        }
        return NULL;
    }
    /* A vector may be stored as [n] or [1, n]; a matrix exactly [rows, cols]. */
    bool ok = cols ? (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols)
                   : (lm_file_tensor_numel(t) == rows && (t->n_dims == 1 || (t->n_dims == 2 && t->shape[0] == 1)));
    if (!ok) {
        char got[128];
        shape_str(got, sizeof got, t);
        if (cols) lm_errf(e, "%s: tensor \"%s\" has shape %s, expected [%lld, %lld]", where, name, got, (long long)rows, (long long)cols);
        else lm_errf(e, "%s: tensor \"%s\" has shape %s, expected [%lld]", where, name, got, (long long)rows);
        *failed = 1;
        return NULL;
    }
    if (t->type == LM_DTYPE_COUNT || t->type == LM_I32) {
        lm_errf(e, "%s: tensor \"%s\" has type %s, which lumen cannot compute with", where, name, t->type_name);
        *failed = 1;
        return NULL;
    }
    int64_t width = cols ? cols : rows;
    if (width % lm_dtype_block(t->type)) {
        lm_errf(e, "%s: tensor \"%s\" row of %lld is not a whole number of %s blocks", where, name, (long long)width, t->type_name);
        *failed = 1;
        return NULL;
    }
    return t;
}

static void bind_matrix(lm_model *m, lm_tensor *dst, const char *name, int64_t rows, int64_t cols,
                        bool required, lm_err *e, int *failed) {
    if (*failed) return;
    const lm_file_tensor *t = find_checked(m, name, rows, cols, required, e, failed);
    if (!t) return;
    *dst = (lm_tensor){ .type = t->type, .rows = rows, .cols = cols };
    if (m->be->ops->upload_weight(m->be, dst, t->data, e)) {
        lm_err_prefix(e, "%s", name);
        *failed = 1;
    }
}

/* Vectors become f32 copies in backend memory, plus `offset` added to every
 * element when the architecture stores norms as (w - offset). */
static void bind_vector(lm_model *m, lm_tensor *dst, const char *name, int64_t n, bool required,
                        lm_err *e, int *failed) {
    if (*failed) return;
    const lm_file_tensor *t = find_checked(m, name, n, 0, required, e, failed);
    if (!t) return;
    float *host = lm_xmalloc((size_t)n * sizeof(float));
    lm_dequant_row(t->type, t->data, host, n);
    lm_tensor v = { .type = LM_F32, .rows = 1, .cols = n };
    v.data = m->be->ops->alloc(m->be, (size_t)n * sizeof(float));
    if (!v.data) {
        free(host);
        lm_errf(e, "%s: out of memory for \"%s\"", m->path, name);
        *failed = 1;
        return;
    }
    m->be->ops->write(m->be, v.data, host, (size_t)n * sizeof(float));
    free(host);
    m->owned = lm_xrealloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = v.data;
    *dst = v;
}

static int bind_all(lm_model *m, const name_table *nt, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    int64_t D = c->d_model, F = c->d_ff, V = c->vocab;
    int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    int failed = 0;
    char n[160];
    bind_matrix(m, &m->embed, nt->embed, V, D, true, e, &failed);
    bind_vector(m, &m->out_norm, nt->out_norm, D, true, e, &failed);
    if (c->tie_embeddings) m->lm_head = m->embed;
    else bind_matrix(m, &m->lm_head, nt->lm_head, V, D, true, e, &failed);
    m->layers = lm_xcalloc((size_t)c->n_layers, sizeof *m->layers);
    for (int l = 0; l < c->n_layers && !failed; l++) {
        lm_layer *L = &m->layers[l];
        bind_vector(m, &L->attn_norm, fmt_name(n, sizeof n, nt->attn_norm, l), D, true, e, &failed);
        bind_matrix(m, &L->wq, fmt_name(n, sizeof n, nt->wq, l), QD, D, true, e, &failed);
        bind_matrix(m, &L->wk, fmt_name(n, sizeof n, nt->wk, l), KD, D, true, e, &failed);
        bind_matrix(m, &L->wv, fmt_name(n, sizeof n, nt->wv, l), KD, D, true, e, &failed);
        bind_matrix(m, &L->wo, fmt_name(n, sizeof n, nt->wo, l), D, QD, true, e, &failed);
        bind_vector(m, &L->bq, fmt_name(n, sizeof n, nt->bq, l), QD, c->qkv_bias, e, &failed);
        bind_vector(m, &L->bk, fmt_name(n, sizeof n, nt->bk, l), KD, c->qkv_bias, e, &failed);
        bind_vector(m, &L->bv, fmt_name(n, sizeof n, nt->bv, l), KD, c->qkv_bias, e, &failed);
        bind_vector(m, &L->bo, fmt_name(n, sizeof n, nt->bo, l), D, c->o_bias, e, &failed);
        bind_vector(m, &L->q_norm, fmt_name(n, sizeof n, nt->q_norm, l), c->head_dim, c->qk_norm, e, &failed);
        bind_vector(m, &L->k_norm, fmt_name(n, sizeof n, nt->k_norm, l), c->head_dim, c->qk_norm, e, &failed);
        bind_vector(m, &L->ffn_norm, fmt_name(n, sizeof n, nt->ffn_norm, l), D, true, e, &failed);
        bind_matrix(m, &L->w_gate, fmt_name(n, sizeof n, nt->gate, l), F, D, true, e, &failed);
        bind_matrix(m, &L->w_up, fmt_name(n, sizeof n, nt->up, l), F, D, true, e, &failed);
        bind_matrix(m, &L->w_down, fmt_name(n, sizeof n, nt->down, l), D, F, true, e, &failed);
    }
    return failed ? -1 : 0;
}

/* Rope frequencies, including GGUF's optional per-frequency divisors
 * (rope_freqs.weight, how llama.cpp stores Llama 3 scaling). */
static int setup_rope(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    m->rot_dim = (int)(c->head_dim * c->rope.partial_factor);
    m->rot_dim -= m->rot_dim % 2;
    if (m->rot_dim <= 0) return lm_errf(e, "%s: rotary dimension is zero", m->path);
    m->inv_freq = lm_xmalloc((size_t)(m->rot_dim / 2) * sizeof(float));
    m->rope_attn_factor = lm_rope_inv_freq(&c->rope, m->rot_dim, m->inv_freq);
    if (m->src.gguf) {
        int failed = 0;
        const lm_file_tensor *t = find_checked(m, "rope_freqs.weight", m->rot_dim / 2, 0, false, e, &failed);
        if (failed) return -1;
        if (t) {
            float *div = lm_xmalloc((size_t)(m->rot_dim / 2) * sizeof(float));
            lm_dequant_row(t->type, t->data, div, m->rot_dim / 2);
            for (int i = 0; i < m->rot_dim / 2; i++) m->inv_freq[i] /= div[i];
            free(div);
        }
    }
    return 0;
}

static bool is_gguf_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4] = { 0 };
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(magic, "GGUF", 4);
}

int lm_model_load(lm_model **out, const char *path, lm_backend *be, lm_err *e) {
    *out = NULL;
    lm_model *m = lm_xcalloc(1, sizeof *m);
    m->be = be;
    m->path = lm_xstrdup(path);
    int rc;
    if (lm_is_dir(path)) {
        rc = lm_config_load_hf(&m->cfg, path, e);
        if (!rc) rc = lm_weights_open_hf(&m->src, path, e);
        if (!rc) rc = bind_all(m, &k_hf_names, e);
    } else if (!lm_file_exists(path)) {
        rc = lm_errf(e, "%s: no such file or directory", path);
    } else if (is_gguf_file(path)) {
        rc = lm_weights_open_gguf(&m->src, path, e);
        if (!rc) rc = lm_config_from_gguf(&m->cfg, m->src.gguf, e);
        if (!rc) rc = bind_all(m, &k_gguf_names, e);
    } else {
        rc = lm_errf(e, "%s: not a model folder or a GGUF file", path);
    }
    if (!rc) rc = setup_rope(m, e);
    if (rc) {
        lm_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void lm_model_free(lm_model *m) {
    if (!m) return;
    lm_model_scratch_free(m);
    for (int i = 0; i < m->n_owned; i++) m->be->ops->free(m->be, m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->inv_freq);
    lm_config_free(&m->cfg);
    lm_weights_close(&m->src);
    free(m->path);
    free(m);
}

size_t lm_model_kv_bytes_per_token(const lm_model *m) {
    return (size_t)m->cfg.n_layers * 2 * (size_t)m->cfg.n_kv_heads * (size_t)m->cfg.head_dim * sizeof(float);
}

static size_t tensor_bytes(const lm_tensor *t) {
    return t->data ? (size_t)t->rows * lm_dtype_row_bytes(t->type, t->cols) : 0;
}

size_t lm_model_weight_bytes(const lm_model *m) {
    size_t b = tensor_bytes(&m->lm_head) + lm_dtype_row_bytes(m->embed.type, m->embed.cols);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const lm_layer *L = &m->layers[l];
        b += tensor_bytes(&L->wq) + tensor_bytes(&L->wk) + tensor_bytes(&L->wv) + tensor_bytes(&L->wo);
        b += tensor_bytes(&L->w_gate) + tensor_bytes(&L->w_up) + tensor_bytes(&L->w_down);
    }
    return b;
}
