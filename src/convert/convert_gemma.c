/* convert_gemma.c - Gemma 3 and Gemma 4 folders (GGUF archs gemma3,
 * gemma4) for lm_convert_hf, as llama.cpp's converter writes them
 * (Gemma3Model, Gemma4Model):
 *
 *  - names: input_layernorm -> attn_norm, post_attention_layernorm ->
 *    post_attention_norm, pre_feedforward_layernorm -> ffn_norm,
 *    post_feedforward_layernorm -> post_ffw_norm; Gemma 4's per-layer
 *    inputs (per_layer_input_gate -> inp_gate, per_layer_projection ->
 *    proj, post_per_layer_input_norm -> post_norm, embed_tokens_per_layer
 *    -> per_layer_token_embd, per_layer_model_projection ->
 *    per_layer_model_proj, per_layer_projection_norm -> per_layer_proj_norm),
 *    layer_scalar -> layer_output_scale.weight, and its MoE block (router.proj
 *    -> ffn_gate_inp, router.scale -> ffn_gate_inp.scale,
 *    router.per_expert_scale -> ffn_down_exps.scale, the fused experts kept
 *    fused as ffn_gate_up_exps / ffn_down_exps, the three extra norms);
 *  - values: Gemma 3's RMSNorm weights stored as 1 + w (its norms scale by
 *    1 + w; Gemma 4's by w, stored as they are); a padded vocabulary
 *    (Gemma 3's vocab_size runs past its tokenizer) kept whole, the ids
 *    without a token named [PADn] as for the other architectures;
 *  - a multimodal checkpoint's language model (model.language_model.* or
 *    language_model.model.*), its vision and audio towers left out (llama.cpp
 *    writes those to a separate mmproj file);
 *  - keys: the global layers' rope base and (Gemma 3) linear scaling, the
 *    sliding layers' base and window, Gemma 4's layer pattern, per-layer
 *    head widths, KV heads and FFN widths, shared-KV layers and per-layer
 *    input width; Gemma 4's proportional rope as rope_freqs.weight (1 for
 *    the rotated pairs, 1e30 for the rest). */
#include "convert_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>


/* HF name after "model.layers.N.", GGUF suffix after "blk.N.". */
static const struct { const char *hf, *gguf; } k_layer[] = {
    { "input_layernorm.weight", "attn_norm.weight" },
    { "post_attention_layernorm.weight", "post_attention_norm.weight" },
    { "pre_feedforward_layernorm.weight", "ffn_norm.weight" },
    { "post_feedforward_layernorm.weight", "post_ffw_norm.weight" },
    { "self_attn.q_proj.weight", "attn_q.weight" },
    { "self_attn.k_proj.weight", "attn_k.weight" },
    { "self_attn.v_proj.weight", "attn_v.weight" },
    { "self_attn.o_proj.weight", "attn_output.weight" },
    { "self_attn.q_norm.weight", "attn_q_norm.weight" },
    { "self_attn.k_norm.weight", "attn_k_norm.weight" },
    { "mlp.gate_proj.weight", "ffn_gate.weight" },
    { "mlp.up_proj.weight", "ffn_up.weight" },
    { "mlp.down_proj.weight", "ffn_down.weight" },
    { "per_layer_input_gate.weight", "inp_gate.weight" },
    { "per_layer_projection.weight", "proj.weight" },
    { "post_per_layer_input_norm.weight", "post_norm.weight" },
    { "layer_scalar", "layer_output_scale.weight" },
    { "router.proj.weight", "ffn_gate_inp.weight" },
    { "router.scale", "ffn_gate_inp.scale" },
    { "router.per_expert_scale", "ffn_down_exps.scale" },
    { "pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight" },
    { "post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight" },
    { "post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight" },
    { "experts.gate_up_proj", "ffn_gate_up_exps.weight" },
    { "experts.down_proj", "ffn_down_exps.weight" },
};

/* HF name after "model.", GGUF name. */
static const struct { const char *hf, *gguf; } k_top[] = {
    { "embed_tokens.weight", "token_embd.weight" },
    { "norm.weight", "output_norm.weight" },
    { "embed_tokens_per_layer.weight", "per_layer_token_embd.weight" },
    { "per_layer_model_projection.weight", "per_layer_model_proj.weight" },
    { "per_layer_projection_norm.weight", "per_layer_proj_norm.weight" },
};

/* The text model's part of a multimodal checkpoint: what its towers and
 * projectors are named (transformers 4 and 5). */
static const char *const k_towers[] = { "vision_tower.", "audio_tower.", "multi_modal_projector.", "embed_vision.",
                                        "embed_audio." };

