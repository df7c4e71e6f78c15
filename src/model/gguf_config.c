/* gguf_config.c - GGUF metadata -> lm_model_config (see lm_gguf_config.h).
 *
 * general.architecture picks a row of k_archs: the lumen model_type that
 * runs it, whether the converter permuted Q and K for pairwise rope, and the
 * reader of its own keys. Conventions of llama.cpp's converter that change
 * stored values (Qwen3.5's norm weights stored as 1 + w, A_log as -exp) are
 * undone where the architecture binds its tensors (qwen35.c), not here. */
#include "lm_gguf_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static const char *arch_key(const lm_gguf_keys *k, const char *key, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", k->arch, key);
    return buf;
}

bool lm_gguf_arch_int(const lm_gguf_keys *k, const char *key, int64_t *out) {
    char name[160];
    return lm_gguf_get_int(k->g, arch_key(k, key, name, sizeof name), out);
}

bool lm_gguf_arch_float(const lm_gguf_keys *k, const char *key, double *out) {
    char name[160];
    return lm_gguf_get_float(k->g, arch_key(k, key, name, sizeof name), out);
}

int lm_gguf_arch_need(const lm_gguf_keys *k, const char *key, int *out, int lo, lm_err *e) {
    char name[160];
    int64_t v;
    arch_key(k, key, name, sizeof name);
    if (!lm_gguf_get_int(k->g, name, &v)) return lm_errf(e, "%s: missing metadata \"%s\"", k->path, name);
    if (v < lo || v > INT32_MAX) return lm_errf(e, "%s: metadata \"%s\" = %lld out of range", k->path, name, (long long)v);
    *out = (int)v;
    return 0;
}

bool lm_gguf_has_layer_tensor(const lm_gguf_keys *k, int layer, const char *suffix) {
    char name[160];
    snprintf(name, sizeof name, "blk.%d.%s", layer, suffix);
    return lm_gguf_find_tensor(k->g, name) != NULL;
}

/* ---- the architectures ---- */

/* Attention biases and per-head q/k norms: whatever tensors the file has. */
static void read_attn_extras(lm_model_config *c, const lm_gguf_keys *k) {
    c->qkv_bias = lm_gguf_has_layer_tensor(k, 0, "attn_q.bias");
    c->o_bias = lm_gguf_has_layer_tensor(k, 0, "attn_output.bias");
    c->qk_norm = lm_gguf_has_layer_tensor(k, 0, "attn_q_norm.weight");
}

/* llama / mistral / qwen2 / qwen3: a sliding window (mistral) covers
 * every layer. */
static int read_dense(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    read_attn_extras(c, k);
    c->rope.freq_factors = lm_gguf_find_tensor(k->g, "rope_freqs.weight") != NULL;
    int64_t w;
    if (lm_gguf_arch_int(k, "attention.sliding_window", &w) && w > 0) {
        if (w > INT32_MAX) return lm_errf(e, "%s: %s.attention.sliding_window out of range", k->path, k->arch);
        c->sliding_window = (int)w;
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = true;
    }
    if (c->d_ff < 1) return lm_errf(e, "%s: missing metadata \"%s.feed_forward_length\"", k->path, k->arch);
    return 0;
}

static int read_qwen3moe(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    read_attn_extras(c, k);
    c->qk_norm = true; /* Qwen3-MoE always has them; binding says so if absent */
    return lm_gguf_config_moe(c, k, e);
}

typedef struct gguf_arch {
    const char *arch;       /* general.architecture */
    const char *model_type; /* what lm_arch_find serves it as */
    bool qk_permuted;       /* the converter permuted Q/K rows for pairwise (GPT-J style) rope */
    int (*read)(lm_model_config *c, const lm_gguf_keys *k, lm_err *e);
} gguf_arch;

/* LlamaModel's converter permutes q/k (llama.cpp then ropes adjacent
 * pairs); every other converter here keeps Hugging Face's row order, which
 * llama.cpp ropes as NEOX (halves), as transformers does. Qwen3.5's
 * interleaved multimodal rope is the plain one for text positions. */
static const gguf_arch k_archs[] = {
    { "llama", "llama", true, read_dense },
    { "qwen2", "qwen2", false, read_dense },
    { "qwen3", "qwen3", false, read_dense },
    { "qwen3moe", "qwen3_moe", false, read_qwen3moe },
    { "qwen35", "qwen3_5_text", false, lm_gguf_config_hybrid },
    { "qwen3next", "qwen3_next", false, lm_gguf_config_hybrid },
    { "qwen35moe", "qwen3_5_moe_text", false, lm_gguf_config_hybrid },
    { "gemma3", "gemma3_text", false, lm_gguf_config_gemma3 },
    { "gemma4", "gemma4_text", false, lm_gguf_config_gemma4 },
};

static const gguf_arch *find_arch(const char *name) {
    for (size_t i = 0; i < LM_COUNT(k_archs); i++)
        if (!strcmp(k_archs[i].arch, name)) return &k_archs[i];
    return NULL;
}

/* ---- common fields ---- */

