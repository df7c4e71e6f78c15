/* schema.c - JSON Schema -> GBNF text (then gbnf.c compiles it).
 *
 * Supported, as real schemas use it (OpenAI structured outputs, tool
 * parameters, config files):
 *   type (one or a list; "null" in it = nullable), nullable (OpenAPI)
 *   enum, const                      any JSON values, written compactly
 *   anyOf, oneOf                     alternatives; oneOf only when its
 *                                    branches provably exclude each other
 *                                    (see oneof_exclusive), so that
 *                                    "exactly one" is "at least one";
 *                                    allOf of one schema
 *   $ref                             "#", "#/$defs/..", "#/definitions/..",
 *                                    any JSON pointer into the document;
 *                                    recursion allowed
 *   object                           properties in their order; required
 *                                    ones always, optional ones may be left
 *                                    out; additionalProperties false / true
 *                                    / a schema (absent: false when there
 *                                    are properties, else any members)
 *   array                            items, prefixItems, minItems, maxItems
 *   string                           minLength, maxLength, pattern (a
 *                                    regular language, regex.c), format
 *                                    date-time, date, time, email, uuid,
 *                                    uri, ipv4, hostname
 *   integer                          minimum, maximum, exclusiveMinimum,
 *                                    exclusiveMaximum (any integers)
 *   number                           minimum / maximum when both are
 *                                    integers >= 0 (or only minimum 0)
 * Annotations (title, description, default, examples, $schema, $id,
 * $comment, readOnly, writeOnly, deprecated) are ignored. Everything else
 * is refused with the keyword named: a grammar that silently ignores a
 * constraint would produce output the client's validator rejects.
 *
 * Whitespace between tokens: none, one space, or one newline and up to 20
 * spaces/tabs (pretty printing without letting a model loop on spaces). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct sc {
    FILE *f;
    const json_t *root;
    const char *prefix;
    lm_err *e;
    int n_rules;
    /* $ref targets already given a rule: pointer string -> rule number */
    json_t *refs;
    int depth;
} sc;

static const char *const ignored[] = { "title", "description", "default", "examples", "$schema", "$id", "$comment",
                                       "readOnly", "writeOnly", "deprecated", "$defs", "definitions", "strict",
                                       "format", "type", "nullable", "enum", "const", "anyOf", "oneOf", "allOf",
                                       "$ref", "properties", "required", "additionalProperties", "items",
                                       "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
                                       "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "name",
                                       "discriminator", "$anchor", "contentMediaType", "contentEncoding", NULL };

void lm_gbnf_put_literal(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7F) fprintf(f, "\\x%02X", c);
        else fputc(c, f);
    }
}

/* The shared rules every schema grammar uses, named P-ws, P-string ... */
static void put_basics(FILE *f, const char *P) {
    fprintf(f, "%s-ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n", P);
    fprintf(f, "%s-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n", P);
    fprintf(f, "%s-string ::= \"\\\"\" %s-char* \"\\\"\"\n", P, P);
    fprintf(f, "%s-int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n", P);
    fprintf(f, "%s-frac ::= \".\" [0-9]{1,16}\n", P);
    fprintf(f, "%s-exp ::= [eE] [-+]? [0-9]{1,3}\n", P);
    fprintf(f, "%s-number ::= %s-int %s-frac? %s-exp?\n", P, P, P, P);
    fprintf(f, "%s-bool ::= \"true\" | \"false\"\n", P);
    fprintf(f, "%s-null ::= \"null\"\n", P);
    fprintf(f, "%s-value ::= %s-object | %s-array | %s-string | %s-number | %s-bool | %s-null\n", P, P, P, P, P, P, P);
    fprintf(f, "%s-member ::= %s-string %s-ws \":\" %s-ws %s-value\n", P, P, P, P, P);
    fprintf(f, "%s-object ::= \"{\" %s-ws (%s-member (%s-ws \",\" %s-ws %s-member)* %s-ws)? \"}\"\n", P, P, P, P, P, P, P);
    fprintf(f, "%s-array ::= \"[\" %s-ws (%s-value (%s-ws \",\" %s-ws %s-value)* %s-ws)? \"]\"\n", P, P, P, P, P, P, P);
}

