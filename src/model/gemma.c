/* gemma.c - the gemma family: Gemma 3 (gemma3_text, and the language model
 * of the multimodal gemma3) and Gemma 4 (gemma4_text / gemma4), following
 * transformers 5.17's modeling_gemma3.py and modeling_gemma4.py.
 *
 * One forward pass serves both; their differences are data (lm_gemma_config):
 *
 *   x = embed(tok) * sqrt(D)                    (sqrt(D) rounded to f32, as the
 *                                                reference's buffer holds it)
 *   per layer l (sliding-window or full attention, by layer type):
 *     a = attn(norm_q(Wq n(x)), norm_k(Wk n(x)), Wv n(x))    q/k per-head norms
 *     x = x + n_post_attn(Wo a)
 *     x = x + n_post_ffn(Wdown (gelu(Wgate n(x)) * Wup n(x)))   (GeGLU)
 *     gemma4 MoE layers (26B-A4B) run experts beside that MLP:
 *       x = x + n_post_ffn(n_post1(mlp(n(x))) + n_post2(moe(n_pre2(x))))
 *       with the router on rms(x) * scale / sqrt(D), its top k renormalised
 *       and times per_expert_scale, GeGLU experts (lm_moe.h)
 *     gemma4: x = x + n_ple(Wproj (gelu(Wgate_ple x) * ple_l))  per-layer input
 *             x = x * layer_scalar
 *   logits = cap * tanh(lm_head(n(x)) / cap)     when final_logit_softcapping
 *
 * Norms are RMSNorm in f32: gemma3's scale is (1 + w) (folded into the bound
 * weight), gemma4's is w, and gemma4 also normalises V without a scale.
 * Attention scales q.k by query_pre_attn_scalar^-0.5 (gemma3) or 1 (gemma4,
 * whose q/k norms set the scale). Sliding layers attend to the last
 * `sliding_window` positions including their own (transformers' mask is
 * kv > q - window), exactly the attention op's `window`.
 *
 * Rope: each layer type has its own parameters (rope_parameters.{full,
 * sliding}_attention, or legacy rope_theta / rope_local_base_freq /
 * rope_scaling). Gemma4's "proportional" rope keeps the full head width but
 * only its first partial_rotary_factor * Dh / 2 frequencies are non-zero
 * (1 / theta^(2i / Dh)); the rest are 0, which the rope op applies as the
 * identity. A table per layer, since gemma4's head width varies by layer.
 *
 * Gemma4 per layer: head width and KV heads come from per_layer_config (or
 * the older global_head_dim / num_global_key_value_heads); the last
 * num_kv_shared_layers layers compute no K/V and read the KV cache layer of
 * the last earlier layer of their type (so the cache has fewer layers, and
 * is as wide as the widest layer); attention_k_eq_v full layers take V from
 * the K projection (before its norm); use_double_wide_mlp doubles the MLP of
 * the shared layers. Per-layer inputs (PLE): one [T][L*P] tensor per batch,
 *   ple = (rms(Wple_model x0 / sqrt(D)) + embed_ple(tok) * sqrt(P)) / sqrt(2)
 * of which layer l reads columns [l*P, (l+1)*P). The KV cache is as wide as
 * the widest layer for every layer (gemma4's sliding layers use a part).
 *
 * Not supported (clear errors): bidirectional attention (embedding models).
 * transformers 5.17's gemma3 does not pass
 * attn_logit_softcapping to attention, and its multimodal gemma3 does not
 * apply final_logit_softcapping; both are matched here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_arch.h"
#include "lm_blocks.h"
#include "lm_gemma.h"
#include "lm_moe.h"

/* ---- config --------------------------------------------------------------- */

/* One rope object: {"rope_type": default|linear|proportional, "rope_theta",
 * "factor", "partial_rotary_factor"}. */
static int parse_rope_obj(gemma_rope_cfg *r, json_t *o, const char *label, const char *which, lm_err *e) {
    json_t *t = json_object_get(o, "rope_type");
    if (!json_is_string(t)) t = json_object_get(o, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "default";
    lm_json_num(o, "rope_theta", &r->theta);
    lm_json_num(o, "factor", &r->factor);
    lm_json_num(o, "partial_rotary_factor", &r->partial);
    if (!strcmp(type, "default")) r->type = GEMMA_ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) r->type = GEMMA_ROPE_LINEAR;
    else if (!strcmp(type, "proportional")) r->type = GEMMA_ROPE_PROPORTIONAL;
    else return lm_errf(e, "%s: unsupported rope type \"%s\" for %s layers", label, type, which);
    if (!(r->theta > 0)) return lm_errf(e, "%s: rope_theta of %s layers must be > 0", label, which);
    if (!(r->factor > 0)) return lm_errf(e, "%s: rope factor of %s layers must be > 0", label, which);
    if (!(r->partial >= 0 && r->partial <= 1))
        return lm_errf(e, "%s: partial_rotary_factor of %s layers must be in [0, 1]", label, which);
    return 0;
}

/* Per layer type, in the transformers 5 spelling or the older one (rope_theta
 * and rope_scaling for global layers, rope_local_base_freq for local ones). */
static int parse_ropes(struct lm_gemma_config *g, json_t *root, const char *label, lm_err *e) {
    static const char *const key[2] = { "full_attention", "sliding_attention" };
    g->rope[0] = (gemma_rope_cfg){ GEMMA_ROPE_DEFAULT, 1e6, 1, 1 };
    g->rope[1] = (gemma_rope_cfg){ GEMMA_ROPE_DEFAULT, 1e4, 1, 1 };
    if (g->version == 4) g->rope[0] = (gemma_rope_cfg){ GEMMA_ROPE_PROPORTIONAL, 1e6, 1, 0.25 };
    json_t *rp = json_object_get(root, "rope_parameters");
    if (json_is_object(rp) && (json_object_get(rp, key[0]) || json_object_get(rp, key[1]))) {
        for (int i = 0; i < 2; i++) {
            json_t *o = json_object_get(rp, key[i]);
            if (json_is_object(o) && parse_rope_obj(&g->rope[i], o, label, key[i], e)) return -1;
        }
        return 0;
    }
    lm_json_num(root, "rope_theta", &g->rope[0].theta);
    lm_json_num(root, "rope_local_base_freq", &g->rope[1].theta);
    json_t *rs = json_is_object(rp) ? rp : json_object_get(root, "rope_scaling");
    if (json_is_object(rs) && parse_rope_obj(&g->rope[0], rs, label, key[0], e)) return -1;
    return 0;
}

