/* normalize.c - Hugging Face normalizers: string in, string out.
 *
 * Unicode normal forms come from utf8proc; the rest (Replace, Prepend,
 * Lowercase with Rust's char::to_lowercase, Strip, StripAccents, Bert,
 * ByteLevel) are small loops written here because they are HF-specific.
 * Each step reads one buffer and writes another; Sequence ping-pongs
 * between out and tmp. */
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"

void tok_normalizer_free(tok_normalizer *nz) {
    if (!nz) return;
    for (int i = 0; i < nz->n_sub; i++) tok_normalizer_free(&nz->sub[i]);
    free(nz->sub);
    free(nz->content);
    tok_pattern_free(&nz->pat);
}

static bool frozen(uint32_t cp);

static void set(lm_tok_str *out, const char *p, size_t n) {
    out->len = 0;
    tok_str_append(out, p, n);
}

static void map_span(int opts, const char *in, size_t n, lm_tok_str *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(opts | UTF8PROC_STABLE));
    if (r < 0) tok_str_append(out, in, n); /* cannot happen on valid UTF-8; keep the text */
    else tok_str_append(out, dst, (size_t)r);
    free(dst);
}

/* A normal form, passing "inert" characters through untouched: below U+0300
 * for NFC (every such character is NFC already, a starter, and never the
 * second half of a composition), ASCII for the other forms. utf8proc only
 * sees each stretch of other characters together with the inert character
 * before it (which may compose with them), so mostly-Latin text costs a
 * scan, and the result equals normalising the whole string. */
/* HF's tables are Unicode 10: characters assigned later, which utf8proc
 * would change, are starters without mappings there; they pass through and
 * nothing composes or reorders across them. */
static bool frozen(uint32_t cp) {
    return cp >= 0x300 && tok_uni_in(tok_uni_norm_new, tok_uni_norm_new_n, cp);
}

static void unicode_form(int opts, const char *in, size_t n, lm_tok_str *out) {
    uint32_t inert = (opts & UTF8PROC_COMPOSE) && !(opts & UTF8PROC_COMPAT) ? 0x300 : 0x80;
    out->len = 0;
    tok_str_reserve(out, n);
    size_t i = 0;
    while (i < n) {
        size_t j = i, prev = i;
        int l = 1;
        while (j < n && tok_utf8_cp(in + j, n - j, &l) < inert) prev = j, j += (size_t)l;
        if (j == n) {
            tok_str_append(out, in + i, n - i);
            break;
        }
        size_t start = j > i ? prev : j, k = j;
        uint32_t c = 0;
        while (k < n && (c = tok_utf8_cp(in + k, n - k, &l)) >= inert && !frozen(c)) k += (size_t)l;
        tok_str_append(out, in + i, start - i);
        if (k > start) map_span(opts, in + start, k - start, out);
        if (k < n && c >= inert && frozen(c)) { /* pass it through; the next region starts after */
            tok_str_append(out, in + k, (size_t)l);
            k += (size_t)l;
        }
        i = k;
    }
}

static void lowercase(const char *in, size_t n, lm_tok_str *out) {
    out->len = 0;
    tok_str_reserve(out, n + 8);
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = tok_utf8_cp(in + i, n - i, &l);
        char b[8];
        int k;
        if (c == 0x130) { /* the one unconditional multi-char lowercase mapping */
            k = tok_utf8_put('i', b);
            k += tok_utf8_put(0x307, b + k);
        } else {
            k = tok_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)c), b);
        }
        tok_str_append(out, b, (size_t)k);
        i += (size_t)l;
    }
}

static void replace(const tok_normalizer *nz, const char *in, size_t n, lm_tok_str *out,
                    tok_regex_scratch *rs) {
    tok_spans sp = { 0 };
    tok_find_matches(&nz->pat, in, n, &sp, rs);
    out->len = 0;
    tok_str_reserve(out, n);
    for (size_t i = 0; i < sp.n; i++) {
        if (sp.v[i].match) tok_str_append(out, nz->content, nz->content_len);
        else tok_str_append(out, in + sp.v[i].start, sp.v[i].end - sp.v[i].start);
    }
    free(sp.v);
}

/* HF's BertNormalizer is_control: "other" characters (Cc, Cf, Co) except
 * \t \n \r; unassigned ones stay (checked against HF 0.22). */
static bool is_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c); /* HF's tables are old: */
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO; /* no Unicode 16 */
}

