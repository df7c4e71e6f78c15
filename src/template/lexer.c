/* lexer.c - Jinja source to tokens, with jinja2's whitespace rules as
 * transformers configures them (trim_blocks and lstrip_blocks on):
 *
 *   {%- / {{- / {#-   strip all whitespace before the tag
 *   -%} / -}} / -#}   strip all whitespace after it
 *   %} and #}         drop one newline right after (trim_blocks); +%} keeps it
 *   {% and {#         drop spaces/tabs between the line start and the tag
 *                     (lstrip_blocks); {%+ keeps them
 *
 * Inside tags: names, numbers (with _ separators, 0x/0o/0b), strings with
 * Python escapes, and operators; an end marker inside open brackets is not an
 * end (so {{ {'a': {'b': 1}} }} works). {% raw %}...{% endraw %} is data.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

#include <stdlib.h>

typedef struct lexer {
    tpl_fail *f;
    const char *s;
    size_t n;
    tpl_token *v;
    int count, cap;
} lexer;

static tpl_token *push(lexer *L, uint8_t type, size_t pos) {
    if (L->count == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        if (cap > 50000000) tpl_raise(L->f, pos, "template too large");
        tpl_token *nv = tpl_alloc(L->f, (size_t)cap * sizeof *nv);
        if (L->count) memcpy(nv, L->v, (size_t)L->count * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    tpl_token *t = &L->v[L->count++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->pos = pos;
    return t;
}

/* Length of Python whitespace at s[i] (0 if none). */
static size_t space_at(const char *s, size_t n, size_t i) {
    size_t j = i;
    uint32_t c = (uint32_t)tpl_utf8_dec(s, n, &j);
    return tpl_cp_space(c) ? j - i : 0;
}

static size_t skip_space(const char *s, size_t n, size_t i) {
    size_t k;
    while (i < n && (k = space_at(s, n, i)) > 0) i += k;
    return i;
}

/* Emits text[a, b) as data after the whitespace control of the tag that
 * follows it: sign is that tag's '-', '+' or 0; lstrip applies to blocks and
 * comments. */
static void emit_data(lexer *L, size_t a, size_t b, char sign, bool lstrip) {
    const char *s = L->s;
    if (sign == '-') {
        tpl_str t = tpl_strip((tpl_str){ s + a, b - a }, NULL, false, true);
        b = a + t.n;
    } else if (sign != '+' && lstrip) {
        size_t l = b;
        while (l > a && s[l - 1] != '\n') l--;
        bool line_start = l > a || a == 0 || s[a - 1] == '\n';
        if (line_start) {
            size_t k = l;
            while (k < b && (s[k] == ' ' || s[k] == '\t')) k++;
            if (k == b) b = l;
        }
    }
    if (b > a) {
        tpl_token *t = push(L, T_DATA, a);
        t->s = (tpl_str){ s + a, b - a };
    }
}

/* After an end marker at i (pointing just past it): sign '-' strips all
 * whitespace, '+' nothing, else trim_blocks drops one newline (blocks and
 * comments only). */
static size_t after_end(lexer *L, size_t i, char sign, bool trim) {
    if (sign == '-') return skip_space(L->s, L->n, i);
    if (sign != '+' && trim && i < L->n && L->s[i] == '\n') return i + 1;
    return i;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a string literal body (Python escapes) into the arena. */
static tpl_str decode_string(lexer *L, size_t a, size_t b) {
    const char *s = L->s;
    char *out = tpl_alloc(L->f, b - a + 1);
    size_t o = 0;
    for (size_t i = a; i < b; i++) {
        if (s[i] != '\\' || i + 1 >= b) {
            out[o++] = s[i];
            continue;
        }
        char c = s[++i];
        uint32_t cp;
        int nd = 0;
        switch (c) {
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = '\v'; continue;
        case '\n': continue;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                cp = 0;
                int k = 0;
                while (k < 3 && i < b && s[i] >= '0' && s[i] <= '7') {
                    cp = cp * 8 + (uint32_t)(s[i] - '0');
                    i++;
                    k++;
                }
                i--;
                char e[4];
                int m = tpl_utf8_enc(cp, e);
                memcpy(out + o, e, (size_t)m);
                o += (size_t)m;
                continue;
            }
            if (c == 'N') tpl_raise(L->f, i - 1, "\\N{...} escapes are not supported");
            out[o++] = '\\';
            out[o++] = c;
            continue;
        }
        cp = 0;
        for (int k = 0; k < nd; k++) {
            int h = i + 1 + (size_t)k < b ? hexval(s[i + 1 + (size_t)k]) : -1;
            if (h < 0) tpl_raise(L->f, i - 1, "truncated \\%c escape in string", c);
            cp = cp * 16 + (uint32_t)h;
        }
        i += (size_t)nd;
        if (cp > 0x10FFFF) tpl_raise(L->f, i - (size_t)nd - 1, "illegal Unicode character in string");
        char e[4];
        int m = tpl_utf8_enc(cp, e);
        if ((size_t)m > (size_t)nd + 2) tpl_raise(L->f, i, "bad escape");
        memcpy(out + o, e, (size_t)m);
        o += (size_t)m;
    }
    out[o] = 0;
    return (tpl_str){ out, o };
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name1(char c) { return is_name0(c) || is_digit(c); }

/* digits with single '_' separators: returns end, or start if none */
static size_t scan_digits(const char *s, size_t n, size_t i, int base) {
    size_t st = i;
    while (i < n) {
        char c = s[i];
        int v = hexval(c);
        if (v >= 0 && v < base) {
            i++;
        } else if (c == '_' && i > st && i + 1 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 1]) < base) {
            i++;
        } else {
            break;
        }
    }
    return i;
}

