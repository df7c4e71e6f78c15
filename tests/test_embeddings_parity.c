/* test_embeddings_parity.c - embeddings through the engine against
 * transformers: every fixture architecture's last-token embedding of prompt0
 * (its hidden state after the final norm, normalised) equals the one from
 * reference.safetensors' prompt0.hidden.{last}; the sentence-transformers
 * folders of tests/data/embed (mean + Normalize, cls unnormalised) pool as
 * their files say. The prompt goes in prefill chunks of 3 tokens, so pooling
 * folds several forwards. Then the engine's side (embeddings batched with
 * generations change neither; the prefix cache is neither read nor filled)
 * and how the pooling is read (sentence-transformers files, GGUF
 * pooling_type, refusals).
 *
 * Tolerance: the largest |lumen - transformers| over the vector's elements.
 * Measured on this machine (bf16 weights, f32 activations, AVX-512): at
 * most 7.3e-7 on the normalised vectors (qwen3-next; 6e-8 to 5e-7 for the
 * others) and 6.6e-7 on the unnormalised cls vector (elements near 1); the
 * bound of 1e-5 leaves a margin of over 10x. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/lm_engine.h"
#include "format/safetensors.h"
#include "lm_test.h"
#include "test_util.h"

#define EMB_TOL_NORMED 1e-5
#define EMB_TOL_RAW 1e-5

typedef struct emb_collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    lm_finish finish;
    float *vec;
    int n;
    int n_generated;
} emb_collect;

static void on_embed(void *user, const lm_token_event *ev) {
    emb_collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->done) {
        c->done = true;
        c->finish = ev->finish;
        c->n_generated = ev->n_generated;
        if (ev->embedding) {
            c->vec = malloc((size_t)ev->n_embedding * sizeof(float));
            memcpy(c->vec, ev->embedding, (size_t)ev->n_embedding * sizeof(float));
            c->n = ev->n_embedding;
        }
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* The pooled vector of ids (malloc'd, *n its width), or NULL. */
static float *embed_ids(lm_engine *en, const int32_t *ids, int n_ids, int *n) {
    emb_collect c = { .done = false };
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    lm_request *r = NULL;
    lm_err e = { { 0 } };
    if (lm_engine_submit_embed(en, ids, n_ids, on_embed, &c, &r, &e) != LM_ENGINE_OK) {
        fprintf(stderr, "  submit: %s\n", e.msg);
        return NULL;
    }
    pthread_mutex_lock(&c.mu);
    while (!c.done) pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    lm_request_release(r);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    *n = c.n;
    if (c.finish != LM_FINISH_STOP || c.n_generated != 0) {
        free(c.vec);
        return NULL;
    }
    return c.vec;
}

/* transformers' embedding of prompt0 from the reference: the last
 * prompt0.hidden.{l} (after the final norm) pooled by mode over its T rows. */
static bool ref_embedding(const lm_safetensors *ref, lm_pool_mode mode, bool normalize, float *out, int D) {
    const lm_file_tensor *last = NULL;
    char name[64];
    for (int l = 0;; l++) {
        snprintf(name, sizeof name, "prompt0.hidden.%d", l);
        const lm_file_tensor *t = lm_safetensors_find(ref, name);
        if (!t) break;
        last = t;
    }
    if (!last || last->n_dims != 2 || last->shape[1] != D) return false;
    const int T = (int)last->shape[0];
    const float *h = (const float *)last->data;
    double acc[4096] = { 0 };
    if (D > 4096) return false;
    int r0 = mode == LM_POOL_LAST ? T - 1 : 0, r1 = mode == LM_POOL_MEAN ? T : r0 + 1;
    for (int r = r0; r < r1; r++)
        for (int i = 0; i < D; i++) acc[i] += h[(size_t)r * D + i];
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (acc[i] / (r1 - r0)) * (acc[i] / (r1 - r0));
    for (int i = 0; i < D; i++) out[i] = (float)(acc[i] / (r1 - r0) / (normalize ? sqrt(ss) : 1.0));
    return true;
}

/* Embeds prompt0 of the model in dir (pooling as its files say) and compares
 * it with the reference of ref_dir pooled by mode; returns max |diff|. */
