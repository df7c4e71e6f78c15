/* test_gemma4_moe.c - Gemma 4's mixture-of-experts block (26B-A4B's layers:
 * a router and GeGLU experts beside the dense MLP), from a GGUF against
 * llama.cpp and from a Hugging Face folder against the same GGUF.
 *
 * No Gemma 4 MoE fixture with transformers' logits exists yet (they are
 * made on the GPU machine), so the reference is llama.cpp, an independent
 * implementation: the gemma4 fixture GGUF (tests/data/gguf/gemma4, llama.cpp's
 * conversion of ../shared/fixtures/models/gemma4) widened to F32 (so that
 * llama.cpp computes in f32 too) with a MoE block added to every layer from
 * a fixed pseudo-random stream, in llama.cpp's tensor names
 * (ffn_gate_inp.weight / .scale, ffn_gate_up_exps, ffn_down_exps / .scale,
 * pre_ffw_norm_2, post_ffw_norm_1 / _2). The same values under the Hugging
 * Face names (router.proj / scale / per_expert_scale, experts.gate_up_proj /
 * down_proj, pre_feedforward_layernorm_2, post_feedforward_layernorm_1 / _2)
 * added to the fixture folder must give the GGUF's logits: that checks the
 * folder's layout against llama.cpp's reading of the converter's names. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "convert/lm_convert.h"
#include "convert_check.h"
#include "engine/lm_parity_oracle.h"
#include "engine/lm_runner.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/safetensors.h"
#include "hf_quant_gen.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "q35moe_gen.h"
#include "quant/lm_quant.h"
#include "test_util.h"

#define G4_E 8  /* experts */
#define G4_K 2  /* top k */
#define G4_I 32 /* expert FFN width */

/* One layer's MoE block, f32: router [E][D], router scale [D], expert scale
 * [E], three norms [D], gate_up [E][2I][D] (gate rows first), down [E][D][I]. */
typedef struct g4_moe {
    float *router, *rscale, *escale, *pre2, *post1, *post2, *gate_up, *down;
} g4_moe;

static uint64_t g4_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* Uniform in [c - r, c + r): u is exact in float, r * u exact in double,
 * so the one rounding gives the same bits with or without FMA contraction
 * (the recorded answer below pins the file's hash). */
static void g4_fill(float *x, size_t n, float c, float r, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        const float u = (float)(g4_next(s) >> 40) / (float)(1 << 23) - 1.0f;
        x[i] = (float)((double)c + (double)r * (double)u);
    }
}

/* Layer l's block: the router wide enough that each token's top 2 stand
 * clear (no near-tie for two implementations to break differently). */
static g4_moe g4_make(int64_t D, int l) {
    uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)(l + 1) * 0x100000001B3ull;
    g4_moe m;
    m.router = malloc((size_t)(G4_E * D) * sizeof(float));
    m.rscale = malloc((size_t)D * sizeof(float));
    m.escale = malloc(G4_E * sizeof(float));
    m.pre2 = malloc((size_t)D * sizeof(float));
    m.post1 = malloc((size_t)D * sizeof(float));
    m.post2 = malloc((size_t)D * sizeof(float));
    m.gate_up = malloc((size_t)(G4_E * 2 * G4_I * D) * sizeof(float));
    m.down = malloc((size_t)(G4_E * D * G4_I) * sizeof(float));
    g4_fill(m.router, (size_t)(G4_E * D), 0.0f, 0.5f, &s);
    g4_fill(m.rscale, (size_t)D, 1.0f, 0.3f, &s);
    g4_fill(m.escale, G4_E, 1.0f, 0.4f, &s);
    g4_fill(m.pre2, (size_t)D, 1.0f, 0.2f, &s);
    g4_fill(m.post1, (size_t)D, 1.0f, 0.2f, &s);
    g4_fill(m.post2, (size_t)D, 1.0f, 0.2f, &s);
    g4_fill(m.gate_up, (size_t)(G4_E * 2 * G4_I * D), 0.0f, 0.15f, &s);
    g4_fill(m.down, (size_t)(G4_E * D * G4_I), 0.0f, 0.15f, &s);
    return m;
}

