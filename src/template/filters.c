/* filters.c - jinja2's built-in filters on strings and numbers, with
 * Python semantics, plus transformers' tojson (json.dumps keeping key order,
 * no ASCII escaping); those on sequences and mappings are filters_seq.c's.
 * Each filter takes the value and its evaluated arguments, by position or
 * by the keyword names jinja2 documents. Also here: the argument helpers
 * (filters, tests and methods use them) and the lookup of a filter by name
 * in both files' tables.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#define _GNU_SOURCE /* memmem */
#include "tpl_internal.h"

#include <math.h>
#include <stdlib.h>

/* ---- arguments ----------------------------------------------------------- */

bool tpl_arg(tpl_argv *av, int idx, const char *name, tpl_val *out) {
    if (idx >= 0 && idx < av->npos) {
        *out = av->pos[idx];
        return true;
    }
    for (int k = 0; k < av->nkw && name; k++)
        if (tpl_str_eq(av->kwname[k], name)) {
            av->used_kw |= 1u << k;
            *out = av->kw[k];
            return true;
        }
    return false;
}

void tpl_args_done(tpl_rt *rt, tpl_argv *av, int max_pos, const char *what) {
    if (av->npos > max_pos) tpl_rt_raise(rt, "%s got too many positional arguments (%d)", what, av->npos);
    for (int k = 0; k < av->nkw; k++)
        if (!(av->used_kw & (1u << k)))
            tpl_rt_raise(rt, "%s got an unexpected keyword argument '%.*s'", what, (int)LM_MIN(av->kwname[k].n, 60),
                         av->kwname[k].p);
}

bool tpl_arg_bool(tpl_rt *rt, tpl_argv *av, int idx, const char *name, bool dflt) {
    tpl_val v;
    return tpl_arg(av, idx, name, &v) ? tpl_truthy(rt, v) : dflt;
}

int64_t tpl_arg_int(tpl_rt *rt, tpl_argv *av, int idx, const char *name, int64_t dflt) {
    tpl_val v;
    if (!tpl_arg(av, idx, name, &v) || v.t == TV_NONE) return dflt;
    if (v.t == TV_INT) return v.u.i;
    if (v.t == TV_BOOL) return v.u.b;
    if (v.t == TV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9e18) return (int64_t)v.u.f;
    tpl_rt_raise(rt, "'%s' argument must be an integer, not %s", name, tpl_type_name(&v));
}

static tpl_val need_str(tpl_rt *rt, tpl_val v) { return tpl_to_str(rt, v); }

tpl_val tpl_html_escape(tpl_rt *rt, tpl_val v) {
    if (v.t == TV_STR && (v.flags & TVF_MARKUP)) return v;
    tpl_val s = tpl_to_str(rt, v);
    tpl_buf b = { 0 };
    size_t run = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        const char *r = NULL;
        switch (s.u.s.p[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        default: continue;
        }
        tpl_buf_put(rt, &b, s.u.s.p + run, i - run);
        tpl_buf_puts(rt, &b, r);
        run = i + 1;
    }
    tpl_buf_put(rt, &b, s.u.s.p + run, s.u.s.n - run);
    tpl_val out = tpl_buf_val(&b);
    out.flags = TVF_MARKUP;
    return out;
}

/* ---- filters ------------------------------------------------------------- */

static tpl_val f_abs(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "abs");
    if (v.t == TV_INT) {
        if (v.u.i == INT64_MIN) tpl_rt_raise(rt, "integer overflow in abs");
        return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (v.t == TV_BOOL) return tv_int(v.u.b);
    if (v.t == TV_FLOAT) return tv_float(fabs(v.u.f));
    if (v.t == TV_UNDEF) tpl_undef_fail(rt, v);
    tpl_rt_raise(rt, "bad operand type for abs(): '%s'", tpl_type_name(&v));
}

static tpl_val f_attr(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val name;
    if (!tpl_arg(av, 0, "name", &name) || name.t != TV_STR) tpl_rt_raise(rt, "attr needs a string name");
    tpl_args_done(rt, av, 1, "attr");
    return tpl_getattr(rt, v, tpl_sv(name));
}

