/* gguf_config_gemma.c - the GGUF keys of Gemma 3 (gemma3), as llama.cpp's
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
    double swa_theta = 10000.0, cap = 0;
    lm_gguf_arch_float(k, "rope.freq_base_swa", &swa_theta);
    if (!(swa_theta > 0)) return lm_errf(e, "%s: %s.rope.freq_base_swa must be > 0", k->path, k->arch);
    g->rope[0] = (gemma_rope_cfg){ c->rope.type == LM_ROPE_LINEAR ? GEMMA_ROPE_LINEAR : GEMMA_ROPE_DEFAULT,
                                   c->rope.theta, c->rope.factor, 1 };
    g->rope[1] = (gemma_rope_cfg){ GEMMA_ROPE_DEFAULT, swa_theta, 1, 1 };
    const double scalar = c->n_layers == 62 ? (double)c->d_model / c->n_heads : (double)c->head_dim;
    g->attn_scale = (float)pow(scalar, -0.5);
    if (lm_gguf_arch_float(k, "final_logit_softcapping", &cap) && !(cap >= 0))
        return lm_errf(e, "%s: %s.final_logit_softcapping must be >= 0", k->path, k->arch);
    g->final_softcap = (float)cap;
    return lm_gemma_config_check(c, k->path, e);
}