/* The string literal of a JSON value, compact, as a GBNF literal. */
static void put_json_literal(FILE *f, const json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    fputc('"', f);
    lm_gbnf_put_literal(f, s, strlen(s));
    fputc('"', f);
    free(s);
}

static int new_rule(sc *c) { return c->n_rules++; }

static void add_text(sc *c, const char *buf, size_t len) {
    json_array_append_new(json_object_get(c->refs, ""), json_stringn_nocheck(buf, len));
}

static int rule_text(sc *c, int r, const json_t *s);

static int schema_rule(sc *c, const json_t *s, int *out);

/* ---- integers in a range ---- */

/* Digits a..b of the same length (as strings), as GBNF. */
static void digits_range(FILE *f, const char *a, const char *b, int n) {
    if (n == 0) return;
    bool full = true; /* 0..0 to 9..9: any digits (else the split below doubles per digit) */
    for (int i = 0; i < n && full; i++) full = a[i] == '0' && b[i] == '9';
    if (full) {
        fprintf(f, "[0-9]{%d}", n);
        return;
    }
    if (n == 1) {
        fprintf(f, "[%c-%c]", a[0], b[0]);
        return;
    }
    if (a[0] == b[0]) {
        fprintf(f, "\"%c\" ", a[0]);
        digits_range(f, a + 1, b + 1, n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n), memset(zeros, '0', (size_t)n);
    fputc('(', f);
    fprintf(f, "\"%c\" (", a[0]);
    digits_range(f, a + 1, nines, n - 1);
    fputs(")", f);
    if (b[0] - a[0] > 1) fprintf(f, " | [%c-%c] [0-9]{%d}", a[0] + 1, b[0] - 1, n - 1);
    fprintf(f, " | \"%c\" (", b[0]);
    digits_range(f, zeros, b + 1, n - 1);
    fputs("))", f);
}

/* Non-negative integers lo..hi (hi < 0: unbounded), as alternatives. */
static void nonneg_range(FILE *f, long long lo, long long hi) {
    char a[24], b[24];
    int la = snprintf(a, sizeof a, "%lld", lo);
    int lb = hi < 0 ? 16 : snprintf(b, sizeof b, "%lld", hi);
    bool first = true;
    for (int L = la; L <= lb; L++) {
        char x[24], y[24];
        if (L == la) memcpy(x, a, (size_t)L);
        else x[0] = '1', memset(x + 1, '0', (size_t)L - 1);
        if (hi >= 0 && L == lb) memcpy(y, b, (size_t)L);
        else memset(y, '9', (size_t)L);
        fputs(first ? "(" : " | ", f);
        first = false;
        fputc('(', f);
        digits_range(f, x, y, L);
        fputc(')', f);
    }
    fputc(')', f);
}

static void int_range(FILE *f, bool has_lo, long long lo, bool has_hi, long long hi) {
    /* the negative part mirrored, then the non-negative part */
    bool neg = !has_lo || lo < 0, pos = !has_hi || hi >= 0;
    fputc('(', f);
    if (neg) {
        long long nlo = has_hi && hi < 0 ? -hi : 1, nhi = has_lo ? -lo : -1;
        fputs("\"-\" ", f);
        nonneg_range(f, nlo, nhi);
    }
    if (pos) {
        if (neg) fputs(" | ", f);
        nonneg_range(f, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    fputc(')', f);
}

static int get_bound(sc *c, const json_t *s, const char *key, bool integer, bool *has, double *v) {
    const json_t *x = json_object_get(s, key);
    if (!x) return 0;
    if (!json_is_number(x)) return lm_errf(c->e, "'%s' must be a number", key);
    *v = json_number_value(x);
    /* integers a double holds exactly: up to 2^53, so JavaScript's
     * Number.MAX_SAFE_INTEGER, which agents' tools use as a bound, fits */
    if (integer && fabs(*v) > 9007199254740992.0) return lm_errf(c->e, "'%s' is out of range", key);
    *has = true;
    return 0;
}

static int put_integer(sc *c, const json_t *s) {
    bool hl = false, hh = false, el = false, eh = false;
    double lo = 0, hi = 0, elo = 0, ehi = 0;
    if (get_bound(c, s, "minimum", true, &hl, &lo) || get_bound(c, s, "maximum", true, &hh, &hi) ||
        get_bound(c, s, "exclusiveMinimum", true, &el, &elo) || get_bound(c, s, "exclusiveMaximum", true, &eh, &ehi))
        return -1;
    long long L = hl ? (long long)ceil(lo) : 0, H = hh ? (long long)floor(hi) : 0;
    if (el) L = hl ? LM_MAX(L, (long long)floor(elo) + 1) : (long long)floor(elo) + 1, hl = true;
    if (eh) H = hh ? LM_MIN(H, (long long)ceil(ehi) - 1) : (long long)ceil(ehi) - 1, hh = true;
    if (hl && hh && L > H) return lm_errf(c->e, "no integer satisfies minimum %lld and maximum %lld", L, H);
    if (!hl && !hh) {
        fprintf(c->f, "%s-int", c->prefix);
        return 0;
    }
    int_range(c->f, hl, L, hh, H);
    return 0;
}

static int put_number(sc *c, const json_t *s) {
    bool hl = false, hh = false, el = false, eh = false;
    double lo = 0, hi = 0, x;
    if (get_bound(c, s, "minimum", false, &hl, &lo) || get_bound(c, s, "maximum", false, &hh, &hi) ||
        get_bound(c, s, "exclusiveMinimum", false, &el, &x) || get_bound(c, s, "exclusiveMaximum", false, &eh, &x))
        return -1;
    const char *P = c->prefix;
    if (el || eh) return lm_errf(c->e, "exclusiveMinimum / exclusiveMaximum on a number are not supported");
    if (!hl && !hh) {
        fprintf(c->f, "%s-number", P);
        return 0;
    }
    if (!hl || lo < 0 || lo != floor(lo) || (hh && (hi != floor(hi) || hi < lo)) || hi > 1e15)
        return lm_errf(c->e, "number bounds other than integer minimum >= 0 (and integer maximum) are not supported");
    if (!hh) { /* x >= lo: integer part >= lo */
        fputc('(', c->f);
        nonneg_range(c->f, (long long)lo, -1);
        fprintf(c->f, " %s-frac? %s-exp?)", P, P);
        return 0;
    }
    fputc('(', c->f);
    if (hi > lo) {
        fputc('(', c->f);
        nonneg_range(c->f, (long long)lo, (long long)hi - 1);
        fprintf(c->f, " %s-frac?) | ", P);
    }
    fprintf(c->f, "\"%lld\" (\".\" \"0\"{1,16})?)", (long long)hi);
    return 0;
}

/* ---- strings ---- */

static const struct {
    const char *name, *re;
} formats[] = {
    { "date-time", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])" },
    { "date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])" },
    { "time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?" },
    { "email", "[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){0,8}\\.[A-Za-z]{2,24}" },
    { "uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" },
    { "uri", "[A-Za-z][A-Za-z0-9+.-]{0,15}:[^ \\\\\"<>{}|^`]{1,2000}" },
    { "ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])" },
    { "hostname", "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,8}" },
};

/* The regex written as a GBNF /re/s atom (slashes escaped). */
static void put_regex(FILE *f, const char *re, size_t n) {
    fputc('/', f);
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '\\' && i + 1 < n) {
            fputc(re[i++], f);
            fputc(re[i], f);
            continue;
        }
        if (re[i] == '/') fputc('\\', f);
        if (re[i] == '\n') {
            fputs("\\n", f);
            continue;
        }
        fputc(re[i], f);
    }
    fputs("/s", f);
}