static bool starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

int lm_conv_gemma_name(int version, const char *name, conv_tensor *t) {
    const char *rest = NULL;
    if (starts(name, "model.language_model.")) rest = name + strlen("model.language_model.");
    else if (starts(name, "language_model.model.")) rest = name + strlen("language_model.model.");
    else if (starts(name, "model.")) rest = name + strlen("model.");
    else if (!strcmp(name, "lm_head.weight") || !strcmp(name, "language_model.lm_head.weight"))
        return snprintf(t->name, sizeof t->name, "output.weight"), 1;
    const char *tower = starts(name, "model.") ? name + strlen("model.") : name;
    for (size_t i = 0; i < LM_COUNT(k_towers); i++)
        if (starts(tower, k_towers[i])) return 0;
    if (!rest) return -1;
    const char *gguf = NULL;
    int layer, used = 0;
    if (sscanf(rest, "layers.%d.%n", &layer, &used) == 1 && used > 0) {
        if (strstr(rest + used, "rotary_emb.inv_freq")) return 0;
        for (size_t i = 0; i < LM_COUNT(k_layer) && !gguf; i++)
            if (!strcmp(rest + used, k_layer[i].hf)) gguf = k_layer[i].gguf;
        if (!gguf) return -1;
        snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, gguf);
    } else {
        for (size_t i = 0; i < LM_COUNT(k_top) && !gguf; i++)
            if (!strcmp(rest, k_top[i].hf)) gguf = k_top[i].gguf;
        if (!gguf) return -1;
        snprintf(t->name, sizeof t->name, "%s", gguf);
    }
    const size_t n = strlen(rest);
    if (version == 3 && n >= 11 && !strcmp(rest + n - 11, "norm.weight")) t->vx = CONV_VX_PLUS1;
    return 1;
}

/* ---- keys ---------------------------------------------------------------------- */

static bool cfg_i64(json_t *cfg, const char *key, int64_t *v) {
    json_t *j = json_object_get(cfg, key);
    if (!json_is_integer(j)) return false;
    *v = json_integer_value(j);
    return true;
}

/* A rope setting of one layer kind ("full_attention" / "sliding_attention"):
 * from rope_parameters' (or rope_scaling's) entry for that kind, else, in
 * a flat config, the global layers' from rope_parameters itself or the top
 * level and the sliding layers' base from rope_local_base_freq. */
static json_t *rope_of(json_t *cfg, const char *kind, const char *key) {
    json_t *rp = json_object_get(cfg, "rope_parameters");
    if (!rp) rp = json_object_get(cfg, "rope_scaling");
    if (json_object_get(rp, "full_attention") || json_object_get(rp, "sliding_attention"))
        return json_object_get(json_object_get(rp, kind), key);
    if (!strcmp(kind, "sliding_attention"))
        return !strcmp(key, "rope_theta") ? json_object_get(cfg, "rope_local_base_freq") : NULL;
    json_t *v = json_object_get(rp, key);
    if (!v && !strcmp(key, "rope_type")) v = json_object_get(rp, "type");
    return v ? v : json_object_get(cfg, key);
}

