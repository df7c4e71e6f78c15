/* gbnf.c - GBNF grammar text -> builder (lm_grammar_from_gbnf).
 *
 * The subset (llama.cpp's GBNF, which most tools that write grammars for
 * local models target):
 *   name ::= alternatives          rules; names are [A-Za-z0-9_-]+; the
 *                                  grammar starts at `root`
 *   a b | c                        sequence and alternatives
 *   "text"                         a literal (\n \r \t \\ \" \xHH \uHHHH
 *                                  \UHHHHHHHH escapes; UTF-8 allowed)
 *   [a-z_] [^"\\]                  a character class (code points, ranges,
 *                                  negation, the same escapes)
 *   .                              any character
 *   ( ... )                        a group
 *   x* x+ x? x{m} x{m,} x{m,n}     repetition (bounds up to 1000)
 *   /regex/  /regex/s              lumen's extension: a regular expression
 *                                  (regex.c); with s, as the inside of a
 *                                  JSON string (JSON Schema's pattern)
 *   # comment                      to the end of the line
 * A rule ends at the end of its line outside parentheses, unless the next
 * line starts with `|`. Refused: undefined rules, left recursion, and a
 * repetition of something that can match the empty string. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct gp {
    const char *s, *end;
    g_builder *b;
    lm_err *e;
    int line;
} gp;

static int fail(gp *p, const char *what) {
    return lm_errf(p->e, "grammar line %d: %s", p->line, what);
}

static bool is_name(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; }

/* Skips spaces and comments; newlines too when nl. */
static void skip(gp *p, bool nl) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            if (c == '\n') p->line++;
            p->s++;
        } else {
            break;
        }
    }
}

static int hex(gp *p, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (p->s >= p->end) return fail(p, "a \\x/\\u escape ends early");
        char c = *p->s++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(p, "a \\x/\\u escape has a non-hex digit");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* One character of a literal or class (escapes decoded, UTF-8 read) as a
 * code point; *raw set when it was \xHH (a byte, not a code point). */
static int read_char(gp *p, uint32_t *cp, bool *raw) {
    *raw = false;
    if (p->s >= p->end) return fail(p, "unterminated literal or class");
    unsigned char c = (unsigned char)*p->s++;
    if (c == '\\') {
        if (p->s >= p->end) return fail(p, "a lone backslash");
        char x = *p->s++;
        switch (x) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case 'x': *raw = true; return hex(p, 2, cp);
        case 'u': return hex(p, 4, cp);
        case 'U': return hex(p, 8, cp);
        default: *cp = (unsigned char)x; return 0;
        }
    }
    if (c < 0x80) return *cp = c, 0;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0 || p->end - p->s < n) return fail(p, "invalid UTF-8");
    uint32_t v = c & (0x3F >> n);
    for (int i = 0; i < n; i++) v = v << 6 | ((unsigned char)*p->s++ & 0x3F);
    *cp = v;
    return 0;
}

static int alternatives(gp *p, int rule, int depth);

static int literal(gp *p, int rule) {
    p->s++; /* the quote */
    while (p->s < p->end && *p->s != '"') {
        uint32_t cp;
        bool raw;
        if (read_char(p, &cp, &raw)) return -1;
        if (cp > 0x10FFFF) return fail(p, "a code point past U+10FFFF");
        if (raw) gb_byte(p->b, rule, (uint8_t)cp);
        else gb_codepoint(p->b, rule, cp);
    }
    if (p->s >= p->end) return fail(p, "unterminated literal");
    p->s++;
    return 0;
}

static int char_class(gp *p, int rule) {
    p->s++; /* [ */
    bool neg = p->s < p->end && *p->s == '^';
    if (neg) p->s++;
    int n = 0, cap = 8;
    uint32_t *lo = lm_xmalloc(cap * sizeof *lo), *hi = lm_xmalloc(cap * sizeof *hi);
    int rc = 0;
    while (p->s < p->end && *p->s != ']') {
        uint32_t a, z;
        bool raw;
        if ((rc = read_char(p, &a, &raw))) break;
        z = a;
        if (p->end - p->s >= 2 && p->s[0] == '-' && p->s[1] != ']') {
            p->s++;
            if ((rc = read_char(p, &z, &raw))) break;
        }
        if (z < a || z > 0x10FFFF) {
            rc = fail(p, "a bad range in a character class");
            break;
        }
        if (n == cap) {
            cap *= 2;
            lo = lm_xrealloc(lo, cap * sizeof *lo);
            hi = lm_xrealloc(hi, cap * sizeof *hi);
        }
        lo[n] = a, hi[n] = z, n++;
    }
    if (!rc && p->s >= p->end) rc = fail(p, "unterminated character class");
    if (!rc) {
        p->s++;
        gb_class(p->b, rule, lo, hi, n, neg);
    }
    free(lo);
    free(hi);
    return rc;
}

/* /re/ or /re/s (lumen's extension): a regular expression (regex.c), with
 * s as the inside of a JSON string. */
