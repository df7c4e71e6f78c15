/* test_tokenizer.c - the tokenizer against Hugging Face's own outputs (the
 * fixture cases, through `lumen check-tokenizer`), and small hand-built
 * tokenizers for the rules the fixtures do not reach: added-token flags,
 * byte fallback and unk fusing, Metaspace prepend schemes, both merge
 * encodings, malformed files, invalid UTF-8 and the streaming decoder. */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lm_test.h"
#include "test_util.h"
#include "tokenizer/lm_tokenizer.h"

/* ---- helpers ---- */

static lm_tokenizer *load_str(const char *json, lm_err *e) {
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_load_json(&t, json, strlen(json), NULL, 0, "test.json", e)) return NULL;
    return t;
}

static bool enc_is(lm_tokenizer *t, const char *text, bool special, const int32_t *want, size_t n) {
    lm_tok_ids ids = { 0 };
    lm_err e = { { 0 } };
    bool ok = lm_tokenizer_encode(t, text, strlen(text), special, &ids, &e) == 0 && ids.n == n &&
              (n == 0 || !memcmp(ids.ids, want, n * sizeof *want));
    if (!ok) {
        fprintf(stderr, "  encode(\"%s\") = [", text);
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, "%s%d", i ? "," : "", ids.ids[i]);
        fprintf(stderr, "]\n");
    }
    lm_tok_ids_free(&ids);
    return ok;
}

static bool dec_is(lm_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want) {
    lm_tok_str s = { 0 };
    lm_tokenizer_decode(t, ids, n, skip, &s);
    bool ok = s.len == strlen(want) && !memcmp(s.s, want, s.len);
    if (!ok) fprintf(stderr, "  decode = \"%s\", want \"%s\"\n", s.s, want);
    lm_tok_str_free(&s);
    return ok;
}

#define LM_REQUIRE_MSG_(t, e)                              \
    do {                                                   \
        LM_CHECK_MSG((t) != NULL, "load failed: %s", (e).msg); \
        if (!(t)) return;                                  \
    } while (0)

#define IDS(...) ((const int32_t[]){ __VA_ARGS__ }), (sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t))
#define ENC(t, text, sp, ...) LM_CHECK(enc_is(t, text, sp, IDS(__VA_ARGS__)))
#define DEC(t, skip, want, ...) LM_CHECK(dec_is(t, IDS(__VA_ARGS__), skip, want))

/* ---- the fixtures, through the CLI ----
 * Each fixture tokenizer's 101 cases (HF tokenizers 0.22, shared fixtures)
 * plus 200 random stress texts (every Unicode space, combining marks,
 * scripts, Unicode 16 letters, emoji, control characters, added-token
 * strings; 180 short, 20 long) answered by the same HF version through
 * tools/tokbench/make_cases.js (seeds 2026 and 2027, MAX_PIECES=150 for the
 * long ones), kept in tests/data/tokenizer/. One check-tokenizer run each. */

static void run_fixture(lm_test_ctx *lm_t_, const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char path[1024], cmd[3072], *out = NULL, *err = NULL;
    snprintf(path, sizeof path, "%s/cases.jsonl", dir);
    size_t n1 = 0, n2 = 0;
    char *a = lm_tu_read(path, &n1);
    snprintf(path, sizeof path, "%s/tests/data/tokenizer/%s.stress.jsonl", LUMEN_SOURCE_DIR, name);
    char *b = lm_tu_read(path, &n2);
    LM_REQUIRE(a && b);
    char *tmp = lm_tu_mkdir("tokcases");
    snprintf(path, sizeof path, "%s/all.jsonl", tmp);
    char *all = malloc(n1 + n2 + 2);
    memcpy(all, a, n1);
    all[n1] = '\n';
    memcpy(all + n1 + 1, b, n2);
    LM_REQUIRE(lm_tu_write(path, all, n1 + n2 + 1) == 0);
    snprintf(cmd, sizeof cmd, "'%s' check-tokenizer '%s' '%s'", lm_test_lumen_bin(), dir, path);
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "%s\n%s", out ? out : "", err ? err : "");
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    LM_CHECK(json_integer_value(json_object_get(j, "failed")) == 0);
    LM_CHECK(json_integer_value(json_object_get(j, "passed")) == 301);
    if (rc == 0) printf("  %s", out);
    json_decref(j);
    free(all);
    free(a);
    free(b);
    free(tmp);
    free(out);
    free(err);
    free(dir);
}

