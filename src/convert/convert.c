/* convert.c - lm_convert_hf: a Hugging Face folder into a GGUF file.
 *
 * Design: the folder's config.json gives the architecture and the
 * hyper-parameters, written under llama.cpp's keys in its order
 * (general.*, {arch}.*, general.file_type, the llama extras,
 * general.quantization_version, then the tokenizer: convert_vocab.c). The
 * tensors are taken in the safetensors files' order and renamed by a
 * table of HF name patterns; llama's q and k rows are permuted as llama.cpp
 * permutes them (within each head, the rotary halves interleaved: row
 * h*hd + 2i + j comes from h*hd + j*hd/2 + i). Each tensor's type is the
 * converter's (F32 for 1-D tensors and norms, else the mix's plain type or
 * the source's bf16/f16) and then, for a quantised mix, llama-quantize's
 * rule on top (lm_quant_mix.h); data goes row by row through f32 unless it
 * is copied as is. The Qwen3.5 hybrid's names and transforms are
 * convert_hybrid.c's. */
#include "convert_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_file.h"
#include "../format/lm_weights.h"
#include "../model/lm_arch.h"
#include "../quant/lm_quant.h"

/* An architecture the converter knows: HF model_type -> GGUF arch. */
typedef struct conv_arch {
    const char *model_type, *arch;
    bool permute_qk;   /* llama: q/k rows interleaved for GGML's rope */
    bool llama_extras; /* {arch}.vocab_size and rope.dimension_count */
    bool hybrid;       /* Qwen3.5 (convert_hybrid.c) */
    bool moe;          /* experts stacked per layer, the router kept f32 */
    bool mrope;        /* rope.dimension_sections always (Qwen3.5) */
    int gemma;         /* Gemma 3 or 4 (convert_gemma.c), else 0 */
} conv_arch;

static const conv_arch k_archs[] = {
    { "llama", "llama", true, true, false, false, false, 0 },
    { "mistral", "llama", true, true, false, false, false, 0 },
    { "qwen2", "qwen2", false, false, false, false, false, 0 },
    { "qwen3", "qwen3", false, false, false, false, false, 0 },
    { "qwen3_moe", "qwen3moe", false, false, false, true, false, 0 },
    { "qwen3_next", "qwen3next", false, false, true, true, false, 0 },
    { "qwen3_5_text", "qwen35", false, false, true, false, true, 0 },
    { "qwen3_5", "qwen35", false, false, true, false, true, 0 }, /* multimodal: its text_config and language model */
    { "qwen3_5_moe_text", "qwen35moe", false, false, true, true, true, 0 },
    { "qwen3_5_moe", "qwen35moe", false, false, true, true, true, 0 },
    { "gemma3_text", "gemma3", .gemma = 3 },
    { "gemma3", "gemma3", .gemma = 3 }, /* multimodal: its text_config and language model */
    { "gemma4_text", "gemma4", .gemma = 4 },
    { "gemma4", "gemma4", .gemma = 4 },
};
#define CONV_KNOWN "llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5, qwen3_5_moe, gemma3, gemma4"

/* The hybrid's geometry from its config (hparams: text_config where nested). */
static conv_hybrid conv_hybrid_of(json_t *hp, const conv_arch *a) {
    conv_hybrid h = { .next = !strcmp(a->arch, "qwen3next") };
    json_t *v;
#define GETI(key, field) \
    if (json_is_integer(v = json_object_get(hp, key))) h.field = json_integer_value(v)
    GETI("num_hidden_layers", n_layer);
    GETI("mtp_num_hidden_layers", n_mtp);
    GETI("linear_num_key_heads", hk);
    GETI("linear_num_value_heads", hv);
    GETI("linear_key_head_dim", dk);
    GETI("linear_value_head_dim", dv);
#undef GETI
    return h;
}

/* HF name suffixes inside model.layers.N. and their GGUF names. */
static const struct { const char *hf, *gguf; } k_layer_names[] = {
    { "input_layernorm.weight", "attn_norm.weight" },
    { "post_attention_layernorm.weight", "ffn_norm.weight" },
    { "self_attn.q_proj.weight", "attn_q.weight" },
    { "self_attn.q_proj.bias", "attn_q.bias" },
    { "self_attn.k_proj.weight", "attn_k.weight" },
    { "self_attn.k_proj.bias", "attn_k.bias" },
    { "self_attn.v_proj.weight", "attn_v.weight" },
    { "self_attn.v_proj.bias", "attn_v.bias" },
    { "self_attn.o_proj.weight", "attn_output.weight" },
    { "self_attn.q_norm.weight", "attn_q_norm.weight" },
    { "self_attn.k_norm.weight", "attn_k_norm.weight" },
    { "mlp.gate_proj.weight", "ffn_gate.weight" },
    { "mlp.up_proj.weight", "ffn_up.weight" },
    { "mlp.down_proj.weight", "ffn_down.weight" },
    { "mlp.gate.weight", "ffn_gate_inp.weight" }, /* a MoE layer's router */
};