/* Layer types: explicit layer_types, else every sliding_window_pattern-th
 * layer is global (default 6); gemma4 forces the last layer to global. */
static int parse_layer_types(lm_model_config *c, json_t *root, int version, const char *label, lm_err *e) {
    json_t *lt = json_object_get(root, "layer_types");
    if (json_is_array(lt)) {
        for (int l = 0; l < c->n_layers; l++) {
            json_t *s = json_array_get(lt, (size_t)l);
            const char *v = json_is_string(s) ? json_string_value(s) : "";
            if (strcmp(v, "sliding_attention") && strcmp(v, "full_attention"))
                return lm_errf(e, "%s: layer_types[%d] is \"%s\", expected sliding_attention or full_attention",
                               label, l, v);
        }
    } else {
        int pattern = 6;
        if (!lm_json_int(root, "sliding_window_pattern", &pattern)) lm_json_int(root, "_sliding_window_pattern", &pattern);
        if (pattern < 1) return lm_errf(e, "%s: sliding_window_pattern must be >= 1", label);
        for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = (l + 1) % pattern != 0;
    }
    if (version == 4) c->layer_sliding[c->n_layers - 1] = false;
    bool any = false;
    for (int l = 0; l < c->n_layers; l++) any |= c->layer_sliding[l];
    c->sliding_window = 0;
    if (any && (!lm_json_int(root, "sliding_window", &c->sliding_window) || c->sliding_window < 1))
        return lm_errf(e, "%s: sliding-window layers but no positive sliding_window", label);
    return 0;
}

/* Shared KV (lm_gemma.h): the GGUF reader gets the same rule as config.json's. */
int lm_gemma_share_kv(lm_model_config *c, int shared, bool double_wide, const char *label, lm_err *e) {
    struct lm_gemma_config *g = c->gemma;
    int first = c->n_layers - shared;
    if (shared < 0 || (shared > 0 && first <= 0))
        return lm_errf(e, "%s: num_kv_shared_layers %d leaves no layer to share from", label, shared);
    g->n_kv_layers = shared > 0 ? first : c->n_layers;
    for (int l = first; shared > 0 && l < c->n_layers; l++) {
        gemma_layer_cfg *L = &g->layer[l];
        L->shared = true;
        L->d_ff *= double_wide ? 2 : 1;
        L->kv_layer = -1;
        for (int j = first - 1; j >= 0 && L->kv_layer < 0; j--)
            if (c->layer_sliding[j] == c->layer_sliding[l]) L->kv_layer = j;
        if (L->kv_layer < 0)
            return lm_errf(e, "%s: layer %d shares KV but no earlier layer is %s attention", label, l,
                           c->layer_sliding[l] ? "sliding" : "full");
        const gemma_layer_cfg *S = &g->layer[L->kv_layer];
        if (S->head_dim != L->head_dim || S->n_kv_heads != L->n_kv_heads)
            return lm_errf(e, "%s: layer %d shares KV with layer %d of another head shape", label, l, L->kv_layer);
    }
    return 0;
}

/* Gemma4's per-layer head width and KV heads: per_layer_config {"idx":
 * {"head_dim", "num_key_value_heads"}}, or (older configs) global_head_dim
 * (default 512) for full layers and num_global_key_value_heads with
 * attention_k_eq_v. */
static int parse_gemma4_layers(struct lm_gemma_config *g, lm_model_config *c, json_t *root, const char *label,
                               lm_err *e) {
    bool k_eq_v = lm_json_bool(root, "attention_k_eq_v", false);
    json_t *plc = json_object_get(root, "per_layer_config");
    if (json_is_object(plc)) {
        const char *k;
        json_t *v;
        json_object_foreach(plc, k, v) {
            char *end;
            long l = strtol(k, &end, 10);
            if (*end || end == k || l < 0 || l >= c->n_layers || !json_is_object(v))
                return lm_errf(e, "%s: per_layer_config has an entry \"%s\" that is not a layer index", label, k);
            const char *f;
            json_t *x;
            json_object_foreach(v, f, x) {
                int *dst = !strcmp(f, "head_dim") ? &g->layer[l].head_dim
                           : !strcmp(f, "num_key_value_heads") ? &g->layer[l].n_kv_heads : NULL;
                if (!dst) return lm_errf(e, "%s: per_layer_config[%s].%s is not supported", label, k, f);
                if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 65536)
                    return lm_errf(e, "%s: per_layer_config[%s].%s must be a positive integer", label, k, f);
                *dst = (int)json_integer_value(x);
            }
        }
    } else {
        int gdim = 512, gkv = 0;
        lm_json_int(root, "global_head_dim", &gdim);
        if (k_eq_v) lm_json_int(root, "num_global_key_value_heads", &gkv);
        for (int l = 0; l < c->n_layers; l++) {
            if (c->layer_sliding[l]) continue;
            g->layer[l].head_dim = gdim;
            if (gkv > 0) g->layer[l].n_kv_heads = gkv;
        }
    }
    int shared = 0;
    lm_json_int(root, "num_kv_shared_layers", &shared);
    for (int l = 0; l < c->n_layers; l++) g->layer[l].k_eq_v = k_eq_v && !c->layer_sliding[l];
    if (lm_gemma_share_kv(c, shared, lm_json_bool(root, "use_double_wide_mlp", false), label, e)) return -1;
    int P = 256, Vp = 262144;
    json_t *pj = json_object_get(root, "hidden_size_per_layer_input");
    if (json_is_null(pj)) P = 0;
    else lm_json_int(root, "hidden_size_per_layer_input", &P);
    lm_json_int(root, "vocab_size_per_layer_input", &Vp);
    if (P < 0 || (P > 0 && Vp < 1)) return lm_errf(e, "%s: bad per-layer input sizes (%d, %d)", label, P, Vp);
    g->ple_dim = P;
    g->ple_vocab = Vp;
    return 0;
}

/* One config per model, layers uniform until a reader says otherwise. */
struct lm_gemma_config *lm_gemma_config_new(lm_model_config *c, int version) {
    struct lm_gemma_config *g = lm_xcalloc(1, sizeof *g + (size_t)c->n_layers * sizeof(gemma_layer_cfg));
    c->gemma = g;
    g->version = version;
    for (int l = 0; l < c->n_layers; l++)
        g->layer[l] = (gemma_layer_cfg){ c->head_dim, c->n_kv_heads, c->d_ff, l, false, false };
    g->n_kv_layers = c->n_layers;
    return g;
}