LM_TEST(tokenizer_fixture_tiny_bpe) { run_fixture(lm_t_, "tiny-bpe"); }
LM_TEST(tokenizer_fixture_qwen3) { run_fixture(lm_t_, "qwen3"); }
LM_TEST(tokenizer_fixture_llama3) { run_fixture(lm_t_, "llama3"); }
LM_TEST(tokenizer_fixture_mistral) { run_fixture(lm_t_, "mistral"); }
LM_TEST(tokenizer_fixture_gemma3) { run_fixture(lm_t_, "gemma3"); }

/* Tokenizers built from the tiny fixture vocabulary with components the real
 * ones do not use (ByteLevel with add_prefix_space and its regex,
 * RobertaProcessing; NFKD, a Replace regex, BertProcessing, Replace and
 * Strip decoders), 150 cases each answered by HF tokenizers 0.22
 * (tools/tokbench/make_cases.js). Self-contained: no fixtures needed. */
static void run_variant(lm_test_ctx *lm_t_, const char *name) {
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' check-tokenizer '%s/tests/data/tokenizer/%s' '%s/tests/data/tokenizer/%s/cases.jsonl'",
             lm_test_lumen_bin(), LUMEN_SOURCE_DIR, name, LUMEN_SOURCE_DIR, name);
    int rc = lm_tu_run(cmd, &out, &err);
    LM_CHECK_MSG(rc == 0, "%s\n%s", out ? out : "", err ? err : "");
    LM_CHECK(out && strstr(out, "\"passed\":150,"));
    free(out);
    free(err);
}

LM_TEST(tokenizer_variant_bytelevel) { run_variant(lm_t_, "variant-bytelevel"); }
LM_TEST(tokenizer_variant_nfkd) { run_variant(lm_t_, "variant-nfkd"); }

/* The checker must fail, and say where, when a case is wrong. */
LM_TEST(tokenizer_check_reports_failure) {
    char *dir = lm_test_fixture_path("tokenizers/tiny-bpe");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char *cases = lm_tu_mkdir("tokcheck");
    char path[1024], cmd[3072], *out = NULL;
    snprintf(path, sizeof path, "%s/cases.jsonl", cases);
    /* a wrong case, then a real one */
    char src[1024];
    snprintf(src, sizeof src, "%s/cases.jsonl", dir);
    char *real = lm_tu_read(src, NULL);
    LM_REQUIRE(real);
    char *nl = strchr(real, '\n');
    if (nl) nl[1] = 0;
    char bad[4096];
    snprintf(bad, sizeof bad, "{\"text\":\"Hello world\",\"ids\":[1,2]}\n%s", real);
    free(real);
    LM_REQUIRE(lm_tu_write(path, bad, strlen(bad)) == 0);
    snprintf(cmd, sizeof cmd, "'%s' check-tokenizer '%s' '%s'", lm_test_lumen_bin(), dir, path);
    int rc = lm_tu_run(cmd, &out, NULL);
    LM_CHECK(rc == 1);
    LM_CHECK(out && strstr(out, "\"passed\":1") && strstr(out, "\"failed\":1"));
    LM_CHECK(out && strstr(out, "\"line\":1") && strstr(out, "\"field\":\"ids\""));
    free(out);
    free(cases);
    free(dir);
}

/* `lumen tokenize` prints ids and tokens. */
LM_TEST(tokenizer_cli_tokenize) {
    char *dir = lm_test_fixture_path("tokenizers/qwen3");
    if (!dir) LM_SKIP("%s", lm_test_fixtures_why());
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' 'Hello world'", lm_test_lumen_bin(), dir);
    LM_CHECK(lm_tu_run(cmd, &out, NULL) == 0);
    LM_CHECK(out && strstr(out, "\"ids\":[9707,1879]") && strstr(out, "\"Hello\""));
    free(out);
    free(dir);
}