static void g4_free(g4_moe *m) {
    free(m->router), free(m->rscale), free(m->escale), free(m->pre2), free(m->post1), free(m->post2);
    free(m->gate_up), free(m->down);
}

/* A tensor to write: its name, shape (outermost first) and f32 data. */
typedef struct g4_t {
    char name[96];
    int nd;
    int64_t shape[3];
    float *data; /* owned */
} g4_t;

static g4_t *g4_add(g4_t *ts, int *n, const char *name, int nd, const int64_t *shape, const float *src) {
    g4_t *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    size_t numel = 1;
    for (int d = 0; d < nd; d++) numel *= (size_t)(t->shape[d] = shape[d]);
    t->data = malloc(numel * sizeof(float));
    if (src) memcpy(t->data, src, numel * sizeof(float));
    return t;
}

static size_t g4_numel(const g4_t *t) {
    size_t n = 1;
    for (int d = 0; d < t->nd; d++) n *= (size_t)t->shape[d];
    return n;
}

/* The gemma4 fixture GGUF with every tensor as F32 and a MoE block in every
 * layer, its experts as one ffn_gate_up_exps (fused) or as ffn_gate_exps and
 * ffn_up_exps. Written to out; 0 on success. */
static int g4_write_gguf(const char *src, const char *out, bool fused, lm_err *e) {
    lm_gguf g = { 0 };
    if (lm_gguf_open(&g, src, e)) return -1;
    int64_t D = 0, L = 0;
    lm_gguf_get_int(&g, "gemma4.embedding_length", &D);
    lm_gguf_get_int(&g, "gemma4.block_count", &L);
    lm_gguf_writer *w = lm_gguf_writer_create(g.alignment);
    int rc = 0;
    for (int i = 0; rc == 0 && i < g.n_kv; i++) rc = lm_gguf_copy_kv(w, &g.kv[i], e);
    lm_gguf_set_int(w, "gemma4.expert_count", LM_GGUF_U32, G4_E);
    lm_gguf_set_int(w, "gemma4.expert_used_count", LM_GGUF_U32, G4_K);
    lm_gguf_set_int(w, "gemma4.expert_feed_forward_length", LM_GGUF_U32, G4_I);
    g4_t *ts = calloc((size_t)g.n_tensors + 10 * (size_t)L, sizeof *ts);
    int n = 0;
    for (int i = 0; rc == 0 && i < g.n_tensors; i++) {
        const lm_file_tensor *t = &g.tensors[i];
        g4_t *o = g4_add(ts, &n, t->name, t->n_dims, t->shape, NULL);
        const size_t numel = g4_numel(o);
        lm_dequant_row(t->type, t->data, o->data, (int64_t)numel);
    }
    for (int l = 0; rc == 0 && l < L; l++) {
        g4_moe m = g4_make(D, l);
        char nm[96];
#define G4_ADD(suffix, nd, shape, data) \
    (snprintf(nm, sizeof nm, "blk.%d." suffix, l), g4_add(ts, &n, nm, nd, shape, data))
        G4_ADD("ffn_gate_inp.weight", 2, ((int64_t[]){ G4_E, D }), m.router);
        G4_ADD("ffn_gate_inp.scale", 1, ((int64_t[]){ D }), m.rscale);
        G4_ADD("ffn_down_exps.scale", 1, ((int64_t[]){ G4_E }), m.escale);
        G4_ADD("pre_ffw_norm_2.weight", 1, ((int64_t[]){ D }), m.pre2);
        G4_ADD("post_ffw_norm_1.weight", 1, ((int64_t[]){ D }), m.post1);
        G4_ADD("post_ffw_norm_2.weight", 1, ((int64_t[]){ D }), m.post2);
        G4_ADD("ffn_down_exps.weight", 3, ((int64_t[]){ G4_E, D, G4_I }), m.down);
        if (fused) {
            G4_ADD("ffn_gate_up_exps.weight", 3, ((int64_t[]){ G4_E, 2 * G4_I, D }), m.gate_up);
        } else {
            g4_t *gt = G4_ADD("ffn_gate_exps.weight", 3, ((int64_t[]){ G4_E, G4_I, D }), NULL);
            g4_t *ut = G4_ADD("ffn_up_exps.weight", 3, ((int64_t[]){ G4_E, G4_I, D }), NULL);
            const size_t half = (size_t)(G4_I * D);
            for (int x = 0; x < G4_E; x++) {
                memcpy(gt->data + x * half, m.gate_up + (size_t)x * 2 * half, half * sizeof(float));
                memcpy(ut->data + x * half, m.gate_up + (size_t)x * 2 * half + half, half * sizeof(float));
            }
        }
#undef G4_ADD
        g4_free(&m);
    }
    for (int i = 0; rc == 0 && i < n; i++) rc = lm_gguf_add_tensor(w, ts[i].name, LM_F32, ts[i].nd, ts[i].shape, e);
    if (rc == 0) rc = lm_gguf_writer_begin(w, out, e);
    for (int i = 0; rc == 0 && i < n; i++) rc = lm_gguf_writer_put(w, ts[i].data, g4_numel(&ts[i]) * sizeof(float), e);
    if (rc == 0) rc = lm_gguf_writer_finish(w, e);
    for (int i = 0; i < n; i++) free(ts[i].data);
    free(ts);
    lm_gguf_writer_free(w);
    lm_gguf_close(&g);
    return rc;
}