/* The checks both readers end with (lm_gemma.h). */
int lm_gemma_config_check(const lm_model_config *c, const char *label, lm_err *e) {
    for (int l = 0; l < c->n_layers; l++) {
        const gemma_layer_cfg *L = &c->gemma->layer[l];
        if (L->head_dim % 2 || L->head_dim > 1024)
            return lm_errf(e, "%s: layer %d head_dim %d must be even and at most 1024", label, l, L->head_dim);
        if (L->n_kv_heads < 1 || c->n_heads % L->n_kv_heads)
            return lm_errf(e, "%s: layer %d: %d attention heads are not a multiple of %d KV heads", label, l,
                           c->n_heads, L->n_kv_heads);
    }
    return 0;
}

/* Gemma4's MoE block (enable_moe_block: every layer): num_experts,
 * top_k_experts, moe_intermediate_size (or expert_intermediate_size); the
 * router always renormalises its top k. */
static int parse_moe(lm_model_config *c, json_t *root, int version, const char *label, lm_err *e) {
    if (version != 4) return lm_errf(e, "%s: enable_moe_block is a gemma4 setting", label);
    if (!lm_json_int(root, "num_experts", &c->n_experts) || c->n_experts < 1 || c->n_experts > 4096)
        return lm_errf(e, "%s: enable_moe_block needs num_experts in [1, 4096]", label);
    if ((!lm_json_int(root, "top_k_experts", &c->n_experts_per_tok) &&
         !lm_json_int(root, "num_experts_per_tok", &c->n_experts_per_tok)) ||
        c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts)
        return lm_errf(e, "%s: top_k_experts must be in [1, num_experts = %d]", label, c->n_experts);
    if ((!lm_json_int(root, "moe_intermediate_size", &c->moe_d_ff) &&
         !lm_json_int(root, "expert_intermediate_size", &c->moe_d_ff)) ||
        c->moe_d_ff < 1)
        return lm_errf(e, "%s: enable_moe_block needs a positive moe_intermediate_size", label);
    c->norm_topk_prob = true;
    c->decoder_sparse_step = 1;
    c->layer_moe = lm_xcalloc((size_t)c->n_layers, sizeof(bool));
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = true;
    return 0;
}

static int gemma_parse_config(lm_model_config *c, json_t *root, const char *label, lm_err *e) {
    int version = !strncmp(c->model_type, "gemma4", 6) ? 4 : 3;
    if (c->act != LM_ACT_GELU_TANH && c->act != LM_ACT_GELU)
        return lm_errf(e, "%s: gemma models use a gelu activation", label);
    if (!c->d_ff) return lm_errf(e, "%s: missing \"intermediate_size\"", label);
    json_t *bidi = json_object_get(root, "use_bidirectional_attention");
    if (json_is_true(bidi) || (json_is_string(bidi) && !strcmp(json_string_value(bidi), "all")))
        return lm_errf(e, "%s: bidirectional attention (an embedding model) is not supported", label);
    if (lm_json_bool(root, "enable_moe_block", false) && parse_moe(c, root, version, label, e)) return -1;
    c->qkv_bias = c->o_bias = lm_json_bool(root, "attention_bias", false);
    c->qk_norm = true;

    struct lm_gemma_config *g = lm_gemma_config_new(c, version); /* freed with c, also on errors */
    if (parse_layer_types(c, root, version, label, e) || parse_ropes(g, root, label, e)) return -1;
    if (version == 4 && parse_gemma4_layers(g, c, root, label, e)) return -1;

    double qpas = 256, cap = 0;
    lm_json_num(root, "query_pre_attn_scalar", &qpas);
    if (!(qpas > 0)) return lm_errf(e, "%s: query_pre_attn_scalar must be > 0", label);
    g->attn_scale = version == 4 ? 1.0f : (float)pow(qpas, -0.5);
    if (lm_json_num(root, "final_logit_softcapping", &cap) && !(cap > 0))
        return lm_errf(e, "%s: final_logit_softcapping must be > 0 or null", label);
    g->final_softcap = (float)cap;
    return lm_gemma_config_check(c, label, e);
}

/* ---- weights --------------------------------------------------------------- */

typedef struct gemma_layer {
    lm_tensor attn_norm, post_attn_norm, pre_ffn_norm, post_ffn_norm; /* [D] f32 */
    lm_tensor wq, wk, wv, wo;      /* [H*Dh][D], [Hkv*Dh][D] x2, [D][H*Dh]; wk/wv absent when shared */
    lm_tensor bq, bk, bv, bo;      /* attention_bias; data NULL when absent */
    lm_tensor q_norm, k_norm;      /* [Dh] f32 */
    lm_tensor w_gate, w_up, w_down; /* [F][D], [F][D], [D][F] */
    lm_tensor ple_gate, ple_proj;  /* [P][D], [D][P] (gemma4 per-layer input) */
    lm_tensor ple_norm;            /* [D] f32 */
    /* gemma4's MoE block, in layers with a router */
    bool moe;
    lm_moe_layer experts;          /* router [E][D], experts (lm_moe.h) */
    lm_tensor router_norm;         /* [D] f32: router.scale / sqrt(D), the router input's norm weight */
    lm_tensor expert_scale;        /* [1][E] f32: per_expert_scale */
    lm_tensor pre_ffn_norm2, post_ffn_norm1, post_ffn_norm2; /* [D] f32 */
    float layer_scalar;
    float *inv_freq;               /* [Dh / 2] host, this layer type's rope */
    float rope_factor;             /* rope attn_factor (1) */
} gemma_layer;

/* Activations, grown to the largest batch seen (see llama.c). Capacities in
 * floats per token row; views of any narrower width fit. */
typedef struct gemma_scratch {
    int cap_tokens, cap_out;
    lm_tensor x, h, q, qn, k, kn, v, vn, attn, o, gate, up, act; /* [T][...] */
    lm_tensor ple, ple_tmp, pg, pl, pa;                           /* [T][L*P] x2, [T][P] x3 */
    lm_tensor hs, logits;                                         /* [n_out][D], [n_out][V] */
    lm_tensor mlp, router;                                        /* [T][D], [T][E] (MoE layers) */
} gemma_scratch;

typedef struct gemma {
    const struct lm_gemma_config *g;
    gemma_layer *layers;
    lm_tensor ones;          /* [max Dh] f32 ones: gemma4's scale-free V norm */
    lm_tensor ple_embed;     /* [Vp][L*P] */
    lm_tensor ple_model_proj; /* [L*P][D] */
    lm_tensor ple_proj_norm; /* [P] f32 */
    float embed_scale, ple_embed_scale;
    bool final_softcap;      /* applies g->final_softcap (not in multimodal gemma3) */
    int max_dh, max_kv, max_ff;
    gemma_scratch s;
    char moe_pat[6][160];    /* HF MoE name patterns with the prefix (lm_moe_names) */
    lm_moe_names moe_names;
    /* the sliding layers' rings (lm_kv_pool.ring_blocks): the pool as their
     * kernels see it and each sequence's ring table, rebuilt per forward */
    lm_kv_pool ring_pool;
    int32_t *ring_ids;
    const int32_t **ring_tables;
    size_t ring_ids_cap;
    int ring_tables_cap;
} gemma;