/* ---- merges in both JSON encodings give the same tokenizer ---- */

LM_TEST(tokenizer_merges_both_encodings) {
    char *path = lm_test_fixture_path("tokenizers/tiny-bpe/tokenizer.json");
    if (!path) LM_SKIP("%s", lm_test_fixtures_why());
    json_t *root = json_load_file(path, 0, NULL);
    LM_REQUIRE(root);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    LM_REQUIRE(json_array_size(merges) > 100 && json_is_array(json_array_get(merges, 0)));
    char *pairs = json_dumps(root, JSON_COMPACT);
    for (size_t i = 0; i < json_array_size(merges); i++) { /* [a, b] -> "a b" */
        json_t *m = json_array_get(merges, i);
        char buf[512];
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                 json_string_value(json_array_get(m, 1)));
        json_array_set_new(merges, i, json_string(buf));
    }
    char *strings = json_dumps(root, JSON_COMPACT);
    lm_err e = { { 0 } };
    lm_tokenizer *a = load_str(pairs, &e), *b = load_str(strings, &e);
    LM_REQUIRE(a && b);
    const char *texts[] = { "Hello, world! The quick brown fox.", "  spaces\n\nand\ttabs 12345",
                            "café naïve 日本語 😀", "" };
    for (size_t i = 0; i < LM_COUNT(texts); i++) {
        lm_tok_ids x = { 0 }, y = { 0 };
        lm_tokenizer_encode(a, texts[i], strlen(texts[i]), true, &x, &e);
        lm_tokenizer_encode(b, texts[i], strlen(texts[i]), true, &y, &e);
        LM_CHECK(x.n == y.n && (x.n == 0 || !memcmp(x.ids, y.ids, x.n * sizeof *x.ids)));
        LM_CHECK(i == 3 || x.n > 3);
        lm_tok_ids_free(&x);
        lm_tok_ids_free(&y);
    }
    lm_tokenizer_free(a);
    lm_tokenizer_free(b);
    free(pairs);
    free(strings);
    json_decref(root);
    free(path);
}

/* ---- SentencePiece-style BPE: byte fallback, unk fusing, Strip decoder ---- */

static const char k_spm[] =
    "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x41>\":3,\"<0xC3>\":4,\"<0xA9>\":5,"
    "\"\xE2\x96\x81\":6,\"a\":7,\"b\":8,\"\xE2\x96\x81" "a\":9,\"ab\":10,\"\xE2\x96\x81" "ab\":11},"
    "\"merges\":[\"\xE2\x96\x81 a\",\"a b\",\"\xE2\x96\x81" "a b\"]},"
    "\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
    "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}}";

LM_TEST(tokenizer_spm_byte_fallback) {
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(k_spm, &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "ab a", false, 11, 9);
    ENC(t, "ab a", true, 1, 11, 9);
    ENC(t, "\xC3\xA9", false, 6, 4, 5); /* é: no token, two byte tokens */
    ENC(t, "A", false, 6, 3);
    ENC(t, "x", false, 6, 0);         /* no byte token for 'x': unk */
    ENC(t, "xxx", false, 6, 0);       /* fuse_unk */
    ENC(t, "x</s>x", false, 6, 0, 2, 6, 0); /* normalisation runs per segment */
    ENC(t, "", true, 1);
    DEC(t, false, "ab a", 11, 9);
    DEC(t, false, "<s> ab a", 1, 11, 9);  /* Strip only cuts a space at the very start */
    DEC(t, true, "ab a", 1, 11, 9);
    DEC(t, false, "\xC3\xA9", 6, 4, 5);
    DEC(t, false, "\xEF\xBF\xBD" "a", 4, 7);                 /* a lone lead byte */
    DEC(t, false, "\xEF\xBF\xBD\xEF\xBF\xBD" "a", 4, 4, 7); /* one U+FFFD per byte */
    DEC(t, false, "a", 7, 99999, -5);                        /* unknown ids are skipped */
    LM_CHECK(lm_tokenizer_bos(t) == 1 && lm_tokenizer_adds_bos(t) && !lm_tokenizer_adds_eos(t));
    LM_CHECK(lm_tokenizer_is_special(t, 2) && !lm_tokenizer_is_special(t, 7));
    LM_CHECK(lm_tokenizer_token_to_id(t, "\xE2\x96\x81" "ab", 5) == 11);
    size_t l;
    const char *s = lm_tokenizer_id_to_token(t, 1, &l);
    LM_CHECK(s && l == 3 && !memcmp(s, "<s>", 3));
    LM_CHECK(lm_tokenizer_id_to_token(t, 12, &l) == NULL);
    lm_tokenizer_free(t);
}