/* The gemma4 fixture folder with the same MoE block under Hugging Face's
 * names and enable_moe_block in its config, in <tmp>/<tag>; with mlx, as
 * mlx-lm saves it (mlx-community): under language_model.model., the
 * experts as switch_glu stacks. The folder (malloc'd) or NULL. */
static char *g4_write_folder(const char *src, const char *tag, bool mlx, lm_err *e) {
    char *dir = lm_tu_mkdir(tag), path[1200];
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg) return free(dir), NULL;
    const int64_t D = json_integer_value(json_object_get(cfg, "hidden_size"));
    const int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    json_object_set_new(cfg, "enable_moe_block", json_true());
    json_object_set_new(cfg, "num_experts", json_integer(G4_E));
    json_object_set_new(cfg, "top_k_experts", json_integer(G4_K));
    json_object_set_new(cfg, "moe_intermediate_size", json_integer(G4_I));
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = json_dump_file(cfg, path, JSON_INDENT(2));
    json_decref(cfg);
    lm_safetensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    if (rc || lm_safetensors_open(&st, path, e)) return free(dir), NULL;
    hqg_tensor *t = calloc((size_t)st.n_tensors + 9 * (size_t)L, sizeof *t);
    g4_moe *ms = calloc((size_t)L, sizeof *ms);
    float **halves = calloc(2 * (size_t)L, sizeof *halves);
    int n = 0;
    const char *pre = mlx ? "language_model.model." : "model.";
    for (int i = 0; i < st.n_tensors; i++) {
        const lm_file_tensor *s = &st.tensors[i];
        hqg_tensor *x = &t[n++];
        if (mlx && !strncmp(s->name, "model.", 6)) snprintf(x->name, sizeof x->name, "%s%.100s", pre, s->name + 6);
        else snprintf(x->name, sizeof x->name, "%.150s", s->name);
        x->dtype = s->type == LM_F32 ? "F32" : "BF16";
        x->n_dims = s->n_dims;
        for (int d = 0; d < s->n_dims && d < 3; d++) x->shape[d] = s->shape[d];
        x->data = s->data, x->nbytes = s->nbytes;
    }
    for (int l = 0; l < L; l++) {
        g4_moe *m = &ms[l];
        *m = g4_make(D, l);
        const struct { const char *suffix; int nd; int64_t shape[3]; const float *data; } parts[] = {
            { "router.proj.weight", 2, { G4_E, D }, m->router },
            { "router.scale", 1, { D }, m->rscale },
            { "router.per_expert_scale", 1, { G4_E }, m->escale },
            { "pre_feedforward_layernorm_2.weight", 1, { D }, m->pre2 },
            { "post_feedforward_layernorm_1.weight", 1, { D }, m->post1 },
            { "post_feedforward_layernorm_2.weight", 1, { D }, m->post2 },
            { "experts.gate_up_proj", 3, { G4_E, 2 * G4_I, D }, m->gate_up },
            { "experts.down_proj", 3, { G4_E, D, G4_I }, m->down },
        };
        for (size_t p = 0; p < LM_COUNT(parts); p++) {
            if (mlx && !strncmp(parts[p].suffix, "experts.", 8)) continue; /* as switch_glu stacks below */
            hqg_tensor *x = &t[n++];
            snprintf(x->name, sizeof x->name, "%slayers.%d.%s", pre, l, parts[p].suffix);
            x->dtype = "F32";
            x->n_dims = parts[p].nd;
            size_t numel = 1;
            for (int d = 0; d < parts[p].nd; d++) numel *= (size_t)(x->shape[d] = parts[p].shape[d]);
            x->data = parts[p].data, x->nbytes = numel * sizeof(float);
        }
        if (mlx) { /* switch_glu: gate [E][I][D], up [E][I][D], down [E][D][I] */
            const size_t half = (size_t)(G4_I * D);
            float *g = halves[2 * l] = malloc(G4_E * half * sizeof(float)), *u = halves[2 * l + 1] = malloc(G4_E * half * sizeof(float));
            for (int x = 0; x < G4_E; x++) {
                memcpy(g + x * half, m->gate_up + (size_t)x * 2 * half, half * sizeof(float));
                memcpy(u + x * half, m->gate_up + (size_t)x * 2 * half + half, half * sizeof(float));
            }
            const struct { const char *kind; int64_t r, c; const float *data; } st3[] = {
                { "gate", G4_I, D, g }, { "up", G4_I, D, u }, { "down", D, G4_I, m->down } };
            for (int k = 0; k < 3; k++) {
                hqg_tensor *x = &t[n++];
                snprintf(x->name, sizeof x->name, "%slayers.%d.experts.switch_glu.%s_proj.weight", pre, l, st3[k].kind);
                x->dtype = "F32", x->n_dims = 3, x->shape[0] = G4_E, x->shape[1] = st3[k].r, x->shape[2] = st3[k].c;
                x->data = st3[k].data, x->nbytes = (size_t)(G4_E * st3[k].r * st3[k].c) * sizeof(float);
            }
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = hqg_write_safetensors(path, t, n);
    for (int l = 0; l < L; l++) g4_free(&ms[l]);
    for (int i = 0; i < 2 * L; i++) free(halves[i]);
    free(ms), free(t), free(halves);
    lm_safetensors_close(&st);
    /* the reference's prompt ids (not its logits: the model differs) for the engine test */
    char ref[1200];
    snprintf(path, sizeof path, "%s/reference.safetensors", src);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    size_t nb = 0;
    char *data = lm_tu_read(path, &nb);
    rc |= !data || lm_tu_write(ref, data, nb);
    free(data);
    if (rc) return free(dir), NULL;
    return dir;
}

static const int32_t k_prompt[] = { 2, 334, 17, 12, 305, 44, 280, 903, 59, 377, 39, 201, 14, 90, 612, 31 };

/* The MoE GGUF in the tmpdir (fused or stacked experts), or NULL (skips
 * without the fixture file). */
static char *g4_gguf(lm_test_ctx *lm_t_, bool fused) {
    char src[1024], out[1200];
    snprintf(src, sizeof src, "%s/tests/data/gguf/gemma4/model.bf16.gguf", LUMEN_SOURCE_DIR);
    snprintf(out, sizeof out, "%s/gemma4-moe.%s.f32.gguf", lm_test_tmpdir(), fused ? "fused" : "stacked");
    lm_err e = { { 0 } };
    if (access(out, R_OK) == 0) return strdup(out);
    LM_CHECK_MSG(g4_write_gguf(src, out, fused, &e) == 0, "%s", e.msg);
    return e.msg[0] ? NULL : strdup(out);
}

/* All logits of k_prompt from model path (a folder or a GGUF) into a new array. */
static float *g4_logits(lm_test_ctx *lm_t_, const char *path) {
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_model *m = NULL;
    lm_runner *r = NULL;
    float *lg = NULL;
    const int T = (int)LM_COUNT(k_prompt);
    if (be && lm_model_load(&m, path, be, &e) == 0 && lm_runner_create(&r, m, 64, 64, &e) == 0) {
        LM_CHECK(m->cfg.n_experts == G4_E && m->cfg.n_experts_per_tok == G4_K && m->cfg.moe_d_ff == G4_I);
        lg = malloc((size_t)T * (size_t)m->cfg.vocab * sizeof(float));
        if (lm_runner_eval(r, k_prompt, T, true, lg, &e)) {
            free(lg);
            lg = NULL;
        }
    }
    LM_CHECK_MSG(lg != NULL, "%s: %s", path, e.msg);
    lm_runner_free(r);
    lm_model_free(m);
    if (be) lm_backend_destroy(be);
    return lg;
}

/* llama.cpp's answer on gguf against lumen's (the F32 oracle tolerance);
 * skips without node-llama-cpp. */
static void g4_oracle(lm_test_ctx *lm_t_, const char *gguf) {
    const char *why = lm_tu_llamacpp_missing();
    if (why) LM_SKIP("%s", why);
    char json[1300];
    snprintf(json, sizeof json, "%s.llamacpp.json", gguf);
    char *out = lm_tu_llamacpp_answer(lm_t_, gguf, k_prompt, (int)LM_COUNT(k_prompt), 16);
    int rc = out ? lm_tu_write(json, out, strlen(out)) : -1;
    free(out);
    if (rc) return;
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_source *src = NULL;
    LM_REQUIRE(be && lm_source_open(&src, gguf, &e) == 0);
    lm_oracle_result o;
    rc = lm_parity_oracle_run(src, json, be, 0, 0, &o, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        char *js = lm_oracle_json(gguf, json, be, &o);
        printf("  %s\n", js);
        free(js);
        LM_CHECK_MSG(o.ok, "max |logprob - llama.cpp| %.3g (tol %.3g), KL %.3g (tol %.3g), %d greedy mismatches",
                     o.max_logprob_diff, o.tolerance, o.kl, o.kl_tolerance, o.greedy_mismatch);
        LM_CHECK(o.greedy_steps == 16 && o.greedy_checked >= 8);
    }
    lm_source_unref(src);
    lm_backend_destroy(be);
}

/* lumen on the MoE GGUF against llama.cpp's answer recorded on it
 * (tests/data/gguf/gemma4-moe/F32.llamacpp.json: oracle.mjs, node-llama-cpp
 * 3.21.1, with k_prompt and 16 greedy ids), so that the check runs where
 * node-llama-cpp is not installed. The file must be the one llama.cpp saw:
 * its hash is pinned (a change to the generator or to the fixture GGUF
 * means re-recording the answer with the live test below's command). */
#define G4_XXH64 0x18470337f9471e3dull
LM_TEST(gemma4_moe_gguf_matches_llamacpp_recorded) {
    char *f = g4_gguf(lm_t_, true);
    LM_REQUIRE(f != NULL);
    size_t n = 0;
    char *bytes = lm_tu_read(f, &n);
    LM_REQUIRE(bytes != NULL);
    const unsigned long long h = (unsigned long long)XXH64(bytes, n, 0);
    free(bytes);
    LM_CHECK_MSG(h == G4_XXH64, "%s hashes to 0x%llx, not the recorded file's 0x%llx: re-record the answer", f, h,
                 (unsigned long long)G4_XXH64);
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_source *src = NULL;
    LM_REQUIRE(be && lm_source_open(&src, f, &e) == 0);
    lm_oracle_result o;
    int rc = lm_parity_oracle_run(src, LUMEN_SOURCE_DIR "/tests/data/gguf/gemma4-moe/F32.llamacpp.json", be, 0, 0,
                                  &o, &e);
    LM_CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc == 0) {
        char *js = lm_oracle_json(f, "F32.llamacpp.json", be, &o);
        printf("  %s\n", js);
        free(js);
        LM_CHECK_MSG(o.ok, "max |logprob - llama.cpp| %.3g (tol %.3g), KL %.3g (tol %.3g), %d greedy mismatches",
                     o.max_logprob_diff, o.tolerance, o.kl, o.kl_tolerance, o.greedy_mismatch);
        LM_CHECK(o.greedy_steps == 16 && o.greedy_checked >= 8);
    }
    lm_source_unref(src);
    lm_backend_destroy(be);
    free(f);
}

