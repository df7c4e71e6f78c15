/* test_tokenizer_gguf.c - a tokenizer from GGUF metadata alone gives the same
 * ids as the tokenizer.json it came from: each fixture tokenizer is written
 * as a GGUF (tokens, types, scores or merges, the way llama.cpp's converter
 * stores them) and checked against the fixture cases. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "test_util.h"
#include "tokenizer/lm_tokenizer.h"

typedef struct buf { unsigned char *p; size_t n, cap; } buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        while (b->n + n > b->cap) b->cap = b->cap ? b->cap * 2 : 1 << 16;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s, size_t n) { u64(b, n); put(b, s, n); }
static void key(buf *b, const char *k, uint32_t type) { str(b, k, strlen(k)); u32(b, type); }

enum { T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9 };

typedef struct vocab { char **tok; size_t *len; int *type; float *score; int n; } vocab;

/* Tokens by id from tokenizer.json's model.vocab and added_tokens. */
static bool read_vocab(json_t *root, vocab *v) {
    json_t *mv = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    int n = 0;
    const char *k;
    size_t kl;
    json_t *x;
    json_object_keylen_foreach(mv, k, kl, x) n = LM_MAX(n, (int)json_integer_value(x) + 1);
    for (size_t i = 0; i < json_array_size(added); i++)
        n = LM_MAX(n, (int)json_integer_value(json_object_get(json_array_get(added, i), "id")) + 1);
    v->n = n;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->type = calloc((size_t)n, sizeof *v->type);
    v->score = calloc((size_t)n, sizeof *v->score);
    json_object_keylen_foreach(mv, k, kl, x) {
        int id = (int)json_integer_value(x);
        v->tok[id] = malloc(kl + 1);
        memcpy(v->tok[id], k, kl + 1);
        v->len[id] = kl;
        v->type[id] = (kl == 6 && !strncmp(k, "<0x", 3)) ? 6 : 1;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        int id = (int)json_integer_value(json_object_get(a, "id"));
        const char *c = json_string_value(json_object_get(a, "content"));
        if (!v->tok[id]) {
            v->tok[id] = strdup(c);
            v->len[id] = strlen(c);
        }
        v->type[id] = json_is_true(json_object_get(a, "special")) ? 3 : 4;
    }
    for (int i = 0; i < n; i++)
        if (!v->tok[i]) return false; /* GGUF needs dense ids */
    return true;
}

static void free_vocab(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    free(v->type);
    free(v->score);
}

/* Writes FIXTURE as a GGUF of tokenizer model `model`: "llama" with scores
 * derived from merge ranks (a token made by merge r scores -r); "gpt2" with
 * merges and the pre-tokenizer pre; "gemma4" as llama.cpp's Gemma 4
 * converter writes it (its LlamaHfVocab tokens, types and -1000 scores, the
 * merges, no space prefix, no pre key). */
static bool write_gguf(const char *fixture, const char *out, const char *model, const char *pre, bool add_bos) {
    const bool spm = !strcmp(model, "llama"), gemma4 = !strcmp(model, "gemma4");
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", fixture);
    char *path = lm_test_fixture_path(rel);
    json_t *root = path ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    if (!root) return false;
    vocab v = { 0 };
    bool ok = read_vocab(root, &v);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t nm = json_array_size(merges);
    char **ms = calloc(nm + 1, sizeof *ms);
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) ms[i] = strdup(json_string_value(m));
        else {
            const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
            ms[i] = malloc(strlen(a) + strlen(b) + 2);
            sprintf(ms[i], "%s %s", a, b);
        }
    }
    if (spm) {
        for (int i = 0; i < v.n; i++) v.score[i] = -1e9f;
        for (size_t r = nm; r-- > 0;) { /* lowest rank wins */
            char *sp = strchr(ms[r], ' ');
            size_t la = (size_t)(sp - ms[r]);
            char *joined = malloc(strlen(ms[r]));
            memcpy(joined, ms[r], la);
            strcpy(joined + la, sp + 1);
            json_t *id = json_object_get(json_object_get(json_object_get(root, "model"), "vocab"), joined);
            if (json_is_integer(id)) v.score[json_integer_value(id)] = -(float)r;
            free(joined);
        }
        json_t *unk = json_object_get(json_object_get(root, "model"), "unk_token");
        for (int i = 0; i < v.n && json_is_string(unk); i++)
            if (!strcmp(v.tok[i], json_string_value(unk))) v.type[i] = 2;
    }
    if (gemma4)
        for (int i = 0; i < v.n; i++) v.score[i] = -1000.0f;
    buf b = { 0 };
    put(&b, "GGUF", 4);
    u32(&b, 3);
    u64(&b, 0);
    u64(&b, gemma4 ? 8 : 7);
    key(&b, "tokenizer.ggml.model", T_STRING);
    str(&b, model, strlen(model));
    key(&b, "tokenizer.ggml.tokens", T_ARRAY);
    u32(&b, T_STRING);
    u64(&b, (uint64_t)v.n);
    for (int i = 0; i < v.n; i++) str(&b, v.tok[i], v.len[i]);
    key(&b, "tokenizer.ggml.token_type", T_ARRAY);
    u32(&b, T_I32);
    u64(&b, (uint64_t)v.n);
    for (int i = 0; i < v.n; i++) put(&b, &v.type[i], 4);
    if (spm || gemma4) {
        key(&b, "tokenizer.ggml.scores", T_ARRAY);
        u32(&b, T_F32);
        u64(&b, (uint64_t)v.n);
        for (int i = 0; i < v.n; i++) put(&b, &v.score[i], 4);
        key(&b, "tokenizer.ggml.add_space_prefix", T_BOOL);
        unsigned char t = !strcmp(fixture, "mistral");
        put(&b, &t, 1);
    }
    if (!spm) {
        key(&b, "tokenizer.ggml.merges", T_ARRAY);
        u32(&b, T_STRING);
        u64(&b, nm);
        for (size_t i = 0; i < nm; i++) str(&b, ms[i], strlen(ms[i]));
    }
    if (pre) {
        key(&b, "tokenizer.ggml.pre", T_STRING);
        str(&b, pre, strlen(pre));
    }
    key(&b, "tokenizer.ggml.add_bos_token", T_BOOL);
    unsigned char ab = add_bos;
    put(&b, &ab, 1);
    key(&b, "tokenizer.ggml.bos_token_id", T_U32); /* the template's token, if any */
    uint32_t bos = 0;
    json_t *st = json_object_get(json_object_get(root, "post_processor"), "special_tokens");
    const char *name;
    json_t *val;
    json_object_foreach(st, name, val) bos = (uint32_t)json_integer_value(json_array_get(json_object_get(val, "ids"), 0));
    put(&b, &bos, 4);
    ok = ok && lm_tu_write(out, b.p, b.n) == 0;
    free(b.p);
    for (size_t i = 0; i < nm; i++) free(ms[i]);
    free(ms);
    free_vocab(&v);
    json_decref(root);
    return ok;
}

