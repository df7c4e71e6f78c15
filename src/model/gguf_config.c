/* gguf_config.c - GGUF metadata -> lm_model_config for the llama architecture.
 *
 * llama.cpp's converter stores the HF config under "llama.*" keys and permutes
 * the rows of Q and K so that rope rotates adjacent pairs; we record that as
 * rope.interleaved instead of undoing the permutation. */
#include "lm_gguf_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int need_int(const lm_gguf *g, const char *key, int *out, int lo, lm_err *e) {
    int64_t v;
    if (!lm_gguf_get_int(g, key, &v)) return lm_errf(e, "%s: missing metadata \"%s\"", g->file.path, key);
    if (v < lo || v > INT32_MAX) return lm_errf(e, "%s: metadata \"%s\" = %lld out of range", g->file.path, key, (long long)v);
    *out = (int)v;
    return 0;
}

int lm_config_from_gguf(lm_model_config *c, const lm_gguf *g, lm_err *e) {
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    const char *path = g->file.path ? g->file.path : "gguf";
    char *arch = lm_gguf_get_str(g, "general.architecture");
    if (!arch) return lm_errf(e, "%s: missing metadata \"general.architecture\"", path);
    if (strcmp(arch, "llama")) {
        lm_errf(e, "%s: unsupported GGUF architecture \"%s\" (supported: llama)", path, arch);
        free(arch);
        return -1;
    }
    free(arch);
    snprintf(c->model_type, sizeof c->model_type, "llama");
    if (need_int(g, "llama.embedding_length", &c->d_model, 1, e) ||
        need_int(g, "llama.block_count", &c->n_layers, 1, e) ||
        need_int(g, "llama.feed_forward_length", &c->d_ff, 1, e) ||
        need_int(g, "llama.attention.head_count", &c->n_heads, 1, e))
        return -1;
    c->n_kv_heads = c->n_heads;
    int64_t v;
    if (lm_gguf_get_int(g, "llama.attention.head_count_kv", &v)) c->n_kv_heads = (int)v;
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return lm_errf(e, "%s: head_count %d is not a multiple of head_count_kv %d", path, c->n_heads, c->n_kv_heads);
    c->head_dim = c->d_model / c->n_heads;
    if (lm_gguf_get_int(g, "llama.attention.key_length", &v)) c->head_dim = (int)v;
    if (c->head_dim <= 0 || c->head_dim % 2) return lm_errf(e, "%s: bad head dimension %d", path, c->head_dim);
    c->max_pos = 4096;
    if (lm_gguf_get_int(g, "llama.context_length", &v) && v > 0 && v <= INT32_MAX) c->max_pos = (int)v;
    double f;
    c->norm_eps = 1e-5f;
    if (lm_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &f)) c->norm_eps = (float)f;

    /* vocab: explicit key, else the tokenizer's token list, else the embedding rows */
    const lm_file_tensor *emb = lm_gguf_find_tensor(g, "token_embd.weight");
    if (lm_gguf_get_int(g, "llama.vocab_size", &v)) c->vocab = (int)v;
    else if (emb && emb->n_dims == 2) c->vocab = (int)emb->shape[0];
    if (c->vocab <= 0) return lm_errf(e, "%s: cannot determine the vocabulary size", path);

    lm_rope_config *r = &c->rope;
    r->theta = 10000.0;
    r->factor = 1.0;
    r->partial_factor = 1.0;
    r->interleaved = true;
    if (lm_gguf_get_float(g, "llama.rope.freq_base", &f)) r->theta = f;
    if (lm_gguf_get_int(g, "llama.rope.dimension_count", &v)) {
        if (v <= 0 || v > c->head_dim || v % 2) return lm_errf(e, "%s: bad rope.dimension_count %lld", path, (long long)v);
        r->partial_factor = (double)v / c->head_dim;
    }
    char *scaling = lm_gguf_get_str(g, "llama.rope.scaling.type");
    if (scaling && strcmp(scaling, "none")) {
        if (!strcmp(scaling, "linear")) {
            r->type = LM_ROPE_LINEAR;
        } else if (!strcmp(scaling, "yarn")) {
            r->type = LM_ROPE_YARN;
            r->beta_fast = 32.0;
            r->beta_slow = 1.0;
            r->orig_max_pos = c->max_pos;
            if (lm_gguf_get_int(g, "llama.rope.scaling.original_context_length", &v)) r->orig_max_pos = (double)v;
        } else {
            lm_errf(e, "%s: unsupported rope scaling \"%s\"", path, scaling);
            free(scaling);
            return -1;
        }
        if (!lm_gguf_get_float(g, "llama.rope.scaling.factor", &r->factor) || !(r->factor > 0)) {
            free(scaling);
            return lm_errf(e, "%s: rope scaling without a positive llama.rope.scaling.factor", path);
        }
    }
    free(scaling);

    c->tie_embeddings = lm_gguf_find_tensor(g, "output.weight") == NULL;
    c->layer_sliding = lm_xcalloc((size_t)c->n_layers, sizeof(bool));
    if (lm_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int)v;
    }
    if (lm_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v)) c->bos_id = (int)v;
    return 0;
}
