/* fuzz_tokenizer_common.h - tokenizers built in memory for the tokenizer
 * harnesses, and the invariants every encode/decode must keep.
 *
 * Three tokenizers cover the code paths: a byte-level BPE (GPT-2 bytes, the
 * Qwen split regex, NFC, added tokens, TemplateProcessing), a
 * SentencePiece-style one (Prepend/Replace normaliser, byte fallback, unk,
 * Replace/ByteFallback/Fuse/Strip decoder) and a Metaspace one with
 * lstrip/rstrip/single_word added tokens and a Lowercase normaliser.
 * LUMEN_FUZZ_TOKENIZER=PATH adds a real one (a tokenizer.json, folder or
 * .gguf). Invariants (LM_ASSERT, so a break is a crash): decoding gives valid
 * UTF-8; the streaming detokenizer's pieces are whole UTF-8 and concatenate
 * to decode(); the byte-level tokenizer round-trips any text (after lossy
 * UTF-8 repair) - its added tokens are ASCII because HF, too, runs added
 * tokens through the ByteLevel decoder, which garbles non-ASCII ones. */
#ifndef FUZZ_TOKENIZER_COMMON_H
#define FUZZ_TOKENIZER_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define FZ_MAX_TOK 4

static lm_tokenizer *g_fz_tok[FZ_MAX_TOK] __attribute__((unused));
static int g_fz_n __attribute__((unused));

static inline void fz_add(lm_tokenizer *t) {
    if (t) g_fz_tok[g_fz_n++] = t;
}

static inline void fz_put_cp(lm_tok_str *s, uint32_t cp) {
    char b[4];
    tok_str_append(s, b, (size_t)tok_utf8_put(cp, b));
}

/* A JSON string literal of bytes already valid UTF-8. */
static inline void fz_json_str(lm_tok_str *s, const char *p, size_t n) {
    tok_str_append(s, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '"' || c == '\\') tok_str_append(s, "\\", 1);
        if ((unsigned char)c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", (unsigned char)c);
            tok_str_append(s, e, 6);
        } else tok_str_append(s, &c, 1);
    }
    tok_str_append(s, "\"", 1);
}

static inline char *fz_bytelevel_json(void) {
    lm_tok_str s = { 0 };
    tok_str_append(&s, "{\"model\":{\"type\":\"BPE\",\"vocab\":{", 32);
    for (int b = 0; b < 256; b++) {
        lm_tok_str k = { 0 };
        fz_put_cp(&k, tok_byte_to_cp[b]);
        fz_json_str(&s, k.s, k.len);
        char v[16];
        snprintf(v, sizeof v, ":%d,", b);
        tok_str_append(&s, v, strlen(v));
        lm_tok_str_free(&k);
    }
    static const char *const extra =
        "\"\xC4\xA0t\":256,\"he\":257,\"\xC4\xA0the\":258,\"in\":259,\"\xC4\xA0\xC4\xA0\":260,\"er\":261,"
        "\"\xC3\xA4\xC2\xBD\":262,\"\xC3\xA4\xC2\xBD\xC5\x82\":263},"
        "\"merges\":[\"\xC4\xA0 t\",\"h e\",\"\xC4\xA0t he\",\"i n\",\"\xC4\xA0 \xC4\xA0\",\"e r\","
        "[\"\xC3\xA4\",\"\xC2\xBD\"],[\"\xC3\xA4\xC2\xBD\",\"\xC5\x82\"]]},"
        "\"added_tokens\":[{\"id\":264,\"content\":\"<|im_start|>\",\"special\":true,\"normalized\":false},"
        "{\"id\":265,\"content\":\"<think>\",\"special\":false,\"normalized\":false},"
        "{\"id\":266,\"content\":\"cafe\",\"special\":false,\"normalized\":true}],"
        "\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|im_start|>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<|im_start|>\":{\"id\":\"<|im_start|>\",\"ids\":[264],\"tokens\":[\"<|im_start|>\"]}}},"
        "\"decoder\":{\"type\":\"ByteLevel\"}}";
    tok_str_append(&s, extra, strlen(extra));
    return s.s;
}