static void number(lexer *L, size_t *ip) {
    const char *s = L->s;
    size_t n = L->n, i = *ip, st = i;
    char buf[96];
    size_t k = 0;
    /* float: digits ('.' digits)? (e[+-]digits)? with at least one of the two */
    bool prev_dot = i > 0 && s[i - 1] == '.';
    if (!prev_dot) {
        size_t j = scan_digits(s, n, i, 10);
        size_t frac = j;
        bool has_frac = false, has_exp = false;
        if (j < n && s[j] == '.' && j + 1 < n && is_digit(s[j + 1])) {
            frac = scan_digits(s, n, j + 1, 10);
            has_frac = true;
        }
        size_t e = frac;
        if (e < n && (s[e] == 'e' || s[e] == 'E')) {
            size_t x = e + 1;
            if (x < n && (s[x] == '+' || s[x] == '-')) x++;
            size_t y = scan_digits(s, n, x, 10);
            if (y > x) {
                e = y;
                has_exp = true;
            }
        }
        if (has_frac || has_exp) {
            for (size_t q = st; q < e && k < sizeof buf - 1; q++)
                if (s[q] != '_') buf[k++] = s[q];
            buf[k] = 0;
            tpl_token *t = push(L, T_FLOAT, st);
            t->f = strtod(buf, NULL);
            *ip = e;
            return;
        }
    }
    int base = 10;
    size_t d = i;
    if (s[i] == '0' && i + 1 < n && (s[i + 1] | 32) == 'x') base = 16, d = i + 2;
    else if (s[i] == '0' && i + 1 < n && (s[i + 1] | 32) == 'o') base = 8, d = i + 2;
    else if (s[i] == '0' && i + 1 < n && (s[i + 1] | 32) == 'b') base = 2, d = i + 2;
    if (base != 10 && d < n && s[d] == '_') d++;
    size_t e = scan_digits(s, n, d, base);
    if (e == d) {
        if (base != 10) tpl_raise(L->f, st, "invalid number literal");
        e = d + 1;
    }
    if (base == 10 && s[st] == '0') { /* 0(_?0)* only */
        e = st + 1;
        while (e < n && (s[e] == '0' || (s[e] == '_' && e + 1 < n && s[e + 1] == '0'))) e++;
    }
    uint64_t v = 0;
    for (size_t q = d; q < e; q++) {
        if (s[q] == '_') continue;
        uint64_t dv = (uint64_t)hexval(s[q]);
        if (v > (UINT64_MAX - dv) / (uint64_t)base || v * (uint64_t)base + dv > (uint64_t)INT64_MAX)
            tpl_raise(L->f, st, "integer literal too large");
        v = v * (uint64_t)base + dv;
    }
    tpl_token *t = push(L, T_INT, st);
    t->i = (int64_t)v;
    *ip = e;
}

