/* test_parity_gemma.c - gemma3 and gemma4 against transformers 5.17's logits,
 * and gemma's bad inputs failing with one line that names the file.
 *
 * Fixtures: ../shared/fixtures/models/{gemma3,gemma4} (sliding window 16,
 * prompts of 7, 64 and 300 tokens), on the best ISA and on the scalar path;
 * and two made for lumen in tests/data/gemma (see tools/gemma_fixtures):
 *   gemma3-x  GQA 4:2, Dh 24, window 8, global layers with linear rope
 *             scaling, final_logit_softcapping 1.5 and attn_logit_softcapping
 *             3.0 (which transformers' gemma3 does not apply), D = 96 so
 *             sqrt(D) is not a round number;
 *   gemma4-x  7 layers, the last 3 sharing KV (sliding and full),
 *             attention_k_eq_v with 1 global KV head, double-wide MLP in the
 *             shared layers, global head width 48 with proportional rope,
 *             per-layer inputs of width 8, final_logit_softcapping 2.0;
 * each with its 300-token prompt only (window 8, so most of it is outside
 * every sliding window). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <stdint.h>

#include "base/lm_file.h"
#include "engine/lm_kv_cache.h"
#include "engine/lm_parity.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "test_util.h"

static void shared_parity(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", model);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_tu_parity(lm_t_, dir, isa, threads, 3, NULL);
    free(dir);
}

static void repo_parity(lm_test_ctx *lm_t_, const char *model, lm_cpu_isa isa, int threads) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/gemma/%s", LUMEN_SOURCE_DIR, model);
    lm_tu_parity(lm_t_, dir, isa, threads, 1, NULL);
}

LM_TEST(parity_gemma3) { shared_parity(lm_t_, "gemma3", LM_ISA_AUTO, 2); }
LM_TEST(parity_gemma3_scalar) { shared_parity(lm_t_, "gemma3", LM_ISA_SCALAR, 1); }
LM_TEST(parity_gemma4) { shared_parity(lm_t_, "gemma4", LM_ISA_AUTO, 2); }
LM_TEST(parity_gemma4_scalar) { shared_parity(lm_t_, "gemma4", LM_ISA_SCALAR, 3); }
LM_TEST(parity_gemma3_softcap_linear_rope) { repo_parity(lm_t_, "gemma3-x", LM_ISA_AUTO, 3); }
LM_TEST(parity_gemma4_shared_kv_k_eq_v) { repo_parity(lm_t_, "gemma4-x", LM_ISA_AUTO, 2); }
LM_TEST(parity_gemma4_shared_kv_k_eq_v_scalar) { repo_parity(lm_t_, "gemma4-x", LM_ISA_SCALAR, 1); }

/* ---- bad inputs ----------------------------------------------------------- */

static void expect_error(lm_test_ctx *lm_t_, const char *path, const char *needle1, const char *needle2) {
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, NULL);
    lm_model *m = NULL;
    lm_err e = { { 0 } };
    int rc = lm_model_load(&m, path, be, &e);
    LM_CHECK_MSG(rc == -1 && m == NULL, "loading %s should fail", path);
    LM_CHECK_MSG(strstr(e.msg, needle1) != NULL, "message \"%s\" lacks \"%s\"", e.msg, needle1);
    if (needle2) LM_CHECK_MSG(strstr(e.msg, needle2) != NULL, "message \"%s\" lacks \"%s\"", e.msg, needle2);
    LM_CHECK_MSG(strchr(e.msg, '\n') == NULL, "message is not one line: %s", e.msg);
    lm_model_free(m);
    lm_backend_destroy(be);
}

/* In s (n bytes), replaces the first `from` by `to`, which has the same length. */
static bool patch(char *s, size_t n, const char *from, const char *to) {
    size_t k = strlen(from);
    LM_ASSERT(strlen(to) == k);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, from, k)) {
            memcpy(s + i, to, k);
            return true;
        }
    return false;
}

/* A copy of the repo fixture `model` with `from` replaced by `to` in
 * config.json (cfg) or in model.safetensors' header (!cfg). */