/* A MoE expert's HF name (model.layers.N.mlp.experts.E.<kind>_proj.weight):
 * the stacked tensor's GGUF name into out and E, or -1. */
static int conv_expert(const char *name, char *out, size_t n) {
    int layer, expert, used = 0;
    char kind[8];
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", &layer, &expert, kind, &used) != 3 ||
        name[used] || expert < 0 || (strcmp(kind, "gate") && strcmp(kind, "up") && strcmp(kind, "down")))
        return -1;
    snprintf(out, n, "blk.%d.ffn_%s_exps.weight", layer, kind);
    return expert;
}

/* The GGUF name of HF tensor name into out; false for tensors llama.cpp
 * drops (rotary inverse frequencies). -1: unknown. */
static int conv_name(const char *name, char *out, size_t n) {
    if (!strcmp(name, "model.embed_tokens.weight")) return snprintf(out, n, "token_embd.weight"), 1;
    if (!strcmp(name, "model.norm.weight")) return snprintf(out, n, "output_norm.weight"), 1;
    if (!strcmp(name, "lm_head.weight")) return snprintf(out, n, "output.weight"), 1;
    int layer, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) == 1 && used > 0) {
        if (strstr(name + used, "rotary_emb.inv_freq")) return 0;
        for (size_t i = 0; i < LM_COUNT(k_layer_names); i++) {
            if (!strcmp(name + used, k_layer_names[i].hf))
                return snprintf(out, n, "blk.%d.%s", layer, k_layer_names[i].gguf), 1;
        }
    }
    return -1;
}

/* ---- hyper-parameters ---------------------------------------------------------- */

static int cfg_int(json_t *cfg, const char *key, int64_t *v) {
    json_t *j = json_object_get(cfg, key);
    if (!json_is_integer(j)) return 0;
    *v = json_integer_value(j);
    return 1;
}

/* The expert count: num_local_experts (transformers 5), else num_experts. */
static int cfg_experts(json_t *cfg, int64_t *v) {
    return cfg_int(cfg, "num_local_experts", v) || cfg_int(cfg, "num_experts", v);
}

/* A rope setting: in transformers 5's rope_parameters, else the Hub
 * layout's rope_scaling, else at the top of config.json (rope_theta). */
static json_t *rope_get(json_t *cfg, const char *key) {
    json_t *v = json_object_get(json_object_get(cfg, "rope_parameters"), key);
    if (!v) v = json_object_get(json_object_get(cfg, "rope_scaling"), key);
    return v ? v : json_object_get(cfg, key);
}

/* The rope type ("default", "llama3" ...), or NULL (older configs say "type"). */
static const char *rope_type_of(json_t *cfg) {
    const char *t = json_string_value(rope_get(cfg, "rope_type"));
    return t ? t : json_string_value(json_object_get(json_object_get(cfg, "rope_scaling"), "type"));
}

/* A rope number, or dflt. */
static float rope_num(json_t *cfg, const char *key, float dflt) {
    json_t *v = rope_get(cfg, key);
    return json_is_number(v) ? (float)json_number_value(v) : dflt;
}

/* "Llama G256" from ".../llama-g256": the folder's name, '-' and '_' as
 * spaces, each word capitalised (llama.cpp's default general.name). */
static void model_name(const char *dir, char *out, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    size_t k = 0;
    bool word = true;
    for (size_t i = start; i < len && k + 1 < n; i++) {
        char c = dir[i] == '-' || dir[i] == '_' ? ' ' : dir[i];
        out[k++] = word && c >= 'a' && c <= 'z' ? (char)(c - 32) : c;
        word = c == ' ';
    }
    out[k] = 0;
}

/* llama.cpp's size label: "1.7M", "8.0B" (two significant digits at least);
 * with experts "8x169K": the shared parameters and one expert's. */
static void size_label(int64_t params, int64_t expert_params, int64_t n_experts, char *out, size_t n) {
    if (n_experts > 0) {
        const int k = snprintf(out, n, "%lldx", (long long)n_experts);
        if (k > 0 && (size_t)k < n) size_label(params - expert_params + expert_params / n_experts, 0, 0, out + k, n - (size_t)k);
        return;
    }
    double p = (double)params;
    const char *suffix = p > 1e12 ? "T" : p > 1e9 ? "B" : p > 1e6 ? "M" : "K";
    double scaled = p * (p > 1e12 ? 1e-12 : p > 1e9 ? 1e-9 : p > 1e6 ? 1e-6 : 1e-3);
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", nearbyint(scaled));
    int nd = (int)strlen(digits);
    const char *d = digits;
    while (*d == '0') d++, nd--;
    int fix = 2 - nd > 0 ? 2 - nd : 0;
    snprintf(out, n, "%.*f%s", fix, scaled, suffix);
}

