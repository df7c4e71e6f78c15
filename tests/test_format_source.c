/* test_format_source.c - one opened source (format/lm_source.h) feeds the
 * model, tokenizer and template loaders, for a GGUF file and for a Hugging
 * Face folder alike; bad paths fail with one line that names them; and a
 * model keeps its source's files mapped after the caller lets go.
 *
 * The fixture gguf/llama-g256 is a Hugging Face folder that also holds the
 * GGUF conversions of its own model, so both kinds of source are checked
 * against the same statements of the folder's files: config.json,
 * tokenizer.json's added tokens, chat_template.jinja and the logits of
 * reference.safetensors (what transformers computed). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/lm_file.h"
#include "engine/lm_runner.h"
#include "format/lm_source.h"
#include "format/safetensors.h"
#include "lm_test.h"
#include "model/lm_model.h"
#include "template/lm_template.h"
#include "test_util.h"
#include "tokenizer/lm_tokenizer.h"

#define FIXTURE "gguf/llama-g256"
/* bf16 like model.safetensors: the reference logits hold for both */
#define FIXTURE_GGUF FIXTURE "/model.bf16.gguf"
/* lumen parity's tolerance; this fixture agrees to ~2e-5 */
#define LOGIT_TOL 1e-3

static const char k_text[] = "<|im_start|>user\nHello, world! 1234 caf\xC3\xA9<|im_end|>";

/* What the fixture folder's files state. */
typedef struct stated {
    json_t *config;      /* config.json */
    int32_t im_end;      /* "<|im_end|>" in tokenizer.json's added_tokens */
    char *jinja;         /* chat_template.jinja */
    size_t jinja_len;
} stated;

static int stated_int(const stated *s, const char *key) {
    return (int)json_integer_value(json_object_get(s->config, key));
}

static bool stated_load(stated *s, const char *dir) {
    memset(s, 0, sizeof *s);
    s->im_end = -1;
    char *p = lm_path_join(dir, "config.json");
    s->config = json_load_file(p, 0, NULL);
    free(p);
    p = lm_path_join(dir, "tokenizer.json");
    json_t *tok = json_load_file(p, 0, NULL);
    free(p);
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, t)
        if (lm_streq(json_string_value(json_object_get(t, "content")), "<|im_end|>"))
            s->im_end = (int32_t)json_integer_value(json_object_get(t, "id"));
    json_decref(tok);
    p = lm_path_join(dir, "chat_template.jinja");
    s->jinja = lm_tu_read(p, &s->jinja_len);
    free(p);
    return s->config && s->im_end >= 0 && s->jinja;
}

static void stated_free(stated *s) {
    json_decref(s->config);
    free(s->jinja);
}

static void check_model(lm_test_ctx *lm_t_, const lm_model *m, const stated *s) {
    LM_CHECK(!strcmp(m->cfg.model_type, json_string_value(json_object_get(s->config, "model_type"))));
    LM_CHECK(m->cfg.vocab == stated_int(s, "vocab_size"));
    LM_CHECK(m->cfg.d_model == stated_int(s, "hidden_size"));
    LM_CHECK(m->cfg.n_layers == stated_int(s, "num_hidden_layers"));
    LM_CHECK(m->cfg.n_heads == stated_int(s, "num_attention_heads"));
    LM_CHECK(m->cfg.n_kv_heads == stated_int(s, "num_key_value_heads"));
    LM_CHECK(m->cfg.d_ff == stated_int(s, "intermediate_size"));
}

static void check_tokenizer(lm_test_ctx *lm_t_, const lm_tokenizer *t, const stated *s) {
    LM_CHECK_MSG(lm_tokenizer_n_vocab(t) == stated_int(s, "vocab_size"), "%d ids", lm_tokenizer_n_vocab(t));
    LM_CHECK(lm_tokenizer_token_to_id(t, "<|im_end|>", 10) == s->im_end);
    /* config.json's eos_token_id is tokenizer_config.json's eos_token */
    LM_CHECK(lm_tokenizer_eos(t) == stated_int(s, "eos_token_id") && lm_tokenizer_eos(t) == s->im_end);
}