static int put_string(sc *c, const json_t *s) {
    const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return lm_errf(c->e, "minLength / maxLength must be integers");
    if (pat && (mn || mx)) return lm_errf(c->e, "pattern together with minLength / maxLength is not supported");
    if (pat) {
        if (!json_is_string(pat)) return lm_errf(c->e, "'pattern' must be a string");
        const char *p = json_string_value(pat);
        size_t n = json_string_length(pat);
        bool start = n && p[0] == '^', end = n > (size_t)start && p[n - 1] == '$' && (n < 2 || p[n - 2] != '\\');
        fputs("\"\\\"\" ", c->f);
        if (!start) fputs("/.*/s ", c->f);
        put_regex(c->f, p + start, n - start - end);
        if (!end) fputs(" /.*/s", c->f);
        fputs(" \"\\\"\"", c->f);
        /* check it compiles now, to name it in the error */
        g_builder b;
        gb_init(&b);
        int r;
        int rc = lm_regex_rule(&b, p + start, n - start - end, true, &r, c->e);
        gb_free(&b);
        if (rc) return lm_err_prefix(c->e, "pattern \"%.80s\"", p);
        return 0;
    }
    if (fmt && json_is_string(fmt)) {
        for (size_t i = 0; i < LM_COUNT(formats); i++)
            if (!strcmp(formats[i].name, json_string_value(fmt))) {
                if (mn || mx) return lm_errf(c->e, "format together with minLength / maxLength is not supported");
                fputs("\"\\\"\" ", c->f);
                put_regex(c->f, formats[i].re, strlen(formats[i].re));
                fputs(" \"\\\"\"", c->f);
                return 0;
            }
        return lm_errf(c->e, "string format '%.40s' is not supported", json_string_value(fmt));
    }
    if (mn || mx) {
        long long a = mn ? json_integer_value(mn) : 0, z = mx ? json_integer_value(mx) : -1;
        if (a < 0 || a > 1000 || z > 1000 || (z >= 0 && z < a))
            return lm_errf(c->e, "minLength / maxLength must be within 0..1000 and in order");
        if (z >= 0) fprintf(c->f, "\"\\\"\" %s-char{%lld,%lld} \"\\\"\"", c->prefix, a, z);
        else fprintf(c->f, "\"\\\"\" %s-char{%lld,} \"\\\"\"", c->prefix, a);
        return 0;
    }
    fprintf(c->f, "%s-string", c->prefix);
    return 0;
}