static tpl_val f_capitalize(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "capitalize");
    return tpl_case_map(rt, tpl_sv(need_str(rt, v)), 3);
}

static tpl_val f_center(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    int64_t w = tpl_arg_int(rt, av, 0, "width", 80);
    tpl_args_done(rt, av, 1, "center");
    tpl_val s = need_str(rt, v);
    int64_t len = (int64_t)tpl_utf8_len(s.u.s.p, s.u.s.n);
    if (w <= len) return s;
    if (w > (int64_t)(64 << 20)) tpl_rt_raise(rt, "center width too large");
    int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
    tpl_buf b = { 0 };
    for (int64_t i = 0; i < left; i++) tpl_buf_put(rt, &b, " ", 1);
    tpl_buf_put(rt, &b, s.u.s.p, s.u.s.n);
    for (int64_t i = 0; i < pad - left; i++) tpl_buf_put(rt, &b, " ", 1);
    return tpl_buf_val(&b);
}

static tpl_val f_default(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val d = tv_strn("", 0);
    tpl_arg(av, 0, "default_value", &d);
    bool boolean = tpl_arg_bool(rt, av, 1, "boolean", false);
    tpl_args_done(rt, av, 2, "default");
    if (v.t == TV_UNDEF || (boolean && !tpl_truthy(rt, v))) return d;
    return v;
}

static tpl_val f_escape(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "escape");
    return tpl_html_escape(rt, v);
}

static tpl_val f_forceescape(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "forceescape");
    if (v.t == TV_STR) v.flags &= (uint8_t)~TVF_MARKUP;
    return tpl_html_escape(rt, v);
}

/* Python float(str): optional spaces, sign, digits, inf/nan. */
static bool parse_float(tpl_str s, double *out) {
    tpl_str t = tpl_strip(s, NULL, true, true);
    if (t.n == 0 || t.n > 300) return false;
    char buf[320];
    size_t k = 0;
    for (size_t i = 0; i < t.n; i++) {
        char c = t.p[i];
        if (c == '_') {
            if (i == 0 || i + 1 == t.n || !(t.p[i - 1] >= '0' && t.p[i - 1] <= '9') ||
                !(t.p[i + 1] >= '0' && t.p[i + 1] <= '9'))
                return false;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", c) || !c) return false;
        buf[k++] = c;
    }
    buf[k] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end || end == buf) return false;
    *out = d;
    return true;
}