/* The same against llama.cpp run now (skips without node-llama-cpp). */
LM_TEST(gemma4_moe_gguf_matches_llamacpp) {
    char *f = g4_gguf(lm_t_, true);
    LM_REQUIRE(f != NULL);
    g4_oracle(lm_t_, f);
    free(f);
}

/* Experts as ffn_gate_exps + ffn_up_exps: the same model, bit for bit. */
LM_TEST(gemma4_moe_gguf_stacked_equals_fused) {
    char *f = g4_gguf(lm_t_, true), *s = g4_gguf(lm_t_, false);
    LM_REQUIRE(f && s);
    float *a = g4_logits(lm_t_, f), *b = g4_logits(lm_t_, s);
    if (a && b) LM_CHECK(!memcmp(a, b, LM_COUNT(k_prompt) * 1024 * sizeof(float)));
    free(a), free(b), free(f), free(s);
}

/* The folder under Hugging Face's names gives the GGUF's logits (the
 * fixture's bf16 weights widened either way; kernels on bf16 and f32 rows
 * may round their sums differently) and the same greedy tokens. */
LM_TEST(gemma4_moe_folder_equals_gguf) {
    char *src = lm_test_fixture_path("models/gemma4");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    char *dir = g4_write_folder(src, "gemma4-moe", false, &e), *f = g4_gguf(lm_t_, true);
    LM_CHECK_MSG(dir != NULL, "%s", e.msg);
    LM_REQUIRE(dir && f);
    float *a = g4_logits(lm_t_, dir), *b = g4_logits(lm_t_, f);
    if (a && b) {
        const size_t n = LM_COUNT(k_prompt) * 1024;
        double gap = 0, spread = 0;
        for (size_t i = 0; i < n; i++) {
            gap = fmax(gap, fabs((double)a[i] - b[i]));
            spread = fmax(spread, fabs((double)a[i] - a[0]));
        }
        printf("  folder vs GGUF: max |logit gap| %.3g over %zu logits (their spread %.3g)\n", gap, n, spread);
        LM_CHECK(gap <= 1e-4 && spread > 0.5);
    }
    free(a), free(b), free(dir), free(f), free(src);
}