static void check_gguf(lm_test_ctx *lm_t_, const char *fixture, const char *model, const char *pre, bool add_bos) {
    char tok_rel[256];
    snprintf(tok_rel, sizeof tok_rel, "tokenizers/%s", fixture);
    if (!lm_test_have_fixture(tok_rel)) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_tu_mkdir("tokgguf");
    char g[1024], cmd[4096], *out = NULL, *err = NULL;
    snprintf(g, sizeof g, "%s/%s.gguf", dir, fixture);
    LM_REQUIRE(write_gguf(fixture, g, model, pre, add_bos));
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/%s/cases.jsonl", fixture);
    char *cases = lm_test_fixture_path(rel);
    snprintf(cmd, sizeof cmd, "'%s' check-tokenizer '%s' '%s'", lm_test_lumen_bin(), g, cases);
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "%s%s", out ? out : "", err ? err : "");
    if (rc == 0) printf("  %s", out);
    free(out);
    free(err);
    free(cases);
    free(dir);
}

LM_TEST(tokenizer_gguf_spm_mistral) { check_gguf(lm_t_, "mistral", "llama", NULL, true); }
LM_TEST(tokenizer_gguf_bpe_qwen3) { check_gguf(lm_t_, "qwen3", "gpt2", "qwen2", false); }
LM_TEST(tokenizer_gguf_bpe_llama3) { check_gguf(lm_t_, "llama3", "gpt2", "llama-bpe", false); }
LM_TEST(tokenizer_gguf_spm_gemma3) { check_gguf(lm_t_, "gemma3", "llama", NULL, true); }
/* Gemma 4 GGUFs carry llama.cpp's "gemma4" vocabulary; Gemma 3's tokenizer
 * (the same family: BPE over "▁"-escaped text with byte fallback) written
 * that way must give its HF ids, BOS included although the file says
 * add_bos_token false (as early Gemma 4 conversions did; llama.cpp forces
 * it). llama.cpp's own tokenizer gives the same ids on this file
 * (tools/llamacpp/tokenize.mjs: 101 of 101, measured 2026-12-05). */
LM_TEST(tokenizer_gguf_gemma4_vocab) { check_gguf(lm_t_, "gemma3", "gemma4", NULL, false); }

/* A GGUF token need not be valid UTF-8: a user-defined token "\x9f" must not
 * match inside an emoji (whose bytes contain 0x9f) and split the character. */