/* rope.dimension_sections: mrope_section padded to 4 (or, absent, the
 * hybrid's default); true when there was one. */
static bool put_mrope(lm_gguf_writer *w, const char *arch, json_t *cfg, bool dflt) {
    json_t *ms = rope_get(cfg, "mrope_section");
    int32_t sec[4] = { 11, 11, 10, 0 };
    if (json_is_array(ms)) {
        for (size_t i = 0; i < 4; i++) sec[i] = i < json_array_size(ms) ? (int32_t)json_integer_value(json_array_get(ms, i)) : 0;
    } else if (!dflt) {
        return false;
    }
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    lm_gguf_set_arr(w, key, LM_GGUF_I32, sec, 4);
    return json_is_array(ms);
}

/* The general.* and {arch}.* keys, up to the tokenizer. */
static int put_hparams(lm_gguf_writer *w, const char *dir, json_t *cfg, const conv_arch *a, int ftype,
                       int64_t n_params, int64_t expert_params, lm_err *e) {
    char key[128], name[128], label[32];
    int64_t n_layer, n_ctx, n_embd, n_ff = 0, n_head, n_kv = -1, head_dim = -1, vocab;
    /* a model whose every layer is sparse (Qwen3.5-MoE) has no intermediate_size */
    const bool has_ff = cfg_int(cfg, "intermediate_size", &n_ff);
    if (!cfg_int(cfg, "num_hidden_layers", &n_layer) || !cfg_int(cfg, "hidden_size", &n_embd) ||
        !(has_ff || a->moe) || !cfg_int(cfg, "num_attention_heads", &n_head) || !cfg_int(cfg, "vocab_size", &vocab))
        return lm_errf(e, "%s/config.json: num_hidden_layers, hidden_size, intermediate_size, num_attention_heads "
                       "and vocab_size are required", dir);
    const char *rope_type = rope_type_of(cfg);
    if (!a->gemma && rope_type && strcmp(rope_type, "default") && !(a->permute_qk && !strcmp(rope_type, "llama3")))
        return lm_errf(e, "%s/config.json: rope_type \"%s\" is not converted yet (only the default rope, and llama3 "
                       "for llama)", dir, rope_type);
    lm_gguf_set_str(w, "general.architecture", a->arch, strlen(a->arch));
    lm_gguf_set_str(w, "general.type", "model", 5);
    model_name(dir, name, sizeof name);
    lm_gguf_set_str(w, "general.name", name, strlen(name));
    int64_t n_exp = 0, n_used = 0, moe_ff = 0;
    if (a->gemma) {
        cfg_experts(cfg, &n_exp);
        size_label(n_params, expert_params, n_exp, label, sizeof label);
        lm_gguf_set_str(w, "general.size_label", label, strlen(label));
        return lm_conv_gemma_hparams(w, dir, a->arch, a->gemma, cfg, ftype, e);
    }
    if (a->moe && (!cfg_experts(cfg, &n_exp) || !cfg_int(cfg, "num_experts_per_tok", &n_used) ||
                   !cfg_int(cfg, "moe_intermediate_size", &moe_ff)))
        return lm_errf(e, "%s/config.json: num_local_experts (or num_experts), num_experts_per_tok and "
                       "moe_intermediate_size are required", dir);
    size_label(n_params, expert_params, n_exp, label, sizeof label);
    lm_gguf_set_str(w, "general.size_label", label, strlen(label));
#define ARCH_KEY(k) (snprintf(key, sizeof key, "%s.%s", a->arch, k), key)
    const conv_hybrid hy = a->hybrid ? conv_hybrid_of(cfg, a) : (conv_hybrid){ 0 };
    lm_gguf_set_int(w, ARCH_KEY("block_count"), LM_GGUF_U32, n_layer + hy.n_mtp);
    if (cfg_int(cfg, "max_position_embeddings", &n_ctx)) lm_gguf_set_int(w, ARCH_KEY("context_length"), LM_GGUF_U32, n_ctx);
    lm_gguf_set_int(w, ARCH_KEY("embedding_length"), LM_GGUF_U32, n_embd);
    if (has_ff) lm_gguf_set_int(w, ARCH_KEY("feed_forward_length"), LM_GGUF_U32, n_ff);
    lm_gguf_set_int(w, ARCH_KEY("attention.head_count"), LM_GGUF_U32, n_head);
    if (cfg_int(cfg, "num_key_value_heads", &n_kv)) lm_gguf_set_int(w, ARCH_KEY("attention.head_count_kv"), LM_GGUF_U32, n_kv);
    const bool mrope = put_mrope(w, a->arch, cfg, false);
    json_t *theta = rope_get(cfg, "rope_theta");
    if (json_is_number(theta)) lm_gguf_set_float(w, ARCH_KEY("rope.freq_base"), LM_GGUF_F32, json_number_value(theta));
    json_t *eps = json_object_get(cfg, "rms_norm_eps");
    if (json_is_number(eps))
        lm_gguf_set_float(w, ARCH_KEY("attention.layer_norm_rms_epsilon"), LM_GGUF_F32, json_number_value(eps));
    if (a->moe) {
        lm_gguf_set_int(w, ARCH_KEY("expert_count"), LM_GGUF_U32, n_exp);
        lm_gguf_set_int(w, ARCH_KEY("expert_used_count"), LM_GGUF_U32, n_used);
    }
    if (cfg_int(cfg, "head_dim", &head_dim)) {
        lm_gguf_set_int(w, ARCH_KEY("attention.key_length"), LM_GGUF_U32, head_dim);
        lm_gguf_set_int(w, ARCH_KEY("attention.value_length"), LM_GGUF_U32, head_dim);
    }
    lm_gguf_set_int(w, "general.file_type", LM_GGUF_U32, ftype);
    int64_t shared_ff = 0;
    if (a->moe) {
        lm_gguf_set_int(w, ARCH_KEY("expert_feed_forward_length"), LM_GGUF_U32, moe_ff);
        if (cfg_int(cfg, "shared_expert_intermediate_size", &shared_ff))
            lm_gguf_set_int(w, ARCH_KEY("expert_shared_feed_forward_length"), LM_GGUF_U32, shared_ff);
    }
    if (a->llama_extras) {
        lm_gguf_set_int(w, ARCH_KEY("vocab_size"), LM_GGUF_U32, vocab);
        lm_gguf_set_int(w, ARCH_KEY("rope.dimension_count"), LM_GGUF_U32, head_dim > 0 ? head_dim : n_embd / n_head);
    }
    if (a->hybrid) {
        if (hy.hk < 1 || hy.hv < 1 || hy.dk < 1 || hy.dv < 1 || hy.hv % hy.hk)
            return lm_errf(e, "%s/config.json: linear_num_key_heads, linear_num_value_heads (a multiple of it), "
                           "linear_key_head_dim and linear_value_head_dim are required", dir);
        int64_t k = 4, every = 4;
        if (hy.n_mtp > 0) lm_gguf_set_int(w, ARCH_KEY("nextn_predict_layers"), LM_GGUF_U32, hy.n_mtp);
        cfg_int(cfg, "linear_conv_kernel_dim", &k);
        cfg_int(cfg, "full_attention_interval", &every);
        lm_gguf_set_int(w, ARCH_KEY("ssm.conv_kernel"), LM_GGUF_U32, k);
        lm_gguf_set_int(w, ARCH_KEY("ssm.state_size"), LM_GGUF_U32, hy.dk);
        lm_gguf_set_int(w, ARCH_KEY("ssm.group_count"), LM_GGUF_U32, hy.hk);
        lm_gguf_set_int(w, ARCH_KEY("ssm.time_step_rank"), LM_GGUF_U32, hy.hv);
        lm_gguf_set_int(w, ARCH_KEY("ssm.inner_size"), LM_GGUF_U32, hy.dv * hy.hv);
        lm_gguf_set_int(w, ARCH_KEY("full_attention_interval"), LM_GGUF_U32, every);
        const int64_t rd = head_dim > 0 ? head_dim : n_embd / n_head;
        lm_gguf_set_int(w, ARCH_KEY("rope.dimension_count"), LM_GGUF_U32,
                        (int64_t)((double)rd * rope_num(cfg, "partial_rotary_factor", 0.25f)));
        if (!mrope && a->mrope) put_mrope(w, a->arch, cfg, true);
    }
#undef ARCH_KEY
    lm_gguf_set_int(w, "general.quantization_version", LM_GGUF_U32, 2);
    return 0;
}