static bool parse_int(tpl_str s, int base, int64_t *out) {
    tpl_str t = tpl_strip(s, NULL, true, true);
    size_t i = 0;
    bool neg = false;
    if (i < t.n && (t.p[i] == '+' || t.p[i] == '-')) neg = t.p[i++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (i + 1 < t.n && t.p[i] == '0' && strchr("xXoObB", t.p[i + 1]) && t.p[i + 1]) {
            char c = (char)(t.p[i + 1] | 32);
            int b = c == 'x' ? 16 : c == 'o' ? 8 : 2;
            if (base && base != b) return false;
            base = b;
            i += 2;
        } else if (base == 0) {
            base = 10;
        }
    }
    if (i >= t.n) return false;
    uint64_t v = 0;
    for (; i < t.n; i++) {
        char c = t.p[i];
        if (c == '_') continue;
        int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'z') ? (c | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        if (v > (uint64_t)INT64_MAX + neg) return false;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static tpl_val f_float(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val d = tv_float(0.0);
    tpl_arg(av, 0, "default", &d);
    tpl_args_done(rt, av, 1, "float");
    double x;
    switch (v.t) {
    case TV_UNDEF: tpl_undef_fail(rt, v); /* Undefined.__float__ raises */
    case TV_FLOAT: return v;
    case TV_INT: return tv_float((double)v.u.i);
    case TV_BOOL: return tv_float(v.u.b);
    case TV_STR: return parse_float(tpl_sv(v), &x) ? tv_float(x) : d;
    default: return d;
    }
}

static tpl_val f_int(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val d = tv_int(0);
    tpl_arg(av, 0, "default", &d);
    int64_t base = tpl_arg_int(rt, av, 1, "base", 10);
    tpl_args_done(rt, av, 2, "int");
    int64_t i;
    double x;
    switch (v.t) {
    case TV_UNDEF: tpl_undef_fail(rt, v); /* Undefined.__int__ raises */
    case TV_INT: return v;
    case TV_BOOL: return tv_int(v.u.b);
    case TV_FLOAT:
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return d;
        return tv_int((int64_t)v.u.f);
    case TV_STR:
        if (base >= 0 && base <= 36 && base != 1 && parse_int(tpl_sv(v), (int)base, &i)) return tv_int(i);
        if (parse_float(tpl_sv(v), &x) && isfinite(x) && fabs(x) < 9.2e18) return tv_int((int64_t)x);
        return d;
    default: return d;
    }
}

static tpl_val f_format(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val s = need_str(rt, v);
    if (av->nkw && av->npos) tpl_rt_raise(rt, "can't handle positional and keyword arguments at the same time");
    if (av->nkw) {
        tpl_val d = tv_dict(rt, (size_t)av->nkw);
        for (int k = 0; k < av->nkw; k++) tpl_dict_set(rt, d.u.d, tv_strn(av->kwname[k].p, av->kwname[k].n), av->kw[k]);
        return tpl_percent_format(rt, tpl_sv(s), d);
    }
    tpl_val t = tv_list(rt, (size_t)av->npos);
    t.flags = TVF_TUPLE;
    for (int i = 0; i < av->npos; i++) tpl_list_push(rt, t.u.l, av->pos[i]);
    return tpl_percent_format(rt, tpl_sv(s), t);
}

/* str.splitlines(): \n \r \r\n \v \f \x1c-\x1e \x85 \u2028 \u2029 */
static tpl_list *split_lines(tpl_rt *rt, tpl_str s) {
    tpl_list *l = tv_list(rt, 0).u.l;
    size_t a = 0, i = 0;
    while (i < s.n) {
        size_t st = i;
        uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &i);
        if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
            c == 0x2028 || c == 0x2029) {
            tpl_list_push(rt, l, tv_strn(s.p + a, st - a));
            if (c == '\r' && i < s.n && s.p[i] == '\n') i++;
            a = i;
        }
    }
    if (a < s.n) tpl_list_push(rt, l, tv_strn(s.p + a, s.n - a));
    return l;
}

static tpl_val f_indent(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val w = tv_int(4);
    tpl_arg(av, 0, "width", &w);
    bool first = tpl_arg_bool(rt, av, 1, "first", false), blank = tpl_arg_bool(rt, av, 2, "blank", false);
    tpl_args_done(rt, av, 3, "indent");
    if (v.t == TV_UNDEF) tpl_undef_fail(rt, v); /* jinja2 does s += "\n" */
    if (v.t != TV_STR) tpl_rt_raise(rt, "unsupported operand type(s) for +=: '%s' and 'str'", tpl_type_name(&v));
    tpl_buf ind = { 0 };
    if (w.t == TV_STR) tpl_buf_put(rt, &ind, w.u.s.p, w.u.s.n);
    else
        for (int64_t i = 0; i < LM_MIN(tpl_arg_int(rt, av, 0, "width", 4), 10000); i++) tpl_buf_put(rt, &ind, " ", 1);
    tpl_val s = need_str(rt, v);
    tpl_buf tmp = { 0 };
    tpl_buf_put(rt, &tmp, s.u.s.p, s.u.s.n);
    tpl_buf_put(rt, &tmp, "\n", 1);
    tpl_list *lines = split_lines(rt, (tpl_str){ tmp.p, tmp.n });
    tpl_buf b = { 0 };
    if (first) tpl_buf_put(rt, &b, ind.p, ind.n);
    for (size_t i = 0; i < lines->n; i++) {
        tpl_val ln = lines->v[i];
        if (i) {
            tpl_buf_put(rt, &b, "\n", 1);
            if (blank || ln.u.s.n) tpl_buf_put(rt, &b, ind.p, ind.n);
        }
        tpl_buf_put(rt, &b, ln.u.s.p, ln.u.s.n);
    }
    return tpl_buf_val(&b);
}

