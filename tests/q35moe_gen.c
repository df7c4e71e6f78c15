/* q35moe_gen.c - Qwen3.5-family test checkpoints (q35moe_gen.h). */
#include "q35moe_gen.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "hf_quant_gen.h"
#include "lm_test.h"
#include "test_util.h"

/* qwen3-next fixture geometry, read from its config */
typedef struct q3n_geom {
    int64_t D, Hk, Hv, Dk, Dv, E, L;
} q3n_geom;

static int64_t cfg_i(json_t *c, const char *k) { return json_integer_value(json_object_get(c, k)); }

/* Rows of a [rows][D] bf16 matrix picked by map into a new buffer. */
static uint8_t *pick_rows(const lm_file_tensor *t, const int64_t *map, int64_t n) {
    const size_t rb = (size_t)t->shape[1] * 2;
    uint8_t *out = malloc((size_t)n * rb);
    for (int64_t r = 0; r < n; r++) memcpy(out + (size_t)r * rb, t->data + (size_t)map[r] * rb, rb);
    return out;
}

typedef struct q35moe_ckpt {
    hqg_tensor *t;
    int n;
    uint8_t **bufs;
    int n_bufs;
} q35moe_ckpt;

static hqg_tensor *add(q35moe_ckpt *c, const char *name, int n_dims, const int64_t *shape, const void *data,
                       size_t nbytes) {
    hqg_tensor *x = &c->t[c->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = "BF16";
    x->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) x->shape[d] = shape[d];
    x->data = data, x->nbytes = nbytes;
    return x;
}

static uint8_t *own(q35moe_ckpt *c, uint8_t *buf) { return c->bufs[c->n_bufs++] = buf; }

/* Layer l's linear-attention projections of the fixture as Qwen3.5 stores them, under dst. */
static void split_projections(q35moe_ckpt *c, const lm_safetensors *st, const q3n_geom *g, const char *dst, int l) {
    char name[150];
    const int64_t r = g->Hv / g->Hk, KD = g->Hk * g->Dk, VD = g->Hv * g->Dv, C = 2 * KD + VD;
    const int64_t G = 2 * g->Dk + 2 * r * g->Dv; /* in_proj_qkvz rows a key head: q, k, v (r heads), z (r heads) */
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_qkvz.weight", l);
    const lm_file_tensor *qkvz = lm_safetensors_find(st, name);
    snprintf(name, sizeof name, "model.layers.%d.linear_attn.in_proj_ba.weight", l);
    const lm_file_tensor *ba = lm_safetensors_find(st, name);
    if (!qkvz || !ba) return;
    int64_t *map = malloc((size_t)(C + VD) * sizeof *map);
    for (int64_t h = 0; h < g->Hk; h++) {
        for (int64_t i = 0; i < g->Dk; i++) {
            map[h * g->Dk + i] = h * G + i;                /* q */
            map[KD + h * g->Dk + i] = h * G + g->Dk + i;   /* k */
        }
        for (int64_t i = 0; i < r * g->Dv; i++) {
            map[2 * KD + h * r * g->Dv + i] = h * G + 2 * g->Dk + i;      /* v */
            map[C + h * r * g->Dv + i] = h * G + 2 * g->Dk + r * g->Dv + i; /* z */
        }
    }
    const size_t rb = (size_t)g->D * 2;
    snprintf(name, sizeof name, "%slinear_attn.in_proj_qkv.weight", dst);
    add(c, name, 2, (int64_t[]){ C, g->D }, own(c, pick_rows(qkvz, map, C)), (size_t)C * rb);
    snprintf(name, sizeof name, "%slinear_attn.in_proj_z.weight", dst);
    add(c, name, 2, (int64_t[]){ VD, g->D }, own(c, pick_rows(qkvz, map + C, VD)), (size_t)VD * rb);
    for (int which = 0; which < 2; which++) { /* in_proj_ba rows a key head: b (r), a (r) */
        for (int64_t h = 0; h < g->Hk; h++)
            for (int64_t i = 0; i < r; i++) map[h * r + i] = h * 2 * r + which * r + i;
        snprintf(name, sizeof name, "%slinear_attn.in_proj_%s.weight", dst, which ? "a" : "b");
        add(c, name, 2, (int64_t[]){ g->Hv, g->D }, own(c, pick_rows(ba, map, g->Hv)), (size_t)g->Hv * rb);
    }
    free(map);
}

