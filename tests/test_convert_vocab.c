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

/* Writes dir's tokenizer as GGUF metadata alone, for GGUF architecture
 * arch, into the tmpdir (path in out). */
static int write_vocab(const char *name, const char *dir, const char *arch, char *out, size_t n, lm_err *e) {
    snprintf(out, n, "%s/vocab-%s-%s.gguf", lm_test_tmpdir(), name, arch);
    lm_gguf_writer *w = lm_gguf_writer_create(32);
    lm_gguf_set_str(w, "general.architecture", arch, strlen(arch)); /* llama.cpp wants one */
    int rc = lm_convert_vocab(w, dir, arch, vocab_size(dir), e);
    rc = rc ? rc : lm_gguf_writer_begin(w, out, e);
    rc = rc ? rc : lm_gguf_writer_finish(w, e);
    lm_gguf_writer_free(w);
    return rc;
}

/* dir's tokenizer written for arch gives the fixture cases' ids in lumen
 * and, for a SentencePiece-style one (spm) where node-llama-cpp is
 * installed, in llama.cpp (tokenize.mjs; its byte-level BPE readers do not
 * normalise as the HF tokenizers do, so their cases differ: tiny_bpe below). */
static void check_vocab(lm_test_ctx *lm_t_, const char *name, const char *arch, bool spm) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char out[512];
    lm_err e = { { 0 } };
    int wrc = write_vocab(name, dir, arch, out, sizeof out, &e);
    LM_CHECK_MSG(wrc == 0, "%s", e.msg);
    LM_REQUIRE(wrc == 0);
    char *o = NULL;
    int rc = check_tokenizer(out, dir, &o);
    LM_CHECK_MSG(rc == 0, "%s", o ? o : "");
    if (rc == 0) printf("  %s", o);
    free(o);
    if (spm && !lm_tu_llamacpp_missing()) {
        char cmd[2048], *err = NULL;
        snprintf(cmd, sizeof cmd, "node '%s/tools/llamacpp/tokenize.mjs' '%s' '%s/cases.jsonl'", LUMEN_SOURCE_DIR, out, dir);
        o = NULL;
        rc = lm_tu_run(cmd, &o, &err);
        LM_CHECK_MSG(rc == 0, "llama.cpp on lumen's %s vocabulary: %s%s", arch, o ? o : "", err ? err : "");
        if (rc == 0) printf("  llama.cpp: %.60s\n", o ? strstr(o, "\"equal\"") : "");
        free(o);
        free(err);
    }
    free(dir);
}

LM_TEST(convert_vocab_qwen3) { check_vocab(lm_t_, "qwen3", "qwen3", false); }
LM_TEST(convert_vocab_llama3) { check_vocab(lm_t_, "llama3", "llama", false); }
/* SentencePiece-style tokenizers (BPE over "▁" text, byte fallback): as
 * llama.cpp's SentencePiece vocabulary (scores from the merge ranks), and
 * as its Gemma 4 vocabulary (the merges themselves) */
LM_TEST(convert_vocab_spm_mistral) { check_vocab(lm_t_, "mistral", "llama", true); }
LM_TEST(convert_vocab_spm_gemma3) { check_vocab(lm_t_, "gemma3", "gemma3", true); }
LM_TEST(convert_vocab_gemma4) { check_vocab(lm_t_, "gemma3", "gemma4", true); }
/* The model fixtures' tokenizer has no normaliser but Qwen2's split regex,
 * so llama.cpp names its pre-tokenizer qwen2, and a GGUF reader that
 * normalises as Qwen2 does (NFC) differs on 2 of 101 cases (decomposed
 * accents). lumen's conversion must behave exactly as llama.cpp's does. */
LM_TEST(convert_vocab_tiny_bpe_as_llamacpp) {
    char *dir = lm_test_fixture_path("tokenizers/tiny-bpe"), *theirs = lm_test_fixture_path("gguf/llama-g256/model.bf16.gguf");
    if (!dir || !theirs) LM_SKIP("%s", lm_test_fixtures_why());
    char out[512];
    lm_err e = { { 0 } };
    LM_REQUIRE(write_vocab("tiny-bpe", dir, "llama", out, sizeof out, &e) == 0);
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

/* A tokenizer that is not BPE (Unigram, WordPiece) is refused with a
 * message naming its model, not mis-written. */
LM_TEST(convert_vocab_refuses_unigram) {
    char *dir = lm_tu_mkdir("unigram"), path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    static const char doc[] = "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]]}}";
    LM_REQUIRE(lm_tu_write(path, doc, sizeof doc - 1) == 0);
    lm_err e = { { 0 } };
    lm_gguf_writer *w = lm_gguf_writer_create(32);
    LM_CHECK(lm_convert_vocab(w, dir, "llama", 1, &e) != 0 && strstr(e.msg, "Unigram"));
    printf("  %s\n", e.msg);
    lm_gguf_writer_free(w);
    free(dir);
}