/* Continuous batching on the MoE model gives each request its solo tokens. */
LM_TEST(gemma4_moe_engine_batch_equals_alone) {
    char *src = lm_test_fixture_path("models/gemma4");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    char *dir = g4_write_folder(src, "gemma4-moe-engine", false, &e);
    LM_CHECK_MSG(dir != NULL, "%s", e.msg);
    if (dir) lm_tu_engine_concurrent_equals_alone(lm_t_, dir, 24, 2, 16);
    free(dir), free(src);
}

/* The same folder as mlx-lm saves it (language_model.model., experts as
 * switch_glu stacks) gives the GGUF's logits too. */
LM_TEST(gemma4_moe_mlx_folder_equals_gguf) {
    char *src = lm_test_fixture_path("models/gemma4");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    char *dir = g4_write_folder(src, "gemma4-moe-mlx", true, &e), *f = g4_gguf(lm_t_, true);
    LM_CHECK_MSG(dir != NULL, "%s", e.msg);
    LM_REQUIRE(dir && f);
    float *a = g4_logits(lm_t_, dir), *b = g4_logits(lm_t_, f);
    if (a && b) {
        double gap = 0;
        for (size_t i = 0; i < LM_COUNT(k_prompt) * 1024; i++) gap = fmax(gap, fabs((double)a[i] - b[i]));
        printf("  mlx-lm layout vs GGUF: max |logit gap| %.3g\n", gap);
        LM_CHECK(gap <= 1e-4); /* 0 on the CPU; 1.4e-5 on an H200 (stacked and fused experts take other kernels) */
    }
    free(a), free(b), free(dir), free(f), free(src);
}