/* Last-position logits of reference prompt0 against transformers'. */
static void check_runs(lm_test_ctx *lm_t_, lm_model *m, const char *dir) {
    char *p = lm_path_join(dir, "reference.safetensors");
    lm_safetensors ref;
    lm_err e = { { 0 } };
    int rc = lm_safetensors_open(&ref, p, &e);
    free(p);
    LM_REQUIRE(rc == 0);
    const lm_file_tensor *ids_t = lm_safetensors_find(&ref, "prompt0.ids");
    const lm_file_tensor *log_t = lm_safetensors_find(&ref, "prompt0.logits");
    const int V = m->cfg.vocab;
    LM_REQUIRE(ids_t && log_t && ids_t->type == LM_I32 && log_t->type == LM_F32);
    const int T = (int)ids_t->shape[0];
    LM_REQUIRE(log_t->n_dims == 2 && log_t->shape[0] == T && log_t->shape[1] == V);
    /* safetensors data is only byte-aligned: copy before reading as numbers */
    int32_t *ids = malloc(ids_t->nbytes);
    float *want = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    memcpy(ids, ids_t->data, ids_t->nbytes);
    memcpy(want, log_t->data + (size_t)(T - 1) * V * sizeof(float), (size_t)V * sizeof(float));
    lm_runner *r = NULL;
    LM_CHECK_MSG(lm_runner_create(&r, m, T + 1, 0, &e) == 0 && lm_runner_eval(r, ids, T, false, got, &e) == 0,
                 "%s", e.msg);
    double err = 0;
    for (int i = 0; i < V && r; i++) err = fmax(err, fabs((double)got[i] - want[i]));
    LM_CHECK_MSG(r && err <= LOGIT_TOL, "max |lumen - transformers| = %g", err);
    LM_CHECK(r && lm_argmax(got, V) == lm_argmax(want, V));
    lm_runner_free(r);
    free(ids);
    free(want);
    free(got);
    lm_safetensors_close(&ref);
}

/* Model, tokenizer and template from one source at path; returns the
 * tokenizer (for comparing two sources) or NULL. */
static lm_tokenizer *check_source(lm_test_ctx *lm_t_, const char *path, lm_source_kind kind, const char *dir,
                                  const stated *s) {
    lm_err e = { { 0 } };
    lm_source *src = NULL;
    LM_CHECK_MSG(lm_source_open(&src, path, &e) == 0, "%s", e.msg);
    if (!src) return NULL;
    LM_CHECK(lm_source_kind_of(src) == kind && !strcmp(lm_source_path(src), path));
    LM_CHECK(!strcmp(lm_source_folder(src), dir));
    LM_CHECK((lm_source_gguf(src) != NULL) == (kind == LM_SOURCE_GGUF));

    lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
    lm_model *m = NULL;
    lm_tokenizer *tok = NULL;
    char *tpl = NULL;
    size_t tpl_len = 0;
    LM_CHECK_MSG(be && lm_model_load_from(&m, src, be, &e) == 0, "%s", e.msg);
    LM_CHECK_MSG(lm_tokenizer_load_from(&tok, src, &e) == 0, "%s", e.msg);
    LM_CHECK_MSG(lm_template_load_from(src, &tpl, &tpl_len, &e) == 0, "%s", e.msg);
    if (m) check_model(lm_t_, m, s);
    if (tok) check_tokenizer(lm_t_, tok, s);
    /* the same template through the template loader and the tokenizer's */
    LM_CHECK(tpl && tpl_len == s->jinja_len && !memcmp(tpl, s->jinja, tpl_len));
    LM_CHECK(tok && lm_streq(lm_tokenizer_chat_template(tok), s->jinja));
    if (tpl) {
        lm_template *t = NULL;
        LM_CHECK_MSG(lm_template_parse(tpl, tpl_len, "chat_template", &t, &e) == 0, "%s", e.msg);
        lm_template_free(t);
    }
    if (m) check_runs(lm_t_, m, dir);
    free(tpl);
    lm_model_free(m);
    lm_backend_destroy(be);
    lm_source_unref(src);
    return tok;
}