/* ---- tensors ---------------------------------------------------------------------- */

/* Source head of output head i when value heads go from grouped by key
 * head (r a key head) to tiled (hk key heads). */
static int64_t conv_tiled_src(int64_t i, int r, int hk) { return (i % hk) * r + i / hk; }

/* Source row of t's output row r (of rows): llama's q/k permutation, or the
 * hybrid's value-head re-order. */
static int64_t conv_src_row(const conv_tensor *t, int64_t r, int64_t rows) {
    if (t->permute_heads) {
        int64_t hd = rows / t->permute_heads, h = r / hd, k = r % hd;
        return h * hd + (k % 2) * (hd / 2) + k / 2;
    }
    if (t->gate_up) { /* expert x's rows [gate F; up F] */
        const int64_t f = t->src->shape[1] / 2;
        return (r / f) * 2 * f + (t->gate_up - 1) * f + r % f;
    }
    if (t->qkvz) { /* rows grouped per key head: [q Dk; k Dk; v r Dv; z r Dv] */
        const int64_t dk = t->qkvz_dk, rv = (int64_t)t->v_r * t->v_hd, g = 2 * dk + 2 * rv, kd = t->v_hk * dk;
        if (t->qkvz == 2) return (r / rv) * g + 2 * dk + rv + r % rv;
        if (r < kd) return (r / dk) * g + r % dk;
        if (r < 2 * kd) return ((r - kd) / dk) * g + dk + (r - kd) % dk;
        return ((r - 2 * kd) / rv) * g + 2 * dk + (r - 2 * kd) % rv;
    }
    if (t->v_r && !t->v_cols && r >= t->v_row0) {
        const int64_t j = r - t->v_row0;
        return t->v_row0 + conv_tiled_src(j / t->v_hd, t->v_r, t->v_hk) * t->v_hd + j % t->v_hd;
    }
    return r;
}

