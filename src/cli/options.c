/* options.c - argv against a command's option table, and --help from it
 * (see options.h).
 *
 * A table's fields are read and written with memcpy at their offset and size,
 * so one INT kind serves int, long and uint64_t fields alike; the entry's
 * size says which. A table that does not fit its fields is a broken
 * invariant: every parse and help checks the table first and asserts. */
#include "options.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/lm_base.h"

/* Help layout: option column, then help text wrapped at the width. */
#define HELP_COL 24
#define HELP_WIDTH 80

/* ---- value parsers -------------------------------------------------------------------- */

bool lm_opt_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool lm_opt_float(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

bool lm_opt_size(const char *s, size_t *out) {
    char *end;
    if (*s < '0' || *s > '9') return false; /* no sign, no space */
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || v > (1ull << (60 - shift))) return false;
    *out = (size_t)(v << shift);
    return true;
}

/* ---- fields ----------------------------------------------------------------------------- */

static long long get_int(const void *field, size_t size) {
    if (size == sizeof(int32_t)) {
        int32_t v;
        memcpy(&v, field, sizeof v);
        return v;
    }
    int64_t v;
    memcpy(&v, field, sizeof v);
    return v;
}

static void put_int(void *field, size_t size, long long v) {
    if (size == sizeof(int32_t)) {
        int32_t x = (int32_t)v;
        memcpy(field, &x, sizeof x);
    } else {
        int64_t x = v;
        memcpy(field, &x, sizeof x);
    }
}

static double get_float(const void *field, size_t size) {
    if (size == sizeof(float)) {
        float v;
        memcpy(&v, field, sizeof v);
        return v;
    }
    double v;
    memcpy(&v, field, sizeof v);
    return v;
}

static void put_float(void *field, size_t size, double v) {
    if (size == sizeof(float)) {
        float x = (float)v;
        memcpy(field, &x, sizeof x);
    } else {
        memcpy(field, &v, sizeof v);
    }
}

/* Each entry's field has the size its kind writes. */
static void check_table(const lm_opt *t) {
    for (; t->kind != LM_OPT_END; t++) {
        switch (t->kind) {
        case LM_OPT_FLAG: LM_ASSERT(t->size == sizeof(bool)); break;
        case LM_OPT_INT:
            LM_ASSERT(t->size == 8 || (t->size == 4 && t->ilo >= INT32_MIN && t->ihi <= INT32_MAX));
            LM_ASSERT(t->ilo <= t->ihi);
            break;
        case LM_OPT_FLOAT: LM_ASSERT(t->size == sizeof(float) || t->size == sizeof(double)); break;
        case LM_OPT_SIZE: LM_ASSERT(t->size == sizeof(size_t)); break;
        case LM_OPT_STRING: case LM_OPT_ARG: LM_ASSERT(t->size == sizeof(const char *)); break;
        case LM_OPT_CHOICE: LM_ASSERT(t->size == sizeof(int) && t->choices && t->choices[0].name); break;
        case LM_OPT_CUSTOM: LM_ASSERT(t->parse && t->want); break;
        case LM_OPT_GROUP: check_table(t->group); break;
        case LM_OPT_END: break;
        }
        LM_ASSERT(t->name || t->kind == LM_OPT_GROUP);
    }
}

/* ---- lookup ----------------------------------------------------------------------------- */

/* The entry spelled a, NULL if none; *base: where its table's struct sits. */
static const lm_opt *find_opt(const lm_opt *t, const char *a, size_t at, size_t *base) {
    for (; t->kind != LM_OPT_END; t++) {
        if (t->kind == LM_OPT_GROUP) {
            const lm_opt *o = find_opt(t->group, a, at + t->off, base);
            if (o) return o;
        } else if (t->kind != LM_OPT_ARG && (!strcmp(t->name, a) || (t->alias && !strcmp(t->alias, a)))) {
            *base = at;
            return t;
        }
    }
    return NULL;
}

/* The (*nth)th positional entry, counting down *nth; NULL past the last. */
static const lm_opt *find_arg(const lm_opt *t, int *nth, size_t at, size_t *base) {
    for (; t->kind != LM_OPT_END; t++) {
        if (t->kind == LM_OPT_GROUP) {
            const lm_opt *o = find_arg(t->group, nth, at + t->off, base);
            if (o) return o;
        } else if (t->kind == LM_OPT_ARG && (*nth)-- == 0) {
            *base = at;
            return t;
        }
    }
    return NULL;
}