/* Long SentencePiece words are cut before "▁" only where no merge crosses:
 * here "b▁" is a token (and its merge ranks first), so no cut after 'b'. */
LM_TEST(tokenizer_spm_long_word_cuts) {
    const char *json =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xE2\x96\x81\":0,\"a\":1,\"b\":2,\"\xE2\x96\x81" "a\":3,"
        "\"ab\":4,\"\xE2\x96\x81" "ab\":5,\"b\xE2\x96\x81\":6,\"c\":7},"
        "\"merges\":[\"b \xE2\x96\x81\",\"\xE2\x96\x81 a\",\"a b\",\"\xE2\x96\x81" "a b\"]},"
        "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}}";
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(json, &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, " ab ab ab ab ab ab", false, 3, 6, 1, 6, 1, 6, 1, 6, 1, 6, 4);
    ENC(t, " ac ac ac ac ac ac", false, 3, 7, 3, 7, 3, 7, 3, 7, 3, 7, 3, 7); /* cut after 'c' */
    lm_tokenizer_free(t);
}

/* ---- added tokens: lstrip / rstrip / single_word / normalized ---- */

static const char k_added[] =
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\" \":0,\"a\":1,\"b\":2,\"k\":3,\"o\":4,\"t\":5,\"x\":6,\"<\":7,\">\":8,\"n\":9},"
    "\"merges\":[]},\"normalizer\":{\"type\":\"Lowercase\"},"
    "\"added_tokens\":["
    "{\"id\":100,\"content\":\"<X>\",\"special\":true,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"single_word\":false},"
    "{\"id\":101,\"content\":\"tok\",\"special\":false,\"single_word\":true,\"normalized\":false},"
    "{\"id\":102,\"content\":\"<n>\",\"special\":false,\"normalized\":true}]}";

LM_TEST(tokenizer_added_token_flags) {
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(k_added, &e);
    LM_REQUIRE_MSG_(t, e);
    /* the file says 100..102; HF numbers new added tokens from the vocabulary
     * size (10), and so do we */
    ENC(t, "a <X> b", false, 1, 10, 2);            /* both spaces stripped */
    ENC(t, "a  <X>b", false, 1, 10, 2);
    ENC(t, "tok atok tok", false, 11, 0, 1, 5, 4, 3, 0, 11); /* not inside a word */
    ENC(t, "<N>", false, 12);                       /* matched after lowercasing */
    ENC(t, "<x>", false, 7, 6, 8);                  /* <X> is matched raw only */
    DEC(t, false, "a <X> b", 1, 10, 2);            /* no decoder: joined with spaces */
    DEC(t, true, "a b", 1, 10, 2);
    LM_CHECK(lm_tokenizer_n_added(t) == 3);
    const char *c;
    bool sp;
    LM_CHECK(lm_tokenizer_added(t, 1, &c, &sp) == 11 && !strcmp(c, "tok") && !sp);
    LM_CHECK(lm_tokenizer_n_vocab(t) == 13);
    lm_tokenizer_free(t);
}

/* ---- Metaspace pre-tokenizer and decoder ---- */

static char *metaspace_json(const char *scheme) {
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xE2\x96\x81\":0,\"a\":1,\"b\":2,\"\xE2\x96\x81" "a\":3,"
             "\"\xE2\x96\x81" "b\":4,\"<s>\":5},\"merges\":[[\"\xE2\x96\x81\",\"a\"],[\"\xE2\x96\x81\",\"b\"]]},"
             "\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
             "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"%s\",\"split\":true},"
             "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"%s\",\"split\":true}}",
             scheme, scheme);
    return buf;
}