static tpl_val f_lower(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "lower");
    return tpl_case_map(rt, tpl_sv(need_str(rt, v)), 0);
}

static tpl_val f_upper(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "upper");
    return tpl_case_map(rt, tpl_sv(need_str(rt, v)), 1);
}

static tpl_val f_pprint(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "pprint");
    tpl_buf b = { 0 };
    tpl_repr_of(rt, &b, v);
    return tpl_buf_val(&b);
}

static tpl_val f_replace(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val old, rep;
    if (!tpl_arg(av, 0, "old", &old) || !tpl_arg(av, 1, "new", &rep)) tpl_rt_raise(rt, "replace needs old and new");
    int64_t count = tpl_arg_int(rt, av, 2, "count", -1);
    tpl_args_done(rt, av, 3, "replace");
    old = need_str(rt, old);
    rep = need_str(rt, rep);
    return tpl_str_replace(rt, tpl_sv(need_str(rt, v)), tpl_sv(old), tpl_sv(rep), count);
}

static tpl_val f_round(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    int64_t prec = tpl_arg_int(rt, av, 0, "precision", 0);
    tpl_val m = tv_cstr("common");
    tpl_arg(av, 1, "method", &m);
    tpl_args_done(rt, av, 2, "round");
    if (v.t == TV_UNDEF) tpl_undef_fail(rt, v);
    if (v.t != TV_INT && v.t != TV_FLOAT && v.t != TV_BOOL)
        tpl_rt_raise(rt, "type %s doesn't define __round__ method", tpl_type_name(&v));
    double x = v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : v.u.b;
    if (m.t != TV_STR) tpl_rt_raise(rt, "method must be common, ceil or floor");
    tpl_str ms = tpl_sv(m);
    if (prec > 300) prec = 300;
    if (prec < -300) prec = -300;
    if (tpl_str_eq(ms, "common")) {
        if (v.t != TV_FLOAT) { /* round(int, n) stays an int */
            int64_t i = v.t == TV_INT ? v.u.i : v.u.b;
            if (prec >= 0) return tv_int(i);
            if (prec < -18) return tv_int(0);
            int64_t p = 1;
            for (int64_t k = 0; k < -prec; k++) p *= 10;
            int64_t q = i / p, r = i % p;
            if (r < 0) r += p, q--;
            if (2 * (r / 2) != r || 2 * r > p || (2 * r == p && (q & 1))) q += (2 * r > p || (2 * r == p && (q & 1)));
            return tv_int(q * p);
        }
        if (!isfinite(x)) return tv_float(x);
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            return tv_float(strtod(buf, NULL));
        }
        double p = pow(10.0, (double)-prec), q = x / p, r = nearbyint(q);
        return tv_float(r * p);
    }
    double p = pow(10.0, (double)prec);
    if (tpl_str_eq(ms, "ceil")) return tv_float(ceil(x * p) / p);
    if (tpl_str_eq(ms, "floor")) return tv_float(floor(x * p) / p);
    tpl_rt_raise(rt, "method must be common, ceil or floor");
}

static tpl_val f_safe(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "safe");
    tpl_val s = tpl_to_str(rt, v);
    s.flags |= TVF_MARKUP;
    return s;
}

static tpl_val f_string(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "string");
    return tpl_to_str(rt, v);
}

static tpl_val f_striptags(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "striptags");
    tpl_val s = need_str(rt, v);
    tpl_buf b = { 0 };
    bool in_tag = false, space = false, any = false;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        if (c == '<') in_tag = true;
        else if (c == '>' && in_tag) in_tag = false;
        else if (!in_tag) {
            if (c == ' ' || c == '\n' || c == '\t' || c == '\r') space = true;
            else {
                if (space && any) tpl_buf_put(rt, &b, " ", 1);
                tpl_buf_put(rt, &b, &c, 1);
                space = false;
                any = true;
            }
        }
    }
    return tpl_buf_val(&b);
}

