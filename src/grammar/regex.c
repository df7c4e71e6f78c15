/* regex.c - a regular expression -> builder (lm_grammar_from_regex), and
 * the same for JSON Schema's `pattern` (schema.c calls lm_regex_rule).
 *
 * The output must match the expression as a whole (a leading ^ and a
 * trailing $ are accepted and mean nothing more). Supported: literals and
 * escapes (\n \t \r \f \v \0 \xHH \uHHHH, escaped punctuation), classes
 * [...] with ranges and negation, \d \w \s \D \W \S, `.` (any character
 * but a newline), groups ( ) and (?: ), named groups (?<n> ), alternation,
 * quantifiers * + ? {m} {m,} {m,n} (a lazy ? after them is accepted: the
 * language is the same). Refused with the construct named: backreferences,
 * lookaround, word boundaries, anchors inside the expression. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct rp {
    const char *s, *p, *end;
    g_builder *b;
    lm_err *e;
} rp;

static int rfail(rp *x, const char *what) {
    return lm_errf(x->e, "regex at offset %d: %s", (int)(x->p - x->s), what);
}

/* Code point ranges being collected for one class. */
typedef struct ranges {
    uint32_t *lo, *hi;
    int n, cap;
} ranges;

static void rg_add(ranges *r, uint32_t lo, uint32_t hi) {
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 8;
        r->lo = lm_xrealloc(r->lo, (size_t)r->cap * sizeof *r->lo);
        r->hi = lm_xrealloc(r->hi, (size_t)r->cap * sizeof *r->hi);
    }
    r->lo[r->n] = lo, r->hi[r->n] = hi, r->n++;
}

/* \d \w \s and their negations, as ranges (negated ones are complemented
 * by the caller through `neg`). */
static bool class_escape(char c, ranges *r, bool *neg) {
    *neg = c == 'D' || c == 'W' || c == 'S';
    switch (c) {
    case 'd': case 'D': rg_add(r, '0', '9'); return true;
    case 'w': case 'W': rg_add(r, '0', '9'), rg_add(r, 'A', 'Z'), rg_add(r, 'a', 'z'), rg_add(r, '_', '_'); return true;
    case 's': case 'S': rg_add(r, '\t', '\r'), rg_add(r, ' ', ' '); return true;
    default: return false;
    }
}

static int hexn(rp *x, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (x->p >= x->end) return rfail(x, "a hex escape ends early");
        char c = *x->p++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return rfail(x, "a hex escape has a non-hex digit");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* One character (after a backslash when esc) as a code point. */
static int read_cp(rp *x, uint32_t *cp) {
    unsigned char c = (unsigned char)*x->p++;
    if (c < 0x80) return *cp = c, 0;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0 || x->end - x->p < n) return rfail(x, "invalid UTF-8");
    uint32_t v = c & (0x3F >> n);
    for (int i = 0; i < n; i++) v = v << 6 | ((unsigned char)*x->p++ & 0x3F);
    *cp = v;
    return 0;
}

/* The escape after a backslash that stands for one character. */
static int escape_cp(rp *x, uint32_t *cp) {
    if (x->p >= x->end) return rfail(x, "a trailing backslash");
    char c = *x->p++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hexn(x, 2, cp);
    case 'u': return hexn(x, 4, cp);
    case 'b': case 'B': return rfail(x, "word boundaries (\\b, \\B) are not supported");
    case 'A': case 'z': case 'Z': return rfail(x, "anchors inside the expression are not supported");
    default:
        if ((c >= '1' && c <= '9') || c == 'k') return rfail(x, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return rfail(x, "an unknown escape");
        *cp = (unsigned char)c;
        return 0;
    }
}

static int bracket(rp *x, int rule) {
    x->p++; /* [ */
    bool neg = x->p < x->end && *x->p == '^';
    if (neg) x->p++;
    ranges r = { 0 };
    int rc = 0;
    bool first = true;
    while (!rc) {
        if (x->p >= x->end) {
            rc = rfail(x, "an unterminated [ class");
            break;
        }
        if (*x->p == ']' && !first) break;
        first = false;
        uint32_t a;
        if (*x->p == '\\') {
            x->p++;
            bool cneg;
            ranges sub = { 0 };
            if (x->p < x->end && class_escape(*x->p, &sub, &cneg)) {
                x->p++;
                if (cneg) { /* complement within the class: add the gaps */
                    uint32_t next = 0;
                    for (int i = 0; i < sub.n; i++) {
                        if (sub.lo[i] > next) rg_add(&r, next, sub.lo[i] - 1);
                        next = sub.hi[i] + 1;
                    }
                    rg_add(&r, next, 0x10FFFF);
                } else {
                    for (int i = 0; i < sub.n; i++) rg_add(&r, sub.lo[i], sub.hi[i]);
                }
                free(sub.lo), free(sub.hi);
                continue;
            }
            free(sub.lo), free(sub.hi);
            if ((rc = escape_cp(x, &a))) break;
        } else if ((rc = read_cp(x, &a))) {
            break;
        }
        uint32_t z = a;
        if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                if ((rc = escape_cp(x, &z))) break;
            } else if ((rc = read_cp(x, &z))) {
                break;
            }
            if (z < a) {
                rc = rfail(x, "a class range out of order");
                break;
            }
        }
        rg_add(&r, a, z);
    }
    if (!rc) {
        x->p++;
        gb_class(x->b, rule, r.lo, r.hi, r.n, neg);
    }
    free(r.lo), free(r.hi);
    return rc;
}

