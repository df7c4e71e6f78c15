/* pretokenize.c - Split patterns (PCRE2) and the Hugging Face pre-tokenizers.
 *
 * A pre-tokenizer turns a list of pieces into a finer list. Matching yields
 * a list of spans that covers the text, each flagged match/non-match (HF's
 * Pattern::find_matches); a split behaviour (Removed, Isolated,
 * MergedWithPrevious, MergedWithNext, Contiguous) turns those into the kept
 * pieces, exactly as tokenizers' NormalizedString::split does. Regexes are
 * PCRE2 in UTF + UCP mode, JIT-compiled when the platform allows. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "tok_internal.h"

/* GPT-2's pre-tokenizer regex (ByteLevel with use_regex). */
static const char k_gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

void tok_spans_push(tok_spans *s, uint32_t start, uint32_t end, bool match) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = lm_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (tok_span){ start, end, match };
}

void tok_pieces_push(tok_pieces *p, uint32_t off, uint32_t len, bool first) {
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->v = lm_xrealloc(p->v, p->cap * sizeof *p->v);
    }
    p->v[p->n++] = (tok_piece){ off, len, first };
}

/* Property classes of the Unicode 16 characters this PCRE2 does not know,
 * appended as explicit ranges: "\x{lo}-\x{hi}..." for the categories that X
 * (a general category, one or two letters) covers. */
static void append_new_ranges(lm_tok_str *o, const char *x, size_t xn) {
    static const char *const names[] = { "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl",
                                         "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk",
                                         "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co" };
    for (int i = 0; i < tok_uni_new_n; i++) {
        const char *n = names[tok_uni_new[i].cat];
        bool in = xn == 1 ? n[0] == x[0] : (xn == 2 && n[0] == x[0] && n[1] == x[1]) ||
                                           (xn == 2 && x[0] == 'L' && (x[1] == '&' || x[1] == 'C') &&
                                            n[0] == 'L' && (n[1] == 'u' || n[1] == 'l' || n[1] == 't'));
        if (!in) continue;
        char r[40];
        int l = snprintf(r, sizeof r, "\\x{%X}-\\x{%X}", tok_uni_new[i].lo, tok_uni_new[i].hi);
        tok_str_append(o, r, (size_t)l);
    }
}

static bool is_category(const char *x, size_t n) {
    return (n == 1 || n == 2) && x[0] && strchr("LMNPSZC", x[0]);
}

/* Rewrites a Hugging Face regex (Oniguruma syntax) for PCRE2:
 * - \s and \S mean Unicode White_Space, as in Oniguruma and Rust; PCRE2's
 *   UCP \s leaves out U+0085 (NEL);
 * - \w, \W, \d, \D take Oniguruma's Unicode meaning (see below);
 * - \p{X} / \pX also match the Unicode 16 characters of category X that
 *   PCRE2's older tables call unassigned (tok_uni_new); \P{X} outside a
 *   class likewise. Character classes are tracked so the ranges go in the
 *   right place. */
static char *rewrite_regex(const char *src, size_t n, size_t *out_n) {
    lm_tok_str o = { 0 };
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char d = src[i + 1];
            if (d == 's' || d == 'S') {
                tok_str_append(&o, d == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15);
                i++;
                continue;
            }
            if (d == 'w' || d == 'd' || ((d == 'W' || d == 'D') && !in_class)) {
                /* Oniguruma's \w is Unicode's: Alphabetic, marks, decimal
                 * digits, connector punctuation, joiners (PCRE2's is
                 * letters, all numbers and '_'); \d is Nd in both, but
                 * the tables differ in age */
                bool neg = d == 'W' || d == 'D', word = d == 'w' || d == 'W';
                if (!in_class) tok_str_append(&o, neg ? "[^" : "[", neg ? 2 : 1);
                if (word) {
                    static const char w[] = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}";
                    tok_str_append(&o, w, sizeof w - 1);
                    append_new_ranges(&o, "L", 1);
                    append_new_ranges(&o, "Nl", 2);
                    append_new_ranges(&o, "M", 1);
                    append_new_ranges(&o, "Pc", 2);
                } else {
                    tok_str_append(&o, "\\p{Nd}", 6);
                }
                append_new_ranges(&o, "Nd", 2);
                if (!in_class) tok_str_append(&o, "]", 1);
                i++;
                continue;
            }
            if ((d == 'p' || d == 'P') && i + 2 < n) {
                const char *x = src + i + 2;
                size_t xn = 1, skip = 3;
                if (*x == '{') {
                    const char *e = memchr(x, '}', n - (i + 2));
                    if (e) x++, xn = (size_t)(e - x), skip = 3 + xn + 1;
                    else xn = 0;
                }
                if (xn && is_category(x, xn) && *x != '^' && (d == 'p' || !in_class)) {
                    bool neg = d == 'P';
                    if (!in_class) tok_str_append(&o, neg ? "[^" : "[", neg ? 2 : 1);
                    tok_str_append(&o, "\\p{", 3);
                    tok_str_append(&o, x, xn);
                    tok_str_append(&o, "}", 1);
                    append_new_ranges(&o, x, xn);
                    if (!in_class) tok_str_append(&o, "]", 1);
                    i += skip - 1;
                    continue;
                }
            }
            tok_str_append(&o, src + i, 2);
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            tok_str_append(&o, src + i, 1);
            /* a leading ']' or '^]' is a literal member */
            if (i + 1 < n && src[i + 1] == '^') tok_str_append(&o, src + ++i, 1);
            if (i + 1 < n && src[i + 1] == ']') tok_str_append(&o, src + ++i, 1);
            continue;
        }
        if (c == '[' && in_class && i + 1 < n && src[i + 1] == ':') { /* [:alpha:] */
            const char *e = strstr(src + i + 2, ":]");
            size_t l = e && (size_t)(e - src) < n ? (size_t)(e - src) + 2 - i : 1;
            tok_str_append(&o, src + i, l);
            i += l - 1;
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        tok_str_append(&o, src + i, 1);
    }
    tok_str_reserve(&o, 0);
    *out_n = o.len;
    return o.s;
}