/* jinja2's title filter: capitalise each run between - whitespace ( { [ < */
static tpl_val f_title(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "title");
    tpl_val s = need_str(rt, v);
    tpl_buf b = { 0 };
    size_t i = 0;
    bool start = true;
    while (i < s.u.s.n) {
        uint32_t c = (uint32_t)tpl_utf8_dec(s.u.s.p, s.u.s.n, &i);
        bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || tpl_cp_space(c);
        uint32_t o = sep ? c : start ? tpl_cp_upper(c) : tpl_cp_lower(c);
        start = sep;
        char e[4];
        tpl_buf_put(rt, &b, e, (size_t)tpl_utf8_enc(o, e));
    }
    return tpl_buf_val(&b);
}

static tpl_val f_tojson(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    bool ascii = tpl_arg_bool(rt, av, 0, "ensure_ascii", false);
    tpl_val ind = tv_none(), seps = tv_none();
    tpl_arg(av, 1, "indent", &ind);
    tpl_arg(av, 2, "separators", &seps);
    bool sort = tpl_arg_bool(rt, av, 3, "sort_keys", false);
    tpl_args_done(rt, av, 4, "tojson");
    const char *indent = NULL;
    int indent_len = 0;
    if (ind.t == TV_INT || ind.t == TV_BOOL) {
        int64_t k = ind.t == TV_INT ? ind.u.i : ind.u.b;
        if (k > 1000) tpl_rt_raise(rt, "indent too large");
        indent_len = k > 0 ? (int)k : 0;
        char *sp = tpl_rt_alloc(rt, (size_t)indent_len + 1);
        memset(sp, ' ', (size_t)indent_len);
        indent = sp;
    } else if (ind.t == TV_STR) {
        if (ind.u.s.n > 1000) tpl_rt_raise(rt, "indent too large");
        indent = ind.u.s.p;
        indent_len = (int)ind.u.s.n;
    } else if (ind.t != TV_NONE) {
        tpl_rt_raise(rt, "indent must be an integer or a string");
    }
    const char *item_sep = NULL, *key_sep = NULL;
    if (seps.t == TV_LIST) {
        if (seps.u.l->n != 2 || seps.u.l->v[0].t != TV_STR || seps.u.l->v[1].t != TV_STR)
            tpl_rt_raise(rt, "separators must be a (item_separator, key_separator) pair of strings");
        item_sep = tv_str_copy(rt, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n).u.s.p;
        key_sep = tv_str_copy(rt, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n).u.s.p;
    } else if (seps.t != TV_NONE) {
        tpl_rt_raise(rt, "separators must be a pair of strings");
    }
    tpl_buf b = { 0 };
    tpl_tojson(rt, &b, v, ascii, indent, indent_len, item_sep, key_sep, sort);
    return tpl_buf_val(&b);
}

static tpl_val f_trim(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val chars;
    bool has = tpl_arg(av, 0, "chars", &chars) && chars.t != TV_NONE;
    tpl_args_done(rt, av, 1, "trim");
    tpl_val s = need_str(rt, v);
    tpl_str cs = has ? tpl_sv(need_str(rt, chars)) : (tpl_str){ 0 };
    tpl_str r = tpl_strip(tpl_sv(s), has ? &cs : NULL, true, true);
    tpl_val out = tv_strn(r.p, r.n);
    out.flags = s.flags & TVF_MARKUP;
    return out;
}