/* Tensor names: HF text checkpoints use "model.", multimodal ones
 * "model.language_model." (transformers 5) or "language_model.model." (the
 * original gemma3 layout, still what 5.17 writes for it). */
static const char *const k_prefixes[] = { "model.", "model.language_model.", "language_model.model." };

typedef struct namer {
    const char *prefix;
    char buf[256];
} namer;

static const char *nm(namer *n, const char *suffix, int layer) {
    char pat[200];
    snprintf(pat, sizeof pat, "%s%s", n->prefix, suffix);
    snprintf(n->buf, sizeof n->buf, pat, layer);
    return n->buf;
}

/* Tensor names of a layout, after the prefix (a %d is the layer). */
typedef struct gemma_names {
    const char *embed, *norm, *head;
    const char *attn_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm;
    const char *q, *k, *v, *o, *bq, *bk, *bv, *bo, *q_norm, *k_norm, *gate, *up, *down;
    const char *ple_gate, *ple_proj, *ple_norm, *layer_scalar;   /* gemma4 */
    const char *ple_embed, *ple_model_proj, *ple_proj_norm;      /* gemma4 */
    /* gemma4 MoE: router scale, per-expert scale, the three extra norms, then
     * the router, fused experts (transformers) and stacked ones (mlx-lm's
     * switch_glu), as lm_moe_names' router, gate_up, down_fused, *_exps */
    const char *router_scale, *expert_scale, *pre_ffn_norm2, *post_ffn_norm1, *post_ffn_norm2;
    const char *router, *gate_up, *down_fused, *gate_exps, *up_exps, *down_exps;
} gemma_names;

static const gemma_names k_hf_names = {
    "embed_tokens.weight", "norm.weight", "lm_head.weight",
    "layers.%d.input_layernorm.weight", "layers.%d.post_attention_layernorm.weight",
    "layers.%d.pre_feedforward_layernorm.weight", "layers.%d.post_feedforward_layernorm.weight",
    "layers.%d.self_attn.q_proj.weight", "layers.%d.self_attn.k_proj.weight", "layers.%d.self_attn.v_proj.weight",
    "layers.%d.self_attn.o_proj.weight", "layers.%d.self_attn.q_proj.bias", "layers.%d.self_attn.k_proj.bias",
    "layers.%d.self_attn.v_proj.bias", "layers.%d.self_attn.o_proj.bias", "layers.%d.self_attn.q_norm.weight",
    "layers.%d.self_attn.k_norm.weight", "layers.%d.mlp.gate_proj.weight", "layers.%d.mlp.up_proj.weight",
    "layers.%d.mlp.down_proj.weight",
    "layers.%d.per_layer_input_gate.weight", "layers.%d.per_layer_projection.weight",
    "layers.%d.post_per_layer_input_norm.weight", "layers.%d.layer_scalar",
    "embed_tokens_per_layer.weight", "per_layer_model_projection.weight", "per_layer_projection_norm.weight",
    "layers.%d.router.scale", "layers.%d.router.per_expert_scale", "layers.%d.pre_feedforward_layernorm_2.weight",
    "layers.%d.post_feedforward_layernorm_1.weight", "layers.%d.post_feedforward_layernorm_2.weight",
    "layers.%d.router.proj.weight", "layers.%d.experts.gate_up_proj", "layers.%d.experts.down_proj",
    "layers.%d.experts.switch_glu.gate_proj.weight", "layers.%d.experts.switch_glu.up_proj.weight",
    "layers.%d.experts.switch_glu.down_proj.weight",
};

/* llama.cpp's converter (Gemma3Model); the gemma4 names are Gemma4Model's */
static const gemma_names k_gguf_names = {
    "token_embd.weight", "output_norm.weight", "output.weight",
    "blk.%d.attn_norm.weight", "blk.%d.post_attention_norm.weight", "blk.%d.ffn_norm.weight",
    "blk.%d.post_ffw_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_output.bias",
    "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight",
    "blk.%d.inp_gate.weight", "blk.%d.proj.weight", "blk.%d.post_norm.weight", "blk.%d.layer_output_scale.weight",
    "per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight",
    "blk.%d.ffn_gate_inp.scale", "blk.%d.ffn_down_exps.scale", "blk.%d.pre_ffw_norm_2.weight",
    "blk.%d.post_ffw_norm_1.weight", "blk.%d.post_ffw_norm_2.weight",
    NULL, NULL, NULL, NULL, NULL, NULL, /* lm_moe_gguf_names */
};

static void bind_layer(lm_binder *b, namer *n, const gemma_names *nt, gemma_layer *L, const gemma_layer_cfg *lc,
                       const lm_model_config *c, int l, float norm_off) {
    const struct lm_gemma_config *g = c->gemma;
    int64_t D = c->d_model, QD = (int64_t)c->n_heads * lc->head_dim, KD = (int64_t)lc->n_kv_heads * lc->head_dim;
    int64_t F = lc->d_ff, P = g->ple_dim;
    lm_bind_f32(b, &L->attn_norm, nm(n, nt->attn_norm, l), 1, D, true, norm_off);
    lm_bind_f32(b, &L->post_attn_norm, nm(n, nt->post_attn_norm, l), 1, D, true, norm_off);
    lm_bind_f32(b, &L->pre_ffn_norm, nm(n, nt->pre_ffn_norm, l), 1, D, true, norm_off);
    lm_bind_f32(b, &L->post_ffn_norm, nm(n, nt->post_ffn_norm, l), 1, D, true, norm_off);
    lm_bind_matrix(b, &L->wq, nm(n, nt->q, l), QD, D, true, true);
    lm_bind_matrix(b, &L->wo, nm(n, nt->o, l), D, QD, true, true);
    lm_bind_vector(b, &L->bq, nm(n, nt->bq, l), QD, c->qkv_bias);
    lm_bind_vector(b, &L->bo, nm(n, nt->bo, l), D, c->o_bias);
    lm_bind_f32(b, &L->q_norm, nm(n, nt->q_norm, l), 1, lc->head_dim, true, norm_off);
    if (!lc->shared) {
        lm_bind_matrix(b, &L->wk, nm(n, nt->k, l), KD, D, true, true);
        lm_bind_vector(b, &L->bk, nm(n, nt->bk, l), KD, c->qkv_bias);
        if (!lc->k_eq_v) {
            lm_bind_matrix(b, &L->wv, nm(n, nt->v, l), KD, D, true, true);
            lm_bind_vector(b, &L->bv, nm(n, nt->bv, l), KD, c->qkv_bias);
        }
        lm_bind_f32(b, &L->k_norm, nm(n, nt->k_norm, l), 1, lc->head_dim, true, norm_off);
    }
    namer nu = *n;
    lm_bind_matrix_group(b, 2, (lm_tensor *const[]){ &L->w_gate, &L->w_up },
                         (const char *const[]){ nm(n, nt->gate, l),
                                                nm(&nu, nt->up, l) },
                         (const int64_t[]){ F, F }, D);
    lm_bind_matrix(b, &L->w_down, nm(n, nt->down, l), D, F, true, true);
    L->layer_scalar = 1.0f;
    if (g->version == 4) {
        if (P > 0) {
            lm_bind_matrix(b, &L->ple_gate, nm(n, nt->ple_gate, l), P, D, true, true);
            lm_bind_matrix(b, &L->ple_proj, nm(n, nt->ple_proj, l), D, P, true, true);
            lm_bind_vector(b, &L->ple_norm, nm(n, nt->ple_norm, l), D, true);
        }
        lm_tensor s = { 0 };
        lm_bind_vector(b, &s, nm(n, nt->layer_scalar, l), 1, false);
        if (s.data) b->m->be->ops->read(b->m->be, &L->layer_scalar, s.data, sizeof(float));
    }
}

