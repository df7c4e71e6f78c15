/* test_convert_vocab.c - the tokenizer metadata lumen convert writes is the
 * tokenizer: the fixture tokenizers' tokenizer.json written as GGUF
 * metadata by convert_vocab.c, then loaded back as a GGUF vocabulary, give
 * the fixture cases' ids (with and without special tokens) and decodings. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "convert/lm_convert.h"
#include "lm_test.h"
#include "test_util.h"

/* Ids in tokenizer.json run to max id + 1 (the folders have no config.json). */
static int vocab_size(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *j = json_load_file(path, 0, NULL), *v;
    const char *k;
    size_t i;
    int n = 0;
    json_object_foreach(json_object_get(json_object_get(j, "model"), "vocab"), k, v) {
        n = LM_MAX(n, (int)json_integer_value(v) + 1);
    }
    json_array_foreach(json_object_get(j, "added_tokens"), i, v) {
        n = LM_MAX(n, (int)json_integer_value(json_object_get(v, "id")) + 1);
    }
    json_decref(j);
    return n;
}

/* `lumen check-tokenizer` of gguf on dir's cases: its exit status, its JSON line in *out. */
static int check_tokenizer(const char *gguf, const char *dir, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' check-tokenizer '%s' '%s/cases.jsonl'", lm_test_lumen_bin(), gguf, dir);
    char *err = NULL;
    int rc = lm_tu_run(cmd, out, &err);
    free(err);
    return rc;
}

/* Writes dir's tokenizer as GGUF metadata alone into the tmpdir (path in out). */
static int write_vocab(const char *name, const char *dir, char *out, size_t n, lm_err *e) {
    snprintf(out, n, "%s/vocab-%s.gguf", lm_test_tmpdir(), name);
    lm_gguf_writer *w = lm_gguf_writer_create(32);
    int rc = lm_convert_vocab(w, dir, vocab_size(dir), e);
    rc = rc ? rc : lm_gguf_writer_begin(w, out, e);
    rc = rc ? rc : lm_gguf_writer_finish(w, e);
    lm_gguf_writer_free(w);
    return rc;
}

static void check_vocab(lm_test_ctx *lm_t_, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char out[512];
    lm_err e = { { 0 } };
    int wrc = write_vocab(name, dir, out, sizeof out, &e);
    LM_CHECK_MSG(wrc == 0, "%s", e.msg);
    LM_REQUIRE(wrc == 0);
    char *o = NULL;
    int rc = check_tokenizer(out, dir, &o);
    LM_CHECK_MSG(rc == 0, "%s", o ? o : "");
    if (rc == 0) printf("  %s", o);
    free(o);
    free(dir);
}

LM_TEST(convert_vocab_qwen3) { check_vocab(lm_t_, "qwen3"); }
LM_TEST(convert_vocab_llama3) { check_vocab(lm_t_, "llama3"); }
/* The model fixtures' tokenizer has no normaliser but Qwen2's split regex,
 * so llama.cpp names its pre-tokenizer qwen2, and a GGUF reader that
 * normalises as Qwen2 does (NFC) differs on 2 of 101 cases (decomposed
 * accents). lumen's conversion must behave exactly as llama.cpp's does. */
LM_TEST(convert_vocab_tiny_bpe_as_llamacpp) {
    char *dir = lm_test_fixture_path("tokenizers/tiny-bpe"), *theirs = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf");
    if (!dir || !theirs) LM_SKIP("%s", lm_test_fixtures_why());
    char out[512];
    lm_err e = { { 0 } };
    LM_REQUIRE(write_vocab("tiny-bpe", dir, out, sizeof out, &e) == 0);
    char *a = NULL, *b = NULL;
    check_tokenizer(out, dir, &a);
    check_tokenizer(theirs, dir, &b);
    const char *pa = a ? strstr(a, "\"passed\":") : NULL, *pb = b ? strstr(b, "\"passed\":") : NULL;
    LM_CHECK(pa && pb && atoi(pa + 9) == atoi(pb + 9) && atoi(pa + 9) >= 99);
    printf("  lumen's conversion: %.40s; llama.cpp's: %.40s\n", pa ? pa : "?", pb ? pb : "?");
    free(a);
    free(b);
    free(dir);
    free(theirs);
}

/* SentencePiece-style tokenizers are refused with a message, not mis-written. */
LM_TEST(convert_vocab_refuses_spm) {
    char *dir = lm_test_fixture_path("tokenizers/mistral");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_gguf_writer *w = lm_gguf_writer_create(32);
    LM_CHECK(lm_convert_vocab(w, dir, 32000, &e) != 0 && strstr(e.msg, "SentencePiece"));
    lm_gguf_writer_free(w);
    free(dir);
}