LM_TEST(tokenizer_gguf_invalid_utf8_token) {
    static const char *const toks[] = { "<unk>", "<s>", "</s>", "\x9f", "\xE2\x96\x81", "a" };
    static const int32_t types[] = { 2, 3, 3, 4, 1, 1 };
    buf b = { 0 };
    put(&b, "GGUF", 4);
    u32(&b, 3);
    u64(&b, 0);
    u64(&b, 4);
    key(&b, "tokenizer.ggml.model", T_STRING);
    str(&b, "llama", 5);
    key(&b, "tokenizer.ggml.tokens", T_ARRAY);
    u32(&b, T_STRING);
    u64(&b, 6);
    for (int i = 0; i < 6; i++) str(&b, toks[i], strlen(toks[i]));
    key(&b, "tokenizer.ggml.token_type", T_ARRAY);
    u32(&b, T_I32);
    u64(&b, 6);
    put(&b, types, sizeof types);
    key(&b, "tokenizer.ggml.scores", T_ARRAY);
    u32(&b, T_F32);
    u64(&b, 6);
    for (int i = 0; i < 6; i++) {
        float sc = -(float)i;
        put(&b, &sc, 4);
    }
    char *dir = lm_tu_mkdir("tokgguf8");
    char path[1024];
    snprintf(path, sizeof path, "%s/t.gguf", dir);
    LM_REQUIRE(lm_tu_write(path, b.p, b.n) == 0);
    free(b.p);
    lm_tokenizer *t;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_tokenizer_load(&t, path, &e) == 0);
    const char *text = "a \xF0\x9F\x98\x80 a\x9f";
    lm_tok_ids ids = { 0 };
    LM_CHECK(lm_tokenizer_encode(t, text, strlen(text), true, &ids, &e) == 0);
    /* ▁ a ▁ <unk>(emoji) ▁ a <unk>(U+FFFD for the stray byte); no bos id given */
    static const int32_t want[] = { 4, 5, 4, 0, 4, 5, 0 };
    LM_CHECK(ids.n == LM_COUNT(want) && !memcmp(ids.ids, want, sizeof want));
    LM_CHECK(lm_tokenizer_bos(t) == -1 && !lm_tokenizer_adds_bos(t));
    lm_tok_ids_free(&ids);
    lm_tokenizer_free(t);
    free(dir);
}

/* A pre-tokenizer name lumen does not know is refused by name (llama.cpp
 * refuses it too), not read as GPT-2's split: Qwen3.5's "qwen35" once was. */
LM_TEST(tokenizer_gguf_unknown_pre_refused) {
    if (!lm_test_have_fixture("tokenizers/qwen3")) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_tu_mkdir("tokgguf-pre"), g[1024];
    snprintf(g, sizeof g, "%s/made-up.gguf", dir);
    LM_REQUIRE(write_gguf("qwen3", g, "gpt2", "made-up-pre", false));
    lm_tokenizer *t = NULL;
    lm_err e = { { 0 } };
    LM_CHECK(lm_tokenizer_load(&t, g, &e) != 0 && strstr(e.msg, "\"made-up-pre\"") && strstr(e.msg, "qwen35"));
    printf("  %s\n", e.msg);
    lm_tokenizer_free(t);
    free(dir);
}

/* "smollm" (SmolLM's GGUFs): digits one by one, then GPT-2's split, as its
 * tokenizer.json's Digits + ByteLevel pre-tokenizers do: the Llama 3
 * vocabulary (which has 3-digit tokens) under both gives the same ids. */
LM_TEST(tokenizer_gguf_smollm_digits) {
    char *path = lm_test_fixture_path("tokenizers/llama3/tokenizer.json");
    if (!path) LM_SKIP("%s", lm_test_fixtures_why());
    char *dir = lm_tu_mkdir("tokgguf-smollm"), g[1024];
    snprintf(g, sizeof g, "%s/smollm.gguf", dir);
    LM_REQUIRE(write_gguf("llama3", g, "gpt2", "smollm", false));
    json_t *root = json_load_file(path, 0, NULL);
    LM_REQUIRE(root != NULL);
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s, s:[{s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence", "pretokenizers",
                                  "type", "Digits", "individual_digits", 1, "type", "ByteLevel", "add_prefix_space", 0,
                                  "trim_offsets", 1, "use_regex", 1));
    char *js = json_dumps(root, JSON_COMPACT);
    lm_tokenizer *hf = NULL, *gg = NULL;
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_tokenizer_load_json(&hf, js, strlen(js), NULL, 0, "smollm", &e) == 0 && lm_tokenizer_load(&gg, g, &e) == 0);
    static const char *const texts[] = { "In 2024 we sold 1234567 units at $19.99", "x = 3.14159; y = 2718", "plain words only" };
    int same = 0;
    size_t digits = 0;
    for (size_t i = 0; i < LM_COUNT(texts); i++) {
        lm_tok_ids a = { 0 }, b = { 0 };
        LM_REQUIRE(lm_tokenizer_encode(hf, texts[i], strlen(texts[i]), false, &a, &e) == 0 &&
                   lm_tokenizer_encode(gg, texts[i], strlen(texts[i]), false, &b, &e) == 0);
        same += a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids);
        if (i == 0) digits = b.n;
        lm_tok_ids_free(&a), lm_tok_ids_free(&b);
    }
    printf("  smollm: %d of %zu texts as the tokenizer.json (%zu tokens for the first)\n", same, LM_COUNT(texts), digits);
    LM_CHECK(same == (int)LM_COUNT(texts) && digits >= 18); /* its 15 digits one token each */
    lm_tokenizer_free(hf), lm_tokenizer_free(gg);
    free(js), json_decref(root), free(path), free(dir);
}