/* ---- objects and arrays ---- */

static int put_object(sc *c, const json_t *s) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    const char *P = c->prefix;
    if (props && !json_is_object(props)) return lm_errf(c->e, "'properties' must be an object");
    if (req && !json_is_array(req)) return lm_errf(c->e, "'required' must be an array");
    size_t n = json_object_size(props);
    for (size_t i = 0; i < json_array_size(req); i++) {
        const json_t *k = json_array_get(req, i);
        if (!json_is_string(k)) return lm_errf(c->e, "'required' must list strings");
        if (!json_object_get(props, json_string_value(k)))
            return lm_errf(c->e, "required property '%.60s' is not in 'properties'", json_string_value(k));
    }
    if (!props && !add) {
        fprintf(c->f, "%s-object", P);
        return 0;
    }
    /* the members: rule number of each value */
    const char **keys = lm_xcalloc(n + 1, sizeof *keys);
    int *val = lm_xcalloc(n + 1, sizeof *val);
    bool *required = lm_xcalloc(n + 1, 1);
    size_t i = 0;
    const char *k;
    const json_t *v;
    int rc = 0;
    json_object_foreach((json_t *)props, k, v) {
        keys[i] = k;
        for (size_t j = 0; j < json_array_size(req); j++)
            required[i] |= !strcmp(json_string_value(json_array_get(req, j)), k);
        if ((rc = schema_rule(c, v, &val[i]))) {
            lm_err_prefix(c->e, "properties.%.60s", k);
            break;
        }
        i++;
    }
    int extra = -1;
    if (!rc && add && !json_is_boolean(add)) rc = schema_rule(c, add, &extra);
    else if (!rc && (json_is_true(add) || (!add && !props))) extra = -2; /* any value */
    if (rc) {
        free(keys), free(val), free(required);
        return -1;
    }
    /* F_j: members from j on, none written yet; R_j: the same after one;
     * both end with the whitespace before "}" */
    int F = c->n_rules, R = F + (int)n + 1;
    c->n_rules += 2 * ((int)n + 1);
    fprintf(c->f, "(\"{\" %s-ws %s-r%d \"}\")", P, P, F);
    char vr[64];
    if (extra == -2) snprintf(vr, sizeof vr, "%s-value", P);
    else snprintf(vr, sizeof vr, "%s-r%d", P, extra);
    for (size_t j = 0; j <= n; j++) {
        for (int first = 1; first >= 0; first--) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            fprintf(f, "%s-r%d ::= ", P, (first ? F : R) + (int)j);
            if (j == n) {
                if (!first) fprintf(f, "%s-ws", P);
                if (extra != -1 && first)
                    fprintf(f, " | %s-string %s-ws \":\" %s-ws %s (%s-ws \",\" %s-ws %s-string %s-ws \":\" %s-ws %s)* %s-ws",
                            P, P, P, vr, P, P, P, P, P, vr, P);
                if (extra != -1 && !first)
                    fprintf(f, " | (%s-ws \",\" %s-ws %s-string %s-ws \":\" %s-ws %s)+ %s-ws", P, P, P, P, P, vr, P);
            } else {
                if (!first) fprintf(f, "%s-ws \",\" %s-ws ", P, P);
                json_t *ks = json_string(keys[j]);
                char *kd = json_dumps(ks, JSON_ENCODE_ANY);
                fputc('"', f);
                lm_gbnf_put_literal(f, kd, strlen(kd));
                fputc('"', f);
                free(kd);
                json_decref(ks);
                fprintf(f, " %s-ws \":\" %s-ws %s-r%d %s-r%d", P, P, P, val[j], P, R + (int)j + 1);
                if (!required[j]) fprintf(f, " | %s-r%d", P, (first ? F : R) + (int)j + 1);
            }
            fputc('\n', f);
            fclose(f);
            add_text(c, buf, len);
            free(buf);
        }
    }
    free(keys), free(val), free(required);
    return 0;
}

