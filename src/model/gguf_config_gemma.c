/* gguf_config_gemma.c - the GGUF keys of Gemma 3 and Gemma 4, as llama.cpp's
 * converter writes them and its loader reads them.
 *
 * What the file does not say is taken as llama.cpp takes it: the sliding
 * layers follow attention.sliding_window_pattern (a period, default 6, or
 * one flag per layer) when attention.sliding_window is set; sliding layers
 * rope with rope.freq_base_swa (default 10000); the attention scale is
 * 1/sqrt(head_dim), except for the 62-layer (27B) model whose
 * query_pre_attn_scalar is hidden / heads. The norm weights are stored as
 * 1 + w (gemma.c binds them so). */
#include <math.h>
#include <string.h>

#include "lm_gemma.h"
#include "lm_gguf_config.h"

/* Which layers use the sliding window. */
static int read_sliding(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    int64_t w;
    if (!lm_gguf_arch_int(k, "attention.sliding_window", &w) || w <= 0) return 0;
    if (w > INT32_MAX) return lm_errf(e, "%s: %s.attention.sliding_window out of range", k->path, k->arch);
    c->sliding_window = (int)w;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", k->arch);
    const lm_gguf_kv *kv = lm_gguf_find_kv(k->g, key);
    if (kv && kv->type == LM_GGUF_ARRAY) {
        if (kv->arr_count != (uint64_t)c->n_layers || (kv->arr_type != LM_GGUF_BOOL && kv->arr_type != LM_GGUF_U8))
            return lm_errf(e, "%s: %s is not one flag per layer", k->path, key);
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = kv->arr_data[l] != 0;
        return 0;
    }
    int64_t period = 6;
    if (kv && (!lm_gguf_get_int(k->g, key, &period) || period < 1))
        return lm_errf(e, "%s: %s must be a positive period or one flag per layer", k->path, key);
    for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = (l + 1) % period != 0;
    return 0;
}

/* Sliding layers' rope: rope.freq_base_swa, 10000 when absent (llama.cpp's
 * default), over the whole head. */
static int read_swa_rope(struct lm_gemma_config *g, const lm_gguf_keys *k, lm_err *e) {
    double theta = 10000.0;
    lm_gguf_arch_float(k, "rope.freq_base_swa", &theta);
    if (!(theta > 0)) return lm_errf(e, "%s: %s.rope.freq_base_swa must be > 0", k->path, k->arch);
    g->rope[1] = (gemma_rope_cfg){ GEMMA_ROPE_DEFAULT, theta, 1, 1 };
    return 0;
}

int lm_gguf_config_gemma3(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    c->act = LM_ACT_GELU_TANH;
    c->qk_norm = true;
    c->qkv_bias = lm_gguf_has_layer_tensor(k, 0, "attn_q.bias");
    c->o_bias = lm_gguf_has_layer_tensor(k, 0, "attn_output.bias");
    if (c->d_ff < 1) return lm_errf(e, "%s: missing metadata \"%s.feed_forward_length\"", k->path, k->arch);
    if (c->rope.type != LM_ROPE_DEFAULT && c->rope.type != LM_ROPE_LINEAR)
        return lm_errf(e, "%s: gemma3 takes linear rope scaling only", k->path);
    struct lm_gemma_config *g = lm_gemma_config_new(c, 3);
    if (read_sliding(c, k, e)) return -1;
    double cap = 0;
    g->rope[0] = (gemma_rope_cfg){ c->rope.type == LM_ROPE_LINEAR ? GEMMA_ROPE_LINEAR : GEMMA_ROPE_DEFAULT,
                                   c->rope.theta, c->rope.factor, 1 };
    if (read_swa_rope(g, k, e)) return -1;
    const double scalar = c->n_layers == 62 ? (double)c->d_model / c->n_heads : (double)c->head_dim;
    g->attn_scale = (float)pow(scalar, -0.5);
    if (lm_gguf_arch_float(k, "final_logit_softcapping", &cap) && !(cap >= 0))
        return lm_errf(e, "%s: %s.final_logit_softcapping must be >= 0", k->path, k->arch);
    g->final_softcap = (float)cap;
    return lm_gemma_config_check(c, k->path, e);
}

/* "<arch>.<key>" as one value for every layer or one per layer, into
 * out[n_layers]; 0 when absent (out untouched), 1 when read, -1 on error. */
static int per_layer_int(const lm_gguf_keys *k, const char *key, int n_layers, int *out, lm_err *e) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", k->arch, key);
    const lm_gguf_kv *kv = lm_gguf_find_kv(k->g, name);
    if (!kv) return 0;
    int64_t v;
    for (int l = 0; l < n_layers; l++) {
        bool ok = kv->type == LM_GGUF_ARRAY ? kv->arr_count == (uint64_t)n_layers && lm_gguf_arr_int(kv, (uint64_t)l, &v)
                                            : lm_gguf_get_int(k->g, name, &v);
        if (!ok || v < 1 || v > INT32_MAX)
            return lm_errf(e, "%s: %s must be a positive integer or one per layer", k->path, name);
        out[l] = (int)v;
    }
    return 1;
}

/* The full layers' proportional rope: llama.cpp's converter ropes all of
 * their head width but stores a frequency factor per pair, 1 for the
 * rotated pairs and 1e30 for the rest (Gemma4Model.generate_extra_tensors),
 * so the rotated fraction is the share of factors equal to 1. */