LM_TEST(format_source_gguf_and_folder_give_model_tokenizer_template) {
    char *dir = lm_test_fixture_path(FIXTURE), *gguf = lm_test_fixture_path(FIXTURE_GGUF);
    stated s;
    if (!dir || !gguf || !stated_load(&s, dir)) {
        free(dir);
        free(gguf);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    lm_tokenizer *from_gguf = check_source(lm_t_, gguf, LM_SOURCE_GGUF, dir, &s);
    lm_tokenizer *from_dir = check_source(lm_t_, dir, LM_SOURCE_HF, dir, &s);
    /* GGUF metadata and tokenizer.json rebuild the same tokenizer */
    if (from_gguf && from_dir) {
        lm_err e = { { 0 } };
        lm_tok_ids a = { 0 }, b = { 0 };
        LM_CHECK(lm_tokenizer_encode(from_gguf, k_text, strlen(k_text), true, &a, &e) == 0);
        LM_CHECK(lm_tokenizer_encode(from_dir, k_text, strlen(k_text), true, &b, &e) == 0);
        LM_CHECK(a.n > 5 && a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids));
        LM_CHECK(a.n > 0 && a.ids[a.n - 1] == s.im_end);
        lm_tok_ids_free(&a);
        lm_tok_ids_free(&b);
    }
    lm_tokenizer_free(from_gguf);
    lm_tokenizer_free(from_dir);
    stated_free(&s);
    free(dir);
    free(gguf);
}

/* A model keeps the files mapped: the caller drops its handle right after
 * loading and the model still computes the reference logits (a source freed
 * under it would unmap the weights and crash the forward). */
LM_TEST(format_source_outlives_the_callers_handle) {
    char *dir = lm_test_fixture_path(FIXTURE), *gguf = lm_test_fixture_path(FIXTURE_GGUF);
    if (!dir || !gguf) {
        free(dir);
        free(gguf);
        LM_SKIP("%s", lm_test_fixtures_why());
    }
    const char *paths[] = { gguf, dir };
    for (size_t i = 0; i < LM_COUNT(paths); i++) {
        lm_err e = { { 0 } };
        lm_source *src = NULL;
        lm_model *m = NULL;
        lm_backend *be = lm_cpu_backend_create(2, LM_ISA_AUTO, &e);
        LM_REQUIRE(be && lm_source_open(&src, paths[i], &e) == 0);
        LM_CHECK(lm_source_ref(src) == src); /* a second holder ... */
        lm_source_unref(src);                /* ... lets go */
        LM_CHECK_MSG(lm_model_load_from(&m, src, be, &e) == 0, "%s", e.msg);
        lm_source_unref(src); /* the caller's handle: the model holds the last reference */
        if (m) {
            LM_CHECK(m->source == src && !strcmp(lm_source_path(m->source), paths[i]));
            check_runs(lm_t_, m, dir);
        }
        lm_model_free(m);
        lm_backend_destroy(be);
    }
    free(dir);
    free(gguf);
}

/* Every failure is one line that names the path. */
static void check_msg(lm_test_ctx *lm_t_, const lm_err *e, const char *path, const char *needle) {
    LM_CHECK_MSG(strstr(e->msg, path) && strstr(e->msg, needle), "\"%s\" lacks \"%s\" or \"%s\"", e->msg, path,
                 needle);
    LM_CHECK_MSG(!strchr(e->msg, '\n'), "not one line: %s", e->msg);
}

/* Opens path (which must succeed) and expects the model and tokenizer
 * loaders to refuse it, the model's message holding model_needle; the
 * template loader refuses it too, or reads tpl_text when that is given
 * (any single file may be a template). */