int tok_pattern_compile(tok_pattern *p, lm_err *e) {
    if (p->kind != TOK_PAT_REGEX) return 0;
    size_t n;
    char *src = rewrite_regex(p->str, p->len, &n);
    int code;
    PCRE2_SIZE at;
    p->re = pcre2_compile((PCRE2_SPTR)src, n, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    free(src);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return lm_errf(e, "regex /%.80s/: %s at offset %zu", p->str, (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    return 0;
}

void tok_pattern_free(tok_pattern *p) {
    if (p->re) pcre2_code_free(p->re);
    free(p->str);
    *p = (tok_pattern){ 0 };
}

static pcre2_match_data *scratch_md(tok_regex_scratch *rs) {
    if (!rs->md) rs->md = pcre2_match_data_create(4, NULL);
    return rs->md;
}

static size_t char_len_at(const char *s, size_t n, size_t i) {
    size_t l = (size_t)tok_utf8_len((uint8_t)s[i]);
    return i + l > n ? n - i : l;
}

void tok_find_matches(const tok_pattern *p, const char *s, size_t n, tok_spans *out,
                      tok_regex_scratch *rs) {
    out->n = 0;
    if (n == 0) {
        tok_spans_push(out, 0, 0, false);
        return;
    }
    size_t prev = 0;
    if (p->kind == TOK_PAT_STRING) {
        if (p->len) {
            for (size_t i = 0; i + p->len <= n;) {
                const char *hit = memmem(s + i, n - i, p->str, p->len);
                if (!hit) break;
                size_t at = (size_t)(hit - s);
                if (prev != at) tok_spans_push(out, (uint32_t)prev, (uint32_t)at, false);
                tok_spans_push(out, (uint32_t)at, (uint32_t)(at + p->len), true);
                prev = i = at + p->len;
            }
        }
    } else {
        pcre2_match_data *md = scratch_md(rs);
        size_t pos = 0;
        while (pos <= n) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t a = ov[0], b = ov[1];
            if (prev != a) tok_spans_push(out, (uint32_t)prev, (uint32_t)a, false);
            tok_spans_push(out, (uint32_t)a, (uint32_t)b, true);
            prev = b;
            if (b > a) pos = b;
            else if (b >= n) break;
            else pos = b + char_len_at(s, n, b);
        }
    }
    if (prev != n) tok_spans_push(out, (uint32_t)prev, (uint32_t)n, false);
}

typedef bool (*char_pred)(uint32_t c, uint32_t arg);

static void find_chars(const char *s, size_t n, char_pred pred, uint32_t arg, tok_spans *out) {
    out->n = 0;
    if (n == 0) {
        tok_spans_push(out, 0, 0, false);
        return;
    }
    size_t prev = 0;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = tok_utf8_cp(s + i, n - i, &l);
        if (pred(c, arg)) {
            if (prev != i) tok_spans_push(out, (uint32_t)prev, (uint32_t)i, false);
            tok_spans_push(out, (uint32_t)i, (uint32_t)(i + (size_t)l), true);
            prev = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (prev != n) tok_spans_push(out, (uint32_t)prev, (uint32_t)n, false);
}

/* Applies the behaviour to the spans, pushing the kept pieces (offset by
 * base) to out. Empty pieces are dropped, as PreTokenizedString::split does. */
static void apply_behavior(tok_spans *sp, tok_split_behavior b, bool invert, uint32_t base,
                           bool first, tok_pieces *out) {
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = !sp->v[i].match;
    size_t k = 0; /* compacted result in sp->v[0..k), match = "remove" */
    switch (b) {
    case TOK_SPLIT_REMOVED:
        k = sp->n;
        break;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = 0;
        k = sp->n;
        break;
    case TOK_SPLIT_CONTIGUOUS: {
        bool prev = false;
        for (size_t i = 0; i < sp->n; i++) {
            tok_span s = sp->v[i];
            if (s.match == prev && k) sp->v[k - 1].end = s.end;
            else sp->v[k++] = (tok_span){ s.start, s.end, 0 };
            prev = s.match;
        }
        break;
    }
    case TOK_SPLIT_MERGED_PREV: {
        bool prev = false;
        for (size_t i = 0; i < sp->n; i++) {
            tok_span s = sp->v[i];
            if (s.match && !prev && k) sp->v[k - 1].end = s.end;
            else sp->v[k++] = (tok_span){ s.start, s.end, 0 };
            prev = s.match;
        }
        break;
    }
    case TOK_SPLIT_MERGED_NEXT: {
        /* walk backwards, merging a match into the piece after it */
        bool prev = false;
        size_t n = sp->n;
        tok_span *r = lm_xmalloc((n ? n : 1) * sizeof *r);
        for (size_t i = n; i-- > 0;) {
            tok_span s = sp->v[i];
            if (s.match && !prev && k) r[k - 1].start = s.start;
            else r[k++] = (tok_span){ s.start, s.end, 0 };
            prev = s.match;
        }
        for (size_t i = 0; i < k; i++) sp->v[i] = r[k - 1 - i];
        free(r);
        break;
    }
    }
    for (size_t i = 0; i < k; i++) {
        tok_span s = sp->v[i];
        if (s.match || s.end == s.start) continue;
        tok_pieces_push(out, base + s.start, s.end - s.start, first && s.start == 0);
    }
}

static bool pred_ws(uint32_t c, uint32_t a) { (void)a; return tok_is_whitespace(c); }
static bool pred_punct(uint32_t c, uint32_t a) { (void)a; return tok_is_punct(c); }
static bool pred_digit(uint32_t c, uint32_t a) { (void)a; return tok_is_numeric(c); }
static bool pred_eq(uint32_t c, uint32_t a) { return c == a; }

static void swap_pieces(tok_pieces *a, tok_pieces *b) {
    tok_pieces t = *a;
    *a = *b;
    *b = t;
}

/* Splits every piece of p with a char predicate or a pattern. */
static void split_all(tok_pieces *p, tok_pieces *tmp, tok_spans *sp, const tok_pattern *pat,
                      char_pred pred, uint32_t arg, tok_split_behavior b, bool invert,
                      tok_regex_scratch *rs) {
    tmp->n = 0;
    for (size_t i = 0; i < p->n; i++) {
        tok_piece pc = p->v[i];
        const char *s = p->buf.s + pc.off;
        if (pat) tok_find_matches(pat, s, pc.len, sp, rs);
        else find_chars(s, pc.len, pred, arg, sp);
        apply_behavior(sp, b, invert, pc.off, pc.first, tmp);
    }
    /* pieces still point into p->buf: swap only the piece arrays */
    tok_piece *v = p->v;
    size_t cap = p->cap;
    p->v = tmp->v, p->n = tmp->n, p->cap = tmp->cap;
    tmp->v = v, tmp->cap = cap, tmp->n = 0;
}

static void bytelevel_map(tok_pieces *p, tok_pieces *tmp) {
    tmp->n = 0;
    tmp->buf.len = 0;
    for (size_t i = 0; i < p->n; i++) {
        tok_piece pc = p->v[i];
        uint32_t off = (uint32_t)tmp->buf.len;
        tok_str_reserve(&tmp->buf, pc.len * 2);
        for (uint32_t j = 0; j < pc.len; j++) {
            char b[4];
            int l = tok_utf8_put(tok_byte_to_cp[(uint8_t)p->buf.s[pc.off + j]], b);
            tok_str_append(&tmp->buf, b, (size_t)l);
        }
        tok_pieces_push(tmp, off, (uint32_t)(tmp->buf.len - off), pc.first);
    }
    swap_pieces(p, tmp);
}

/* Rewrites each piece through fn (prepend / replace), into tmp's buffer. */
static void metaspace_rewrite(const tok_pretok *pt, tok_pieces *p, tok_pieces *tmp) {
    char rep[4];
    int rl = tok_utf8_put(pt->replacement, rep);
    tmp->n = 0;
    tmp->buf.len = 0;
    for (size_t i = 0; i < p->n; i++) {
        tok_piece pc = p->v[i];
        const char *s = p->buf.s + pc.off;
        uint32_t off = (uint32_t)tmp->buf.len;
        bool starts = pc.len >= (uint32_t)rl && !memcmp(s, rep, (size_t)rl);
        bool starts_space = pc.len && s[0] == ' ';
        if (!starts && !starts_space &&
            (pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && pc.first)))
            tok_str_append(&tmp->buf, rep, (size_t)rl);
        for (uint32_t j = 0; j < pc.len; j++) {
            if (s[j] == ' ') tok_str_append(&tmp->buf, rep, (size_t)rl);
            else tok_str_append(&tmp->buf, s + j, 1);
        }
        tok_pieces_push(tmp, off, (uint32_t)(tmp->buf.len - off), pc.first);
    }
    swap_pieces(p, tmp);
}

static void prefix_space(tok_pieces *p, tok_pieces *tmp) {
    tmp->n = 0;
    tmp->buf.len = 0;
    for (size_t i = 0; i < p->n; i++) {
        tok_piece pc = p->v[i];
        uint32_t off = (uint32_t)tmp->buf.len;
        if (!pc.len || p->buf.s[pc.off] != ' ') tok_str_append(&tmp->buf, " ", 1);
        tok_str_append(&tmp->buf, p->buf.s + pc.off, pc.len);
        tok_pieces_push(tmp, off, (uint32_t)(tmp->buf.len - off), pc.first);
    }
    swap_pieces(p, tmp);
}

void tok_pretokenize(const tok_pretok *pt, tok_pieces *p, tok_pieces *tmp, tok_spans *sp,
                     tok_regex_scratch *rs) {
    switch (pt->kind) {
    case TOK_PRE_SPLIT:
        split_all(p, tmp, sp, &pt->pat, NULL, 0, pt->behavior, pt->invert, rs);
        break;
    case TOK_PRE_BYTELEVEL:
        if (pt->add_prefix_space) prefix_space(p, tmp);
        if (pt->use_regex) split_all(p, tmp, sp, &pt->pat, NULL, 0, TOK_SPLIT_ISOLATED, false, rs);
        if (!pt->defer_map) bytelevel_map(p, tmp);
        break;
    case TOK_PRE_METASPACE:
        metaspace_rewrite(pt, p, tmp);
        if (pt->split)
            split_all(p, tmp, sp, NULL, pred_eq, pt->replacement, TOK_SPLIT_MERGED_NEXT, false, rs);
        break;
    case TOK_PRE_WHITESPACE:
        split_all(p, tmp, sp, &pt->pat, NULL, 0, TOK_SPLIT_REMOVED, true, rs);
        break;
    case TOK_PRE_WHITESPACE_SPLIT:
        split_all(p, tmp, sp, NULL, pred_ws, 0, TOK_SPLIT_REMOVED, false, rs);
        break;
    case TOK_PRE_PUNCTUATION:
        split_all(p, tmp, sp, NULL, pred_punct, 0, pt->behavior, false, rs);
        break;
    case TOK_PRE_DIGITS:
        split_all(p, tmp, sp, NULL, pred_digit, 0,
                  pt->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, false, rs);
        break;
    case TOK_PRE_BERT:
        split_all(p, tmp, sp, NULL, pred_ws, 0, TOK_SPLIT_REMOVED, false, rs);
        split_all(p, tmp, sp, NULL, pred_punct, 0, TOK_SPLIT_ISOLATED, false, rs);
        break;
    case TOK_PRE_CHAR_DELIM:
        split_all(p, tmp, sp, NULL, pred_eq, pt->replacement, TOK_SPLIT_REMOVED, false, rs);
        break;
    case TOK_PRE_SEQUENCE:
        for (int i = 0; i < pt->n_sub; i++) tok_pretokenize(&pt->sub[i], p, tmp, sp, rs);
        break;
    }
}

void tok_pretok_free(tok_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_sub; i++) tok_pretok_free(&p->sub[i]);
    free(p->sub);
    tok_pattern_free(&p->pat);
}

/* Sets up the built-in regexes of ByteLevel (GPT-2) and Whitespace. */
int tok_pretok_builtin_regex(tok_pretok *p, lm_err *e) {
    const char *src = p->kind == TOK_PRE_WHITESPACE ? "\\w+|[^\\w\\s]+" : k_gpt2_re;
    p->pat.kind = TOK_PAT_REGEX;
    p->pat.str = lm_xstrdup(src);
    p->pat.len = strlen(src);
    return tok_pattern_compile(&p->pat, e);
}