/* Layer l's MoE block (gemma4): router, experts, scales and norms. */
static void bind_moe(lm_binder *b, namer *n, const gemma_names *nt, const lm_moe_names *mn, gemma_layer *L, int l) {
    const lm_model_config *c = &b->m->cfg;
    const int64_t D = c->d_model;
    lm_moe_bind(b, &L->experts, mn, l);
    lm_bind_vector(b, &L->router_norm, nm(n, nt->router_scale, l), D, true);
    lm_bind_vector(b, &L->expert_scale, nm(n, nt->expert_scale, l), c->n_experts, true);
    lm_bind_vector(b, &L->pre_ffn_norm2, nm(n, nt->pre_ffn_norm2, l), D, true);
    lm_bind_vector(b, &L->post_ffn_norm1, nm(n, nt->post_ffn_norm1, l), D, true);
    lm_bind_vector(b, &L->post_ffn_norm2, nm(n, nt->post_ffn_norm2, l), D, true);
    if (b->failed) return;
    /* the router's input is rms(x) * scale * D^-0.5: one norm weight */
    lm_backend *be = b->m->be;
    float *w = lm_xmalloc((size_t)D * sizeof(float));
    be->ops->read(be, w, L->router_norm.data, (size_t)D * sizeof(float));
    const float root = (float)pow((double)D, -0.5);
    for (int64_t i = 0; i < D; i++) w[i] *= root;
    be->ops->write(be, L->router_norm.data, w, (size_t)D * sizeof(float));
    free(w);
}

/* The MoE names of a checkpoint: llama.cpp's, or the HF ones under the prefix. */
static const lm_moe_names *moe_names(gemma *G, const namer *n, const gemma_names *nt, bool gguf) {
    if (gguf) return &lm_moe_gguf_names;
    const char *const src[6] = { nt->router, nt->gate_up, nt->down_fused, nt->gate_exps, nt->up_exps, nt->down_exps };
    for (int i = 0; i < 6; i++) snprintf(G->moe_pat[i], sizeof G->moe_pat[i], "%s%s", n->prefix, src[i]);
    G->moe_names = (lm_moe_names){ .router = G->moe_pat[0], .gate_up = G->moe_pat[1], .down_fused = G->moe_pat[2],
                                   .gate_exps = G->moe_pat[3], .up_exps = G->moe_pat[4], .down_exps = G->moe_pat[5] };
    return &G->moe_names;
}

/* This layer type's inverse frequencies over the layer's full head width. */
static float *rope_table(const gemma_rope_cfg *r, int Dh) {
    float *inv = lm_xcalloc((size_t)Dh / 2, sizeof(float));
    lm_rope_config rc = { .type = r->type == GEMMA_ROPE_LINEAR ? LM_ROPE_LINEAR : LM_ROPE_DEFAULT,
                          .theta = r->theta, .factor = r->factor };
    lm_rope_inv_freq(&rc, Dh, inv);
    if (r->type == GEMMA_ROPE_PROPORTIONAL) {
        int angles = (int)floor(r->partial * Dh / 2);
        for (int i = 0; i < Dh / 2; i++) inv[i] = i < angles ? (float)(inv[i] / r->factor) : 0.0f;
    }
    return inv;
}