static tpl_val f_truncate(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    int64_t length = tpl_arg_int(rt, av, 0, "length", 255);
    bool kill = tpl_arg_bool(rt, av, 1, "killwords", false);
    tpl_val end = tv_cstr("...");
    tpl_arg(av, 2, "end", &end);
    int64_t leeway = tpl_arg_int(rt, av, 3, "leeway", 5);
    tpl_args_done(rt, av, 4, "truncate");
    if (v.t != TV_STR) { /* jinja2 takes len() of whatever it gets */
        int64_t len = tpl_len(rt, v);
        if (len <= length + LM_MAX(leeway, 0)) return v;
        tpl_rt_raise(rt, "'%s' object cannot be truncated", tpl_type_name(&v));
    }
    tpl_val s = v;
    end = need_str(rt, end);
    int64_t n = (int64_t)tpl_utf8_len(s.u.s.p, s.u.s.n), ne = (int64_t)tpl_utf8_len(end.u.s.p, end.u.s.n);
    if (length < ne) tpl_rt_raise(rt, "expected length >= %lld, got %lld", (long long)ne, (long long)length);
    if (leeway < 0) tpl_rt_raise(rt, "expected leeway >= 0, got %lld", (long long)leeway);
    if (n <= length + leeway) return s;
    tpl_list *chars = tpl_iter_list(rt, s);
    size_t keep = (size_t)(length - ne);
    size_t bytes = keep < chars->n ? (size_t)(chars->v[keep].u.s.p - s.u.s.p) : s.u.s.n;
    if (!kill) {
        size_t sp = bytes;
        while (sp > 0 && s.u.s.p[sp - 1] != ' ') sp--;
        if (sp > 0) bytes = sp - 1;
    }
    tpl_buf b = { 0 };
    tpl_buf_put(rt, &b, s.u.s.p, bytes);
    tpl_buf_put(rt, &b, end.u.s.p, end.u.s.n);
    return tpl_buf_val(&b);
}

static tpl_val f_wordcount(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "wordcount");
    tpl_val s = need_str(rt, v);
    int64_t n = 0;
    bool in = false;
    size_t i = 0;
    while (i < s.u.s.n) {
        uint32_t c = (uint32_t)tpl_utf8_dec(s.u.s.p, s.u.s.n, &i);
        bool w = c == '_' || tpl_cp_alpha(c) || tpl_cp_digit(c);
        if (w && !in) n++;
        in = w;
    }
    return tv_int(n);
}

/* jinja2's wordwrap: each line of the text through Python's textwrap.wrap
 * (chunks are whitespace runs and words, words also split after a hyphen
 * between letters; greedy fill; whitespace dropped at line ends but kept at
 * the very start; words longer than the width cut to fill the line), lines
 * and paragraphs joined with wrapstring. */
static size_t cp_bytes(tpl_str s, int64_t cps) {
    size_t i = 0;
    for (int64_t k = 0; k < cps && i < s.n; k++) tpl_utf8_dec(s.p, s.n, &i);
    return i;
}

static bool blank(tpl_str s) { return tpl_strip(s, NULL, true, true).n == 0; }

static void wrap_paragraph(tpl_rt *rt, tpl_buf *b, tpl_str s, int64_t width, bool break_long, bool hyphens,
                           tpl_str ws) {
    /* chunks */
    tpl_list *ch = tv_list(rt, 0).u.l;
    size_t i = 0;
    while (i < s.n) {
        size_t st = i, j = i;
        bool space = tpl_cp_space((uint32_t)tpl_utf8_dec(s.p, s.n, &j));
        while (i < s.n) {
            j = i;
            uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &j);
            if (tpl_cp_space(c) != space) break;
            i = j;
            if (!space && hyphens && c == '-' && i < s.n && i - st > 1 &&
                tpl_cp_alpha((uint32_t)(unsigned char)s.p[i]) && tpl_cp_alpha((uint32_t)(unsigned char)s.p[i - 2]))
                break;
        }
        tpl_list_push(rt, ch, tv_strn(s.p + st, i - st));
    }
    size_t k = 0; /* next chunk */
    bool any_line = false;
    while (k < ch->n) {
        tpl_buf line = { 0 };
        int64_t len = 0;
        tpl_str last = { 0 };
        if (any_line && blank(tpl_sv(ch->v[k]))) k++;
        while (k < ch->n) {
            tpl_str c = tpl_sv(ch->v[k]);
            int64_t l = (int64_t)tpl_utf8_len(c.p, c.n);
            if (len + l > width) break;
            tpl_buf_put(rt, &line, c.p, c.n);
            len += l;
            last = c;
            k++;
        }
        if (k < ch->n && (int64_t)tpl_utf8_len(ch->v[k].u.s.p, ch->v[k].u.s.n) > width) {
            tpl_str c = tpl_sv(ch->v[k]);
            if (break_long) {
                int64_t space_left = width - len < 1 ? 1 : width - len;
                size_t end = cp_bytes(c, space_left);
                if (hyphens) { /* break after the last hyphen that fits, if letters precede it */
                    for (size_t h = end; h-- > 1;)
                        if (c.p[h] == '-') {
                            bool letters = false;
                            for (size_t q = 0; q < h; q++) letters |= c.p[q] != '-';
                            if (letters) end = h + 1;
                            break;
                        }
                }
                tpl_buf_put(rt, &line, c.p, end);
                last = (tpl_str){ c.p, end };
                ch->v[k] = tv_strn(c.p + end, c.n - end);
            } else if (line.n == 0) {
                tpl_buf_put(rt, &line, c.p, c.n);
                last = c;
                k++;
            }
        }
        if (line.n && blank(last)) line.n -= last.n;
        if (line.n) {
            if (any_line) tpl_buf_put(rt, b, ws.p, ws.n);
            tpl_buf_put(rt, b, line.p, line.n);
            any_line = true;
        }
    }
}