/* Layer l's experts fused under dst: gate_up_proj [E][gate F; up F][D], down_proj [E][D][F]. */
static void fuse_experts(q35moe_ckpt *c, const lm_safetensors *st, const q3n_geom *g, const char *dst, int l) {
    char name[150];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
    const lm_file_tensor *g0 = lm_safetensors_find(st, name);
    if (!g0) return;
    const int64_t F = g0->shape[0];
    const size_t mb = g0->nbytes;
    uint8_t *gu = own(c, malloc(2 * mb * (size_t)g->E)), *dn = own(c, malloc(mb * (size_t)g->E));
    static const char *const parts[3] = { "gate_proj", "up_proj", "down_proj" };
    for (int64_t x = 0; x < g->E; x++)
        for (int p = 0; p < 3; p++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)x, parts[p]);
            const lm_file_tensor *t = lm_safetensors_find(st, name);
            if (t) memcpy(p == 2 ? dn + (size_t)x * mb : gu + ((size_t)x * 2 + (size_t)p) * mb, t->data, mb);
        }
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", dst);
    add(c, name, 3, (int64_t[]){ g->E, 2 * F, g->D }, gu, 2 * mb * (size_t)g->E);
    snprintf(name, sizeof name, "%smlp.experts.down_proj", dst);
    add(c, name, 3, (int64_t[]){ g->E, g->D, F }, dn, mb * (size_t)g->E);
}

/* An MTP head (mtp.*) as Qwen3.5-MoE ships one: a sparse full-attention
 * layer (the fixture's last layer, experts fused) behind fc [D][2D] and
 * three norms. It is untrained (fc: a fixed pseudo-random pattern); what is
 * tested is that it loads, converts and comes back the same. */
