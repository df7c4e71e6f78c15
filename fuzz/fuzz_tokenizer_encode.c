/* fuzz_tokenizer_encode.c - libFuzzer harness: any bytes to encode.
 *
 * The first byte picks the tokenizer and add_special; the rest is the text
 * (not necessarily UTF-8). Every id must be inside the vocabulary, decoding
 * must keep the invariants of fuzz_tokenizer_common.h (skipping special
 * tokens when add_special is set), and without special tokens the byte-level
 * tokenizer must give back the (UTF-8-repaired) text. The Unicode normal
 * forms must equal utf8proc run on the whole text. */
#include "fuzz_tokenizer_common.h"

#include <utf8proc.h>

/* The normal forms skip characters they leave alone; the result must equal
 * utf8proc on the whole string. */
static void check_forms(const char *s, size_t n) {
    static const tok_norm_kind kinds[] = { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD };
    static const int opts[] = { UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE, UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                                UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT };
    for (int k = 0; k < 4; k++) {
        tok_normalizer nz = { .kind = kinds[k] };
        lm_tok_str out = { 0 }, tmp = { 0 };
        tok_regex_scratch rs = { 0 };
        tok_normalize(&nz, s, n, &out, &tmp, &rs);
        utf8proc_uint8_t *want = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &want,
                                          (utf8proc_option_t)(opts[k] | UTF8PROC_STABLE));
        LM_ASSERT(r >= 0 && (size_t)r == out.len && !memcmp(want, out.s, out.len));
        free(want);
        lm_tok_str_free(&out);
        lm_tok_str_free(&tmp);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_init();
    if (size < 1) return 0;
    lm_tokenizer *t = g_fz_tok[data[0] % g_fz_n];
    bool special = data[0] & 0x80;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    lm_tok_ids ids = { 0 };
    lm_err e = { { 0 } };
    LM_ASSERT(lm_tokenizer_encode(t, text, n, special, &ids, &e) == 0);
    for (size_t i = 0; i < ids.n; i++) LM_ASSERT(ids.ids[i] >= 0 && ids.ids[i] < lm_tokenizer_n_vocab(t));
    lm_tok_str out = { 0 };
    fz_check_decode(t, ids.ids, ids.n, special, &out);
    if (t == g_fz_tok[0] && !special) { /* byte-level, no normaliser: lossless */
        lm_tok_str want = { 0 };
        tok_utf8_lossy(&want, text, n);
        tok_str_reserve(&want, 0);
        LM_ASSERT(out.len == want.len && !memcmp(out.s, want.s, want.len));
        lm_tok_str_free(&want);
    }
    lm_tok_str clean = { 0 };
    tok_utf8_lossy(&clean, text, n);
    tok_str_reserve(&clean, 0);
    check_forms(clean.s, clean.len);
    lm_tok_str_free(&clean);
    lm_tok_str_free(&out);
    lm_tok_ids_free(&ids);
    return 0;
}