static char *variant(const char *model, const char *tag, bool cfg, const char *from, const char *to) {
    char src[512];
    snprintf(src, sizeof src, "%s/tests/data/gemma/%s", LUMEN_SOURCE_DIR, model);
    char *dir = lm_tu_mkdir(tag);
    const char *files[] = { "config.json", "model.safetensors" };
    for (int i = 0; i < 2; i++) {
        char *p = lm_path_join(src, files[i]), *q = lm_path_join(dir, files[i]);
        size_t n = 0;
        char *d = lm_tu_read(p, &n);
        LM_ASSERT(d);
        if (cfg == (i == 0)) {
            /* configs may differ in spacing: callers pass text as it appears */
            bool ok = patch(d, n, from, to);
            LM_ASSERT(ok);
        }
        lm_tu_write(q, d, n);
        free(d);
        free(p);
        free(q);
    }
    return dir;
}

LM_TEST(gemma_load_missing_tensor) {
    char *dir = variant("gemma4-x", "g4-missing", false, "model.per_layer_projection_norm.weight",
                        "model.per_layer_projectiXn_norm.weight");
    expect_error(lm_t_, dir, "model.safetensors: missing tensor", "model.per_layer_projection_norm.weight");
    free(dir);
    dir = variant("gemma4-x", "g4-missing-k", false, "model.layers.3.self_attn.k_norm.weight",
                  "model.layers.3.self_attn.k_nXrm.weight");
    expect_error(lm_t_, dir, "model.safetensors: missing tensor", "layers.3.self_attn.k_norm.weight");
    free(dir);
    dir = variant("gemma3-x", "g3-missing", false, "model.layers.2.post_feedforward_layernorm.weight",
                  "model.layers.2.post_feedforward_layernorX.weight");
    expect_error(lm_t_, dir, "model.safetensors: missing tensor", "layers.2.post_feedforward_layernorm");
    free(dir);
}

LM_TEST(gemma_load_wrong_shape) {
    /* the sliding layers' head width: q_proj no longer matches */
    char *dir = variant("gemma4-x", "g4-shape", true, "\"head_dim\": 16", "\"head_dim\": 32");
    expect_error(lm_t_, dir, "model.safetensors: tensor \"model.layers.0.self_attn.q_proj.weight\" has shape",
                 "expected [128, 96]");
    free(dir);
    dir = variant("gemma4-x", "g4-ple", true, "\"hidden_size_per_layer_input\": 8",
                  "\"hidden_size_per_layer_input\": 9");
    expect_error(lm_t_, dir, "model.safetensors: tensor \"model.embed_tokens_per_layer.weight\" has shape",
                 "expected [1024, 63]");
    free(dir);
    dir = variant("gemma3-x", "g3-shape", true, "\"intermediate_size\": 160", "\"intermediate_size\": 161");
    expect_error(lm_t_, dir, "model.safetensors: tensor \"model.layers.0.mlp.gate_proj.weight\" has shape",
                 "expected [161, 96]");
    free(dir);
    /* without the double-wide MLP the shared layers' MLP is half as wide */
    dir = variant("gemma4-x", "g4-wide", true, "\"use_double_wide_mlp\": true,", "\"use_double_wide_mlp\":false,");
    expect_error(lm_t_, dir, "tensor \"model.layers.4.mlp.gate_proj.weight\" has shape", "expected [128, 96]");
    free(dir);
}

LM_TEST(gemma_load_bad_config) {
    struct { const char *model, *from, *to, *needle; } cases[] = {
        { "gemma4-x", "\"enable_moe_block\": false", "\"enable_moe_block\": true ", "needs num_experts" },
        { "gemma3-x", "\"use_bidirectional_attention\": false", "\"use_bidirectional_attention\": true ",
          "bidirectional" },
        { "gemma3-x", "\"full_attention\",", "\"fuzz_attention\",", "layer_types[1] is \"fuzz_attention\"" },
        { "gemma4-x", "\"num_kv_shared_layers\": 3", "\"num_kv_shared_layers\": 7", "leaves no layer" },
        { "gemma4-x", "\"num_kv_shared_layers\": 3", "\"num_kv_shared_layers\": 6",
          "no earlier layer is full attention" },
        { "gemma4-x", "\"rope_type\": \"proportional\"", "\"rope_type\": \"dynamicxxxxx\"",
          "unsupported rope type \"dynamicxxxxx\"" },
        { "gemma3-x", "\"hidden_activation\": \"gelu_pytorch_tanh\"", "\"hidden_activation\": \"silu\"             ",
          "gelu" },
        { "gemma4-x", "\"head_dim\": 48,", "\"head_dix\": 48,", "per_layer_config[2].head_dix is not supported" },
        { "gemma4-x", "\"head_dim\": 48,", "\"head_dim\": 32,", "layer 6 shares KV with layer 2 of another head shape" },
    };
    for (size_t i = 0; i < LM_COUNT(cases); i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "gemma-cfg-%zu", i);
        char *dir = variant(cases[i].model, tag, true, cases[i].from, cases[i].to);
        expect_error(lm_t_, dir, "config.json", cases[i].needle);
        free(dir);
    }
}