/* ---- parsing ---------------------------------------------------------------------------- */

/* Writes text into the entry's field (dst: its table's struct); false if bad. */
static bool set_value(const lm_opt *o, char *dst, const char *text) {
    void *field = dst + o->off;
    long long n;
    double x;
    size_t bytes;
    switch (o->kind) {
    case LM_OPT_INT:
        if (!lm_opt_int(text, o->ilo, o->ihi, &n)) return false;
        put_int(field, o->size, n);
        return true;
    case LM_OPT_FLOAT:
        if (!lm_opt_float(text, &x)) return false;
        /* written so that NaN is out of every range */
        if (!(o->lo_open ? x > o->lo : x >= o->lo) || !(o->hi_open ? x < o->hi : x <= o->hi)) return false;
        put_float(field, o->size, x);
        return true;
    case LM_OPT_SIZE:
        if (!lm_opt_size(text, &bytes) || bytes < (size_t)o->ilo) return false;
        memcpy(field, &bytes, sizeof bytes);
        return true;
    case LM_OPT_STRING:
        if (strlen(text) < (size_t)o->ilo) return false;
        memcpy(field, &text, sizeof text);
        return true;
    case LM_OPT_CHOICE:
        for (const lm_opt_choice *c = o->choices; c->name; c++)
            if (!strcmp(c->name, text)) {
                memcpy(field, &c->value, sizeof c->value);
                return true;
            }
        return false;
    case LM_OPT_CUSTOM: return o->parse(dst, text);
    default: LM_ASSERT(!"an option kind without a value"); return false;
    }
}

/* "it is not ..." for a bad value, from the kind and the range. */
static void describe_want(const lm_opt *o, char *buf, size_t cap) {
    size_t n;
    switch (o->kind) {
    case LM_OPT_INT: snprintf(buf, cap, "it is not a whole number from %lld to %lld", o->ilo, o->ihi); break;
    case LM_OPT_FLOAT:
        if (isinf(o->hi)) snprintf(buf, cap, "it is not a number %s %g", o->lo_open ? ">" : ">=", o->lo);
        else
            snprintf(buf, cap, "it is not a number in %c%g, %g%c", o->lo_open ? '(' : '[', o->lo, o->hi,
                     o->hi_open ? ')' : ']');
        break;
    case LM_OPT_SIZE:
        snprintf(buf, cap, "it is not a size%s: give bytes or a whole number with K, M, G or T (e.g. 512M, 4G)",
                 o->ilo > 0 ? " above 0" : "");
        break;
    case LM_OPT_STRING: snprintf(buf, cap, "it is empty"); break;
    case LM_OPT_CHOICE:
        n = (size_t)snprintf(buf, cap, "it is not one of");
        for (const lm_opt_choice *c = o->choices; c->name && n < cap; c++)
            n += (size_t)snprintf(buf + n, cap - n, "%s %s", c == o->choices ? "" : ",", c->name);
        break;
    default: snprintf(buf, cap, "it is not %s", o->want ? o->want : "valid"); break;
    }
}

int lm_opts_parse(const lm_opt_cmd *cmd, void *dst, int argc, char **argv) {
    return lm_opts_parse_io(cmd, dst, argc, argv, stdout, stderr);
}

int lm_opts_parse_io(const lm_opt_cmd *cmd, void *dst, int argc, char **argv, FILE *out, FILE *err) {
    check_table(cmd->opts);
    memcpy(dst, cmd->defaults, cmd->size);
    bool only_args = false;
    int n_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        size_t base = 0;
        if (!only_args && !strcmp(a, "--")) {
            only_args = true;
            continue;
        }
        if (!only_args && a[0] == '-' && a[1]) {
            if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
                lm_opts_help(cmd, out);
                return 0;
            }
            const lm_opt *o = find_opt(cmd->opts, a, 0, &base);
            if (!o) {
                fprintf(err, "lumen %s: unknown option %s (see lumen %s --help)\n", cmd->name, a, cmd->name);
                return 2;
            }
            if (o->kind == LM_OPT_FLAG) {
                const bool on = true;
                memcpy((char *)dst + base + o->off, &on, sizeof on);
                continue;
            }
            if (i + 1 >= argc) {
                fprintf(err, "lumen: option %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!set_value(o, (char *)dst + base, v)) {
                char want[256];
                describe_want(o, want, sizeof want);
                fprintf(err, "lumen %s: bad value for %s '%s': %s\n", cmd->name, a, v, want);
                return 2;
            }
            continue;
        }
        int nth = n_args++;
        const lm_opt *p = find_arg(cmd->opts, &nth, 0, &base);
        if (!p) {
            fprintf(err, "lumen %s: unexpected argument %s (see lumen %s --help)\n", cmd->name, a, cmd->name);
            return 2;
        }
        memcpy((char *)dst + base + p->off, &a, sizeof a);
    }
    return -1;
}