LM_TEST(tokenizer_metaspace) {
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(metaspace_json("first"), &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "a b", false, 3, 4);
    ENC(t, "<s>a b", false, 5, 1, 4); /* not at the start of the text: no prefix */
    DEC(t, false, "a b", 3, 4);       /* HF drops every ▁ of the first token */
    DEC(t, false, " a b", 0, 3, 4);   /* ...only of the first token */
    lm_tokenizer_free(t);
    t = load_str(metaspace_json("always"), &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "<s>a b", false, 5, 3, 4);
    lm_tokenizer_free(t);
    t = load_str(metaspace_json("never"), &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "a b", false, 1, 4);
    DEC(t, false, " a b", 3, 4);
    lm_tokenizer_free(t);
}

/* ---- normalizers and pre-tokenizers the fixtures do not use ---- */

LM_TEST(tokenizer_normalizers_pretokenizers) {
    /* NFKC + Lowercase + Strip, Digits + Punctuation + WhitespaceSplit; a
     * vocabulary of single characters with unk, so ids spell the pieces. */
    const char *json =
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"vocab\":{\"?\":0,\"a\":1,\"b\":2,\"1\":3,\"2\":4,\",\":5,"
        "\"i\":6,\"\xCC\x87\":7,\"fi\":8,\"f\":9},\"merges\":[\"f i\"]},"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
        "{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true}]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"},"
        "{\"type\":\"Digits\",\"individual_digits\":true},{\"type\":\"Punctuation\",\"behavior\":\"Isolated\"}]}}";
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(json, &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "  AB12,a  ", false, 1, 2, 3, 4, 5, 1);
    ENC(t, "\xEF\xAC\x81", false, 8);          /* U+FB01 ﬁ -> "fi" under NFKC, then merged */
    ENC(t, "\xC4\xB0", false, 6, 7);           /* İ lowercases to i + U+0307 */
    ENC(t, "\xEF\xBC\xA1", false, 1);           /* fullwidth A -> a */
    lm_tokenizer_free(t);
}

/* HF matches regexes with Unicode 16 tables; PCRE2 here is older. U+105E4
 * (Todhri, new in 16.0) must count as \p{L}; U+0085 as \s. */
LM_TEST(tokenizer_regex_unicode16) {
    const char *json =
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"vocab\":{\"?\":0,\"a\":1,\"b\":2},\"merges\":[]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[\\\\p{L}\\\\s]+\"},\"behavior\":\"Removed\",\"invert\":true},"
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s\"},\"behavior\":\"Removed\",\"invert\":false}]}}";
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(json, &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "a\xF0\x90\x97\xA4" "b", false, 1, 0, 2); /* kept: a letter */
    ENC(t, "a!b", false, 1, 2);                         /* '!' removed */
    ENC(t, "a\xC2\x85" "b", false, 1, 2);               /* NEL is whitespace: removed */
    lm_tokenizer_free(t);
}

/* Whitespace is \w+|[^\w\s]+ in Oniguruma's Unicode sense (answers from HF
 * tokenizers 0.22): marks, Nd, Nl, Pc and joiners are word characters, No
 * (½) is not. A word's later characters take the "##" prefix. */
LM_TEST(tokenizer_regex_word_class) {
    const char *json =
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"continuing_subword_prefix\":\"##\","
        "\"vocab\":{\"?\":0,\"a\":1,\"b\":2,\"##b\":3},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Whitespace\"}}";
    lm_err e = { { 0 } };
    lm_tokenizer *t = load_str(json, &e);
    LM_REQUIRE_MSG_(t, e);
    ENC(t, "a\xC2\xBD" "b", false, 1, 0, 2);          /* ½ splits */
    ENC(t, "ae\xCC\x81" "b", false, 1, 0, 0, 3);       /* combining acute stays in */
    ENC(t, "a\xE2\x80\xBF" "b", false, 1, 0, 3);      /* U+203F Pc */
    ENC(t, "a\xE2\x85\xAB" "b", false, 1, 0, 3);      /* Roman numeral twelve, Nl */
    ENC(t, "a\xE0\xA4\x83" "b", false, 1, 0, 3);      /* Devanagari visarga, Mc */
    ENC(t, "a\xF0\x90\x97\xA4" "b", false, 1, 0, 3);  /* Unicode 16 letter */
    ENC(t, "a\xE2\x80\x8D" "b", false, 1, 0, 3);      /* zero-width joiner */
    ENC(t, "a!b", false, 1, 0, 2);
    lm_tokenizer_free(t);
}