static int put_array(sc *c, const json_t *s) {
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    const char *P = c->prefix;
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx))) return lm_errf(c->e, "minItems / maxItems must be integers");
    long long a = mn ? json_integer_value(mn) : 0, z = mx ? json_integer_value(mx) : -1;
    if (a < 0 || a > 1000 || z > 1000 || (z >= 0 && z < a)) return lm_errf(c->e, "minItems / maxItems must be within 0..1000 and in order");
    if (prefix) {
        if (!json_is_array(prefix) || json_array_size(prefix) == 0) return lm_errf(c->e, "'prefixItems' must be a non-empty array");
        if (mn || mx || (items && !json_is_false(items))) return lm_errf(c->e, "prefixItems with items, minItems or maxItems is not supported");
        size_t n = json_array_size(prefix);
        int *r = lm_xmalloc(n * sizeof *r);
        for (size_t i = 0; i < n; i++)
            if (schema_rule(c, json_array_get(prefix, i), &r[i])) {
                free(r);
                return lm_err_prefix(c->e, "prefixItems[%zu]", i);
            }
        fprintf(c->f, "(\"[\" %s-ws", P);
        for (size_t i = 0; i < n; i++) {
            if (i) fprintf(c->f, " %s-ws \",\" %s-ws", P, P);
            fprintf(c->f, " %s-r%d", P, r[i]);
        }
        free(r);
        fprintf(c->f, " %s-ws \"]\")", P);
        return 0;
    }
    char item[64];
    if (items && !json_is_true(items)) {
        if (json_is_false(items)) return lm_errf(c->e, "'items': false without prefixItems is not supported");
        int r;
        if (schema_rule(c, items, &r)) return lm_err_prefix(c->e, "items");
        snprintf(item, sizeof item, "%s-r%d", P, r);
    } else {
        snprintf(item, sizeof item, "%s-value", P);
    }
    FILE *f = c->f;
    if (z == 0) {
        fprintf(f, "(\"[\" %s-ws \"]\")", P);
        return 0;
    }
    char rep[48];
    long long lo = a > 0 ? a - 1 : 0;
    if (z < 0) snprintf(rep, sizeof rep, "{%lld,}", lo);
    else snprintf(rep, sizeof rep, "{%lld,%lld}", lo, z - 1);
    if (a == 0) fprintf(f, "(\"[\" %s-ws (%s (%s-ws \",\" %s-ws %s)%s %s-ws)? \"]\")", P, item, P, P, item, rep, P);
    else fprintf(f, "(\"[\" %s-ws %s (%s-ws \",\" %s-ws %s)%s %s-ws \"]\")", P, item, P, P, item, rep, P);
    return 0;
}

/* ---- schemas ---- */

/* Resolves a local $ref (a JSON pointer into the root document). */
static const json_t *resolve(sc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *at = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char key[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof key) {
            if (p[0] == '~' && p[1] == '1') key[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') key[n++] = '~', p += 2;
            else key[n++] = *p++;
        }
        key[n] = 0;
        if (json_is_object(at)) at = json_object_get(at, key);
        else if (json_is_array(at)) at = json_array_get(at, (size_t)strtoul(key, NULL, 10));
        else return NULL;
        if (!at) return NULL;
    }
    return at;
}