static tpl_val f_wordwrap(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    int64_t width = tpl_arg_int(rt, av, 0, "width", 79);
    bool break_long = tpl_arg_bool(rt, av, 1, "break_long_words", true);
    tpl_val ws = tv_cstr("\n");
    if (tpl_arg(av, 2, "wrapstring", &ws) && ws.t == TV_NONE) ws = tv_cstr("\n");
    bool hyphens = tpl_arg_bool(rt, av, 3, "break_on_hyphens", true);
    tpl_args_done(rt, av, 4, "wordwrap");
    if (width <= 0) tpl_rt_raise(rt, "invalid width %lld (must be > 0)", (long long)width);
    if (v.t == TV_UNDEF) tpl_undef_fail(rt, v);
    if (v.t != TV_STR) tpl_rt_raise(rt, "'%s' object has no attribute 'splitlines'", tpl_type_name(&v));
    ws = need_str(rt, ws);
    tpl_list *lines = split_lines(rt, tpl_sv(need_str(rt, v)));
    tpl_buf b = { 0 };
    for (size_t li = 0; li < lines->n; li++) {
        if (li) tpl_buf_put(rt, &b, ws.u.s.p, ws.u.s.n);
        wrap_paragraph(rt, &b, tpl_sv(lines->v[li]), width, break_long, hyphens, tpl_sv(ws));
    }
    return tpl_buf_val(&b);
}

static const tpl_filter_def k_filters[] = {
    { "abs", f_abs }, { "attr", f_attr }, { "capitalize", f_capitalize }, { "center", f_center },
    { "d", f_default }, { "default", f_default }, { "e", f_escape }, { "escape", f_escape },
    { "float", f_float }, { "forceescape", f_forceescape }, { "format", f_format }, { "indent", f_indent },
    { "int", f_int }, { "lower", f_lower }, { "pprint", f_pprint }, { "replace", f_replace },
    { "round", f_round }, { "safe", f_safe }, { "string", f_string }, { "striptags", f_striptags },
    { "title", f_title }, { "tojson", f_tojson }, { "trim", f_trim }, { "truncate", f_truncate },
    { "upper", f_upper }, { "wordcount", f_wordcount }, { "wordwrap", f_wordwrap },
};

static tpl_filter_fn find_filter(tpl_str name) {
    for (size_t i = 0; i < LM_COUNT(k_filters); i++)
        if (tpl_str_eq(name, k_filters[i].name)) return k_filters[i].fn;
    for (size_t i = 0; i < tpl_seq_filters_n; i++)
        if (tpl_str_eq(name, tpl_seq_filters[i].name)) return tpl_seq_filters[i].fn;
    return NULL;
}

bool tpl_filter_exists(tpl_str name) { return find_filter(name) != NULL; }

tpl_val tpl_filter(tpl_rt *rt, tpl_str name, tpl_val v, tpl_argv *av) {
    tpl_filter_fn fn = find_filter(name);
    if (!fn) tpl_rt_raise(rt, "no filter named '%.*s'", (int)LM_MIN(name.n, 60), name.p);
    return fn(rt, v, av);
}
