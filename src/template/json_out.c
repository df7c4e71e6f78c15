/* json_out.c - the tojson filter, byte for byte what transformers produces:
 * json.dumps(x, ensure_ascii=False, indent=None, separators=None,
 * sort_keys=False) with those options overridable, and Python's repr() of a
 * float (the shortest string that reads back to the same double), which
 * json.dumps and str() both use.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

#include <math.h>
#include <stdlib.h>

/* repr(float): shortest round-trip digits; fixed notation when the decimal
 * exponent is in [-4, 16), else d.ddde+XX; always a '.0' on integers. */
void tpl_float_repr(double x, char out[32]) {
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *s = tmp;
    bool neg = *s == '-';
    if (neg) s++;
    char dig[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.' && nd < 20) dig[nd++] = *s;
    int e = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char *o = out;
    if (neg) *o++ = '-';
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) *o++ = i < nd ? dig[i] : '0';
            *o++ = '.';
            if (nd > e + 1)
                for (int i = e + 1; i < nd; i++) *o++ = dig[i];
            else
                *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -e - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = dig[i];
        }
        *o = 0;
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = dig[i];
        }
        int ae = e < 0 ? -e : e; /* |e| <= 324 */
        *o++ = 'e';
        *o++ = e < 0 ? '-' : '+';
        if (ae >= 100) *o++ = (char)('0' + ae / 100);
        *o++ = (char)('0' + ae / 10 % 10);
        *o++ = (char)('0' + ae % 10);
        *o = 0;
    }
}

static void json_str(tpl_rt *rt, tpl_buf *b, tpl_str s, bool ascii) {
    tpl_buf_put(rt, b, "\"", 1);
    size_t i = 0, run = 0;
    while (i < s.n) {
        unsigned char c = (unsigned char)s.p[i];
        const char *esc = NULL;
        char tmp[16];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20 || (ascii && c == 0x7F)) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        }
        if (esc) {
            tpl_buf_put(rt, b, s.p + run, i - run);
            tpl_buf_puts(rt, b, esc);
            run = ++i;
            continue;
        }
        if (c >= 0x80 && ascii) {
            tpl_buf_put(rt, b, s.p + run, i - run);
            uint32_t cp = (uint32_t)tpl_utf8_dec(s.p, s.n, &i);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            }
            tpl_buf_puts(rt, b, tmp);
            run = i;
            continue;
        }
        i++;
    }
    tpl_buf_put(rt, b, s.p + run, s.n - run);
    tpl_buf_put(rt, b, "\"", 1);
}

static void json_float(tpl_rt *rt, tpl_buf *b, double f) {
    char tmp[32];
    if (isnan(f)) strcpy(tmp, "NaN");
    else if (isinf(f)) strcpy(tmp, f < 0 ? "-Infinity" : "Infinity");
    else tpl_float_repr(f, tmp);
    tpl_buf_puts(rt, b, tmp);
}

typedef struct json_opts {
    bool ascii, sort;
    const char *indent;
    int indent_len;
    const char *item_sep, *key_sep;
} json_opts;

static void newline_indent(tpl_rt *rt, tpl_buf *b, const json_opts *o, int level) {
    tpl_buf_put(rt, b, "\n", 1);
    for (int i = 0; i < level; i++) tpl_buf_put(rt, b, o->indent, (size_t)o->indent_len);
}

static void json_key(tpl_rt *rt, tpl_buf *b, tpl_val k, const json_opts *o) {
    switch (k.t) {
    case TV_STR: json_str(rt, b, tpl_sv(k), o->ascii); return;
    case TV_INT: tpl_buf_printf(rt, b, "\"%lld\"", (long long)k.u.i); return;
    case TV_BOOL: tpl_buf_puts(rt, b, k.u.b ? "\"true\"" : "\"false\""); return;
    case TV_NONE: tpl_buf_puts(rt, b, "\"null\""); return;
    case TV_FLOAT:
        tpl_buf_puts(rt, b, "\"");
        json_float(rt, b, k.u.f);
        tpl_buf_puts(rt, b, "\"");
        return;
    default:
        tpl_rt_raise(rt, "keys must be str, int, float, bool or None, not %s", tpl_type_name(&k));
    }
}

/* Insertion sort of key indices (stable, no global state; dicts are small). */
static void sort_pairs(tpl_rt *rt, const tpl_dict *d, size_t *idx) {
    for (size_t i = 0; i < d->n; i++) idx[i] = i;
    for (size_t i = 1; i < d->n; i++) {
        size_t x = idx[i], j = i;
        while (j > 0 && tpl_cmp(rt, d->k[idx[j - 1]], d->k[x]) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = x;
    }
}

static void json_val(tpl_rt *rt, tpl_buf *b, tpl_val v, const json_opts *o, int level) {
    switch (v.t) {
    case TV_NONE: tpl_buf_puts(rt, b, "null"); return;
    case TV_BOOL: tpl_buf_puts(rt, b, v.u.b ? "true" : "false"); return;
    case TV_INT: tpl_buf_printf(rt, b, "%lld", (long long)v.u.i); return;
    case TV_FLOAT: json_float(rt, b, v.u.f); return;
    case TV_STR: json_str(rt, b, tpl_sv(v), o->ascii); return;
    case TV_LIST:
        if (v.flags & TVF_NOT_LIST) tpl_rt_raise(rt, "Object of type %s is not JSON serializable", tpl_type_name(&v));
        break;
    case TV_DICT: break;
    default: tpl_rt_raise(rt, "Object of type %s is not JSON serializable", tpl_type_name(&v));
    }
    if (++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "values nested too deeply for tojson");
    if (v.t == TV_LIST) {
        if (v.u.l->n == 0) {
            tpl_buf_puts(rt, b, "[]");
        } else {
            tpl_buf_puts(rt, b, "[");
            for (size_t i = 0; i < v.u.l->n; i++) {
                if (i) tpl_buf_puts(rt, b, o->item_sep);
                if (o->indent) newline_indent(rt, b, o, level + 1);
                json_val(rt, b, v.u.l->v[i], o, level + 1);
            }
            if (o->indent) newline_indent(rt, b, o, level);
            tpl_buf_puts(rt, b, "]");
        }
    } else {
        const tpl_dict *d = v.u.d;
        if (d->n == 0) {
            tpl_buf_puts(rt, b, "{}");
        } else {
            size_t *idx = NULL;
            if (o->sort) {
                idx = tpl_rt_alloc(rt, d->n * sizeof *idx);
                sort_pairs(rt, d, idx);
            }
            tpl_buf_puts(rt, b, "{");
            for (size_t i = 0; i < d->n; i++) {
                size_t k = idx ? idx[i] : i;
                if (i) tpl_buf_puts(rt, b, o->item_sep);
                if (o->indent) newline_indent(rt, b, o, level + 1);
                json_key(rt, b, d->k[k], o);
                tpl_buf_puts(rt, b, o->key_sep);
                json_val(rt, b, d->v[k], o, level + 1);
            }
            if (o->indent) newline_indent(rt, b, o, level);
            tpl_buf_puts(rt, b, "}");
        }
    }
    rt->depth--;
}

void tpl_tojson(tpl_rt *rt, tpl_buf *b, tpl_val v, bool ensure_ascii, const char *indent,
                int indent_len, const char *item_sep, const char *key_sep, bool sort_keys) {
    json_opts o = { ensure_ascii, sort_keys, indent, indent_len,
                    item_sep ? item_sep : (indent ? "," : ", "), key_sep ? key_sep : ": " };
    json_val(rt, b, v, &o, 0);
}