/* ---- oneOf ----
 *
 * A grammar of alternatives accepts a value that matches several of them;
 * oneOf must refuse it. Deciding overlap in general is as hard as schema
 * containment, so lumen accepts oneOf only where it can show that no
 * value matches two branches, the way real schemas are written: the
 * branches take different JSON types, or different const/enum values, or
 * are objects with a required property (a discriminator such as "kind")
 * whose const/enum values or types differ, or one requires a property
 * the other forbids (additionalProperties false). Anything else is a 400
 * naming the two branches; anyOf says "overlap is fine". */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_FRAC = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

static const json_t *deref(sc *c, const json_t *s) {
    for (int i = 0; i < 16 && json_is_object(s) && json_is_string(json_object_get(s, "$ref")); i++)
        s = resolve(c, json_string_value(json_object_get(s, "$ref")));
    return s;
}

static int value_type(const json_t *v) {
    if (json_is_null(v)) return T_NULL;
    if (json_is_boolean(v)) return T_BOOL;
    if (json_is_integer(v)) return T_INT;
    if (json_is_real(v)) return json_real_value(v) == floor(json_real_value(v)) ? T_INT : T_FRAC;
    if (json_is_string(v)) return T_STR;
    return json_is_array(v) ? T_ARR : T_OBJ;
}

static int name_type(const char *t) {
    static const char *const names[] = { "null", "boolean", "integer", "number", "string", "array", "object" };
    static const int bits[] = { T_NULL, T_BOOL, T_INT, T_INT | T_FRAC, T_STR, T_ARR, T_OBJ };
    for (size_t i = 0; i < LM_COUNT(names); i++)
        if (!strcmp(t, names[i])) return bits[i];
    return T_ANY;
}

/* The JSON types schema s admits (T_ANY when it cannot tell). */
static int types_of(sc *c, const json_t *s, int depth) {
    s = deref(c, s);
    if (!json_is_object(s) || depth > 8) return T_ANY;
    const json_t *x;
    int t = 0;
    if ((x = json_object_get(s, "const"))) return value_type(x);
    if ((x = json_object_get(s, "enum"))) {
        for (size_t i = 0; i < json_array_size(x); i++) t |= value_type(json_array_get(x, i));
        return json_array_size(x) ? t : T_ANY;
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        for (size_t i = 0; i < json_array_size(x); i++) t |= types_of(c, json_array_get(x, i), depth + 1);
        return t ? t : T_ANY;
    }
    if ((x = json_object_get(s, "allOf")) && json_array_size(x) == 1) return types_of(c, json_array_get(x, 0), depth + 1);
    if ((x = json_object_get(s, "type"))) {
        if (json_is_string(x)) t = name_type(json_string_value(x));
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++)
            t |= json_is_string(json_array_get(x, i)) ? name_type(json_string_value(json_array_get(x, i))) : T_ANY;
        return t | (json_is_true(json_object_get(s, "nullable")) ? T_NULL : 0);
    }
    if (json_object_get(s, "properties")) return T_OBJ;
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) return T_ARR;
    return T_ANY;
}

/* Whether no value matches both a and b by type or by const/enum values. */
static bool values_exclusive(sc *c, const json_t *a, const json_t *b) {
    a = deref(c, a), b = deref(c, b);
    if (!(types_of(c, a, 0) & types_of(c, b, 0))) return true;
    const json_t *va = json_object_get(a, "const"), *vb = json_object_get(b, "const");
    const json_t *ea = json_object_get(a, "enum"), *eb = json_object_get(b, "enum");
    if (!(va || json_is_array(ea)) || !(vb || json_is_array(eb))) return false;
    size_t na = va ? 1 : json_array_size(ea), nb = vb ? 1 : json_array_size(eb);
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++)
            if (json_equal(va ? va : json_array_get(ea, i), vb ? vb : json_array_get(eb, j))) return false;
    return true;
}

static bool requires(const json_t *s, const char *key) {
    const json_t *req = json_object_get(s, "required");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (json_is_string(json_array_get(req, i)) && !strcmp(json_string_value(json_array_get(req, i)), key)) return true;
    return false;
}