/* The loaded shapes say what the config meant: gemma4-x's KV cache has the
 * 4 non-shared layers (sliding, sliding, full, sliding), each at its own
 * width, and a token costs the sum over them, in the model's figure, the
 * cache's and the startup line's. */
LM_TEST(gemma_load_kv_layout) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/gemma/gemma4-x", LUMEN_SOURCE_DIR);
    lm_backend *be = lm_tu_model_backend(1, NULL);
    lm_model *m = NULL;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_model_load(&m, dir, be, &e) == 0);
    LM_CHECK(m->n_kv_layers == 4);
    LM_CHECK(m->kv_width == 48); /* sliding: 2 KV heads of 16; global: 1 of 48 */
    const int64_t want_w[4] = { 32, 32, 48, 32 };
    LM_REQUIRE(m->kv_layer_width != NULL);
    for (int l = 0; l < 4; l++) LM_CHECK_MSG(m->kv_layer_width[l] == want_w[l], "layer %d: width %lld", l,
                                             (long long)m->kv_layer_width[l]);
    const size_t per = (32 + 32 + 48 + 32) * 2 * sizeof(float); /* not 4 x the widest layer's 48 */
    LM_CHECK(lm_model_kv_bytes_per_token(m) == per);
    const lm_kv_types f32 = { LM_KV_F32, LM_KV_F32 }, b16 = { LM_KV_BF16, LM_KV_BF16 };
    LM_CHECK(lm_kv_model_bytes_per_token(m, f32, 0) == per);
    LM_CHECK(lm_kv_model_bytes_per_token(m, b16, 0) == per / 2);
    lm_kv_cache *kc = NULL;
    LM_REQUIRE(lm_kv_cache_create_for(&kc, m, b16, 16, 4, 0, 0, &e) == 0);
    LM_CHECK(lm_kv_pool_bytes_per_token(&kc->pool) == per / 2);
    LM_CHECK(lm_kv_block_bytes(kc) == 16 * per / 2);
    for (int l = 0; l < 4; l++) LM_CHECK(lm_kv_layer_width(&kc->pool, l) == want_w[l]);
    lm_kv_cache_free(kc);
    lm_model_free(m);
    lm_backend_destroy(be);
}

/* ---- the same weights in other layouts ----------------------------------- */

/* Copies file name from src to dst. */
static void copy_file(const char *src, const char *dst, const char *name) {
    char *p = lm_path_join(src, name), *q = lm_path_join(dst, name);
    size_t n = 0;
    char *d = lm_tu_read(p, &n);
    LM_ASSERT(d);
    lm_tu_write(q, d, n);
    free(d);
    free(p);
    free(q);
}

/* src/model.safetensors -> dst with every tensor name starting "model."
 * renamed to start with `prefix` instead (the header is rewritten, the data
 * is copied as is: offsets are relative to the data). */