static void expect_loaders_fail(lm_test_ctx *lm_t_, const char *path, lm_source_kind kind, const char *model_needle,
                                const char *tpl_text) {
    lm_err e = { { 0 } };
    lm_source *src = NULL;
    LM_REQUIRE(lm_source_open(&src, path, &e) == 0);
    LM_CHECK(lm_source_kind_of(src) == kind);
    lm_backend *be = lm_cpu_backend_create(1, LM_ISA_AUTO, NULL);
    lm_model *m = NULL;
    LM_CHECK(lm_model_load_from(&m, src, be, &e) == -1 && m == NULL);
    check_msg(lm_t_, &e, path, model_needle);
    const lm_weight_source *ws = NULL;
    LM_CHECK(lm_source_weights(src, &ws, &e) == -1 && ws == NULL);
    lm_tokenizer *t = NULL;
    LM_CHECK(lm_tokenizer_load_from(&t, src, &e) == -1 && t == NULL);
    check_msg(lm_t_, &e, path, "");
    char *tpl = NULL;
    size_t len = 0;
    if (tpl_text) {
        LM_CHECK(lm_template_load_from(src, &tpl, &len, &e) == 0 && lm_streq(tpl, tpl_text));
        free(tpl);
    } else {
        LM_CHECK(lm_template_load_from(src, &tpl, &len, &e) == -1 && tpl == NULL);
        check_msg(lm_t_, &e, path, "");
    }
    lm_backend_destroy(be);
    lm_source_unref(src);
}

LM_TEST(format_source_bad_paths) {
    char *dir = lm_tu_mkdir("format-source");
    lm_err e = { { 0 } };
    lm_source *src = NULL;

    /* a GGUF by name is opened at once: missing, or not GGUF inside */
    LM_CHECK(lm_source_open(&src, "/nonexistent/model.gguf", &e) == -1 && src == NULL);
    check_msg(lm_t_, &e, "/nonexistent/model.gguf", "no such file or directory");
    char *bad = lm_path_join(dir, "bad.GGUF");
    LM_REQUIRE(lm_tu_write(bad, "{\"model\": {}}", 13) == 0);
    LM_CHECK(lm_source_open(&src, bad, &e) == -1 && src == NULL);
    check_msg(lm_t_, &e, bad, "not a GGUF file (bad magic)");

    /* anything else opens, and the loaders that need a model refuse it */
    expect_loaders_fail(lm_t_, "/nonexistent/model-dir", LM_SOURCE_FILE, "no such file or directory", NULL);
    char *text = lm_path_join(dir, "x.bin");
    LM_REQUIRE(lm_tu_write(text, "hello", 5) == 0);
    expect_loaders_fail(lm_t_, text, LM_SOURCE_FILE, "not a model folder or a GGUF file", "hello");
    char *empty = lm_path_join(dir, "empty.gguf"); /* a folder, whatever its name */
    LM_REQUIRE(mkdir(empty, 0755) == 0);
    expect_loaders_fail(lm_t_, empty, LM_SOURCE_HF, "config.json", NULL);

    /* a GGUF file under another name is known by its magic */
    char *gguf = lm_test_fixture_path(FIXTURE_GGUF);
    if (gguf) {
        size_t n;
        char *bytes = lm_tu_read(gguf, &n);
        char *renamed = lm_path_join(dir, "weights.bin");
        LM_REQUIRE(bytes && lm_tu_write(renamed, bytes, n) == 0);
        LM_CHECK_MSG(lm_source_open(&src, renamed, &e) == 0, "%s", e.msg);
        LM_CHECK(src && lm_source_kind_of(src) == LM_SOURCE_GGUF && lm_source_gguf(src));
        lm_source_unref(src);
        free(renamed);
        free(bytes);
        free(gguf);
    }
    free(empty);
    free(text);
    free(bad);
    free(dir);
}