static int gemma_bind(lm_model *m, lm_err *e) {
    const lm_model_config *c = &m->cfg;
    const struct lm_gemma_config *g = c->gemma;
    LM_ASSERT(g); /* both config readers set it */
    const bool gguf = m->weights->gguf != NULL;
    const gemma_names *nt = gguf ? &k_gguf_names : &k_hf_names;
    gemma *G = lm_xcalloc(1, sizeof *G);
    m->impl = G;
    G->g = g;
    G->layers = lm_xcalloc((size_t)c->n_layers, sizeof *G->layers);
    lm_binder b = { m, e, 0 };
    namer n = { gguf ? "" : k_prefixes[0], { 0 } };
    for (size_t i = 0; !gguf && i < LM_COUNT(k_prefixes); i++)
        if (lm_bind_has(&b, nm(&(namer){ k_prefixes[i], { 0 } }, nt->embed, 0))) n.prefix = k_prefixes[i];
    bool multimodal = !gguf && n.prefix != k_prefixes[0];
    int64_t D = c->d_model, V = c->vocab, L = c->n_layers, P = g->ple_dim;
    /* gemma3's norms scale by (1 + w); llama.cpp's converter stores 1 + w */
    float norm_off = g->version == 3 && !gguf ? 1.0f : 0.0f;

    lm_bind_matrix(&b, &m->embed, nm(&n, nt->embed, 0), V, D, true, c->tie_embeddings);
    lm_bind_f32(&b, &m->out_norm, nm(&n, nt->norm, 0), 1, D, true, norm_off);
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else {
        const char *head = nt->head;
        if (!gguf && !lm_bind_has(&b, head) && lm_bind_has(&b, "language_model.lm_head.weight"))
            head = "language_model.lm_head.weight";
        lm_bind_matrix(&b, &m->lm_head, head, V, D, true, true);
    }
    if (P > 0) {
        lm_bind_matrix(&b, &G->ple_embed, nm(&n, nt->ple_embed, 0), g->ple_vocab, L * P, true, false);
        lm_bind_matrix(&b, &G->ple_model_proj, nm(&n, nt->ple_model_proj, 0), L * P, D, true, true);
        lm_bind_vector(&b, &G->ple_proj_norm, nm(&n, nt->ple_proj_norm, 0), P, true);
    }
    const lm_moe_names *mn = c->n_experts > 0 ? moe_names(G, &n, nt, gguf) : NULL;
    for (int l = 0; l < c->n_layers && !b.failed; l++) {
        const gemma_layer_cfg *lc = &g->layer[l];
        bind_layer(&b, &n, nt, &G->layers[l], lc, c, l, norm_off);
        G->layers[l].moe = c->layer_moe && c->layer_moe[l];
        if (G->layers[l].moe && !b.failed) bind_moe(&b, &n, nt, mn, &G->layers[l], l);
        G->layers[l].inv_freq = rope_table(&g->rope[c->layer_sliding[l] ? 1 : 0], lc->head_dim);
        G->layers[l].rope_factor = 1.0f;
        G->max_dh = LM_MAX(G->max_dh, lc->head_dim);
        G->max_kv = LM_MAX(G->max_kv, lc->n_kv_heads * lc->head_dim);
        G->max_ff = LM_MAX(G->max_ff, lc->d_ff);
    }
    if (b.failed) return -1;

    /* sqrt(D) and sqrt(P) as the reference's f32 buffers hold them */
    G->embed_scale = (float)sqrt((double)D);
    G->ple_embed_scale = (float)sqrt((double)P);
    m->host_tokens = P > 0; /* per_layer_inputs embeds and range-checks the ids on the host */
    G->final_softcap = g->final_softcap > 0 && !(g->version == 3 && multimodal);
    if (g->version == 4) {
        float *one = lm_xmalloc((size_t)G->max_dh * sizeof(float));
        for (int i = 0; i < G->max_dh; i++) one[i] = 1.0f;
        G->ones = (lm_tensor){ .type = LM_F32, .rows = 1, .cols = G->max_dh };
        G->ones.data = m->be->ops->alloc(m->be, (size_t)G->max_dh * sizeof(float));
        if (G->ones.data) m->be->ops->write(m->be, G->ones.data, one, (size_t)G->max_dh * sizeof(float));
        free(one);
        if (!G->ones.data) return lm_errf(e, "%s: out of memory", m->path);
    }
    m->n_kv_layers = g->n_kv_layers;
    m->kv_width = G->max_kv;
    /* each KV layer at its own width (sliding layers are often narrower) */
    m->kv_layer_width = lm_xmalloc((size_t)g->n_kv_layers * sizeof(int64_t));
    m->kv_layer_sliding = lm_xmalloc((size_t)g->n_kv_layers * sizeof(bool));
    for (int l = 0; l < g->n_kv_layers; l++) {
        m->kv_layer_width[l] = (int64_t)g->layer[l].n_kv_heads * g->layer[l].head_dim;
        m->kv_layer_sliding[l] = c->layer_sliding[l] && c->sliding_window > 0;
    }
    return 0;
}

/* ---- forward ----------------------------------------------------------------- */

static void release_all(lm_backend *be, gemma_scratch *s) {
    lm_tensor *ts[] = { &s->x,  &s->h,    &s->q,       &s->qn, &s->k,  &s->kn, &s->v,  &s->vn,     &s->attn,
                        &s->o,  &s->gate, &s->up,      &s->act, &s->ple, &s->ple_tmp, &s->pg, &s->pl, &s->pa,
                        &s->hs, &s->logits, &s->mlp, &s->router };
    for (size_t i = 0; i < LM_COUNT(ts); i++) lm_tensor_release(be, ts[i]);
}

static int ensure_scratch(lm_model *m, int T, int n_out, lm_err *e) {
    gemma *G = m->impl;
    gemma_scratch *s = &G->s;
    if (s->cap_tokens >= T && s->cap_out >= n_out) return 0;
    release_all(m->be, s);
    const lm_model_config *c = &m->cfg;
    int cap = LM_MAX(T, s->cap_tokens), cap_out = LM_MAX(LM_MAX(n_out, s->cap_out), 1);
    int64_t D = c->d_model, QD = (int64_t)c->n_heads * G->max_dh, KD = G->max_kv, F = G->max_ff;
    int64_t P = G->g->ple_dim, LP = (int64_t)c->n_layers * P;
    struct { lm_tensor *t; int64_t rows, cols; } plan[] = {
        { &s->x, cap, D },     { &s->h, cap, D },       { &s->q, cap, QD },     { &s->qn, cap, QD },
        { &s->k, cap, KD },    { &s->kn, cap, KD },     { &s->v, cap, KD },     { &s->vn, cap, KD },
        { &s->attn, cap, QD }, { &s->o, cap, D },       { &s->gate, cap, F },   { &s->up, cap, F },
        { &s->act, cap, F },   { &s->ple, cap, LP },    { &s->ple_tmp, cap, LP }, { &s->pg, cap, P },
        { &s->pl, cap, P },    { &s->pa, cap, P },      { &s->hs, cap_out, D }, { &s->logits, cap_out, c->vocab },
        { &s->mlp, cap, c->n_experts > 0 ? D : 0 },      { &s->router, cap, c->n_experts },
    };
    for (size_t i = 0; i < LM_COUNT(plan); i++) {
        if (plan[i].cols == 0) continue; /* no per-layer inputs, no experts */
        if (lm_tensor_alloc(m->be, plan[i].t, plan[i].rows, plan[i].cols)) {
            release_all(m->be, s);
            s->cap_tokens = s->cap_out = 0;
            return lm_errf(e, "out of memory for activations of a %d-token batch", T);
        }
    }
    s->cap_tokens = cap;
    s->cap_out = cap_out;
    return 0;
}

/* [rows][cols] over the first rows * cols floats of a scratch buffer. */
static lm_tensor view(const lm_tensor *buf, int64_t rows, int64_t cols) {
    LM_ASSERT(rows * cols <= buf->rows * buf->cols);
    return (lm_tensor){ .type = LM_F32, .rows = rows, .cols = cols, .data = buf->data };
}

static const lm_tensor *opt(const lm_tensor *t) { return t->data ? t : NULL; }