/* ---- errors: malformed or unsupported files say where ---- */

static void expect_error(lm_test_ctx *lm_t_, const char *json, const char *want1, const char *want2) {
    lm_err e = { { 0 } };
    lm_tokenizer *t = (lm_tokenizer *)1;
    int rc = lm_tokenizer_load_json(&t, json, strlen(json), NULL, 0, "bad.json", &e);
    LM_CHECK(rc == -1 && t == NULL);
    LM_CHECK_MSG(strstr(e.msg, want1) && (!want2 || strstr(e.msg, want2)), "message: %s", e.msg);
    LM_CHECK(strstr(e.msg, "bad.json") != NULL);
}

LM_TEST(tokenizer_malformed_json) {
    expect_error(lm_t_, "{\"model\": {\"vocab\": {\"a\": 0,\n  }}", "line 2", "column");
    expect_error(lm_t_, "", "line 1", NULL);
    expect_error(lm_t_, "[1,2]", "expected an object", NULL);
    expect_error(lm_t_, "{}", "model", NULL);
    expect_error(lm_t_, "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "Unigram", NULL);
    expect_error(lm_t_, "{\"model\":{\"vocab\":{\"a\":-1},\"merges\":[]}}", "model.vocab", "bad id");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}", "model.vocab", "share");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", "model.merges[0]", "\"b\"");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", "model.merges[0]", "merged");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a a a\"]}}", "model.merges[0]", NULL);
    expect_error(lm_t_, "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", "model.merges[0]", NULL);
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"Nope\"}}", "pre_tokenizer", "Nope");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"}]}}",
                 "pre_tokenizer.pretokenizers[0]", "offset");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"a\"},\"behavior\":\"Sideways\"}}", "pre_tokenizer", "Sideways");
    /* broken regexes survive the Oniguruma -> PCRE2 rewrite as PCRE2 errors */
    static const char *const bad_re[] = { "\\\\p{L", "[\\\\p{L}", "abc\\\\", "\\\\p", "[[:alpha:", "\\\\w{99999999999}" };
    for (size_t i = 0; i < LM_COUNT(bad_re); i++) {
        char j[512];
        snprintf(j, sizeof j, "{\"model\":{\"vocab\":{}},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"%s\"},\"behavior\":\"Isolated\"}}", bad_re[i]);
        expect_error(lm_t_, j, "pre_tokenizer", "regex");
    }
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{}]}}", "decoder.decoders[1]", NULL);
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"normalizer\":{\"type\":\"Precompiled\"}}", "normalizer", "Precompiled");
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"added_tokens\":[{\"id\":\"x\"}]}", "added_tokens[0]", NULL);
    expect_error(lm_t_, "{\"model\":{\"vocab\":{}},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],\"special_tokens\":{}}}", "post_processor", "<s>");
    /* a missing file names the path */
    lm_err e = { { 0 } };
    lm_tokenizer *t;
    LM_CHECK(lm_tokenizer_load(&t, "/nonexistent/dir/tokenizer.json", &e) == -1);
    LM_CHECK(strstr(e.msg, "/nonexistent/dir/tokenizer.json") != NULL);
}

/* ---- invalid UTF-8 in, streaming out ---- */

static lm_tokenizer *load_fixture(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    char *dir = lm_test_fixture_path(rel);
    if (!dir) return NULL;
    lm_err e = { { 0 } };
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_load(&t, dir, &e)) fprintf(stderr, "  %s\n", e.msg);
    free(dir);
    return t;
}