static void add_mtp(q35moe_ckpt *c, const lm_safetensors *st, const q3n_geom *g) {
    char name[150];
    const int last = (int)g->L - 1;
    snprintf(name, sizeof name, "model.layers.%d.", last);
    const size_t pl = strlen(name);
    for (int i = 0; i < st->n_tensors; i++) {
        const lm_file_tensor *s = &st->tensors[i];
        if (strncmp(s->name, name, pl) || strstr(s->name, ".mlp.experts.")) continue;
        char mn[150];
        snprintf(mn, sizeof mn, "mtp.layers.0.%s", s->name + pl);
        hqg_tensor *x = add(c, mn, s->n_dims, s->shape, s->data, s->nbytes);
        x->dtype = s->type == LM_F32 ? "F32" : "BF16";
    }
    fuse_experts(c, st, g, "mtp.layers.0.", last);
    uint16_t *fc = (uint16_t *)own(c, malloc((size_t)(2 * g->D * g->D) * 2));
    for (int64_t i = 0; i < 2 * g->D * g->D; i++) {
        float v = (float)((i * 7919) % 2001 - 1000) * 1e-4f;
        uint32_t u;
        memcpy(&u, &v, 4);
        fc[i] = (uint16_t)(u >> 16);
    }
    add(c, "mtp.fc.weight", 2, (int64_t[]){ g->D, 2 * g->D }, fc, (size_t)(2 * g->D * g->D) * 2);
    uint16_t *zero = (uint16_t *)own(c, calloc((size_t)g->D, 2)); /* (1 + w) norms at w = 0 */
    static const char *const norms[] = { "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                                         "mtp.norm.weight" };
    for (size_t i = 0; i < LM_COUNT(norms); i++) add(c, norms[i], 1, (int64_t[]){ g->D }, zero, (size_t)g->D * 2);
}

int q35_copy_file(const char *src, const char *dst, const char *name) {
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/%s", src, name);
    snprintf(b, sizeof b, "%s/%s", dst, name);
    if (access(a, R_OK)) return 0;
    size_t n;
    char *d = lm_tu_read(a, &n);
    int rc = d ? lm_tu_write(b, d, n) : -1;
    free(d);
    return rc;
}

/* The qwen3-next fixture as a Qwen3.5-MoE checkpoint in <tmp>/<tag>/qwen3.5-moe
 * (text-only, or multimodal: config under text_config, weights under
 * model.language_model., a vision tensor; with an MTP head or without),
 * with the fixture's reference and tokenizer. Returns the folder
 * (malloc'd), or NULL. */
char *make_q35moe(const char *src, const char *tag, bool multimodal, bool mtp) {
    char *root = lm_tu_mkdir(tag), dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/qwen3.5-moe", root);
    free(root);
    if (mkdir(dir, 0755) && errno != EEXIST) return NULL;
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *text = json_load_file(path, 0, NULL);
    if (!text) return NULL;
    const q3n_geom g = { cfg_i(text, "hidden_size"), cfg_i(text, "linear_num_key_heads"),
                         cfg_i(text, "linear_num_value_heads"), cfg_i(text, "linear_key_head_dim"),
                         cfg_i(text, "linear_value_head_dim"), cfg_i(text, "num_experts"),
                         cfg_i(text, "num_hidden_layers") };
    /* Qwen3_5MoeTextConfig has none of these: every layer sparse, top k renormalised */
    static const char *const gone[] = { "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob",
                                        "intermediate_size" };
    for (size_t i = 0; i < LM_COUNT(gone); i++) json_object_del(text, gone[i]);
    json_object_set_new(text, "model_type", json_string("qwen3_5_moe_text"));
    if (mtp) json_object_set_new(text, "mtp_num_hidden_layers", json_integer(1));
    json_t *cfg = text;
    if (multimodal) {
        json_object_del(text, "architectures");
        cfg = json_object();
        json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen3_5MoeForConditionalGeneration"));
        json_object_set_new(cfg, "model_type", json_string("qwen3_5_moe"));
        json_object_set(cfg, "text_config", text);
        json_object_set(cfg, "eos_token_id", json_object_get(text, "eos_token_id"));
        json_object_set(cfg, "pad_token_id", json_object_get(text, "pad_token_id"));
        json_object_set_new(cfg, "tie_word_embeddings", json_false());
        json_object_set_new(cfg, "vision_config", json_pack("{s:i}", "depth", 1));
        json_decref(text);
    } else {
        json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen3_5MoeForCausalLM"));
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);

    lm_err e = { { 0 } };
    lm_safetensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    if (rc || lm_safetensors_open(&st, path, &e)) return NULL;
    q35moe_ckpt c = { calloc(2 * (size_t)st.n_tensors + 8 * (size_t)g.L + 8, sizeof *c.t), 0,
                      calloc(8 * (size_t)g.L + 8, sizeof(uint8_t *)), 0 };
    const char *pfx = multimodal ? "model.language_model.layers." : "model.layers.";
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *s = &st.tensors[i];
        if (strstr(s->name, ".mlp.experts.") || strstr(s->name, "in_proj_qkvz") || strstr(s->name, "in_proj_ba"))
            continue;
        char name[150];
        if (multimodal && !strncmp(s->name, "model.", 6)) snprintf(name, sizeof name, "model.language_model.%s", s->name + 6);
        else snprintf(name, sizeof name, "%s", s->name);
        hqg_tensor *x = add(&c, name, s->n_dims, s->shape, s->data, s->nbytes);
        x->dtype = s->type == LM_F32 ? "F32" : "BF16";
    }
    for (int l = 0; l < g.L; l++) {
        char dst[64];
        snprintf(dst, sizeof dst, "%s%d.", pfx, l);
        split_projections(&c, &st, &g, dst, l);
        fuse_experts(&c, &st, &g, dst, l);
    }
    if (mtp) add_mtp(&c, &st, &g);
    static const uint16_t vis[4] = { 0x3f80, 0x4000, 0x4040, 0x4080 };
    if (multimodal) add(&c, "model.visual.patch_embed.proj.weight", 2, (int64_t[]){ 2, 2 }, vis, sizeof vis);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = hqg_write_safetensors(path, c.t, c.n);
    for (int i = 0; i < c.n_bufs; i++) free(c.bufs[i]);
    free(c.bufs), free(c.t);
    lm_safetensors_close(&st);
    static const char *const side[] = { "reference.safetensors", "tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "chat_template.jinja" };
    for (size_t i = 0; i < LM_COUNT(side); i++) rc |= q35_copy_file(src, dir, side[i]);
    return rc ? NULL : strdup(dir);
}


/* ---- mlx-lm's layout ------------------------------------------------------------ */

/* name's tail after the text model's prefix (model.language_model. or
 * model.), or NULL for a tensor outside it. */
static const char *q35_text_rest(const char *name) {
    if (!strncmp(name, "model.language_model.", 21)) return name + 21;
    if (!strncmp(name, "model.visual.", 13)) return NULL;
    if (!strncmp(name, "model.", 6)) return name + 6;
    return NULL;
}

static bool q35_ends(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int q35_to_mlx(const char *src, const char *dst, bool language_model) {
    const char *pre = language_model ? "language_model.model." : "model.";
    char path[1200];
    lm_err e = { { 0 } };
    lm_safetensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    if (lm_safetensors_open(&st, path, &e)) return -1;
    hqg_tensor *t = calloc(2 * (size_t)st.n_tensors + 1, sizeof *t);
    void **bufs = calloc(2 * (size_t)st.n_tensors + 1, sizeof *bufs);
    int n = 0, nb = 0, rc = 0;
    for (int i = 0; i < st.n_tensors && !rc; i++) {
        const lm_file_tensor *s = &st.tensors[i];
        const char *rest = q35_text_rest(s->name);
        int layer = -1, x = -1, used = 0;
        char kind[8];
        if (!strcmp(s->name, "lm_head.weight")) rest = NULL;
        else if (!rest) continue; /* the vision tower, the MTP head */
        /* experts one tensor each: stacked at expert 0 */
        if (rest && sscanf(rest, "layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", &layer, &x, kind, &used) == 3 &&
            !rest[used]) {
            if (x) continue;
            char nm[200];
            int E = 0;
            for (;; E++) {
                snprintf(nm, sizeof nm, "%.*slayers.%d.mlp.experts.%d.%s_proj.weight", (int)(rest - s->name), s->name,
                         layer, E, kind);
                if (!lm_safetensors_find(&st, nm)) break;
            }
            uint8_t *stack = bufs[nb++] = malloc((size_t)E * s->nbytes);
            for (int k = 0; k < E; k++) {
                snprintf(nm, sizeof nm, "%.*slayers.%d.mlp.experts.%d.%s_proj.weight", (int)(rest - s->name), s->name,
                         layer, k, kind);
                memcpy(stack + (size_t)k * s->nbytes, lm_safetensors_find(&st, nm)->data, s->nbytes);
            }
            hqg_tensor *o = &t[n++];
            snprintf(o->name, sizeof o->name, "%slayers.%d.mlp.switch_mlp.%s_proj.weight", pre, layer, kind);
            o->dtype = "BF16", o->n_dims = 3, o->shape[0] = E, o->shape[1] = s->shape[0], o->shape[2] = s->shape[1];
            o->data = stack, o->nbytes = (size_t)E * s->nbytes;
            continue;
        }
        /* fused experts: gate and up halves, down as it is */
        if (rest && sscanf(rest, "layers.%d.mlp.experts.%n", &layer, &used) == 1 && used > 0 &&
            (!strcmp(rest + used, "gate_up_proj") || !strcmp(rest + used, "down_proj"))) {
            const bool gu = !strcmp(rest + used, "gate_up_proj");
            const int64_t E = s->shape[0], R = gu ? s->shape[1] / 2 : s->shape[1], C = s->shape[2];
            const size_t half = (size_t)(R * C) * 2;
            for (int part = 0; part < (gu ? 2 : 1); part++) {
                uint8_t *m = bufs[nb++] = malloc((size_t)E * half);
                for (int64_t k = 0; k < E; k++)
                    memcpy(m + (size_t)k * half, s->data + (size_t)k * (gu ? 2 : 1) * half + (size_t)part * half, half);
                hqg_tensor *o = &t[n++];
                snprintf(o->name, sizeof o->name, "%slayers.%d.mlp.switch_mlp.%s_proj.weight", pre, layer,
                         gu ? (part ? "up" : "gate") : "down");
                o->dtype = "BF16", o->n_dims = 3, o->shape[0] = E, o->shape[1] = R, o->shape[2] = C;
                o->data = m, o->nbytes = (size_t)E * half;
            }
            continue;
        }
        hqg_tensor *o = &t[n++];
        if (rest) snprintf(o->name, sizeof o->name, "%s%s", pre, rest);
        else snprintf(o->name, sizeof o->name, "%slm_head.weight", language_model ? "language_model." : "");
        o->dtype = s->type == LM_F32 ? "F32" : "BF16";
        o->n_dims = s->n_dims;
        for (int d = 0; d < s->n_dims && d < 3; d++) o->shape[d] = s->shape[d];
        o->data = s->data, o->nbytes = s->nbytes;
        if (rest && (q35_ends(rest, ".input_layernorm.weight") || q35_ends(rest, ".post_attention_layernorm.weight") ||
                     !strcmp(rest, "norm.weight") || q35_ends(rest, ".q_norm.weight") ||
                     q35_ends(rest, ".k_norm.weight"))) { /* stored as 1 + w */
            const int64_t k = lm_file_tensor_numel(s);
            float *v = bufs[nb++] = malloc((size_t)k * sizeof *v);
            lm_dequant_row(s->type, s->data, v, k);
            for (int64_t j = 0; j < k; j++) v[j] += 1.0f;
            o->dtype = "F32", o->data = v, o->nbytes = (size_t)k * sizeof *v;
        }
        if (rest && q35_ends(rest, ".linear_attn.conv1d.weight") && s->n_dims == 3) /* [C][1][K] -> [C][K][1] */
            o->shape[1] = s->shape[2], o->shape[2] = s->shape[1];
    }
    if (mkdir(dst, 0755) && errno != EEXIST) rc = -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if (!rc) rc = hqg_write_safetensors(path, t, n);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(bufs), free(t);
    lm_safetensors_close(&st);
    static const char *const side[] = { "config.json", "reference.safetensors", "tokenizer.json",
                                        "tokenizer_config.json", "generation_config.json", "chat_template.jinja" };
    for (size_t i = 0; i < LM_COUNT(side) && !rc; i++) rc = q35_copy_file(src, dst, side[i]);
    return rc;
}