static const char k_fz_spm[] =
    "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0x41>\":3,\"<0xC3>\":4,\"<0xA9>\":5,\"<0xF0>\":6,\"<0x9F>\":7,"
    "\"\xE2\x96\x81\":8,\"a\":9,\"b\":10,\"\xE2\x96\x81" "a\":11,\"ab\":12,\"\xE2\x96\x81" "ab\":13,\" \":14},"
    "\"merges\":[\"\xE2\x96\x81 a\",\"a b\",\"\xE2\x96\x81" "a b\"]},"
    "\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
    "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false,\"rstrip\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":1}]}}";

static const char k_fz_meta[] =
    "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"continuing_subword_prefix\":\"##\",\"end_of_word_suffix\":\"</w>\","
    "\"vocab\":{\"?\":0,\"\xE2\x96\x81\":1,\"a\":2,\"##b\":3,\"b</w>\":4,\"##b</w>\":5,\"\xE2\x96\x81" "a\":6,\"<X>\":7,\"w\":8,\"a##b\":9,\"ab\":10},"
    "\"merges\":[\"\xE2\x96\x81 a\",\"a ##b\"]},"
    "\"added_tokens\":[{\"id\":7,\"content\":\"<X>\",\"special\":true,\"lstrip\":true,\"rstrip\":true,\"normalized\":false},"
    "{\"id\":8,\"content\":\"w\",\"special\":false,\"single_word\":true,\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},{\"type\":\"Strip\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":false},"
    "{\"type\":\"Punctuation\",\"behavior\":\"MergedWithNext\"},{\"type\":\"Split\",\"pattern\":{\"String\":\"b\"},\"behavior\":\"MergedWithPrevious\"},"
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s*\"},\"behavior\":\"Contiguous\",\"invert\":true},"
    "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"first\",\"split\":true}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"first\"},"
    "{\"type\":\"BPEDecoder\",\"suffix\":\"</w>\"},{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"
    "{\"type\":\"Strip\",\"content\":\"a\",\"start\":2,\"stop\":2}]}}";

static inline void fz_init(void) {
    if (g_fz_n) return;
    lm_err e = { { 0 } };
    lm_tokenizer *t = NULL;
    char *bl = fz_bytelevel_json();
    if (lm_tokenizer_load_json(&t, bl, strlen(bl), NULL, 0, "bytelevel", &e)) {
        fprintf(stderr, "fuzz: %s\n", e.msg);
        abort();
    }
    free(bl);
    fz_add(t); /* index 0: the round-trip one */
    if (lm_tokenizer_load_json(&t, k_fz_spm, sizeof k_fz_spm - 1, NULL, 0, "spm", &e) ||
        (fz_add(t), lm_tokenizer_load_json(&t, k_fz_meta, sizeof k_fz_meta - 1, NULL, 0, "meta", &e))) {
        fprintf(stderr, "fuzz: %s\n", e.msg);
        abort();
    }
    fz_add(t);
    const char *real = getenv("LUMEN_FUZZ_TOKENIZER");
    if (real) {
        if (lm_tokenizer_load(&t, real, &e)) {
            fprintf(stderr, "fuzz: %s\n", e.msg);
            abort();
        }
        fz_add(t);
    }
}

/* Decodes ids both ways and checks the invariants; returns decode() in out. */
static inline void fz_check_decode(lm_tokenizer *t, const int32_t *ids, size_t n, bool skip, lm_tok_str *out) {
    lm_tokenizer_decode(t, ids, n, skip, out);
    LM_ASSERT(tok_utf8_valid(out->s, out->len));
    lm_detok *d = lm_detok_create(t, skip);
    lm_tok_str all = { 0 }, piece = { 0 };
    for (size_t i = 0; i <= n; i++) {
        piece.len = 0;
        if (i < n) lm_detok_push(d, ids[i], &piece);
        else lm_detok_finish(d, &piece);
        LM_ASSERT(tok_utf8_valid(piece.s, piece.len)); /* whole characters only */
        tok_str_append(&all, piece.s, piece.len);
    }
    LM_ASSERT(all.len == out->len && !memcmp(all.s, out->s, out->len));
    lm_detok_free(d);
    lm_tok_str_free(&all);
    lm_tok_str_free(&piece);
}

#endif