LM_TEST(tokenizer_invalid_utf8_input) {
    lm_tokenizer *t = load_fixture("qwen3");
    if (!t) LM_SKIP("%s", lm_test_fixtures_why());
    lm_err e = { { 0 } };
    lm_tok_ids a = { 0 }, b = { 0 };
    const char bad[] = "ok \xff\xfe \xe2\x82 end \xf0\x9f\x98";
    const char fixed[] = "ok \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD end \xEF\xBF\xBD";
    LM_CHECK(lm_tokenizer_encode(t, bad, sizeof bad - 1, false, &a, &e) == 0);
    LM_CHECK(lm_tokenizer_encode(t, fixed, sizeof fixed - 1, false, &b, &e) == 0);
    LM_CHECK(a.n == b.n && a.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids));
    lm_tok_ids_free(&a);
    lm_tok_ids_free(&b);
    lm_tokenizer_free(t);
}

LM_TEST(tokenizer_stream_whole_chars) {
    lm_tokenizer *t = load_fixture("qwen3");
    if (!t) LM_SKIP("%s", lm_test_fixtures_why());
    const char *text = "A😀 émoji 👍🏽 日本語 \xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88!";
    lm_err e = { { 0 } };
    lm_tok_ids ids = { 0 };
    LM_REQUIRE(lm_tokenizer_encode(t, text, strlen(text), false, &ids, &e) == 0);
    lm_detok *d = lm_detok_create(t, false);
    lm_tok_str all = { 0 };
    int held = 0;
    for (size_t i = 0; i < ids.n; i++) {
        lm_tok_str piece = { 0 };
        lm_detok_push(d, ids.ids[i], &piece);
        if (!piece.len) held++;
        /* every piece is whole UTF-8 on its own */
        lm_tok_str chk = { 0 };
        bool valid = true;
        for (size_t j = 0; j < piece.len;) {
            unsigned char c = (unsigned char)piece.s[j];
            size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            if (j + l > piece.len) valid = false;
            for (size_t k = 1; k < l && j + k < piece.len; k++)
                if (((unsigned char)piece.s[j + k] & 0xC0) != 0x80) valid = false;
            j += l;
        }
        LM_CHECK(valid);
        if (piece.len) {
            all.s = realloc(all.s, all.len + piece.len + 1);
            memcpy(all.s + all.len, piece.s, piece.len);
            all.len += piece.len;
        }
        lm_tok_str_free(&chk);
        lm_tok_str_free(&piece);
    }
    lm_tok_str tail = { 0 };
    lm_detok_finish(d, &tail);
    LM_CHECK(tail.len == 0);
    LM_CHECK(held > 0); /* some emoji took several byte-level tokens */
    LM_CHECK(all.len == strlen(text) && !memcmp(all.s, text, all.len));
    /* a cut-off character decodes to U+FFFD, as HF's lossy decode does */
    size_t cut = 0;
    for (size_t i = 0; i < ids.n && !cut; i++) {
        lm_tok_str s = { 0 };
        lm_tokenizer_decode(t, ids.ids, i + 1, false, &s);
        if (s.len >= 3 && !memcmp(s.s + s.len - 3, "\xEF\xBF\xBD", 3)) cut = i + 1;
        lm_tok_str_free(&s);
    }
    LM_CHECK(cut > 0);
    lm_tok_str_free(&tail);
    free(all.s);
    lm_detok_free(d);
    lm_tok_ids_free(&ids);
    lm_tokenizer_free(t);
}

/* ---- tokenizer_config.json: chat template and special token strings ---- */