static bool is_chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Per-character filter/map steps: Strip accents, Bert cleaning. */
static void filter_chars(const char *in, size_t n, lm_tok_str *out, int mode) {
    out->len = 0;
    tok_str_reserve(out, n);
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = tok_utf8_cp(in + i, n - i, &l);
        char b[4];
        i += (size_t)l;
        if (mode == 0 || mode == 3) {
            /* StripAccents drops every mark (unicode-normalization's
             * is_combining_mark); Bert's strip_accents only Mn. Both with
             * tables older than utf8proc's: later marks stay. */
            utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
            bool mark = mode == 0 ? k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME
                                  : k == UTF8PROC_CATEGORY_MN;
            if (mark && !frozen(c)) continue;
        } else if (mode == 1) { /* bert clean text */
            if (c == 0 || c == 0xFFFD || is_control(c)) continue;
            if (tok_is_whitespace(c)) c = ' ';
        } else if (mode == 2 && is_chinese(c)) { /* bert chinese chars */
            tok_str_append(out, " ", 1);
            tok_str_append(out, b, (size_t)tok_utf8_put(c, b));
            tok_str_append(out, " ", 1);
            continue;
        }
        tok_str_append(out, b, (size_t)tok_utf8_put(c, b));
    }
}

static void strip(bool left, bool right, const char *in, size_t n, lm_tok_str *out) {
    size_t a = 0, b = n;
    while (left && a < b) {
        int l;
        uint32_t c = tok_utf8_cp(in + a, b - a, &l);
        if (!tok_is_whitespace(c)) break;
        a += (size_t)l;
    }
    while (right && b > a) {
        size_t j = b - 1;
        while (j > a && ((uint8_t)in[j] & 0xC0) == 0x80) j--;
        int l;
        uint32_t c = tok_utf8_cp(in + j, b - j, &l);
        if (!tok_is_whitespace(c)) break;
        b = j;
    }
    set(out, in + a, b - a);
}

void tok_normalize(const tok_normalizer *nz, const char *in, size_t n, lm_tok_str *out,
                   lm_tok_str *tmp, tok_regex_scratch *rs) {
    switch (nz->kind) {
    case TOK_NORM_NFC: unicode_form(UTF8PROC_COMPOSE, in, n, out); break;
    case TOK_NORM_NFD: unicode_form(UTF8PROC_DECOMPOSE, in, n, out); break;
    case TOK_NORM_NFKC: unicode_form(UTF8PROC_COMPOSE | UTF8PROC_COMPAT, in, n, out); break;
    case TOK_NORM_NFKD: unicode_form(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, in, n, out); break;
    case TOK_NORM_LOWERCASE: lowercase(in, n, out); break;
    case TOK_NORM_PREPEND:
        out->len = 0;
        if (n) tok_str_append(out, nz->content, nz->content_len);
        tok_str_append(out, in, n);
        break;
    case TOK_NORM_REPLACE: replace(nz, in, n, out, rs); break;
    case TOK_NORM_STRIP: strip(nz->left, nz->right, in, n, out); break;
    case TOK_NORM_STRIP_ACCENTS: filter_chars(in, n, out, 0); break;
    case TOK_NORM_BYTELEVEL: {
        out->len = 0;
        tok_str_reserve(out, n * 2);
        for (size_t i = 0; i < n; i++) {
            char b[4];
            tok_str_append(out, b, (size_t)tok_utf8_put(tok_byte_to_cp[(uint8_t)in[i]], b));
        }
        break;
    }
    case TOK_NORM_BERT: {
        lm_tok_str a = { 0 }, b = { 0 };
        set(&a, in, n);
        if (nz->clean_text) { filter_chars(a.s, a.len, &b, 1); set(&a, b.s, b.len); }
        if (nz->handle_chinese) { filter_chars(a.s, a.len, &b, 2); set(&a, b.s, b.len); }
        if (nz->strip_accents) {
            unicode_form(UTF8PROC_DECOMPOSE, a.s, a.len, &b);
            filter_chars(b.s, b.len, &a, 3);
        }
        if (nz->lowercase) { lowercase(a.s, a.len, &b); set(&a, b.s, b.len); }
        set(out, a.s, a.len);
        lm_tok_str_free(&a);
        lm_tok_str_free(&b);
        break;
    }
    case TOK_NORM_SEQUENCE: {
        set(out, in, n);
        for (int i = 0; i < nz->n_sub; i++) {
            lm_tok_str t = *tmp;
            *tmp = *out;
            *out = t;
            /* tmp now holds the current text; normalise it into out */
            lm_tok_str scratch = { 0 };
            tok_normalize(&nz->sub[i], tmp->s, tmp->len, out, &scratch, rs);
            lm_tok_str_free(&scratch);
        }
        break;
    }
    }
    if (!out->s) tok_str_reserve(out, 0);
    out->s[out->len] = 0;
}