/* Tokens of one tag, from i up to its end marker. kind is 'v' or 'b'. */
static size_t tag_tokens(lexer *L, size_t i, char kind, size_t tag_pos) {
    const char *s = L->s;
    size_t n = L->n;
    int depth = 0;
    static const char *const ops2[] = { "//", "**", "==", "!=", "<=", ">=" };
    for (;;) {
        i = skip_space(s, n, i);
        if (i >= n)
            tpl_raise(L->f, tag_pos, "unexpected end of template: %s tag never closed",
                      kind == 'v' ? "'{{'" : "'{%'");
        char close = kind == 'v' ? '}' : '%';
        if (depth == 0) {
            char sign = 0;
            size_t j = i;
            if ((s[j] == '-' || (s[j] == '+' && kind == 'b')) && j + 1 < n && s[j + 1] == close) sign = s[j++];
            if (s[j] == close && j + 1 < n && s[j + 1] == '}') {
                push(L, kind == 'v' ? T_VAR_END : T_BLOCK_END, i);
                return after_end(L, j + 2, sign, kind == 'b');
            }
        }
        char c = s[i];
        if (is_digit(c)) {
            number(L, &i);
            continue;
        }
        if (is_name0(c)) {
            size_t st = i;
            while (i < n && is_name1(s[i])) i++;
            tpl_token *t = push(L, T_NAME, st);
            t->s = (tpl_str){ s + st, i - st };
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t st = i++;
            while (i < n && s[i] != c) i += (s[i] == '\\' && i + 1 < n) ? 2 : 1;
            if (i >= n) tpl_raise(L->f, st, "unterminated string");
            tpl_token *t = push(L, T_STRING, st);
            t->s = decode_string(L, st + 1, i);
            i++;
            continue;
        }
        size_t len = 0;
        for (size_t k = 0; k < LM_COUNT(ops2); k++)
            if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) len = 2;
        if (!len && strchr("+-/*%~[](){}<>=.:|,;", c) && c) len = 1;
        if (!len) {
            size_t j = i;
            uint32_t cp = (uint32_t)tpl_utf8_dec(s, n, &j);
            if (cp < 0x80 && cp >= 0x20) tpl_raise(L->f, i, "unexpected char '%c'", (char)cp);
            tpl_raise(L->f, i, "unexpected char U+%04X", cp);
        }
        if (c == '(' || c == '[' || c == '{') {
            if (++depth > 500) tpl_raise(L->f, i, "brackets nested too deeply");
        } else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0) tpl_raise(L->f, i, "unexpected '%c'", c);
            depth--;
        }
        tpl_token *t = push(L, T_OP, i);
        t->s = (tpl_str){ s + i, len };
        i += len;
    }
}

/* At s[i] just past "{%" and its sign: is it "raw" \s* (-)%}? Returns the
 * end of the tag or 0. */
static size_t raw_begin(lexer *L, size_t i) {
    const char *s = L->s;
    size_t n = L->n;
    i = skip_space(s, n, i);
    if (n - i < 3 || memcmp(s + i, "raw", 3) || (i + 3 < n && is_name1(s[i + 3]))) return 0;
    i = skip_space(s, n, i + 3);
    if (i + 2 < n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') return skip_space(s, n, i + 3);
    if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') return i + 2;
    return 0;
}

static size_t raw_body(lexer *L, size_t body, size_t tag_pos) {
    const char *s = L->s;
    size_t n = L->n;
    for (size_t i = body; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t j = i + 2;
        char sign = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) sign = s[j++];
        j = skip_space(s, n, j);
        if (n - j < 6 || memcmp(s + j, "endraw", 6)) continue;
        j = skip_space(s, n, j + 6);
        char esign = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) esign = s[j++];
        if (j + 1 >= n || s[j] != '%' || s[j + 1] != '}') continue;
        emit_data(L, body, i, sign, true);
        return after_end(L, j + 2, esign, true);
    }
    tpl_raise(L->f, tag_pos, "missing end of raw directive");
}

tpl_token *tpl_lex(tpl_fail *f, const char *src, size_t len, int *n_out) {
    lexer L = { .f = f, .s = src, .n = len };
    size_t i = 0;
    while (i < len) {
        /* find the next tag start */
        size_t t = i;
        char kind = 0;
        for (; t + 1 < len; t++) {
            if (src[t] != '{') continue;
            char c = src[t + 1];
            if (c == '{') kind = 'v';
            else if (c == '%') kind = 'b';
            else if (c == '#') kind = 'c';
            if (kind) break;
        }
        if (!kind) {
            emit_data(&L, i, len, 0, false);
            break;
        }
        size_t j = t + 2;
        char sign = 0;
        if (j < len && (src[j] == '-' || src[j] == '+')) sign = src[j++];
        size_t raw_end = kind == 'b' ? raw_begin(&L, j) : 0;
        emit_data(&L, i, t, sign, kind != 'v');
        if (raw_end) {
            i = raw_body(&L, raw_end, t);
        } else if (kind == 'c') {
            size_t k = j;
            while (k + 1 < len && !(src[k] == '#' && src[k + 1] == '}')) k++;
            if (k + 1 >= len) tpl_raise(f, t, "missing end of comment tag");
            char esign = (k > j && (src[k - 1] == '-' || src[k - 1] == '+')) ? src[k - 1] : 0;
            i = after_end(&L, k + 2, esign, true);
        } else {
            push(&L, kind == 'v' ? T_VAR_BEGIN : T_BLOCK_BEGIN, t);
            i = tag_tokens(&L, j, kind, t);
        }
    }
    push(&L, T_EOF, len);
    *n_out = L.count;
    return L.v;
}