/* ---- help ------------------------------------------------------------------------------- */

/* Prints text from column `at`, wrapped at HELP_WIDTH, later lines from HELP_COL. */
static void wrap(FILE *f, const char *text, int at) {
    const char *p = text;
    for (;;) {
        while (*p == ' ') p++;
        const char *end = p, *brk = NULL;
        /* the longest run of words that fits; one long word alone if none does */
        while (*end && (at + (end - p) < HELP_WIDTH || !brk)) {
            if (*end == ' ') brk = end;
            end++;
        }
        if (*end == ' ') brk = end;
        if (*end && brk) end = brk;
        fprintf(f, "%.*s\n", (int)(end - p), p);
        for (p = end; *p == ' ';) p++;
        if (!*p) return;
        fprintf(f, "%*s", HELP_COL, "");
        at = HELP_COL;
    }
}

/* The default of o in words, from dflt or the field; "" when it has none. */
static void default_text(const lm_opt *o, const char *field, char *buf, size_t cap) {
    buf[0] = 0;
    if (o->dflt) {
        snprintf(buf, cap, "%s", o->dflt);
        return;
    }
    const char *s;
    size_t bytes;
    int v;
    switch (o->kind) {
    case LM_OPT_INT: snprintf(buf, cap, "%lld", get_int(field, o->size)); break;
    case LM_OPT_FLOAT: snprintf(buf, cap, "%g", get_float(field, o->size)); break;
    case LM_OPT_SIZE:
        memcpy(&bytes, field, sizeof bytes);
        snprintf(buf, cap, "%zu", bytes);
        break;
    case LM_OPT_STRING:
        memcpy(&s, field, sizeof s);
        if (s) snprintf(buf, cap, "%s", s);
        break;
    case LM_OPT_CHOICE:
        memcpy(&v, field, sizeof v);
        for (const lm_opt_choice *c = o->choices; c->name; c++)
            if (c->value == v) {
                snprintf(buf, cap, "%s", c->name);
                break;
            }
        break;
    default: break;
    }
}

static void help_entries(FILE *f, const lm_opt *t, const char *defaults) {
    for (; t->kind != LM_OPT_END; t++) {
        if (t->kind == LM_OPT_GROUP) {
            help_entries(f, t->group, defaults + t->off);
            continue;
        }
        char left[160], meta[96], dflt[160], text[1024];
        size_t n = 0;
        meta[0] = 0;
        if (t->kind == LM_OPT_CHOICE && !t->meta)
            for (const lm_opt_choice *c = t->choices; c->name && n < sizeof meta; c++)
                n += (size_t)snprintf(meta + n, sizeof meta - n, "%s%s", c == t->choices ? "" : "|", c->name);
        else if (t->meta)
            snprintf(meta, sizeof meta, "%s", t->meta);
        int w = snprintf(left, sizeof left, "  %s%s%s%s%s", t->alias ? t->alias : "", t->alias ? ", " : "", t->name,
                         meta[0] ? " " : "", meta);
        default_text(t, defaults + t->off, dflt, sizeof dflt);
        snprintf(text, sizeof text, "%s%s%s%s%s", t->help, dflt[0] ? " (default" : "",
                 dflt[0] ? (t->dflt ? ": " : " ") : "", dflt, dflt[0] ? ")" : "");
        fputs(left, f);
        if (w < HELP_COL - 1) {
            fprintf(f, "%*s", HELP_COL - w, "");
        } else {
            fprintf(f, "\n%*s", HELP_COL, "");
        }
        wrap(f, text, HELP_COL);
    }
}

void lm_opts_help(const lm_opt_cmd *cmd, FILE *f) {
    check_table(cmd->opts);
    fprintf(f, "usage: %s\n", cmd->usage);
    if (cmd->about) fprintf(f, "\n%s", cmd->about);
    fputc('\n', f);
    help_entries(f, cmd->opts, cmd->defaults);
    if (cmd->epilog) fprintf(f, "\n%s", cmd->epilog);
}