static int alt(rp *x, int rule, int depth);

static int quantifier(rp *x, int rule, int from) {
    for (;;) {
        if (x->p >= x->end) return 0;
        char c = *x->p;
        int min, max;
        if (c == '*') min = 0, max = -1, x->p++;
        else if (c == '+') min = 1, max = -1, x->p++;
        else if (c == '?') min = 0, max = 1, x->p++;
        else if (c == '{') {
            const char *q = x->p + 1;
            if (q >= x->end || *q < '0' || *q > '9') return 0; /* a literal { */
            long a = 0, z;
            while (q < x->end && *q >= '0' && *q <= '9' && a < 100000) a = a * 10 + (*q++ - '0');
            z = a;
            if (q < x->end && *q == ',') {
                q++;
                z = -1;
                if (q < x->end && *q >= '0' && *q <= '9') {
                    z = 0;
                    while (q < x->end && *q >= '0' && *q <= '9' && z < 100000) z = z * 10 + (*q++ - '0');
                }
            }
            if (q >= x->end || *q != '}') return rfail(x, "an unterminated {m,n}");
            x->p = q + 1;
            min = (int)a, max = (int)z;
        } else {
            return 0;
        }
        if (x->p < x->end && (*x->p == '?' || *x->p == '+')) x->p++; /* lazy / possessive: same language */
        return gb_repeat(x->b, rule, from, min, max, x->e);
    }
}

static int sequence(rp *x, int rule, int depth) {
    while (x->p < x->end) {
        char c = *x->p;
        int from = x->b->rules[rule].body.n;
        if (c == '|' || c == ')') return 0;
        if (c == '^' && x->p == x->s) {
            x->p++;
            continue;
        }
        if (c == '$' && x->p + 1 == x->end) {
            x->p++;
            continue;
        }
        if (c == '^' || c == '$') return rfail(x, "anchors inside the expression are not supported");
        if (c == '*' || c == '+' || c == '?') return rfail(x, "a quantifier with nothing to repeat");
        if (c == '(') {
            x->p++;
            if (x->p < x->end && *x->p == '?') {
                x->p++;
                if (x->p < x->end && *x->p == ':') x->p++;
                else if (x->p < x->end && *x->p == '<' && x->p + 1 < x->end && x->p[1] != '=' && x->p[1] != '!') {
                    while (x->p < x->end && *x->p != '>') x->p++;
                    if (x->p >= x->end) return rfail(x, "an unterminated group name");
                    x->p++;
                } else if (x->p < x->end && *x->p == 'P' && x->p + 1 < x->end && x->p[1] == '<') {
                    while (x->p < x->end && *x->p != '>') x->p++;
                    if (x->p >= x->end) return rfail(x, "an unterminated group name");
                    x->p++;
                } else {
                    return rfail(x, "lookaround and inline flags ((?=, (?!, (?<=, (?i) ...) are not supported");
                }
            }
            int g = gb_anon(x->b);
            if (alt(x, g, depth + 1)) return -1;
            if (x->p >= x->end || *x->p != ')') return rfail(x, "a ( without its )");
            x->p++;
            gb_push(x->b, rule, G_REF, g);
        } else if (c == '[') {
            if (bracket(x, rule)) return -1;
        } else if (c == '.') {
            x->p++;
            uint32_t lo = '\n', hi = '\n';
            gb_class(x->b, rule, &lo, &hi, 1, true);
        } else if (c == '\\') {
            x->p++;
            ranges r = { 0 };
            bool neg;
            if (x->p < x->end && class_escape(*x->p, &r, &neg)) {
                x->p++;
                gb_class(x->b, rule, r.lo, r.hi, r.n, neg);
                free(r.lo), free(r.hi);
            } else {
                free(r.lo), free(r.hi);
                uint32_t cp;
                if (escape_cp(x, &cp)) return -1;
                gb_codepoint(x->b, rule, cp);
            }
        } else {
            uint32_t cp;
            if (read_cp(x, &cp)) return -1;
            gb_codepoint(x->b, rule, cp);
        }
        if (quantifier(x, rule, from)) return -1;
    }
    return 0;
}

static int alt(rp *x, int rule, int depth) {
    for (;;) {
        if (sequence(x, rule, depth)) return -1;
        if (x->p < x->end && *x->p == '|') {
            x->p++;
            gb_push(x->b, rule, G_ALT, 0);
            continue;
        }
        if (x->p < x->end && *x->p == ')' && depth == 0) return rfail(x, "a ) without its (");
        return 0;
    }
}

int lm_regex_rule(g_builder *b, const char *re, size_t len, bool json_string, int *rule, lm_err *e) {
    rp x = { re, re, re + len, b, e };
    *rule = gb_anon(b);
    b->json_string = json_string;
    b->json_bad = false;
    int rc = alt(&x, *rule, 0);
    b->json_string = false;
    if (!rc && b->json_bad)
        rc = lm_errf(e, "the pattern asks for a quote, backslash or control character, which a JSON string must escape");
    return rc;
}

int lm_grammar_from_regex(lm_grammar **out, const char *re, size_t len, lm_err *e) {
    *out = NULL;
    g_builder b;
    gb_init(&b);
    int root, rc = lm_regex_rule(&b, re, len, false, &root, e);
    if (!rc) rc = gb_finish(&b, root, out, e);
    gb_free(&b);
    return rc;
}