static double embed_vs_ref(lm_test_ctx *lm_t_, const char *dir, const char *ref_dir, lm_pool_mode mode,
                           bool normalize) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", ref_dir);
    lm_err e = { { 0 } };
    lm_safetensors ref = { 0 };
    if (lm_safetensors_open(&ref, path, &e)) {
        LM_CHECK_MSG(false, "%s", e.msg);
        return -1;
    }
    const lm_file_tensor *ids = lm_safetensors_find(&ref, "prompt0.ids");
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_model *m = NULL;
    double worst = -1;
    if (ids && be && lm_model_load(&m, dir, be, &e) == 0) {
        LM_CHECK(m->pooling.mode == mode && m->pooling.normalize == normalize);
        lm_engine *en = NULL;
        lm_engine_opts o = { .ctx = 64, .parallel = 2, .step_tokens = 3 };
        LM_CHECK_MSG(lm_engine_create(&en, m, &o, &e) == 0, "%s", e.msg);
        int n = 0;
        float *v = en ? embed_ids(en, (const int32_t *)ids->data, (int)ids->shape[0], &n) : NULL;
        float *want = calloc((size_t)m->cfg.d_model, sizeof *want);
        LM_CHECK(v && n == m->cfg.d_model);
        LM_CHECK(ref_embedding(&ref, mode, normalize, want, m->cfg.d_model));
        if (v && n == m->cfg.d_model) {
            worst = 0;
            for (int i = 0; i < n; i++) worst = fmax(worst, fabs((double)v[i] - want[i]));
        }
        free(v);
        free(want);
        lm_engine_free(en);
    } else {
        LM_CHECK_MSG(false, "%s: %s", dir, ids ? e.msg : "no prompt0.ids");
    }
    lm_model_free(m);
    lm_backend_destroy(be);
    lm_safetensors_close(&ref);
    return worst;
}

static void parity_fixture(lm_test_ctx *lm_t_, const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    double d = embed_vs_ref(lm_t_, dir, dir, LM_POOL_LAST, true);
    fprintf(stderr, "  %s: last-token embedding max |diff| %.3g (bound %g)\n", name, d, EMB_TOL_NORMED);
    LM_CHECK(d >= 0 && d <= EMB_TOL_NORMED);
    free(dir);
}

LM_TEST(embed_parity_llama) { parity_fixture(lm_t_, "llama"); }
LM_TEST(embed_parity_llama3_rope_mqa) { parity_fixture(lm_t_, "llama3-rope-mqa"); }
LM_TEST(embed_parity_qwen3) { parity_fixture(lm_t_, "qwen3"); }
LM_TEST(embed_parity_qwen3_moe) { parity_fixture(lm_t_, "qwen3-moe"); }
LM_TEST(embed_parity_qwen3_next) { parity_fixture(lm_t_, "qwen3-next"); }
LM_TEST(embed_parity_qwen35) { parity_fixture(lm_t_, "qwen3.5"); }
LM_TEST(embed_parity_gemma3) { parity_fixture(lm_t_, "gemma3"); }
LM_TEST(embed_parity_gemma4) { parity_fixture(lm_t_, "gemma4"); }

/* A folder of tests/data/embed/NAME's sentence-transformers files with the
 * shared fixture's model files linked beside them (malloc'd path). */
static char *st_folder(const char *name, const char *fixture) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", fixture);
    char *src = lm_test_fixture_path(rel);
    if (!src) return NULL;
    char *dir = lm_tu_mkdir(name);
    char a[1024], b[1024];
    static const char *const k_link[] = { "config.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json", "generation_config.json" };
    for (size_t i = 0; i < sizeof k_link / sizeof *k_link; i++) {
        snprintf(a, sizeof a, "%s/%s", src, k_link[i]);
        snprintf(b, sizeof b, "%s/%s", dir, k_link[i]);
        unlink(b);
        if (symlink(a, b)) return free(src), free(dir), NULL;
    }
    static const char *const k_copy[] = { "modules.json", "1_Pooling/config.json" };
    snprintf(b, sizeof b, "%s/1_Pooling", dir);
    mkdir(b, 0755);
    for (size_t i = 0; i < sizeof k_copy / sizeof *k_copy; i++) {
        snprintf(a, sizeof a, "%s/tests/data/embed/%s/%s", LUMEN_SOURCE_DIR, name, k_copy[i]);
        snprintf(b, sizeof b, "%s/%s", dir, k_copy[i]);
        size_t n = 0;
        char *text = lm_tu_read(a, &n);
        if (!text || lm_tu_write(b, text, n)) return free(text), free(src), free(dir), NULL;
        free(text);
    }
    free(src);
    return dir;
}