static int regex_atom(gp *p, int rule) {
    const char *a = ++p->s;
    while (p->s < p->end && *p->s != '/' && *p->s != '\n') p->s += *p->s == '\\' && p->s + 1 < p->end ? 2 : 1;
    if (p->s >= p->end || *p->s != '/') return fail(p, "unterminated /regex/");
    const char *z = p->s++;
    bool json = p->s < p->end && *p->s == 's';
    if (json) p->s++;
    int r;
    if (lm_regex_rule(p->b, a, (size_t)(z - a), json, &r, p->e)) return lm_err_prefix(p->e, "grammar line %d", p->line);
    gb_push(p->b, rule, G_REF, r);
    return 0;
}

static int read_int(gp *p, int *out) {
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return fail(p, "expected a number in {m,n}");
    long v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && v < 100000) v = v * 10 + (*p->s++ - '0');
    *out = (int)v;
    return 0;
}

static int postfix(gp *p, int rule, int from) {
    if (p->s >= p->end) return 0;
    char c = *p->s;
    int min, max;
    if (c == '*') min = 0, max = -1;
    else if (c == '+') min = 1, max = -1;
    else if (c == '?') min = 0, max = 1;
    else if (c == '{') {
        p->s++;
        skip(p, false);
        if (read_int(p, &min)) return -1;
        skip(p, false);
        max = min;
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            skip(p, false);
            max = -1;
            if (p->s < p->end && *p->s != '}' && read_int(p, &max)) return -1;
            skip(p, false);
        }
        if (p->s >= p->end || *p->s != '}') return fail(p, "expected } after {m,n");
    } else {
        return 0;
    }
    p->s++;
    if (gb_repeat(p->b, rule, from, min, max, p->e)) return lm_err_prefix(p->e, "grammar line %d", p->line);
    return 0;
}

/* Items of one alternative until | ) or, at depth 0, the end of the line. */
static int sequence(gp *p, int rule, int depth) {
    for (;;) {
        skip(p, depth > 0);
        if (p->s >= p->end) return 0;
        char c = *p->s;
        int from = p->b->rules[rule].body.n;
        if (c == '"') {
            if (literal(p, rule)) return -1;
        } else if (c == '[') {
            if (char_class(p, rule)) return -1;
        } else if (c == '/') {
            if (regex_atom(p, rule)) return -1;
        } else if (c == '.') {
            p->s++;
            uint32_t lo = 0, hi = 0x10FFFF;
            gb_class(p->b, rule, &lo, &hi, 1, false);
        } else if (c == '(') {
            p->s++;
            int g = gb_anon(p->b);
            if (alternatives(p, g, depth + 1)) return -1;
            skip(p, true);
            if (p->s >= p->end || *p->s != ')') return fail(p, "expected )");
            p->s++;
            gb_push(p->b, rule, G_REF, g);
        } else if (is_name(c)) {
            const char *n0 = p->s;
            while (p->s < p->end && is_name(*p->s)) p->s++;
            const char *save = p->s;
            skip(p, false);
            if (p->end - p->s >= 3 && !memcmp(p->s, "::=", 3)) return fail(p, "a rule starts before the last one ended");
            p->s = save;
            gb_push(p->b, rule, G_REF, gb_named(p->b, n0, (size_t)(p->s - n0)));
        } else {
            return 0; /* | ) newline or something the caller refuses */
        }
        if (postfix(p, rule, from)) return -1;
    }
}

static int alternatives(gp *p, int rule, int depth) {
    for (;;) {
        if (sequence(p, rule, depth)) return -1;
        const char *save = p->s;
        int line = p->line;
        skip(p, true);
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            gb_push(p->b, rule, G_ALT, 0);
            continue;
        }
        if (depth == 0) p->s = save, p->line = line;
        return 0;
    }
}

int lm_grammar_from_gbnf(lm_grammar **out, const char *src, size_t len, lm_err *e) {
    *out = NULL;
    g_builder b;
    gb_init(&b);
    gp p = { src, src + len, &b, e, 1 };
    int root = gb_named(&b, "root", 4), rc = 0;
    for (;;) {
        skip(&p, true);
        if (p.s >= p.end) break;
        const char *n0 = p.s;
        while (p.s < p.end && is_name(*p.s)) p.s++;
        if (p.s == n0) {
            rc = fail(&p, "expected a rule name");
            break;
        }
        size_t nl = (size_t)(p.s - n0);
        skip(&p, false);
        if (p.end - p.s < 3 || memcmp(p.s, "::=", 3)) {
            rc = fail(&p, "expected ::= after the rule name");
            break;
        }
        p.s += 3;
        int r = gb_named(&b, n0, nl);
        if (b.rules[r].defined) {
            rc = lm_errf(e, "grammar line %d: the rule '%s' is defined twice", p.line, b.rules[r].name);
            break;
        }
        b.rules[r].defined = true;
        if ((rc = alternatives(&p, r, 0))) break;
        skip(&p, false);
        if (p.s < p.end && *p.s != '\n') {
            rc = fail(&p, *p.s == ')' ? "unbalanced )" : "unexpected character");
            break;
        }
    }
    if (!rc && !b.rules[root].defined) rc = lm_errf(e, "the grammar has no 'root' rule");
    if (!rc) rc = gb_finish(&b, root, out, e);
    gb_free(&b);
    return rc;
}