static int read_proportional(struct lm_gemma_config *g, const lm_gguf_keys *k, int full_dh, lm_err *e) {
    const lm_file_tensor *t = lm_gguf_find_tensor(k->g, "rope_freqs.weight");
    if (!t) { /* every pair rotates */
        g->rope[0].type = GEMMA_ROPE_DEFAULT;
        return 0;
    }
    if (t->type != LM_F32 || lm_file_tensor_numel(t) != full_dh / 2)
        return lm_errf(e, "%s: rope_freqs.weight is not %d f32 factors", k->path, full_dh / 2);
    int rotated = 0;
    for (int i = 0; i < full_dh / 2; i++) {
        float f;
        memcpy(&f, t->data + (size_t)i * sizeof f, sizeof f);
        if (f == 1.0f && rotated == i) rotated++;
        else if (!(f >= 1e20f)) return lm_errf(e, "%s: rope_freqs.weight[%d] = %g is neither 1 nor unrotated", k->path, i, (double)f);
    }
    g->rope[0].type = GEMMA_ROPE_PROPORTIONAL;
    g->rope[0].partial = 2.0 * rotated / full_dh;
    return 0;
}

int lm_gguf_config_gemma4(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    c->act = LM_ACT_GELU_TANH;
    c->qk_norm = true;
    c->qkv_bias = lm_gguf_has_layer_tensor(k, 0, "attn_q.bias");
    c->o_bias = lm_gguf_has_layer_tensor(k, 0, "attn_output.bias");
    /* the MoE block (26B-A4B): beside the dense MLP in the layers with a router */
    if (lm_gguf_has_layer_tensor(k, 0, "ffn_gate_inp.weight") && lm_gguf_config_moe(c, k, e)) return -1;
    /* head widths: key_length is the full layers', key_length_swa the sliding ones' */
    const int full_dh = c->head_dim;
    int swa_dh;
    if (lm_gguf_arch_need(k, "attention.key_length_swa", &swa_dh, 2, e)) return -1;
    c->head_dim = swa_dh;
    int *kv = lm_xmalloc((size_t)c->n_layers * sizeof(int)), *ff = lm_xmalloc((size_t)c->n_layers * sizeof(int));
    int got_kv = per_layer_int(k, "attention.head_count_kv", c->n_layers, kv, e);
    int got_ff = got_kv < 0 ? -1 : per_layer_int(k, "feed_forward_length", c->n_layers, ff, e);
    if (got_ff < 0 || !got_ff) {
        free(kv);
        free(ff);
        return got_ff < 0 ? -1 : lm_errf(e, "%s: missing metadata \"%s.feed_forward_length\"", k->path, k->arch);
    }
    if (got_kv) c->n_kv_heads = kv[0];
    c->d_ff = ff[0];
    struct lm_gemma_config *g = lm_gemma_config_new(c, 4);
    int rc = read_sliding(c, k, e);
    if (!rc && !c->sliding_window) rc = lm_errf(e, "%s: missing metadata \"%s.attention.sliding_window\"", k->path, k->arch);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        gemma_layer_cfg *L = &g->layer[l];
        L->head_dim = c->layer_sliding[l] ? swa_dh : full_dh;
        if (got_kv) L->n_kv_heads = kv[l];
        L->d_ff = ff[l];
    }
    free(kv);
    free(ff);
    if (rc) return -1;
    int64_t v;
    int shared = 0;
    if (lm_gguf_arch_int(k, "attention.shared_kv_layers", &v)) shared = (int)LM_MIN(LM_MAX(v, -1), INT32_MAX);
    /* the converter writes the doubled MLP widths itself */
    if (lm_gemma_share_kv(c, shared, false, k->path, e)) return -1;
    /* attention_k_eq_v: a full layer that computes K/V but has no V projection */
    for (int l = 0; l < c->n_layers; l++)
        g->layer[l].k_eq_v = !c->layer_sliding[l] && !g->layer[l].shared && !lm_gguf_has_layer_tensor(k, l, "attn_v.weight");
    double cap = 0;
    g->rope[0] = (gemma_rope_cfg){ GEMMA_ROPE_DEFAULT, c->rope.theta, 1, 1 };
    if (read_swa_rope(g, k, e) || read_proportional(g, k, full_dh, e)) return -1;
    g->attn_scale = 1.0f;
    if (lm_gguf_arch_float(k, "final_logit_softcapping", &cap) && !(cap >= 0))
        return lm_errf(e, "%s: %s.final_logit_softcapping must be >= 0", k->path, k->arch);
    g->final_softcap = (float)cap;
    /* per-layer inputs: P from the key, their vocabulary from the table */
    if (lm_gguf_arch_int(k, "embedding_length_per_layer_input", &v) && v > 0 && v <= INT32_MAX) {
        const lm_file_tensor *t = lm_gguf_find_tensor(k->g, "per_layer_token_embd.weight");
        g->ple_dim = (int)v;
        g->ple_vocab = t && t->n_dims == 2 ? (int)LM_MIN(t->shape[0], INT32_MAX) : c->vocab;
    }
    return lm_gemma_config_check(c, k->path, e);
}