LM_TEST(embed_parity_mean_normalize) {
    char *src = lm_test_fixture_path("models/qwen3");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = st_folder("qwen3-mean", "qwen3");
    LM_REQUIRE(dir);
    double d = embed_vs_ref(lm_t_, dir, src, LM_POOL_MEAN, true);
    fprintf(stderr, "  mean + Normalize max |diff| %.3g (bound %g)\n", d, EMB_TOL_NORMED);
    LM_CHECK(d >= 0 && d <= EMB_TOL_NORMED);
    free(dir);
    free(src);
}

LM_TEST(embed_parity_cls_raw) {
    char *src = lm_test_fixture_path("models/llama");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = st_folder("llama-cls", "llama");
    LM_REQUIRE(dir);
    double d = embed_vs_ref(lm_t_, dir, src, LM_POOL_CLS, false);
    fprintf(stderr, "  cls (not normalised) max |diff| %.3g (bound %g)\n", d, EMB_TOL_RAW);
    LM_CHECK(d >= 0 && d <= EMB_TOL_RAW);
    free(dir);
    free(src);
}

/* ---- the engine: batching and the prefix cache ---- */

typedef struct emb_fixture {
    lm_backend *be;
    lm_model *m;
    int32_t ids[300];
    int n_ids;
} emb_fixture;