/* Whether object schema a requires a property that b forbids or that
 * takes values b's same required property never does. */
static bool object_excludes(sc *c, const json_t *a, const json_t *b) {
    const json_t *req = json_object_get(a, "required"), *pa = json_object_get(a, "properties");
    const json_t *pb = json_object_get(b, "properties");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *k = json_string_value(json_array_get(req, i));
        if (!k) continue;
        const json_t *sb = json_object_get(pb, k);
        if (!sb && json_is_false(json_object_get(b, "additionalProperties"))) return true;
        if (sb && json_object_get(pa, k) && requires(b, k) && values_exclusive(c, json_object_get(pa, k), sb)) return true;
    }
    return false;
}

static bool branches_exclusive(sc *c, const json_t *a, const json_t *b) {
    if (values_exclusive(c, a, b)) return true;
    a = deref(c, a), b = deref(c, b);
    if (!json_is_object(a) || !json_is_object(b)) return false;
    if ((types_of(c, a, 0) & types_of(c, b, 0)) != T_OBJ) return false; /* both may be something else too */
    return object_excludes(c, a, b) || object_excludes(c, b, a);
}

static int oneof_exclusive(sc *c, const json_t *branches) {
    for (size_t i = 0; i < json_array_size(branches); i++)
        for (size_t j = i + 1; j < json_array_size(branches); j++)
            if (!branches_exclusive(c, json_array_get(branches, i), json_array_get(branches, j)))
                return lm_errf(c->e,
                               "oneOf branches %zu and %zu may both match one value: lumen enforces oneOf only when "
                               "the branches differ in type, in const/enum values, in a required property's "
                               "const/enum values or type, or when one requires a property the other forbids "
                               "(use anyOf if overlap is fine)",
                               i, j);
    return 0;
}

static int put_type(sc *c, const json_t *s, const char *type) {
    const char *P = c->prefix;
    if (!strcmp(type, "string")) return put_string(c, s);
    if (!strcmp(type, "integer")) return put_integer(c, s);
    if (!strcmp(type, "number")) return put_number(c, s);
    if (!strcmp(type, "boolean")) return fprintf(c->f, "%s-bool", P), 0;
    if (!strcmp(type, "null")) return fprintf(c->f, "%s-null", P), 0;
    if (!strcmp(type, "object")) return put_object(c, s);
    if (!strcmp(type, "array")) return put_array(c, s);
    return lm_errf(c->e, "unknown type '%.40s'", type);
}