/* The per-layer inputs of the whole batch, [T][L*P] in s->ple. */
static void per_layer_inputs(lm_model *m, const lm_batch *b, const lm_tensor *x0) {
    gemma *G = m->impl;
    const struct lm_backend_ops *op = m->be->ops;
    const int T = b->n_tokens;
    int64_t LP = (int64_t)m->cfg.n_layers * G->g->ple_dim;
    lm_tensor ple = view(&G->s.ple, T, LP), tmp = view(&G->s.ple_tmp, T, LP);
    op->matmul(m->be, &tmp, x0, &G->ple_model_proj, NULL);
    op->scale(m->be, &tmp, (float)pow((double)m->cfg.d_model, -0.5));
    op->rms_norm(m->be, &ple, &tmp, &G->ple_proj_norm, m->cfg.norm_eps, 0);
    op->get_rows(m->be, &tmp, &G->ple_embed, b->tokens);
    op->scale(m->be, &tmp, G->ple_embed_scale);
    op->add(m->be, &ple, &tmp);
    op->scale(m->be, &ple, (float)M_SQRT1_2);
}

/* The batch as the ring layers see it (lm_kv_pool.ring_blocks): sequence
 * s's block i is block i % R of its state slot's ring. A forward writes its
 * tokens before any attention reads, so the blocks from the first token's
 * window to the last token must all be distinct ring blocks. */
static int ring_batch(gemma *G, const lm_kv_pool *kv, const lm_batch *b, int window, lm_attn_batch *rb, lm_err *e) {
    const int R = kv->ring_blocks, bs = kv->block_size, S = b->n_seqs;
    G->ring_pool = *kv;
    G->ring_pool.n_blocks = kv->n_state_slots * R;
    if (S > G->ring_tables_cap) {
        G->ring_tables_cap = S;
        G->ring_tables = lm_xrealloc(G->ring_tables, (size_t)S * sizeof *G->ring_tables);
    }
    LM_ASSERT(b->state_slot); /* rings are state: lm_model_check_batch asked for slots */
    /* per sequence its first and last position in the batch */
    int32_t *lo = lm_xmalloc(2 * (size_t)S * sizeof(int32_t)), *hi = lo + S;
    for (int s = 0; s < S; s++) lo[s] = INT32_MAX, hi[s] = -1;
    for (int t = 0; t < b->n_tokens; t++) {
        lo[b->seq[t]] = LM_MIN(lo[b->seq[t]], b->pos[t]);
        hi[b->seq[t]] = LM_MAX(hi[b->seq[t]], b->pos[t]);
    }
    size_t total = 0;
    int rc = 0;
    for (int s = 0; s < S && !rc; s++) {
        if (hi[s] < 0) continue;
        int first = LM_MAX(0, lo[s] - window + 1) / bs;
        if (hi[s] / bs - first + 1 > R)
            rc = lm_errf(e, "a forward gives sequence %d positions %d..%d, more than its sliding-window ring of %d "
                            "tokens holds with the window", s, lo[s], hi[s], R * bs);
        total += (size_t)(hi[s] / bs + 1);
    }
    if (!rc && total > G->ring_ids_cap) {
        G->ring_ids_cap = total;
        G->ring_ids = lm_xrealloc(G->ring_ids, total * sizeof(int32_t));
    }
    for (int s = 0, at = 0; s < S && !rc; s++) {
        int32_t n = hi[s] < 0 ? 0 : hi[s] / bs + 1, *tab = n ? G->ring_ids + at : NULL;
        for (int i = 0; i < n; i++) tab[i] = b->state_slot[s] * R + i % R;
        G->ring_tables[s] = tab;
        at += n;
    }
    free(lo);
    *rb = (lm_attn_batch){ b->n_tokens, b->pos, b->seq, S, G->ring_tables, b->state_slot, NULL };
    return rc;
}