static int read_rope(lm_model_config *c, const lm_gguf_keys *k, bool permuted, lm_err *e) {
    lm_rope_config *r = &c->rope;
    r->theta = 10000.0;
    r->factor = 1.0;
    r->partial_factor = 1.0;
    r->interleaved = permuted;
    int64_t v;
    lm_gguf_arch_float(k, "rope.freq_base", &r->theta);
    if (!(r->theta > 0)) return lm_errf(e, "%s: %s.rope.freq_base must be > 0", k->path, k->arch);
    if (lm_gguf_arch_int(k, "rope.dimension_count", &v)) {
        if (v <= 0 || v > c->head_dim || v % 2)
            return lm_errf(e, "%s: bad %s.rope.dimension_count %lld", k->path, k->arch, (long long)v);
        r->partial_factor = (double)v / c->head_dim;
    }
    char name[160];
    char *scaling = lm_gguf_get_str(k->g, arch_key(k, "rope.scaling.type", name, sizeof name));
    int rc = 0;
    if (scaling && strcmp(scaling, "none")) {
        if (!strcmp(scaling, "linear")) {
            r->type = LM_ROPE_LINEAR;
        } else if (!strcmp(scaling, "yarn")) {
            r->type = LM_ROPE_YARN;
            r->beta_fast = 32.0;
            r->beta_slow = 1.0;
            r->orig_max_pos = c->max_pos;
            if (lm_gguf_arch_int(k, "rope.scaling.original_context_length", &v)) r->orig_max_pos = (double)v;
            lm_gguf_arch_float(k, "rope.scaling.yarn_beta_fast", &r->beta_fast);
            lm_gguf_arch_float(k, "rope.scaling.yarn_beta_slow", &r->beta_slow);
            lm_gguf_arch_float(k, "rope.scaling.yarn_attn_factor", &r->attn_factor);
        } else {
            rc = lm_errf(e, "%s: unsupported rope scaling \"%s\"", k->path, scaling);
        }
        if (!rc && (!lm_gguf_arch_float(k, "rope.scaling.factor", &r->factor) || !(r->factor > 0)))
            rc = lm_errf(e, "%s: rope scaling without a positive %s.rope.scaling.factor", k->path, k->arch);
    }
    free(scaling);
    return rc;
}

static int read_common(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    int blocks;
    if (lm_gguf_arch_need(k, "embedding_length", &c->d_model, 1, e) ||
        lm_gguf_arch_need(k, "block_count", &blocks, 1, e) ||
        lm_gguf_arch_need(k, "attention.head_count", &c->n_heads, 1, e))
        return -1;
    int64_t v;
    /* multi-token-prediction layers are counted in block_count (the
     * hybrids bind them as their MTP head: gguf_config_hybrid.c) */
    c->n_layers = blocks;
    if (lm_gguf_arch_int(k, "nextn_predict_layers", &v) && v > 0) c->n_layers = blocks - (int)LM_MIN(v, blocks);
    if (c->n_layers < 1) return lm_errf(e, "%s: no decoder layers besides the nextn ones", k->path);
    if (lm_gguf_arch_int(k, "feed_forward_length", &v) && v > 0 && v <= INT32_MAX) c->d_ff = (int)v;
    c->n_kv_heads = c->n_heads;
    if (lm_gguf_arch_int(k, "attention.head_count_kv", &v)) c->n_kv_heads = (int)LM_MIN(v, INT32_MAX);
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return lm_errf(e, "%s: head_count %d is not a multiple of head_count_kv %d", k->path, c->n_heads,
                       c->n_kv_heads);
    c->head_dim = c->d_model / c->n_heads;
    if (lm_gguf_arch_int(k, "attention.key_length", &v)) c->head_dim = (int)LM_MIN(v, INT32_MAX);
    if (c->head_dim <= 0 || c->head_dim % 2) return lm_errf(e, "%s: bad head dimension %d", k->path, c->head_dim);
    c->max_pos = 4096;
    if (lm_gguf_arch_int(k, "context_length", &v) && v > 0 && v <= INT32_MAX) c->max_pos = (int)v;
    double f;
    c->norm_eps = 1e-5f;
    if (lm_gguf_arch_float(k, "attention.layer_norm_rms_epsilon", &f)) c->norm_eps = (float)f;
    c->act = LM_ACT_SILU;

    /* vocab: the embedding's rows (the gemma3 converter drops the rows of
     * ids no token has, so vocab_size may say more), else the key */
    const lm_file_tensor *emb = lm_gguf_find_tensor(k->g, "token_embd.weight");
    if (emb && emb->n_dims == 2) c->vocab = (int)LM_MIN(emb->shape[0], INT32_MAX);
    else if (lm_gguf_arch_int(k, "vocab_size", &v)) c->vocab = (int)LM_MIN(v, INT32_MAX);
    if (c->vocab <= 0) return lm_errf(e, "%s: cannot determine the vocabulary size", k->path);

    c->tie_embeddings = lm_gguf_find_tensor(k->g, "output.weight") == NULL;
    c->layer_sliding = lm_xcalloc((size_t)c->n_layers, sizeof(bool));
    if (lm_gguf_get_int(k->g, "tokenizer.ggml.eos_token_id", &v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int)v;
    }
    if (lm_gguf_get_int(k->g, "tokenizer.ggml.bos_token_id", &v)) c->bos_id = (int)v;
    return 0;
}

static void supported(char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < LM_COUNT(k_archs) && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", k_archs[i].arch);
}

int lm_config_from_gguf(lm_model_config *c, const lm_gguf *g, lm_err *e) {
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    const char *path = g->file.path ? g->file.path : "gguf";
    char *arch = lm_gguf_get_str(g, "general.architecture");
    if (!arch) return lm_errf(e, "%s: missing metadata \"general.architecture\"", path);
    const gguf_arch *a = find_arch(arch);
    if (!a) {
        char list[256];
        supported(list, sizeof list);
        lm_errf(e, "%s: unsupported GGUF architecture \"%.64s\" (supported: %s)", path, arch, list);
        free(arch);
        return -1;
    }
    free(arch);
    snprintf(c->model_type, sizeof c->model_type, "%s", a->model_type);
    lm_gguf_keys k = { g, path, a->arch };
    int rc = read_common(c, &k, e);
    if (!rc) rc = read_rope(c, &k, a->qk_permuted, e);
    if (!rc) rc = a->read(c, &k, e);
    if (rc) lm_config_free(c);
    return rc;
}
