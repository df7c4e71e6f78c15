/* test_model_load.c - loading models from folders and GGUF files, and every
 * kind of bad input failing with one clear line that names the file. */
#include <stdlib.h>
#include <string.h>

#include "base/lm_file.h"
#include "engine/lm_runner.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "format/safetensors.h"
#include "test_util.h"

static lm_backend *backend(void) { return lm_cpu_backend_create(1, LM_ISA_AUTO, NULL); }

/* Loads path and expects failure whose message contains both needles. */
static void expect_load_error(lm_test_ctx *lm_t_, const char *path, const char *needle1, const char *needle2) {
    lm_backend *be = backend();
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

/* A folder with the llama fixture's files, config.json replaced by `config`
 * (NULL: the original), model.safetensors by `weights` of n bytes (NULL: original). */
static char *fake_model(const char *tag, const char *config, const void *weights, size_t n) {
    char *src = lm_test_fixture_path("models/llama");
    char *dir = lm_tu_mkdir(tag);
    char *p = lm_path_join(dir, "config.json"), *q = lm_path_join(src, "config.json");
    size_t len;
    char *orig = lm_tu_read(q, &len);
    lm_tu_write(p, config ? config : orig, config ? strlen(config) : len);
    free(orig);
    free(p);
    free(q);
    p = lm_path_join(dir, "model.safetensors");
    q = lm_path_join(src, "model.safetensors");
    char *w = lm_tu_read(q, &len);
    lm_tu_write(p, weights ? weights : w, weights ? n : len);
    free(w);
    free(p);
    free(q);
    free(src);
    return dir;
}

static char *fixture_config(void) {
    char *p = lm_test_fixture_path("models/llama/config.json");
    char *c = p ? lm_tu_read(p, NULL) : NULL;
    free(p);
    return c;
}

/* Replaces the first occurrence of `from` in s with `to` (new string). */
static char *replace(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (!at) return strdup(s);
    size_t n = strlen(s) - strlen(from) + strlen(to) + 1;
    char *r = malloc(n);
    snprintf(r, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return r;
}

/* The llama fixture on a CPU backend; NULL (e says why) when it fails. */
static lm_model *load_llama(const char *dir, lm_backend **be, lm_err *e) {
    lm_model *m = NULL;
    *be = backend();
    return lm_model_load(&m, dir, *be, e) == 0 ? m : NULL;
}

LM_TEST(model_load_llama_fixture) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_backend *be;
    lm_err e = { { 0 } };
    lm_model *m = load_llama(dir, &be, &e);
    LM_REQUIRE(m);
    LM_CHECK(m->cfg.n_layers == 2 && m->cfg.n_heads == 4 && m->cfg.n_kv_heads == 2);
    LM_CHECK(m->cfg.head_dim == 16 && m->cfg.vocab == 1024 && !m->cfg.tie_embeddings);
    LM_CHECK(m->embed.type == LM_BF16);
    /* weights are used in place from the mapping, not copied */
    const lm_file_tensor *t = lm_weights_find(m->weights, "model.embed_tokens.weight", NULL);
    LM_CHECK(t && m->embed.data == (const void *)t->data);
    const lm_file_tensor *h = lm_weights_find(m->weights, "lm_head.weight", NULL);
    LM_CHECK(h && m->lm_head.data == (const void *)h->data);
    /* bytes a decode step reads: every matrix but the embedding table, plus one embedding row */
    LM_CHECK(lm_model_weight_bytes(m) > h->nbytes && lm_model_weight_bytes(m) < h->nbytes + t->nbytes * 2);
    LM_CHECK(m->cfg.n_eos == 1 && m->cfg.eos_ids[0] == 2);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(dir);
}

/* The bytes the CLI weighs against free GPU memory are the loader's: every
 * tensor of the weights it opens, not other .safetensors beside them (the
 * fixture folder holds reference.safetensors; a stray copy counts nothing),
 * and the fit test is the loader's. */
LM_TEST(model_file_tensor_bytes_match_the_loader) {
    char *dir = lm_test_fixture_path("models/llama");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_backend *be;
    lm_err e = { { 0 } };
    lm_model *m = load_llama(dir, &be, &e);
    LM_REQUIRE(m);
    size_t bytes = 0;
    LM_CHECK(lm_model_file_tensor_bytes(dir, &bytes, &e) == 0);
    LM_CHECK_MSG(bytes == lm_weights_bytes(m->weights), "%zu vs the loader's %zu", bytes, lm_weights_bytes(m->weights));
    char *w = lm_path_join(dir, "model.safetensors");
    size_t file_len = 0;
    char *blob = lm_tu_read(w, &file_len);
    LM_CHECK(bytes > 0 && bytes < file_len); /* the file adds its header */
    /* a copy of the weights beside them changes nothing */
    char *copy = fake_model("tensorbytes", NULL, NULL, 0), *stray = lm_path_join(copy, "consolidated.safetensors");
    lm_tu_write(stray, blob, file_len);
    size_t b2 = 0;
    LM_CHECK(lm_model_file_tensor_bytes(copy, &b2, &e) == 0 && b2 == bytes);
    LM_CHECK(lm_model_file_tensor_bytes("/nonexistent/model-dir", &b2, &e) == -1 && b2 == 0);
    LM_CHECK(lm_model_fits(95, 100) && !lm_model_fits(96, 100) && lm_model_fits(0, 0));
    free(stray), free(copy), free(blob), free(w);
    lm_model_free(m);
    lm_backend_destroy(be);
    free(dir);
}

LM_TEST(model_load_missing_path) {
    expect_load_error(lm_t_, "/nonexistent/model-dir", "/nonexistent/model-dir", "no such file");
}

LM_TEST(model_load_not_a_model) {
    char *dir = lm_tu_mkdir("notmodel");
    char *p = lm_path_join(dir, "x.bin");
    lm_tu_write(p, "hello", 5);
    expect_load_error(lm_t_, p, p, "not a model folder or a GGUF file");
    expect_load_error(lm_t_, dir, "config.json", "cannot open");
    free(p);
    free(dir);
}

LM_TEST(model_load_unknown_architecture) {
    char *cfg = fixture_config();
    if (!cfg) LM_SKIP("%s", lm_test_fixtures_why());
    char *bad = replace(cfg, "\"model_type\": \"llama\"", "\"model_type\": \"rwkv9\"");
    char *dir = fake_model("unknown-arch", bad, NULL, 0);
    expect_load_error(lm_t_, dir, "config.json", "unsupported model_type \"rwkv9\"");
    free(cfg);
    free(bad);
    free(dir);
}

LM_TEST(model_load_wrong_shape) {
    char *cfg = fixture_config();
    if (!cfg) LM_SKIP("%s", lm_test_fixtures_why());
    char *bad = replace(cfg, "\"intermediate_size\": 176", "\"intermediate_size\": 160");
    char *dir = fake_model("wrong-shape", bad, NULL, 0);
    expect_load_error(lm_t_, dir, "model.safetensors", "has shape [176, 64], expected [160, 64]");
    free(cfg);
    free(bad);
    free(dir);
}

LM_TEST(model_load_missing_tensor) {
    char *cfg = fixture_config();
    if (!cfg) LM_SKIP("%s", lm_test_fixtures_why());
    char *bad = replace(cfg, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    char *dir = fake_model("missing-tensor", bad, NULL, 0);
    expect_load_error(lm_t_, dir, "model.safetensors", "missing tensor \"model.layers.2.input_layernorm.weight\"");
    free(cfg);
    free(bad);
    free(dir);
}

LM_TEST(model_load_corrupt_config) {
    if (!lm_test_have_fixture("models/llama")) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = fake_model("corrupt-config", "{\"model_type\": \"llama\", ", NULL, 0);
    expect_load_error(lm_t_, dir, "config.json", "invalid JSON");
    free(dir);
}

LM_TEST(model_load_truncated_weights) {
    char *src = lm_test_fixture_path("models/llama/model.safetensors");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    size_t n;
    char *w = lm_tu_read(src, &n);
    size_t cuts[] = { 0, 4, 8, 100, n / 2, n - 1 };
    for (size_t i = 0; i < LM_COUNT(cuts); i++) {
        char *dir = fake_model("truncated", NULL, w, cuts[i]);
        expect_load_error(lm_t_, dir, "model.safetensors", NULL);
        free(dir);
    }
    free(w);
    free(src);
}

LM_TEST(model_load_truncated_gguf) {
    char *src = lm_test_fixture_path("models/llama-2-tiny-random.gguf");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    size_t n;
    char *g = lm_tu_read(src, &n);
    char *dir = lm_tu_mkdir("gguf-trunc");
    char *p = lm_path_join(dir, "cut.gguf");
    size_t cuts[] = { 4, 24, 1000, n / 2, n - 1 };
    for (size_t i = 0; i < LM_COUNT(cuts); i++) {
        lm_tu_write(p, g, cuts[i]);
        expect_load_error(lm_t_, p, p, NULL);
    }
    free(p);
    free(dir);
    free(g);
    free(src);
}

/* The same weights split over two shards with an index load and compute the
 * same logits as the single file. */
LM_TEST(model_load_sharded) {
    char *src = lm_test_fixture_path("models/llama");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    lm_safetensors st;
    char *single = lm_path_join(src, "model.safetensors");
    LM_REQUIRE(lm_safetensors_open(&st, single, NULL) == 0);
    char *dir = lm_tu_mkdir("sharded");
    /* write shard k with the tensors i % 2 == k, in the safetensors layout */
    char index[16384];
    size_t ix = (size_t)snprintf(index, sizeof index, "{\"metadata\": {}, \"weight_map\": {");
    for (int k = 0; k < 2; k++) {
        char header[16384];
        size_t h = (size_t)snprintf(header, sizeof header, "{");
        size_t off = 0;
        for (int i = k; i < st.n_tensors; i += 2) {
            const lm_file_tensor *t = &st.tensors[i];
            char shape[64];
            if (t->n_dims == 1) snprintf(shape, sizeof shape, "%lld", (long long)t->shape[0]);
            else snprintf(shape, sizeof shape, "%lld,%lld", (long long)t->shape[0], (long long)t->shape[1]);
            h += (size_t)snprintf(header + h, sizeof header - h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                                  h > 1 ? "," : "", t->name, t->type_name, shape, off, off + t->nbytes);
            off += t->nbytes;
            ix += (size_t)snprintf(index + ix, sizeof index - ix, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                                   ix > 40 ? ", " : "", t->name, k + 1);
        }
        h += (size_t)snprintf(header + h, sizeof header - h, "}");
        while (h % 8) header[h++] = ' ';
        size_t total = 8 + h + off;
        uint8_t *buf = malloc(total);
        uint64_t hl = h;
        memcpy(buf, &hl, 8);
        memcpy(buf + 8, header, h);
        size_t at = 8 + h;
        for (int i = k; i < st.n_tensors; i += 2) {
            memcpy(buf + at, st.tensors[i].data, st.tensors[i].nbytes);
            at += st.tensors[i].nbytes;
        }
        char name[64];
        snprintf(name, sizeof name, "model-0000%d-of-00002.safetensors", k + 1);
        char *p = lm_path_join(dir, name);
        LM_CHECK(lm_tu_write(p, buf, total) == 0);
        free(p);
        free(buf);
    }
    snprintf(index + ix, sizeof index - ix, "}}");
    char *p = lm_path_join(dir, "model.safetensors.index.json");
    lm_tu_write(p, index, strlen(index));
    free(p);
    char *cfg = fixture_config();
    p = lm_path_join(dir, "config.json");
    lm_tu_write(p, cfg, strlen(cfg));
    free(p);

    lm_backend *be = backend();
    lm_model *a = NULL, *b = NULL;
    lm_err e = { { 0 } };
    LM_CHECK_MSG(lm_model_load(&a, src, be, &e) == 0, "%s", e.msg);
    LM_CHECK_MSG(lm_model_load(&b, dir, be, &e) == 0, "%s", e.msg);
    if (a && b) {
        LM_CHECK(b->weights->n_files == 2);
        int32_t ids[5] = { 1, 17, 300, 42, 999 };
        float la[1024], lb[1024];
        lm_runner *ra = NULL, *rb = NULL;
        LM_REQUIRE(lm_runner_create(&ra, a, 16, 0, &e) == 0 && lm_runner_create(&rb, b, 16, 0, &e) == 0);
        LM_CHECK(lm_runner_eval(ra, ids, 5, false, la, &e) == 0);
        LM_CHECK(lm_runner_eval(rb, ids, 5, false, lb, &e) == 0);
        LM_CHECK(memcmp(la, lb, sizeof la) == 0);
        lm_runner_free(ra);
        lm_runner_free(rb);
    }
    lm_model_free(a);
    lm_model_free(b);
    lm_backend_destroy(be);
    /* an index naming a shard that lacks the tensor fails clearly */
    p = lm_path_join(dir, "model.safetensors.index.json");
    char *bad = replace(index, "\"model.norm.weight\": \"model-00001", "\"model.norm.weight\": \"model-00002");
    if (!strcmp(bad, index)) {
        free(bad);
        bad = replace(index, "\"model.norm.weight\": \"model-00002", "\"model.norm.weight\": \"model-00001");
    }
    lm_tu_write(p, bad, strlen(bad));
    expect_load_error(lm_t_, dir, "index.json", "model.norm.weight");
    free(bad);
    free(p);
    free(cfg);
    free(dir);
    free(single);
    lm_safetensors_close(&st);
    free(src);
}
