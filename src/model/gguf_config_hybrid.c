/* gguf_config_hybrid.c - the GGUF keys of the Qwen3.5 (qwen35, qwen35moe)
 * and Qwen3-Next (qwen3next) hybrids, and the sparse-layer keys of qwen3moe,
 * qwen3next and qwen35moe.
 *
 * The converter writes the Gated DeltaNet geometry as Mamba-style ssm.*
 * keys: ssm.group_count = key heads (Hk), ssm.time_step_rank = value heads
 * (Hv), ssm.state_size = key head width (Dk), ssm.inner_size = Hv * Dv,
 * ssm.conv_kernel = K. Which layers are linear is read from the tensors
 * (blk.N.ssm_a), not from full_attention_interval: the converter writes that
 * key from config.json's full_attention_interval (default 4) even when the
 * checkpoint says layer_types instead, so it can be wrong (it is for the
 * qwen3.5-g256 fixture, whose layers alternate). */
#include <stdlib.h>
#include <string.h>

#include "lm_gguf_config.h"
#include "lm_qwen35.h"

int lm_gguf_config_moe(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    if (lm_gguf_arch_need(k, "expert_count", &c->n_experts, 1, e) ||
        lm_gguf_arch_need(k, "expert_used_count", &c->n_experts_per_tok, 1, e) ||
        lm_gguf_arch_need(k, "expert_feed_forward_length", &c->moe_d_ff, 1, e))
        return -1;
    if (c->n_experts_per_tok > c->n_experts)
        return lm_errf(e, "%s: %s.expert_used_count %d exceeds expert_count %d", k->path, k->arch,
                       c->n_experts_per_tok, c->n_experts);
    int64_t v;
    if (lm_gguf_arch_int(k, "expert_shared_feed_forward_length", &v) && v > 0 && v <= INT32_MAX)
        c->shared_expert_d_ff = (int)v;
    /* llama.cpp renormalises the top-k weights of these architectures
     * unless the file says otherwise */
    bool norm = true;
    char key[160];
    snprintf(key, sizeof key, "%s.expert_weights_norm", k->arch);
    lm_gguf_get_bool(k->g, key, &norm);
    c->norm_topk_prob = norm;
    c->decoder_sparse_step = 1;
    c->layer_moe = lm_xcalloc((size_t)c->n_layers, sizeof(bool));
    bool any_dense = false;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_moe[l] = lm_gguf_has_layer_tensor(k, l, "ffn_gate_inp.weight");
        any_dense |= !c->layer_moe[l];
    }
    if (any_dense && c->d_ff < 1)
        return lm_errf(e, "%s: dense layers but no %s.feed_forward_length", k->path, k->arch);
    return 0;
}

int lm_gguf_config_hybrid(lm_model_config *c, const lm_gguf_keys *k, lm_err *e) {
    lm_hybrid_config *h = lm_xcalloc(1, sizeof *h + (size_t)c->n_layers * sizeof(bool));
    c->hybrid = h;
    c->qk_norm = true;
    int inner;
    if (lm_gguf_arch_need(k, "ssm.group_count", &h->lin_k_heads, 1, e) ||
        lm_gguf_arch_need(k, "ssm.time_step_rank", &h->lin_v_heads, 1, e) ||
        lm_gguf_arch_need(k, "ssm.state_size", &h->lin_k_dim, 1, e) ||
        lm_gguf_arch_need(k, "ssm.inner_size", &inner, 1, e) ||
        lm_gguf_arch_need(k, "ssm.conv_kernel", &h->conv_kernel, 1, e))
        return -1;
    if (h->lin_v_heads % h->lin_k_heads || inner % h->lin_v_heads)
        return lm_errf(e, "%s: %s.ssm: %d value heads of inner size %d over %d key heads do not divide", k->path,
                       k->arch, h->lin_v_heads, inner, h->lin_k_heads);
    h->lin_v_dim = inner / h->lin_v_heads;
    if (h->lin_k_dim > 1024 || h->lin_v_dim > 1024 || h->conv_kernel > 16)
        return lm_errf(e, "%s: %s.ssm head widths %d / %d or conv kernel %d out of range", k->path, k->arch,
                       h->lin_k_dim, h->lin_v_dim, h->conv_kernel);
    /* Qwen3.5's converter re-orders value heads from grouped to tiled
     * (_LinearAttentionVReorderBase); Qwen3-Next's keeps them grouped */
    const bool next = !strcmp(k->arch, "qwen3next");
    h->v_tiled = !next && h->lin_v_heads != h->lin_k_heads;
    h->attn_out_gate = true;
    int64_t nextn = 0; /* the MTP head's layers, after the last block (lm_qwen35.h binds them) */
    lm_gguf_arch_int(k, "nextn_predict_layers", &nextn);
    h->mtp_layers = (int)LM_MIN(LM_MAX(nextn, 0), 64);
    bool any = false;
    for (int l = 0; l < c->n_layers; l++) any |= h->layer_linear[l] = lm_gguf_has_layer_tensor(k, l, "ssm_a");
    if (!any) {
        int every = 4;
        int64_t v;
        if (lm_gguf_arch_int(k, "full_attention_interval", &v) && v >= 1 && v <= INT32_MAX) every = (int)v;
        for (int l = 0; l < c->n_layers; l++) h->layer_linear[l] = (l + 1) % every != 0;
    }
    if (next || !strcmp(k->arch, "qwen35moe")) return lm_gguf_config_moe(c, k, e);
    if (c->d_ff < 1) return lm_errf(e, "%s: missing metadata \"%s.feed_forward_length\"", k->path, k->arch);
    return 0;
}