static bool emb_fixture_open(emb_fixture *f, const char *name) {
    memset(f, 0, sizeof *f);
    char rel[160];
    snprintf(rel, sizeof rel, "models/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) return false;
    snprintf(rel, sizeof rel, "models/%s/reference.safetensors", name);
    char *refp = lm_test_fixture_path(rel);
    lm_safetensors ref = { 0 };
    f->be = lm_tu_model_backend(2, NULL);
    bool ok = refp && f->be && lm_model_load(&f->m, dir, f->be, NULL) == 0 && lm_safetensors_open(&ref, refp, NULL) == 0;
    const lm_file_tensor *t = ok ? lm_safetensors_find(&ref, "prompt2.ids") : NULL;
    if (t) {
        f->n_ids = (int)LM_MIN(t->shape[0], 300);
        memcpy(f->ids, t->data, (size_t)f->n_ids * sizeof(int32_t));
    }
    if (ref.tensors) lm_safetensors_close(&ref);
    free(dir);
    free(refp);
    return ok && f->n_ids >= 100;
}

static void emb_fixture_close(emb_fixture *f) {
    lm_model_free(f->m);
    lm_backend_destroy(f->be);
}

/* Embedding requests batched with running generations change neither: the
 * generations give their solo greedy tokens, the vectors equal those taken
 * alone. Runs on a hybrid too (recurrent state slots for embeddings). */
static void batched_with_generation(lm_test_ctx *lm_t_, const char *name) {
    emb_fixture f;
    if (!emb_fixture_open(&f, name)) {
        emb_fixture_close(&f);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    enum { GEN = 12, NE = 3 };
    int32_t solo[2][GEN];
    const int glen[2] = { 9, 40 }, elen[NE] = { 100, 7, 33 };
    for (int i = 0; i < 2; i++) LM_REQUIRE(lm_tu_greedy_alone(f.m, f.ids + 20 * i, glen[i], GEN, solo[i]) == 0);
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 256, .parallel = 4, .step_tokens = 24, .cache_ram = 8u << 20 };
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    float *alone[NE];
    int D = 0;
    for (int k = 0; k < NE; k++) alone[k] = embed_ids(en, f.ids + k, elen[k], &D);
    lm_tu_collect g[2];
    lm_request *gr[2];
    lm_gen_params p = { .max_tokens = GEN, .repetition_penalty = 1 };
    p.sampling.top_p = 1;
    for (int i = 0; i < 2; i++) {
        lm_tu_collect_init(&g[i]);
        LM_REQUIRE(lm_engine_submit(en, f.ids + 20 * i, glen[i], &p, lm_tu_collect_on_token, &g[i], &gr[i], &e) ==
                   LM_ENGINE_OK);
    }
    for (int k = 0; k < NE; k++) { /* while the generations run */
        int n = 0;
        float *v = embed_ids(en, f.ids + k, elen[k], &n);
        LM_REQUIRE(v && alone[k] && n == D);
        double worst = 0;
        for (int i = 0; i < n; i++) worst = fmax(worst, fabs((double)v[i] - alone[k][i]));
        LM_CHECK_MSG(worst <= 1e-6, "embedding %d batched vs alone: %g", k, worst);
        free(v);
        free(alone[k]);
    }
    for (int i = 0; i < 2; i++) {
        lm_tu_collect_wait(&g[i]);
        LM_CHECK(g[i].n == GEN && memcmp(g[i].toks, solo[i], sizeof solo[i]) == 0);
        lm_request_release(gr[i]);
        lm_tu_collect_destroy(&g[i]);
    }
    lm_engine_free(en);
    emb_fixture_close(&f);
}

LM_TEST(embed_engine_batched_qwen3) { batched_with_generation(lm_t_, "qwen3"); }
LM_TEST(embed_engine_batched_qwen35) { batched_with_generation(lm_t_, "qwen3.5"); }

/* An embedding neither reads nor fills the prefix cache: after one, nothing
 * is cached and a generation of the same prompt hits nothing; after that
 * generation has cached it, the embedding is the same as before. */
LM_TEST(embed_engine_prefix_cache) {
    emb_fixture f;
    if (!emb_fixture_open(&f, "qwen3")) {
        emb_fixture_close(&f);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    lm_engine *en = NULL;
    lm_err e = { { 0 } };
    lm_engine_opts o = { .ctx = 256, .parallel = 2, .step_tokens = 32, .cache_ram = 8u << 20 };
    LM_REQUIRE(lm_engine_create(&en, f.m, &o, &e) == 0);
    int D = 0, D2 = 0;
    float *v1 = embed_ids(en, f.ids, 64, &D);
    LM_REQUIRE(v1);
    lm_engine_stats st;
    lm_engine_get_stats(en, &st);
    LM_CHECK(st.cache_blocks == 0 && st.cache_lookup_tokens == 0);
    lm_gen_params p = { .max_tokens = 2, .repetition_penalty = 1 };
    p.sampling.top_p = 1;
    for (int round = 0; round < 2; round++) { /* the second round's prompt is cached by the first */
        lm_tu_collect g;
        lm_tu_collect_init(&g);
        lm_request *r = NULL;
        LM_REQUIRE(lm_engine_submit(en, f.ids, 64, &p, lm_tu_collect_on_token, &g, &r, &e) == LM_ENGINE_OK);
        lm_tu_collect_wait(&g);
        LM_CHECK_MSG(round == 0 ? g.n_cached == 0 : g.n_cached >= 48, "round %d: %d cached", round, g.n_cached);
        lm_request_release(r);
        lm_tu_collect_destroy(&g);
    }
    lm_engine_get_stats(en, &st);
    uint64_t hits = st.cache_hit_tokens;
    float *v2 = embed_ids(en, f.ids, 64, &D2);
    LM_REQUIRE(v2 && D2 == D);
    LM_CHECK(memcmp(v1, v2, (size_t)D * sizeof(float)) == 0);
    lm_engine_get_stats(en, &st);
    LM_CHECK(st.cache_hit_tokens == hits);
    free(v1);
    free(v2);
    lm_engine_free(en);
    emb_fixture_close(&f);
}

/* ---- reading the pooling ---- */

static void write_file(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    lm_tu_write(p, text, strlen(text));
}

LM_TEST(embed_pooling_config) {
    char *dir = lm_tu_mkdir("pooling-config");
    LM_REQUIRE(dir);
    lm_pooling p;
    lm_pooling_read_hf(&p, dir); /* no sentence-transformers files: the default */
    LM_CHECK(p.mode == LM_POOL_LAST && p.normalize && lm_streq(p.source, "default"));
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/P", dir);
    mkdir(sub, 0755);
    write_file(dir, "modules.json",
               "[{\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
               "{\"path\":\"P\",\"type\":\"sentence_transformers.models.Pooling\"},"
               "{\"path\":\"N\",\"type\":\"sentence_transformers.models.Normalize\"}]");
    write_file(dir, "P/config.json", "{\"pooling_mode_cls_token\":true}");
    lm_pooling_read_hf(&p, dir);
    LM_CHECK(p.mode == LM_POOL_CLS && p.normalize && lm_streq(p.source, "sentence-transformers"));
    write_file(dir, "P/config.json", "{\"pooling_mode_max_tokens\":true}"); /* not done: refused, saying so */
    lm_pooling_read_hf(&p, dir);
    LM_CHECK(p.mode == LM_POOL_NONE && strstr(p.source, "pooling"));
    write_file(dir, "P/config.json", "{\"pooling_mode_mean_tokens\":true,\"pooling_mode_lasttoken\":true}");
    lm_pooling_read_hf(&p, dir);
    LM_CHECK(p.mode == LM_POOL_NONE);
    write_file(dir, "modules.json", "{}");
    lm_pooling_read_hf(&p, dir);
    LM_CHECK(p.mode == LM_POOL_NONE && strstr(p.source, "modules.json"));
    /* GGUF pooling_type, llama.cpp's numbering */
    static const struct { bool has; int64_t type; lm_pool_mode mode; } k_gguf[] = {
        { false, 0, LM_POOL_LAST }, { true, 0, LM_POOL_LAST }, { true, 1, LM_POOL_MEAN },
        { true, 2, LM_POOL_CLS },   { true, 3, LM_POOL_LAST }, { true, 4, LM_POOL_NONE },
    };
    for (size_t i = 0; i < sizeof k_gguf / sizeof *k_gguf; i++) {
        lm_pooling_from_gguf(&p, k_gguf[i].has, k_gguf[i].type);
        LM_CHECK_MSG(p.mode == k_gguf[i].mode && (p.mode == LM_POOL_NONE || p.normalize), "type %lld",
                     (long long)k_gguf[i].type);
    }
    /* the span pooling reads */
    int first, count;
    lm_pooling_span(&(lm_pooling){ .mode = LM_POOL_LAST }, 7, &first, &count);
    LM_CHECK(first == 6 && count == 1);
    lm_pooling_span(&(lm_pooling){ .mode = LM_POOL_MEAN }, 7, &first, &count);
    LM_CHECK(first == 0 && count == 7);
    lm_pooling_span(&(lm_pooling){ .mode = LM_POOL_CLS }, 7, &first, &count);
    LM_CHECK(first == 0 && count == 1);
    free(dir);
}

/* A GGUF model (no pooling_type in llama.cpp's llama converter output)
 * embeds with the default, and an engine refuses embeddings of a model
 * whose pooling is LM_POOL_NONE, saying why. */
LM_TEST(embed_gguf_default_and_refusal) {
    char *path = lm_test_fixture_path("models/llama-2-tiny-random.gguf");
    if (!path) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_backend *be = lm_tu_model_backend(2, &e);
    lm_model *m = NULL;
    LM_REQUIRE(be && lm_model_load(&m, path, be, &e) == 0);
    LM_CHECK(m->pooling.mode == LM_POOL_LAST && m->pooling.normalize);
    lm_engine *en = NULL;
    LM_REQUIRE(lm_engine_create(&en, m, &(lm_engine_opts){ .ctx = 64, .parallel = 1 }, &e) == 0);
    const int32_t ids[] = { 1, 450, 7483, 310 };
    int n = 0;
    float *v = embed_ids(en, ids, 4, &n);
    LM_CHECK(v && n == m->cfg.d_model);
    double ss = 0;
    for (int i = 0; v && i < n; i++) ss += (double)v[i] * v[i];
    LM_CHECK_NEAR(ss, 1.0, 1e-5);
    free(v);
    m->pooling.mode = LM_POOL_NONE;
    snprintf(m->pooling.source, sizeof m->pooling.source, "test reason");
    lm_request *r = NULL;
    LM_CHECK(lm_engine_submit_embed(en, ids, 4, on_embed, NULL, &r, &e) == LM_ENGINE_ERROR && strstr(e.msg, "test reason"));
    lm_engine_free(en);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(path);
}