static void rename_tensors(const char *src, const char *dst, const char *prefix) {
    char *p = lm_path_join(src, "model.safetensors"), *q = lm_path_join(dst, "model.safetensors");
    size_t n = 0;
    unsigned char *d = (unsigned char *)lm_tu_read(p, &n);
    LM_ASSERT(d && n >= 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | d[i];
    json_t *h = json_loadb((const char *)d + 8, hl, 0, NULL), *o = json_object();
    LM_ASSERT(h);
    const char *k;
    json_t *v;
    json_object_foreach(h, k, v) {
        char name[256];
        if (!strncmp(k, "model.", 6)) snprintf(name, sizeof name, "%s%s", prefix, k + 6);
        else snprintf(name, sizeof name, "%s", k);
        json_object_set(o, name, v);
    }
    char *js = json_dumps(o, JSON_COMPACT);
    size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
    size_t out_n = 8 + padded + (n - 8 - hl);
    unsigned char *out = malloc(out_n);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(padded >> (8 * i));
    memcpy(out + 8, js, jl);
    memset(out + 8 + jl, ' ', padded - jl);
    memcpy(out + 8 + padded, d + 8 + hl, n - 8 - hl);
    lm_tu_write(q, out, out_n);
    free(out);
    free(js);
    json_decref(o);
    json_decref(h);
    free(d);
    free(p);
    free(q);
}

/* dst/config.json: src's config edited by fn. */
static void edit_config(const char *src, const char *dst, json_t *(*fn)(json_t *)) {
    char *p = lm_path_join(src, "config.json"), *q = lm_path_join(dst, "config.json");
    json_t *c = json_load_file(p, 0, NULL);
    LM_ASSERT(c);
    c = fn(c);
    char *js = json_dumps(c, JSON_INDENT(1));
    lm_tu_write(q, js, strlen(js));
    free(js);
    json_decref(c);
    free(p);
    free(q);
}

/* Gemma3ForConditionalGeneration's config: the text model under text_config. */
static json_t *wrap_multimodal(json_t *text) {
    json_t *c = json_object();
    json_object_set_new(c, "model_type", json_string("gemma3"));
    json_object_set_new(c, "tie_word_embeddings", json_true());
    json_object_set_new(c, "text_config", text);
    return c;
}

/* The transformers 4 spelling: no layer_types, no rope_parameters. */
static json_t *legacy_config(json_t *c) {
    json_object_del(c, "layer_types");
    json_object_del(c, "rope_parameters");
    json_object_set_new(c, "rope_theta", json_real(1e6));
    json_object_set_new(c, "rope_local_base_freq", json_real(1e4));
    json_object_set_new(c, "sliding_window_pattern", json_integer(6));
    return c;
}

/* The gemma3 fixture as a multimodal checkpoint (weights under
 * language_model.model. and model.language_model.) and with a transformers 4
 * config: the same logits. */
LM_TEST(parity_gemma3_other_layouts) {
    char *src = lm_test_fixture_path("models/gemma3");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    struct { const char *tag, *prefix; json_t *(*cfg)(json_t *); } v[] = {
        { "g3-mm-legacy", "language_model.model.", wrap_multimodal },
        { "g3-mm", "model.language_model.", wrap_multimodal },
        { "g3-legacy-cfg", NULL, legacy_config },
    };
    for (size_t i = 0; i < LM_COUNT(v); i++) {
        char *dir = lm_tu_mkdir(v[i].tag);
        if (v[i].prefix) rename_tensors(src, dir, v[i].prefix);
        else copy_file(src, dir, "model.safetensors");
        copy_file(src, dir, "reference.safetensors");
        edit_config(src, dir, v[i].cfg);
        lm_tu_parity(lm_t_, dir, LM_ISA_AUTO, 2, 3, NULL);
        free(dir);
    }
    free(src);
}

/* transformers 5.17's multimodal gemma3 does not soft-cap its logits: the
 * gemma3-x weights behind a multimodal config give logits whose soft-capped
 * values are the text model's. */
LM_TEST(gemma3_multimodal_no_final_softcap) {
    char src[512];
    snprintf(src, sizeof src, "%s/tests/data/gemma/gemma3-x", LUMEN_SOURCE_DIR);
    char *dir = lm_tu_mkdir("g3x-mm");
    rename_tensors(src, dir, "model.language_model.");
    edit_config(src, dir, wrap_multimodal);
    lm_backend *be = lm_tu_model_backend(2, NULL);
    lm_model *text = NULL, *mm = NULL;
    LM_REQUIRE(lm_model_load(&text, src, be, NULL) == 0 && lm_model_load(&mm, dir, be, NULL) == 0);
    enum { T = 20 };
    int32_t ids[T], pos[T], seq[T], rows[T], table[2] = { 0, 1 };
    for (int t = 0; t < T; t++) ids[t] = 5 + 37 * t % 1000, pos[t] = t, seq[t] = 0, rows[t] = t;
    const int32_t *tables[1] = { table };
    lm_batch b = { .n_tokens = T, .tokens = ids, .pos = pos, .seq = seq, .n_seqs = 1, .block_tables = tables,
                   .n_out = T, .out_rows = rows };
    int V = text->cfg.vocab;
    float *a = malloc(sizeof(float) * T * V), *c = malloc(sizeof(float) * T * V);
    lm_model *ms[2] = { text, mm };
    float *outs[2] = { a, c };
    for (int i = 0; i < 2; i++) {
        lm_kv_pool kv = { .n_layers = ms[i]->n_kv_layers, .block_size = 16, .n_blocks = 2,
                          .kv_width = ms[i]->kv_width };
        void *k[8], *vv[8];
        LM_REQUIRE(kv.n_layers <= 8);
        for (int l = 0; l < kv.n_layers; l++) {
            k[l] = be->ops->alloc(be, sizeof(float) * 32 * (size_t)kv.kv_width);
            vv[l] = be->ops->alloc(be, sizeof(float) * 32 * (size_t)kv.kv_width);
        }
        kv.k = k;
        kv.v = vv;
        lm_err e = { { 0 } };
        LM_CHECK_MSG(lm_model_forward(ms[i], &kv, &b, outs[i], &e) == 0, "%s", e.msg);
        for (int l = 0; l < kv.n_layers; l++) {
            be->ops->free(be, k[l]);
            be->ops->free(be, vv[l]);
        }
    }
    double worst = 0, uncapped = 0;
    for (int i = 0; i < T * V; i++) {
        worst = fmax(worst, fabs(1.5 * tanh(c[i] / 1.5) - a[i]));
        uncapped = fmax(uncapped, fabs(c[i]));
    }
    LM_CHECK_MSG(worst <= 1e-5, "capped multimodal logits differ from the text model's by %g", worst);
    LM_CHECK_MSG(uncapped > 1.5, "multimodal logits never exceed the cap (max %g): were they capped?", uncapped);
    free(a);
    free(c);
    lm_model_free(text);
    lm_model_free(mm);
    lm_backend_destroy(be);
    free(dir);
}

/* google/gemma-3-4b-it's config.json (vision_config left out): its
 * text_config names only what differs from Gemma3TextConfig's defaults, so
 * vocab_size, the head counts, the activation and the tied head come from
 * those defaults (without them the load failed: "missing vocab_size"). */
LM_TEST(gemma3_multimodal_config_uses_text_defaults) {
    static const char cfg[] =
        "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"boi_token_index\": 255999,"
        " \"eoi_token_index\": 256000, \"eos_token_id\": [1, 106], \"image_token_index\": 262144,"
        " \"initializer_range\": 0.02, \"mm_tokens_per_image\": 256, \"model_type\": \"gemma3\","
        " \"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": 10240, \"model_type\": \"gemma3_text\","
        "   \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},"
        "   \"sliding_window\": 1024},"
        " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.50.0.dev0\"}";
    lm_model_config c;
    lm_err e = { { 0 } };
    int rc = lm_config_parse_hf(&c, cfg, "gemma-3-4b-it/config.json", &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) return;
    LM_CHECK(!strcmp(c.model_type, "gemma3_text"));
    LM_CHECK(c.vocab == 262208 && c.d_model == 2560 && c.d_ff == 10240 && c.n_layers == 34);
    LM_CHECK(c.n_heads == 8 && c.n_kv_heads == 4 && c.head_dim == 256);
    LM_CHECK(c.act == LM_ACT_GELU_TANH && c.tie_embeddings && c.max_pos == 131072);
    LM_CHECK(c.sliding_window == 1024);
    for (int l = 0; l < c.n_layers; l++) LM_CHECK_MSG(c.layer_sliding[l] == ((l + 1) % 6 != 0), "layer %d", l);
    lm_config_free(&c);
    /* an explicit value still wins over the default */
    lm_model_config d;
    LM_REQUIRE(lm_config_parse_hf(&d, "{\"model_type\": \"gemma3_text\", \"vocab_size\": 1024, \"hidden_act\": \"gelu\"}",
                                  "c.json", &e) == 0);
    LM_CHECK(d.vocab == 1024 && d.act == LM_ACT_GELU && d.n_layers == 26);
    lm_config_free(&d);
}