/* The converter's own type for a tensor, before any quantisation mix. */
static lm_dtype conv_base_type(const conv_tensor *t, const lm_quant_mix *mix) {
    size_t n = strlen(t->name);
    /* llama.cpp's converter keeps these f32: 1-D, norms, routers, the conv
     * kernel, and anything not named .weight */
    if (t->src->n_dims <= 1 || (n > 12 && !strcmp(t->name + n - 12, "_norm.weight")) || strstr(t->name, "ssm_conv1d") ||
        strstr(t->name, "ffn_gate_inp") || n < 7 || strcmp(t->name + n - 7, ".weight"))
        return LM_F32;
    if (!lm_dtype_is_quant(mix->base)) return mix->base;
    return t->src->type == LM_BF16 || t->src->type == LM_F16 ? t->src->type : LM_F32;
}

void lm_conv_rope_freqs_tensor(lm_file_tensor *t, float *f, int64_t n) {
    memset(t, 0, sizeof *t);
    t->name = "rope_freqs.weight";
    t->type = LM_F32;
    t->n_dims = 1;
    t->shape[0] = n;
    t->data = (const uint8_t *)f;
    t->nbytes = (size_t)n * sizeof *f;
}

/* Llama 3 rope scaling as llama.cpp stores it: rope_freqs.weight, one
 * divisor per rotary frequency (1 for short wavelengths, the factor for
 * long ones, a smooth blend between), computed in float as torch does.
 * Fills t (its data malloc'd) and returns 1, or 0 when the config has no
 * llama3 scaling. */
static int conv_rope_freqs(json_t *cfg, lm_file_tensor *t) {
    if (!rope_type_of(cfg) || strcmp(rope_type_of(cfg), "llama3")) return 0;
    int64_t dim = 0, hidden = 0, heads = 1;
    if (!cfg_int(cfg, "head_dim", &dim)) {
        cfg_int(cfg, "hidden_size", &hidden);
        cfg_int(cfg, "num_attention_heads", &heads);
        dim = heads > 0 ? hidden / heads : 0;
    }
    float base = rope_num(cfg, "rope_theta", 10000.0f), factor = rope_num(cfg, "factor", 8.0f);
    float lo = rope_num(cfg, "low_freq_factor", 1.0f), hi = rope_num(cfg, "high_freq_factor", 4.0f);
    float old = rope_num(cfg, "original_max_position_embeddings", 8192.0f);
    float lo_wave = old / lo, hi_wave = old / hi;
    int n = (int)(dim / 2);
    float *f = lm_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    for (int i = 0; i < n; i++) {
        float freq = 1.0f / powf(base, (float)(2 * i) / (float)dim);
        float wavelen = (float)(2 * M_PI) / freq;
        if (wavelen < hi_wave) {
            f[i] = 1.0f;
        } else if (wavelen > lo_wave) {
            f[i] = factor;
        } else {
            float smooth = (old / wavelen - lo) / (hi - lo);
            f[i] = 1.0f / ((1.0f - smooth) / factor + smooth);
        }
    }
    lm_conv_rope_freqs_tensor(t, f, n);
    return 1;
}

/* Builds the tensor list (safetensors order, generated tensors first) with
 * names, permutations and types. */
/* The tensor's shape in the file: the hybrid's conv1d [channels][1][kernel]
 * squeezed to [channels][kernel] and the shared expert's gate [1][D] to [D],
 * as llama.cpp stores them; a stack of experts [experts][rows][cols]; a
 * split of qkvz its own rows. */
static int conv_shape(const conv_tensor *t, int64_t *shape) {
    int n = 0;
    const bool squeeze = strstr(t->name, "ssm_conv1d") || strstr(t->name, "ffn_gate_inp_shexp");
    if (t->n_parts) shape[n++] = t->n_parts;
    for (int d = 0; d < t->src->n_dims; d++)
        if (!(squeeze && t->src->shape[d] == 1 && t->src->n_dims > 1)) shape[n++] = t->src->shape[d];
    if (t->gate_up) shape[1] /= 2; /* [experts][F][cols] of [experts][2F][cols] */
    else if (t->out_rows) shape[0] = t->out_rows;
    return n;
}