/* lumen convert of the Hugging Face folder writes the GGUF this file
 * builds in llama.cpp's names: every key and every tensor bit for bit (F32:
 * the folder's bf16 and f32 values widened exactly), the experts kept fused
 * as ffn_gate_up_exps [E][2I][D] and ffn_down_exps. Three keys of the
 * generated file are the dense bf16 fixture's (its name, size label and
 * file type), so they are left out of the comparison. */
LM_TEST(gemma4_moe_folder_converts_to_the_gguf) {
    char *src = lm_test_fixture_path("models/gemma4");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    char *dir = g4_write_folder(src, "gemma4-moe-conv", false, &e), *f = g4_gguf(lm_t_, true);
    LM_CHECK_MSG(dir != NULL, "%s", e.msg);
    LM_REQUIRE(dir && f);
    static const char *const side[] = { "tokenizer.json", "tokenizer_config.json", "chat_template.jinja" };
    for (size_t i = 0; i < LM_COUNT(side); i++) /* the generated folder has weights and config only */
        LM_CHECK(q35_copy_file(src, dir, side[i]) == 0);
    char out[1200];
    snprintf(out, sizeof out, "%s/gemma4-moe-converted.f32.gguf", lm_test_tmpdir());
    lm_quantize_report rep;
    static const char *const skip[] = { "general.name", "general.size_label", "general.file_type", NULL };
    if (lm_convert_hf(dir, out, lm_quant_mix_find("F32"), 2, &rep, &e)) LM_CHECK_MSG(0, "%s", e.msg);
    else lm_cc_compare(lm_t_, "gemma4 MoE folder", out, f, 2 * 6, skip);
    free(dir), free(f), free(src);
}

