/* test_convert_vocab.c - the tokenizer metadata lumen convert writes is the
 * tokenizer: the fixture tokenizers' tokenizer.json written as GGUF
 * metadata by convert_vocab.c, then loaded back as a GGUF vocabulary, give
 * the fixture cases' ids (with and without special tokens) and decodings. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/lm_convert.h"
#include "format/gguf.h"
#include "tokenizer/lm_tokenizer.h"
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

/* Qwen3.5's split keeps letters with their combining marks
 * ([\p{L}\p{M}]+; Qwen3's \p{L}+ splits before each mark). The real Qwen3
 * tokenizer with Qwen3.5's regex (its vocabulary is not in the fixtures)
 * converts with tokenizer.ggml.pre "qwen35", and that GGUF gives the
 * tokenizer.json's ids on texts with marks, in lumen and, where
 * node-llama-cpp is installed, in llama.cpp; the same texts under Qwen3's
 * split give other ids, so the split is what the check sees. */
LM_TEST(convert_vocab_qwen35_split) {
    char *src = lm_test_fixture_path("tokenizers/qwen3");
    if (!src) LM_SKIP("%s", lm_test_fixtures_why());
    static const char qwen2_re[] = "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+";
    static const char qwen35_re[] = "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+";
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", src);
    size_t n;
    char *json = lm_tu_read(path, &n);
    LM_REQUIRE(json != NULL);
    char *at = strstr(json, qwen2_re);
    LM_REQUIRE(at != NULL); /* the fixture's split, as JSON text */
    const size_t pre = (size_t)(at - json), old = strlen(qwen2_re), add = strlen(qwen35_re);
    char *j35 = malloc(n - old + add + 1);
    memcpy(j35, json, pre);
    memcpy(j35 + pre, qwen35_re, add);
    memcpy(j35 + pre + add, at + old, n - pre - old + 1);
    char *dir = lm_tu_mkdir("qwen35-tok");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    LM_REQUIRE(lm_tu_write(path, j35, strlen(j35)) == 0);
    char out[512];
    lm_err e = { { 0 } };
    LM_REQUIRE(write_vocab("qwen35", dir, "qwen35", out, sizeof out, &e) == 0);
    lm_gguf g = { 0 };
    LM_REQUIRE(lm_gguf_open(&g, out, &e) == 0);
    char *name = lm_gguf_get_str(&g, "tokenizer.ggml.pre");
    LM_CHECK_MSG(name && !strcmp(name, "qwen35"), "pre %s", name ? name : "(none)");
    free(name);
    lm_tokenizer *hf = NULL, *gg = NULL, *q3 = NULL;
    LM_REQUIRE(lm_tokenizer_load_json(&hf, j35, strlen(j35), NULL, 0, "qwen35", &e) == 0 && lm_tokenizer_load_gguf(&gg, &g, &e) == 0 &&
               lm_tokenizer_load_json(&q3, json, n, NULL, 0, "qwen3", &e) == 0);
    /* marks that stay combining after NFC (llama.cpp does not normalise;
     * a decomposed accent that NFC composes would differ for that reason) */
    static const char *const texts[] = { "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd \u05e2\u05d5\u05b9\u05dc\u05b8\u05dd",
                                         "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 \u0628\u0650\u0643\u064f\u0645\u0652",
                                         "q\u0301uiz j\u0308ump", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
                                         "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u", "plain ASCII text" };
    snprintf(path, sizeof path, "%s/cases.jsonl", dir);
    FILE *cases = fopen(path, "w");
    int same = 0, differ_q3 = 0;
    for (size_t i = 0; i < LM_COUNT(texts); i++) {
        lm_tok_ids a = { 0 }, b = { 0 }, c = { 0 };
        LM_REQUIRE(lm_tokenizer_encode(hf, texts[i], strlen(texts[i]), false, &a, &e) == 0 &&
                   lm_tokenizer_encode(gg, texts[i], strlen(texts[i]), false, &b, &e) == 0 &&
                   lm_tokenizer_encode(q3, texts[i], strlen(texts[i]), false, &c, &e) == 0);
        same += a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids);
        differ_q3 += a.n != c.n || memcmp(a.ids, c.ids, a.n * sizeof *a.ids);
        json_t *line = json_pack("{s:s, s:[]}", "text", texts[i], "ids");
        for (size_t k = 0; k < a.n; k++) json_array_append_new(json_object_get(line, "ids"), json_integer(a.ids[k]));
        char *s = json_dumps(line, JSON_COMPACT);
        fprintf(cases, "%s\n", s);
        free(s);
        json_decref(line);
        lm_tok_ids_free(&a), lm_tok_ids_free(&b), lm_tok_ids_free(&c);
    }
    fclose(cases);
    printf("  qwen35 split: %d of %zu texts as the tokenizer.json; %d of them differ under Qwen3's split\n", same,
           LM_COUNT(texts), differ_q3);
    LM_CHECK(same == (int)LM_COUNT(texts) && differ_q3 >= 2);
    if (!lm_tu_llamacpp_missing()) {
        char cmd[2048], *o = NULL, *err = NULL;
        snprintf(cmd, sizeof cmd, "node '%s/tools/llamacpp/tokenize.mjs' '%s' '%s'", LUMEN_SOURCE_DIR, out, path);
        const int rc = lm_tu_run(cmd, &o, &err);
        LM_CHECK_MSG(rc == 0, "llama.cpp on the qwen35 vocabulary: %s%s", o ? o : "", err ? err : "");
        if (rc == 0) printf("  llama.cpp: %.40s\n", o ? strstr(o, "\"equal\"") : "");
        free(o), free(err);
    }
    lm_tokenizer_free(hf), lm_tokenizer_free(gg), lm_tokenizer_free(q3);
    lm_gguf_close(&g);
    free(j35), free(json), free(dir), free(src);
}