/* 0 when the converter reads src's type (F32, F16, BF16), else -1 with e. */
static int conv_readable(const lm_file_tensor *src, lm_err *e) {
    if (src->type == LM_F32 || src->type == LM_F16 || src->type == LM_BF16) return 0;
    return lm_errf(e, "tensor \"%s\": type %s is not converted (only F32, F16, BF16)", src->name, src->type_name);
}

/* Expert e of the stack named name: the stack's entry (made at the first
 * expert seen, in its place among the tensors) with parts[e] set. */
static int conv_stack_add(conv_tensor *ts, int *n, const char *name, int e, int64_t n_exp, const lm_file_tensor *src,
                          lm_err *err) {
    conv_tensor *t = NULL;
    for (int i = 0; i < *n && !t; i++)
        if (ts[i].n_parts && !strcmp(ts[i].name, name)) t = &ts[i];
    if (e >= n_exp) return lm_errf(err, "tensor \"%s\": expert %d of %lld", src->name, e, (long long)n_exp);
    if (!t) {
        t = &ts[(*n)++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        t->n_parts = (int)n_exp;
        t->parts = lm_xcalloc((size_t)n_exp, sizeof *t->parts);
    }
    if (t->parts[e]) return lm_errf(err, "tensor \"%s\": a second expert %d", src->name, e);
    if (t->src && (src->n_dims != 2 || src->type != t->src->type || src->shape[0] != t->src->shape[0] ||
                   src->shape[1] != t->src->shape[1]))
        return lm_errf(err, "tensor \"%s\": not the shape and type of the layer's other experts", src->name);
    t->parts[e] = src;
    if (!t->src) t->src = src;
    return 0;
}

static int conv_plan(const lm_weight_source *ws, json_t *cfg, const conv_arch *a, const lm_quant_mix *mix,
                     lm_file_tensor *extra, conv_tensor **out, int *n_out, int64_t *n_params, int64_t *expert_params,
                     lm_err *e) {
    int64_t n_head = 0, n_kv = 0, n_layer = 0, n_exp = 0;
    cfg_experts(cfg, &n_exp);
    *expert_params = 0;
    const conv_hybrid hy = a->hybrid ? conv_hybrid_of(cfg, a) : (conv_hybrid){ 0 };
    cfg_int(cfg, "num_attention_heads", &n_head);
    if (!cfg_int(cfg, "num_key_value_heads", &n_kv)) n_kv = n_head;
    cfg_int(cfg, "num_hidden_layers", &n_layer);
    int cap = 0, n = 0;
    for (int f = 0; f < ws->n_files; f++) cap += ws->st[f].n_tensors;
    conv_tensor *ts = lm_xcalloc(2 * (size_t)cap + 2, sizeof *ts); /* a split gives two */
    *n_params = 0;
    int rc = 0;
    if (extra->data) { /* generated tensors come first, as in llama.cpp */
        ts[n].src = extra;
        snprintf(ts[n].name, sizeof ts[n].name, "%s", extra->name);
        ts[n++].type = LM_F32;
    }
    for (int f = 0; rc == 0 && f < ws->n_files; f++) {
        for (int i = 0; rc == 0 && i < ws->st[f].n_tensors; i++) {
            const lm_file_tensor *src = &ws->st[f].tensors[i];
            char stack[96], canon[256];
            const char *cname = a->hybrid ? lm_conv_hybrid_canon(&hy, src->name, canon, sizeof canon) : src->name;
            int ex = a->moe ? conv_expert(cname, stack, sizeof stack) : -1;
            if (ex >= 0) {
                rc = conv_readable(src, e) || conv_stack_add(ts, &n, stack, ex, n_exp, src, e) ? -1 : 0;
                *n_params += lm_file_tensor_numel(src);
                *expert_params += lm_file_tensor_numel(src);
                continue;
            }
            conv_tensor *t = &ts[n];
            int known = a->hybrid  ? lm_conv_hybrid_name(&hy, src->name, t)
                        : a->gemma ? lm_conv_gemma_name(a->gemma, src->name, t)
                                   : conv_name(src->name, t->name, sizeof t->name);
            if (known < 0) {
                rc = lm_errf(e, "tensor \"%s\": no GGUF name for it in %s (lumen convert knows " CONV_KNOWN ")",
                             src->name, a->arch);
            } else if (known) {
                rc = conv_readable(src, e);
            }
            if (rc || !known) {
                memset(t, 0, 2 * sizeof *t);
                continue;
            }
            if (t->gate_up && (src->n_dims != 3 || src->shape[1] % 2)) {
                rc = lm_errf(e, "tensor \"%s\": fused experts must be [experts][2 * F][cols]", src->name);
                continue;
            }
            if (t->gate_up) t[0].out_rows = t[1].out_rows = src->shape[0] * src->shape[1] / 2;
            if (strstr(t->name, "_exps.")) *expert_params += lm_file_tensor_numel(src);
            if (known == 2) { /* the second output of a split: the same source */
                t[1].src = src;
                t[1].type = conv_base_type(&t[1], mix);
            }
            t->src = src;
            if (t->vx && src->n_dims > 1) {
                rc = lm_errf(e, "tensor \"%s\": a %d-D norm or decay", src->name, src->n_dims);
                continue;
            }
            if (a->permute_qk && strstr(t->name, "attn_q.")) t->permute_heads = (int)n_head;
            if (a->permute_qk && strstr(t->name, "attn_k.")) t->permute_heads = (int)n_kv;
            if (t->permute_heads && src->shape[0] % (2 * t->permute_heads)) {
                rc = lm_errf(e, "tensor \"%s\": %lld rows do not split into %d heads of pairs", src->name,
                             (long long)src->shape[0], t->permute_heads);
                continue;
            }
            t->type = conv_base_type(t, mix);
            *n_params += lm_file_tensor_numel(src);
            n += known;
        }
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        for (int k = 0; k < ts[i].n_parts && rc == 0; k++)
            if (!ts[i].parts[k]) rc = lm_errf(e, "%s: expert %d is missing", ts[i].name, k);
        if (ts[i].n_parts && rc == 0) ts[i].type = conv_base_type(&ts[i], mix);
    }
    if (rc) {
        for (int i = 0; i < n; i++) free(ts[i].parts);
        free(ts);
        return -1;
    }
    if (lm_dtype_is_quant(mix->base)) {
        lm_mix_state st = { .mix = mix, .n_layer = (int)n_layer, .n_gqa = n_kv ? (int)(n_head / n_kv) : 0 };
        const char **names = lm_xmalloc((size_t)n * sizeof *names + 1);
        for (int i = 0; i < n; i++) names[i] = ts[i].name;
        lm_mix_prepare(&st, names, n);
        free(names);
        for (int i = 0; i < n; i++) {
            int64_t shape[LM_MAX_DIMS];
            const int nd = conv_shape(&ts[i], shape);
            ts[i].type = lm_mix_tensor_type(&st, ts[i].name, nd, shape, ts[i].type);
        }
    }
    *out = ts;
    *n_out = n;
    return 0;
}

/* A tensor as rows: 1-D tensors are rows of one value (so a bias permutes
 * like its matrix's rows). */
static void conv_rows(const lm_file_tensor *s, int64_t *rows, int64_t *cols) {
    int64_t numel = lm_file_tensor_numel(s);
    *rows = s->n_dims >= 2 && s->shape[s->n_dims - 1] ? numel / s->shape[s->n_dims - 1] : numel;
    *cols = *rows ? numel / *rows : 0;
}

/* t's output as rows: a stack's experts one after another. */
static void conv_out_rows(const conv_tensor *t, int64_t *rows, int64_t *cols) {
    conv_rows(t->src, rows, cols);
    if (t->n_parts) *rows *= t->n_parts;
    if (t->out_rows) *rows = t->out_rows;
}

/* Row r of the output, in the source: through the row re-orders, or the
 * expert's own tensor for a stack. */
static const uint8_t *conv_src_row_ptr(void *ctx, int64_t r) {
    const conv_tensor *t = ctx;
    int64_t rows, cols;
    conv_rows(t->src, &rows, &cols);
    if (t->n_parts) return t->parts[r / rows]->data + (size_t)(r % rows) * lm_dtype_row_bytes(t->src->type, cols);
    return t->src->data + (size_t)conv_src_row(t, r, rows) * lm_dtype_row_bytes(t->src->type, cols);
}

/* A 1-D tensor's values through its transform, in double, as f32. */
static uint8_t *conv_values(const conv_tensor *t, int64_t n) {
    float *out = lm_xmalloc((size_t)n * sizeof *out + 1);
    for (int64_t i = 0; i < n; i++) {
        float w;
        lm_dequant_row(t->src->type, conv_src_row_ptr((void *)t, i), &w, 1);
        out[i] = t->vx == CONV_VX_PLUS1 ? (float)((double)w + 1.0) : (float)-exp((double)w);
    }
    return (uint8_t *)out;
}

/* A copy of t's source (its own type) with the column blocks of value
 * heads re-ordered, for a column re-order (rows then go through as they are). */
static uint8_t *conv_cols(const conv_tensor *t, int64_t rows, int64_t cols) {
    const size_t es = lm_dtype_row_bytes(t->src->type, 1), hb = (size_t)t->v_hd * es, rb = (size_t)cols * es;
    uint8_t *out = lm_xmalloc((size_t)rows * rb + 1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < cols / t->v_hd; h++)
            memcpy(out + (size_t)r * rb + (size_t)h * hb,
                   t->src->data + (size_t)r * rb + (size_t)conv_tiled_src(h, t->v_r, t->v_hk) * hb, hb);
    return out;
}

/* t's data in its output type and row order (malloc'd, *nbytes set). */
static uint8_t *conv_data(const conv_tensor *t, int threads, size_t *nbytes) {
    int64_t rows, cols;
    conv_out_rows(t, &rows, &cols);
    *nbytes = (size_t)rows * lm_dtype_row_bytes(t->type, cols);
    if (t->vx) {
        LM_ASSERT(t->type == LM_F32 && cols == 1);
        return conv_values(t, rows);
    }
    conv_tensor moved;
    lm_file_tensor src;
    uint8_t *copy = NULL;
    if (t->v_cols) { /* the columns re-ordered into a copy, which is then taken row by row */
        copy = conv_cols(t, rows, cols);
        src = *t->src, src.data = copy;
        moved = *t, moved.src = &src, moved.v_r = 0, moved.v_cols = false;
        t = &moved;
    }
    lm_qrows q = { t->src->type, t->type, rows, cols, conv_src_row_ptr, (void *)t, lm_xmalloc(*nbytes + 1) };
    /* 1-D tensors are rows of one value: not worth threads */
    lm_quant_rows(&q, cols > 1 ? threads : 1);
    free(copy);
    return q.dst;
}


/* The known architecture of config.json's model_type, or NULL with e set. */
static const conv_arch *conv_find_arch(const char *dir, json_t *cfg, lm_err *e) {
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    for (size_t i = 0; mt && i < LM_COUNT(k_archs); i++) {
        if (!strcmp(mt, k_archs[i].model_type)) return &k_archs[i];
    }
    lm_errf(e, "%s/config.json: model_type \"%s\" is not converted (lumen convert knows " CONV_KNOWN ")", dir,
            mt ? mt : "(none)");
    return NULL;
}

int lm_convert_hf(const char *dir, const char *out, const lm_quant_mix *mix, int threads, lm_quantize_report *rep,
                  lm_err *e) {
    memset(rep, 0, sizeof *rep);
    char *cfg_path = lm_path_join(dir, "config.json");
    json_error_t je;
    json_t *cfg = json_load_file(cfg_path, 0, &je);
    free(cfg_path);
    if (!cfg) return lm_errf(e, "%s/config.json: %s", dir, je.text);
    lm_weight_source ws = { 0 };
    lm_file_tensor extra = { 0 };
    conv_tensor *ts = NULL;
    int n = 0, rc = 0;
    int64_t n_params = 0, expert_params = 0, vocab = 0;
    lm_gguf_writer *w = lm_gguf_writer_create(32);
    const conv_arch *a = conv_find_arch(dir, cfg, e);
    /* a multimodal checkpoint keeps the text model's settings in text_config */
    json_t *hp = a && (a->hybrid || a->gemma) && json_is_object(json_object_get(cfg, "text_config"))
                     ? json_object_get(cfg, "text_config")
                     : cfg;
    /* what google's Gemma 3 configs leave out, as the loader assumes it */
    if (a && a->gemma == 3) lm_arch_find("gemma3_text")->config_defaults("gemma3_text", hp);
    if (a && a->permute_qk) conv_rope_freqs(hp, &extra);
    if (a && a->gemma) lm_conv_gemma_rope_freqs(hp, &extra);
    cfg_int(hp, "vocab_size", &vocab);
    if (!a || lm_weights_open_hf(&ws, dir, e) || conv_plan(&ws, hp, a, mix, &extra, &ts, &n, &n_params, &expert_params, e))
        rc = -1;
    if (rc == 0) rc = put_hparams(w, dir, hp, a, mix->ftype, n_params, expert_params, e);
    if (rc == 0) rc = lm_convert_vocab(w, dir, a->arch, (int)vocab, e);
    for (int i = 0; rc == 0 && i < n; i++) {
        int64_t shape[LM_MAX_DIMS];
        const int nd = conv_shape(&ts[i], shape);
        rc = lm_gguf_add_tensor(w, ts[i].name, ts[i].type, nd, shape, e);
    }
    if (rc == 0) rc = lm_gguf_writer_begin(w, out, e);
    for (int i = 0; rc == 0 && i < n; i++) {
        size_t nbytes;
        uint8_t *data = conv_data(&ts[i], threads, &nbytes);
        rc = lm_gguf_writer_put(w, data, nbytes, e);
        free(data);
        rep->n_tensors++;
        rep->n_requantised += ts[i].type != ts[i].src->type;
        rep->bytes_in += ts[i].src->nbytes * (size_t)LM_MAX(ts[i].n_parts, 1);
        rep->bytes_out += nbytes;
        rep->count_by_type[ts[i].type]++;
    }
    if (rc == 0) rc = lm_gguf_writer_finish(w, e);
    lm_gguf_writer_free(w);
    for (int i = 0; i < n; i++) free(ts[i].parts);
    free(ts);
    free((void *)extra.data);
    if (ws.n_files) lm_weights_close(&ws);
    json_decref(cfg);
    return rc;
}