static int gemma_forward(lm_model *m, lm_kv_pool *kv, const lm_batch *b, float *logits, lm_err *e) {
    const int T = b->n_tokens;
    gemma *G = m->impl;
    const struct lm_gemma_config *g = G->g;
    const lm_model_config *c = &m->cfg;
    for (int t = 0; g->ple_dim > 0 && t < T; t++)
        if (b->tokens[t] >= g->ple_vocab)
            return lm_errf(e, "token id %d out of range of the per-layer embedding [0, %d)", b->tokens[t],
                           g->ple_vocab);
    if (ensure_scratch(m, T, b->n_out, e)) return -1;
    lm_backend *be = m->be;
    const struct lm_backend_ops *op = be->ops;
    gemma_scratch *s = &G->s;
    const int64_t D = c->d_model, H = c->n_heads, P = g->ple_dim;
    lm_tensor x = view(&s->x, T, D), h = view(&s->h, T, D), o = view(&s->o, T, D);
    lm_attn_batch ab = { T, b->pos, b->seq, b->n_seqs, b->block_tables, b->state_slot, NULL }, rb = ab;
    bool tanh_gelu = c->act == LM_ACT_GELU_TANH;
    if (kv->ring_blocks > 0 && ring_batch(G, kv, b, c->sliding_window, &rb, e)) return -1;

    lm_embed_tokens(m, &x, &m->embed, b);
    op->scale(be, &x, G->embed_scale);
    if (P > 0) per_layer_inputs(m, b, &x);
    for (int l = 0; l < c->n_layers; l++) {
        const gemma_layer *L = &G->layers[l];
        const gemma_layer_cfg *lc = &g->layer[l];
        const int Dh = lc->head_dim, Hkv = lc->n_kv_heads;
        /* a sliding layer kept in a ring reads and writes through it */
        const bool ring = kv->ring_blocks > 0 && kv->layer_ring[lc->kv_layer];
        lm_kv_pool *lkv = ring ? &G->ring_pool : kv;
        const lm_attn_batch *lab = ring ? &rb : &ab;
        lm_tensor q = view(&s->q, T, H * Dh), qn = view(&s->qn, T, H * Dh), attn = view(&s->attn, T, H * Dh);
        lm_rope_params rq = { (int)H, Dh, Dh, false, L->inv_freq, L->rope_factor };
        lm_attn_params ap = { (int)H, Hkv, Dh, g->attn_scale, c->layer_sliding[l] ? c->sliding_window : 0, 0 };

        op->rms_norm(be, &h, &x, &L->attn_norm, c->norm_eps, 0);
        op->matmul(be, &q, &h, &L->wq, opt(&L->bq));
        op->rms_norm(be, &qn, &q, &L->q_norm, c->norm_eps, 0);
        op->rope(be, &qn, b->pos, &rq);
        if (!lc->shared) {
            int64_t KD = (int64_t)Hkv * Dh;
            lm_tensor k = view(&s->k, T, KD), kn = view(&s->kn, T, KD), v = view(&s->v, T, KD);
            lm_tensor vn = view(&s->vn, T, KD), *vw = &v;
            lm_rope_params rk = rq;
            rk.n_heads = Hkv;
            op->matmul(be, &k, &h, &L->wk, opt(&L->bk));
            if (!lc->k_eq_v) op->matmul(be, &v, &h, &L->wv, opt(&L->bv));
            op->rms_norm(be, &kn, &k, &L->k_norm, c->norm_eps, 0);
            op->rope(be, &kn, b->pos, &rk);
            if (g->version == 4) {
                lm_tensor one = view(&G->ones, 1, Dh);
                op->rms_norm(be, &vn, lc->k_eq_v ? &k : &v, &one, c->norm_eps, 0);
                vw = &vn;
            }
            op->kv_write(be, lkv, lc->kv_layer, &kn, vw, lab);
        }
        op->attention(be, &attn, &qn, lkv, lc->kv_layer, lab, &ap);
        op->matmul(be, &o, &attn, &L->wo, opt(&L->bo));
        op->rms_norm(be, &h, &o, &L->post_attn_norm, c->norm_eps, 0);
        op->add(be, &x, &h);

        lm_tensor gate = view(&s->gate, T, lc->d_ff), up = view(&s->up, T, lc->d_ff), act = view(&s->act, T, lc->d_ff);
        const lm_glu glu = tanh_gelu ? LM_GLU_GELU_TANH : LM_GLU_GELU;
        op->rms_norm(be, &h, &x, &L->pre_ffn_norm, c->norm_eps, 0);
        lm_op_matmul_glu(be, &act, &h, &L->w_gate, &L->w_up, glu, &gate, &up);
        op->matmul(be, &o, &act, &L->w_down, NULL);
        lm_tensor ffn = o;
        if (L->moe) { /* ffn = n_post1(o) + n_post2(experts), then the layer's post norm */
            lm_tensor mlp = view(&s->mlp, T, D), lg = view(&s->router, T, c->n_experts);
            op->rms_norm(be, &mlp, &o, &L->post_ffn_norm1, c->norm_eps, 0);
            op->rms_norm(be, &h, &x, &L->router_norm, c->norm_eps, 0);
            op->matmul(be, &lg, &h, &L->experts.router, NULL);
            op->rms_norm(be, &h, &x, &L->pre_ffn_norm2, c->norm_eps, 0);
            const lm_moe_params mp = { .n_experts = c->n_experts, .top_k = c->n_experts_per_tok, .norm_topk = true,
                                       .gate = L->experts.gate, .up = L->experts.up, .down = L->experts.down,
                                       .expert_scale = &L->expert_scale, .act = glu };
            op->moe(be, &o, &h, &lg, &mp);
            op->rms_norm(be, &h, &o, &L->post_ffn_norm2, c->norm_eps, 0);
            op->add(be, &mlp, &h);
            ffn = mlp;
        }
        op->rms_norm(be, &h, &ffn, &L->post_ffn_norm, c->norm_eps, 0);
        op->add(be, &x, &h);

        if (P > 0) {
            lm_tensor pg = view(&s->pg, T, P), pl = view(&s->pl, T, P), pa = view(&s->pa, T, P);
            lm_tensor ple = view(&s->ple, T, (int64_t)c->n_layers * P);
            op->matmul(be, &pg, &x, &L->ple_gate, NULL);
            op->copy_cols(be, &pl, &ple, (int64_t)l * P);
            op->gelu_mul(be, &pa, &pg, &pl, tanh_gelu);
            op->matmul(be, &o, &pa, &L->ple_proj, NULL);
            op->rms_norm(be, &h, &o, &L->ple_norm, c->norm_eps, 0);
            op->add(be, &x, &h);
        }
        if (L->layer_scalar != 1.0f) op->scale(be, &x, L->layer_scalar);
    }
    lm_hidden_out(m, &x, &h, &m->out_norm, 0, b);
    if (b->n_out == 0) return 0;
    lm_tensor hs = view(&s->hs, b->n_out, D), hn = view(&s->h, b->n_out, D);
    lm_tensor lg = view(&s->logits, b->n_out, c->vocab);
    op->gather_rows(be, &hs, &x, b->out_rows, b->n_out);
    op->rms_norm(be, &hn, &hs, &m->out_norm, c->norm_eps, 0);
    op->matmul(be, &lg, &hn, &m->lm_head, NULL);
    if (G->final_softcap) op->softcap(be, &lg, g->final_softcap);
    lm_logits_out(m, b, &lg, logits);
    return 0;
}

static void gemma_free(lm_model *m) {
    gemma *G = m->impl;
    if (!G) return;
    release_all(m->be, &G->s);
    if (G->ones.data) m->be->ops->free(m->be, G->ones.data);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        free(G->layers[l].inv_freq);
        lm_moe_layer_free(&G->layers[l].experts);
    }
    free(G->layers);
    free(G->ring_ids);
    free(G->ring_tables);
    free(G);
    m->impl = NULL;
}

/* Gemma3TextConfig's defaults (transformers): what google/gemma-3-*-it's
 * text_config leaves out. Only missing keys are set; the rope and layer-type
 * defaults live in parse_ropes / parse_layer_types. */
static void gemma_config_defaults(const char *model_type, json_t *root) {
    if (strcmp(model_type, "gemma3_text") && strcmp(model_type, "gemma3")) return;
    json_t *d = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:i, s:b}", "vocab_size", 262208,
                          "hidden_size", 2304, "intermediate_size", 9216, "num_hidden_layers", 26,
                          "num_attention_heads", 8, "num_key_value_heads", 4, "head_dim", 256,
                          "max_position_embeddings", 131072, "rms_norm_eps", 1e-6, "query_pre_attn_scalar", 256,
                          "sliding_window", 4096, "tie_word_embeddings", 1);
    if (d) json_object_update_missing(root, d);
    json_decref(d);
    if (!json_object_get(root, "hidden_activation") && !json_object_get(root, "hidden_act"))
        json_object_set_new(root, "hidden_activation", json_string("gelu_pytorch_tanh"));
}

static const char *const k_gemma_types[] = { "gemma3_text", "gemma3", "gemma4_text", "gemma4", NULL };

const lm_arch lm_arch_gemma = {
    .name = "gemma",
    .model_types = k_gemma_types,
    .config_defaults = gemma_config_defaults,
    .parse_config = gemma_parse_config,
    .bind = gemma_bind,
    .forward = gemma_forward,
    .free = gemma_free,
};