/* The body (alternatives) of schema s, written at the current position. */
static int put_schema(sc *c, const json_t *s) {
    const char *P = c->prefix;
    if (json_is_true(s)) return fprintf(c->f, "%s-value", P), 0;
    if (json_is_false(s)) return lm_errf(c->e, "the schema false (nothing is valid) is not supported");
    if (!json_is_object(s)) return lm_errf(c->e, "a schema must be an object or a boolean");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        bool known = false;
        for (int i = 0; ignored[i] && !known; i++) known = !strcmp(ignored[i], k);
        if (!known) return lm_errf(c->e, "the keyword '%.60s' is not supported", k);
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return lm_errf(c->e, "'$ref' must be a string");
        const json_t *seen = json_object_get(c->refs, json_string_value(ref));
        int r;
        if (seen) {
            r = (int)json_integer_value(seen);
        } else {
            const json_t *t = resolve(c, json_string_value(ref));
            if (!t) return lm_errf(c->e, "'$ref' \"%.80s\" does not resolve within the schema", json_string_value(ref));
            r = new_rule(c);
            json_object_set_new(c->refs, json_string_value(ref), json_integer(r));
            if (rule_text(c, r, t)) return lm_err_prefix(c->e, "$ref \"%.80s\"", json_string_value(ref));
        }
        fprintf(c->f, "%s-r%d", P, r);
        return 0;
    }
    const json_t *cst = json_object_get(s, "const");
    if (cst) {
        put_json_literal(c->f, cst);
        return 0;
    }
    const json_t *en = json_object_get(s, "enum");
    if (en) {
        if (!json_is_array(en) || !json_array_size(en)) return lm_errf(c->e, "'enum' must be a non-empty array");
        fputc('(', c->f);
        for (size_t i = 0; i < json_array_size(en); i++) {
            if (i) fputs(" | ", c->f);
            put_json_literal(c->f, json_array_get(en, i));
        }
        fputc(')', c->f);
        return 0;
    }
    const json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    const json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1) return lm_errf(c->e, "'allOf' with more than one schema is not supported");
        return put_schema(c, json_array_get(all, 0));
    }
    const json_t *type = json_object_get(s, "type");
    bool nullable = json_is_true(json_object_get(s, "nullable"));
    fputc('(', c->f);
    int n = 0;
    if (any) {
        if (!json_is_array(any) || !json_array_size(any)) return lm_errf(c->e, "'anyOf' / 'oneOf' must be a non-empty array");
        if (!json_object_get(s, "anyOf") && oneof_exclusive(c, any)) return -1;
        for (size_t i = 0; i < json_array_size(any); i++) {
            int r;
            if (schema_rule(c, json_array_get(any, i), &r)) return lm_err_prefix(c->e, "anyOf[%zu]", i);
            fprintf(c->f, "%s%s-r%d", n++ ? " | " : "", P, r);
        }
    } else if (json_is_string(type)) {
        n++;
        if (put_type(c, s, json_string_value(type))) return -1;
    } else if (json_is_array(type)) {
        for (size_t i = 0; i < json_array_size(type); i++) {
            if (!json_is_string(json_array_get(type, i))) return lm_errf(c->e, "'type' must list strings");
            if (n++) fputs(" | ", c->f);
            if (put_type(c, s, json_string_value(json_array_get(type, i)))) return -1;
        }
    } else if (type) {
        return lm_errf(c->e, "'type' must be a string or an array of strings");
    } else if (json_object_get(s, "properties")) {
        n++;
        if (put_object(c, s)) return -1;
    } else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) {
        n++;
        if (put_array(c, s)) return -1;
    } else {
        n++;
        fprintf(c->f, "%s-value", P);
    }
    if (nullable) fprintf(c->f, " | %s-null", P);
    fputc(')', c->f);
    return 0;
}

/* Rule r's line for schema s, kept with the others until the end. */
static int rule_text(sc *c, int r, const json_t *s) {
    if (++c->depth > 64) return lm_errf(c->e, "the schema nests deeper than 64 levels");
    char *buf = NULL;
    size_t len = 0;
    FILE *save = c->f;
    c->f = open_memstream(&buf, &len);
    fprintf(c->f, "%s-r%d ::= ", c->prefix, r);
    int rc = put_schema(c, s);
    fputc('\n', c->f);
    fclose(c->f);
    c->f = save;
    c->depth--;
    if (!rc) add_text(c, buf, len);
    free(buf);
    return rc;
}

/* A new rule for schema s; *out its number. */
static int schema_rule(sc *c, const json_t *s, int *out) {
    *out = new_rule(c);
    return rule_text(c, *out, s);
}

int lm_schema_append_gbnf(FILE *out, const json_t *schema, const char *prefix, lm_err *e) {
    sc c = { .f = out, .root = schema, .prefix = prefix, .e = e, .refs = json_object() };
    json_object_set_new(c.refs, "", json_array()); /* the rule texts, in order */
    int r, rc = schema_rule(&c, schema, &r);
    if (!rc) {
        fprintf(out, "%s ::= %s-r%d\n", prefix, prefix, r);
        const json_t *texts = json_object_get(c.refs, "");
        for (size_t i = 0; i < json_array_size(texts); i++)
            fwrite(json_string_value(json_array_get(texts, i)), 1, json_string_length(json_array_get(texts, i)), out);
        put_basics(out, prefix);
    }
    json_decref(c.refs);
    return rc;
}

char *lm_schema_to_gbnf(const json_t *schema, lm_err *e) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fputs("root ::= s\n", f);
    int rc = lm_schema_append_gbnf(f, schema, "s", e);
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

int lm_grammar_from_schema(lm_grammar **out, const json_t *schema, lm_err *e) {
    *out = NULL;
    char *g = lm_schema_to_gbnf(schema, e);
    if (!g) return -1;
    int rc = lm_grammar_from_gbnf(out, g, strlen(g), e);
    free(g);
    return rc;
}