/* Layer i's value of field in per_layer_config (Gemma 4), or -1. */
static int64_t per_layer(json_t *cfg, int64_t i, const char *field) {
    char k[24];
    snprintf(k, sizeof k, "%lld", (long long)i);
    json_t *v = json_object_get(json_object_get(json_object_get(cfg, "per_layer_config"), k), field);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* Whether layer i is a sliding layer: layer_types, else every
 * sliding_window_pattern-th layer is global (6 by default). */
static bool is_sliding(json_t *cfg, int64_t i) {
    json_t *lt = json_array_get(json_object_get(cfg, "layer_types"), (size_t)i);
    if (json_is_string(lt)) return !strcmp(json_string_value(lt), "sliding_attention");
    int64_t pattern = 6;
    cfg_i64(cfg, "sliding_window_pattern", &pattern);
    return pattern <= 1 || (i + 1) % pattern != 0;
}

/* A global layer's setting: the key itself (global_head_dim,
 * num_global_key_value_heads), else per_layer_config's field of the first
 * global layer, else -1. */
static int64_t global_of(json_t *cfg, int64_t n_layer, const char *key, const char *field) {
    int64_t v;
    if (cfg_i64(cfg, key, &v)) return v;
    for (int64_t i = 0; i < n_layer; i++)
        if (!is_sliding(cfg, i) && (v = per_layer(cfg, i, field)) > 0) return v;
    return -1;
}

#define KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)

int lm_conv_gemma_hparams(lm_gguf_writer *w, const char *dir, const char *arch, int version, json_t *cfg, int ftype,
                          lm_err *e) {
    char key[128];
    int64_t n_layer, n_ctx = 131072, n_embd, n_ff, n_head, n_kv, hd;
    if (!cfg_i64(cfg, "num_hidden_layers", &n_layer) || !cfg_i64(cfg, "hidden_size", &n_embd) ||
        !cfg_i64(cfg, "intermediate_size", &n_ff) || !cfg_i64(cfg, "num_attention_heads", &n_head) ||
        !cfg_i64(cfg, "num_key_value_heads", &n_kv) || !cfg_i64(cfg, "head_dim", &hd) || n_layer < 1 || n_layer > 4096)
        return lm_errf(e, "%s/config.json: num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, "
                       "num_key_value_heads and head_dim are required", dir);
    const char *full_type = json_string_value(rope_of(cfg, "full_attention", "rope_type"));
    const bool linear = full_type && !strcmp(full_type, "linear");
    if (full_type && strcmp(full_type, "default") && !linear && !(version == 4 && !strcmp(full_type, "proportional")))
        return lm_errf(e, "%s/config.json: the global layers' rope_type \"%s\" is not converted (default, linear; "
                       "Gemma 4: proportional)", dir, full_type);
    cfg_i64(cfg, "max_position_embeddings", &n_ctx);
    lm_gguf_set_int(w, KEY("block_count"), LM_GGUF_U32, n_layer);
    lm_gguf_set_int(w, KEY("context_length"), LM_GGUF_U32, n_ctx);
    lm_gguf_set_int(w, KEY("embedding_length"), LM_GGUF_U32, n_embd);
    /* Gemma 4's double-wide MLP: the layers that share another's KV are twice as wide */
    int64_t shared = 0;
    cfg_i64(cfg, "num_kv_shared_layers", &shared);
    if (version == 4 && json_is_true(json_object_get(cfg, "use_double_wide_mlp"))) {
        int32_t *ff = lm_xmalloc((size_t)n_layer * sizeof *ff);
        for (int64_t i = 0; i < n_layer; i++) ff[i] = (int32_t)(i < n_layer - shared ? n_ff : 2 * n_ff);
        lm_gguf_set_arr(w, KEY("feed_forward_length"), LM_GGUF_I32, ff, (uint64_t)n_layer);
        free(ff);
    } else {
        lm_gguf_set_int(w, KEY("feed_forward_length"), LM_GGUF_U32, n_ff);
    }
    lm_gguf_set_int(w, KEY("attention.head_count"), LM_GGUF_U32, n_head);
    const int64_t kv_full = version == 4 ? global_of(cfg, n_layer, "num_global_key_value_heads", "num_key_value_heads")
                                         : -1;
    if (kv_full > 0) {
        int32_t *kv = lm_xmalloc((size_t)n_layer * sizeof *kv);
        for (int64_t i = 0; i < n_layer; i++) kv[i] = (int32_t)(is_sliding(cfg, i) ? n_kv : kv_full);
        lm_gguf_set_arr(w, KEY("attention.head_count_kv"), LM_GGUF_I32, kv, (uint64_t)n_layer);
        free(kv);
    } else {
        lm_gguf_set_int(w, KEY("attention.head_count_kv"), LM_GGUF_U32, n_kv);
    }
    if (linear) {
        json_t *f = rope_of(cfg, "full_attention", "factor");
        if (!json_is_number(f)) return lm_errf(e, "%s/config.json: a linear rope without its factor", dir);
        lm_gguf_set_str(w, KEY("rope.scaling.type"), "linear", 6);
        lm_gguf_set_float(w, KEY("rope.scaling.factor"), LM_GGUF_F32, json_number_value(f));
    }
    json_t *theta = rope_of(cfg, "full_attention", "rope_theta"), *swa = rope_of(cfg, "sliding_attention", "rope_theta");
    lm_gguf_set_float(w, KEY("rope.freq_base"), LM_GGUF_F32, json_is_number(theta) ? json_number_value(theta) : 1e6);
    if (json_is_number(swa)) lm_gguf_set_float(w, KEY("rope.freq_base_swa"), LM_GGUF_F32, json_number_value(swa));
    json_t *eps = json_object_get(cfg, "rms_norm_eps");
    lm_gguf_set_float(w, KEY("attention.layer_norm_rms_epsilon"), LM_GGUF_F32,
                      json_is_number(eps) ? json_number_value(eps) : 1e-6);
    const int64_t hd_full = version == 4 ? global_of(cfg, n_layer, "global_head_dim", "head_dim") : hd;
    if (hd_full < 1) return lm_errf(e, "%s/config.json: the global layers' head width (global_head_dim)", dir);
    lm_gguf_set_int(w, KEY("attention.key_length"), LM_GGUF_U32, hd_full);
    lm_gguf_set_int(w, KEY("attention.value_length"), LM_GGUF_U32, hd_full);
    int64_t n_exp = 0, n_used = 0, exp_ff = 0;
    if (cfg_i64(cfg, "num_experts", &n_exp) || cfg_i64(cfg, "num_local_experts", &n_exp))
        lm_gguf_set_int(w, KEY("expert_count"), LM_GGUF_U32, n_exp);
    if (cfg_i64(cfg, "top_k_experts", &n_used) || cfg_i64(cfg, "num_experts_per_tok", &n_used))
        lm_gguf_set_int(w, KEY("expert_used_count"), LM_GGUF_U32, n_used);
    lm_gguf_set_int(w, "general.file_type", LM_GGUF_U32, ftype);
    json_t *soft = json_object_get(cfg, "final_logit_softcapping");
    if (json_is_number(soft) && json_number_value(soft) != 0)
        lm_gguf_set_float(w, KEY("final_logit_softcapping"), LM_GGUF_F32, json_number_value(soft));
    int64_t window, pattern = 0;
    if (!(cfg_i64(cfg, "sliding_window_pattern", &pattern) && pattern == 1) && cfg_i64(cfg, "sliding_window", &window))
        lm_gguf_set_int(w, KEY("attention.sliding_window"), LM_GGUF_U32, window);
    if (version == 4) {
        lm_gguf_set_int(w, KEY("attention.shared_kv_layers"), LM_GGUF_U32, shared);
        int64_t ple = 0;
        cfg_i64(cfg, "hidden_size_per_layer_input", &ple);
        lm_gguf_set_int(w, KEY("embedding_length_per_layer_input"), LM_GGUF_U32, ple);
        uint8_t *pat = lm_xmalloc((size_t)n_layer);
        for (int64_t i = 0; i < n_layer; i++) pat[i] = is_sliding(cfg, i);
        lm_gguf_set_arr(w, KEY("attention.sliding_window_pattern"), LM_GGUF_BOOL, pat, (uint64_t)n_layer);
        free(pat);
        lm_gguf_set_int(w, KEY("attention.key_length_swa"), LM_GGUF_U32, hd);
        lm_gguf_set_int(w, KEY("attention.value_length_swa"), LM_GGUF_U32, hd);
        if (cfg_i64(cfg, "moe_intermediate_size", &exp_ff) || cfg_i64(cfg, "expert_intermediate_size", &exp_ff))
            lm_gguf_set_int(w, KEY("expert_feed_forward_length"), LM_GGUF_U32, exp_ff);
        /* the sliding layers' rotated share: rope_parameters' own partial_rotary_factor, as llama.cpp reads it */
        json_t *prf = json_object_get(json_object_get(cfg, "rope_parameters"), "partial_rotary_factor");
        lm_gguf_set_int(w, KEY("rope.dimension_count"), LM_GGUF_U32, hd_full);
        lm_gguf_set_int(w, KEY("rope.dimension_count_swa"), LM_GGUF_U32,
                        (int64_t)((double)hd * (json_is_number(prf) ? json_number_value(prf) : 1.0)));
    }
    lm_gguf_set_int(w, "general.quantization_version", LM_GGUF_U32, 2);
    return 0;
}

#undef KEY

int lm_conv_gemma_rope_freqs(json_t *cfg, lm_file_tensor *t) {
    const char *type = json_string_value(rope_of(cfg, "full_attention", "rope_type"));
    if (!type || strcmp(type, "proportional")) return 0;
    int64_t n_layer = 0;
    cfg_i64(cfg, "num_hidden_layers", &n_layer);
    const int64_t hd = global_of(cfg, n_layer, "global_head_dim", "head_dim");
    json_t *prf = rope_of(cfg, "full_attention", "partial_rotary_factor");
    if (hd < 2 || hd > 65536) return 0;
    const int64_t pairs = hd / 2, rot = (int64_t)((double)hd * (json_is_number(prf) ? json_number_value(prf) : 1.0) / 2);
    float *f = lm_xmalloc((size_t)pairs * sizeof *f);
    for (int64_t i = 0; i < pairs; i++) f[i] = i < rot ? 1.0f : 1e30f;
    lm_conv_rope_freqs_tensor(t, f, pairs);
    return 1;
}