/* One conversion of folder `dir` (mix) decoded on the CPU and the GPU:
 * the prompt, then 24 steps each fed the CPU's greedy token; the largest
 * |logit GPU - CPU| over the 25 positions and the graphs replayed, or -1. */
static double g4_gpu_vs_cpu(lm_test_ctx *lm_t_, const char *dir, const char *mix, const char *tag, lm_backend *cpu,
                            lm_backend *gpu, long *replayed) {
    char out[1200];
    snprintf(out, sizeof out, "%s/%s.%s.gguf", lm_test_tmpdir(), tag, mix);
    lm_quantize_report rep;
    lm_err e = { { 0 } };
    lm_model *mc = NULL, *mg = NULL;
    lm_runner *rc = NULL, *rg = NULL;
    double worst = -1;
    long r0 = 0, c0 = 0, c1 = 0;
    if (lm_convert_hf(dir, out, lm_quant_mix_find(mix), 2, &rep, &e) || lm_model_load(&mc, out, cpu, &e) ||
        lm_model_load(&mg, out, gpu, &e) || lm_runner_create(&rc, mc, 64, 64, &e) ||
        lm_runner_create(&rg, mg, 64, 64, &e)) {
        LM_CHECK_MSG(0, "%s %s: %s", tag, mix, e.msg);
    } else {
        lm_backend_graph_counts(gpu, &r0, &c0);
        const int V = mc->cfg.vocab;
        float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        bool ok = lm_runner_eval(rc, k_prompt, (int)LM_COUNT(k_prompt), false, a, &e) == 0 &&
                  lm_runner_eval(rg, k_prompt, (int)LM_COUNT(k_prompt), false, b, &e) == 0;
        worst = 0;
        for (int step = 0; ok && step <= 24; step++) {
            for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)a[v] - b[v]));
            int32_t tok = lm_argmax(a, V); /* the CPU's choice feeds both */
            if (step < 24)
                ok = lm_runner_eval(rc, &tok, 1, false, a, &e) == 0 && lm_runner_eval(rg, &tok, 1, false, b, &e) == 0;
        }
        LM_CHECK_MSG(ok, "%s %s: %s", tag, mix, e.msg);
        lm_backend_graph_counts(gpu, replayed, &c1);
        *replayed -= r0;
        free(a), free(b);
    }
    lm_runner_free(rc), lm_runner_free(rg);
    lm_model_free(mc), lm_model_free(mg);
    return worst;
}