LM_TEST(tokenizer_config_fields) {
    lm_tokenizer *t = load_fixture("gemma3");
    if (!t) LM_SKIP("%s", lm_test_fixtures_why());
    LM_CHECK(lm_tokenizer_chat_template(t) && strstr(lm_tokenizer_chat_template(t), "start_of_turn"));
    LM_CHECK(!strcmp(lm_tokenizer_bos_token(t), "<bos>") && lm_tokenizer_bos(t) == 2);
    LM_CHECK(!strcmp(lm_tokenizer_eos_token(t), "<end_of_turn>") && lm_tokenizer_eos(t) == 106);
    LM_CHECK(lm_tokenizer_pad(t) == 0 && lm_tokenizer_adds_bos(t));
    lm_tokenizer_free(t);
    t = load_fixture("llama3");
    LM_REQUIRE(t);
    LM_CHECK(lm_tokenizer_bos(t) == 128000 && lm_tokenizer_eos(t) == 128001);
    LM_CHECK(!lm_tokenizer_adds_bos(t)); /* this release's post-processor adds none */
    lm_tokenizer_free(t);
    /* chat_template.jinja beside tokenizer.json, bos_token as an object */
    char *dir = lm_tu_mkdir("tokcfg");
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    LM_REQUIRE(lm_tu_write(p, k_spm, strlen(k_spm)) == 0);
    const char *cfg = "{\"bos_token\":{\"content\":\"<s>\",\"lstrip\":false},\"eos_token\":\"</s>\","
                      "\"model_max_length\":1000000000000000019884624838656,\"chat_template\":\"X\"}";
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    LM_REQUIRE(lm_tu_write(p, cfg, strlen(cfg)) == 0);
    lm_err e = { { 0 } };
    LM_REQUIRE(lm_tokenizer_load(&t, dir, &e) == 0);
    LM_CHECK(!strcmp(lm_tokenizer_bos_token(t), "<s>") && lm_tokenizer_eos(t) == 2);
    LM_CHECK(!strcmp(lm_tokenizer_chat_template(t), "X"));
    lm_tokenizer_free(t);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    LM_REQUIRE(lm_tu_write(p, "{{ messages }}", 14) == 0);
    LM_REQUIRE(lm_tokenizer_load(&t, dir, &e) == 0);
    LM_CHECK(!strcmp(lm_tokenizer_chat_template(t), "{{ messages }}"));
    lm_tokenizer_free(t);
    free(dir);
}

/* ---- several threads encoding with one tokenizer ---- */

typedef struct enc_job {
    lm_tokenizer *t;
    const char *text;
    lm_tok_ids ids;
} enc_job;

static void *enc_thread(void *arg) {
    enc_job *j = arg;
    lm_err e = { { 0 } };
    for (int r = 0; r < 20; r++) {
        j->ids.n = 0;
        lm_tokenizer_encode(j->t, j->text, strlen(j->text), true, &j->ids, &e);
    }
    return NULL;
}

LM_TEST(tokenizer_threads) {
    lm_tokenizer *t = load_fixture("tiny-bpe");
    if (!t) LM_SKIP("%s", lm_test_fixtures_why());
    const char *text = "Several threads share one tokenizer: the word cache is locked, "
                       "and a thread that finds it busy encodes without it. 12345 \xF0\x9F\x98\x80";
    enc_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (enc_job){ t, text, { 0 } };
        LM_REQUIRE(pthread_create(&th[i], NULL, enc_thread, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++)
        LM_CHECK(jobs[i].ids.n == jobs[0].ids.n && !memcmp(jobs[i].ids.ids, jobs[0].ids.ids, jobs[0].ids.n * 4));
    LM_CHECK(jobs[0].ids.n > 20);
    for (int i = 0; i < 4; i++) lm_tok_ids_free(&jobs[i].ids);
    lm_tokenizer_free(t);
}

/* A check across sections (a post_processor id outside the vocabulary)
 * names the file like every other load error (found by fuzz_tokenizer_json's
 * section form). */
LM_TEST(tokenizer_cross_section_error_names_the_file) {
    static const char doc[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<x>\":{\"id\":\"<x>\",\"ids\":[99],\"tokens\":[\"<x>\"]}}}}";
    lm_tokenizer *t = NULL;
    lm_err e = { { 0 } };
    LM_CHECK(lm_tokenizer_load_json(&t, doc, sizeof doc - 1, NULL, 0, "my.json", &e) != 0 && t == NULL);
    LM_CHECK_MSG(!strncmp(e.msg, "my.json", 7) && strstr(e.msg, "outside the vocabulary"), "%s", e.msg);
}