/* Gemma 4's GELU experts decode on the GPU inside CUDA graphs (the MoE
 * GEMVs fuse GELU as they fuse SiLU; before, every MoE layer read its
 * routing back to the host and no decode step was a graph): the folder
 * converted to BF16 and to Q8_0 (bf16 and quantised experts take different
 * GEMVs), each step's logits within GPU_TOL of the CPU's with exact
 * arithmetic on both (Q8_0: f32 activations), and the GPU replayed graphs.
 * With int8 activations (both backends' default) the Q8_0 model may differ
 * by no more than G4_INT8_TOL; the dense fixture's Q8_0 is printed beside
 * it (the same rounding without experts). Skips without a GPU. */
#define GPU_TOL 2e-3 /* f32 sums in another order over 8 layers */
/* int8 activations rounded differently by each backend: the GPU's 0.757
 * from the CPU's (H200, 2026-12-05), where the CPU's own int8 logits are
 * 1.11 from its exact ones on this model (0.40 on the dense fixture) */
#define G4_INT8_TOL 1.5
LM_TEST(gemma4_moe_cuda_decode_in_graphs) {
    char *src = lm_test_fixture_path("models/gemma4");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_backend *gpu = lm_cuda_backend_create(0, &e);
    if (!gpu) {
        free(src);
        LM_SKIP("no GPU: %s", e.msg);
    }
    char *dir = g4_write_folder(src, "gemma4-moe-gpu", false, &e);
    LM_CHECK_MSG(dir != NULL, "%s", e.msg);
    LM_REQUIRE(dir);
    static const char *const side[] = { "tokenizer.json", "tokenizer_config.json", "chat_template.jinja" };
    for (size_t i = 0; i < LM_COUNT(side); i++) LM_CHECK(q35_copy_file(src, dir, side[i]) == 0);
    lm_backend *cpu = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    LM_REQUIRE(cpu != NULL);
    static const char *const exact[] = { "BF16", "Q8_0" };
    lm_cpu_backend_quant_exact(cpu, true), lm_cuda_backend_quant_exact(gpu, true);
    for (size_t i = 0; i < LM_COUNT(exact); i++) {
        long replayed = 0;
        const double worst = g4_gpu_vs_cpu(lm_t_, dir, exact[i], "gemma4-moe", cpu, gpu, &replayed);
        printf("  %s experts, exact: max |logit GPU - CPU| %.3g over 25 positions; %ld graphs replayed\n", exact[i],
               worst, replayed);
        LM_CHECK(worst >= 0 && worst <= GPU_TOL && replayed >= 10);
    }
    lm_cpu_backend_quant_exact(cpu, false), lm_cuda_backend_quant_exact(gpu, false);
    long replayed = 0, dense_replayed = 0;
    const double moe = g4_gpu_vs_cpu(lm_t_, dir, "Q8_0", "gemma4-moe-int8", cpu, gpu, &replayed);
    const double dense = g4_gpu_vs_cpu(lm_t_, src, "Q8_0", "gemma4-dense-int8", cpu, gpu, &dense_replayed);
    printf("  Q8_0, int8 activations: max |logit GPU - CPU| %.3g with the experts, %.3g the dense fixture\n", moe,
           dense);
    LM_CHECK(moe >= 0 && moe <= G4_INT8_TOL && replayed >= 10);
    lm_backend_destroy(cpu);
    lm_backend_destroy(gpu);
    free(dir), free(src);
}
