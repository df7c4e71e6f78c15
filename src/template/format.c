/* format.c - Python's string formatting for templates: the printf-style
 * 'fmt % args' (also the format filter) and str.format with its field
 * syntax ({}, {0}, {name}, {0.attr}, {0[key]}, !r/!s, a format spec). Both
 * share one formatter of a single value (format_value).
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

#include <math.h>

typedef struct fspec {
    char fill[4];
    int fill_len;
    char align; /* '<' '>' '^' '=' or 0 */
    char sign;  /* '+' ' ' '-' or 0 */
    bool alt, zero;
    int64_t width, prec; /* -1 = unset */
    char type;
} fspec;

static void put_padded(tpl_rt *rt, tpl_buf *b, const char *p, size_t n, const fspec *f, char dflt_align) {
    int64_t len = (int64_t)tpl_utf8_len(p, n);
    int64_t w = f->width > (int64_t)(64 << 20) ? (int64_t)(64 << 20) : f->width;
    int64_t padn = w > len ? w - len : 0;
    char al = f->align ? f->align : dflt_align;
    const char *fill = f->fill_len ? f->fill : " ";
    size_t fl = f->fill_len ? (size_t)f->fill_len : 1;
    if (al == '=' && n && (p[0] == '-' || p[0] == '+' || p[0] == ' ')) {
        tpl_buf_put(rt, b, p, 1);
        p++;
        n--;
    }
    int64_t left = al == '<' ? 0 : al == '^' ? padn / 2 : padn;
    for (int64_t i = 0; i < left; i++) tpl_buf_put(rt, b, fill, fl);
    tpl_buf_put(rt, b, p, n);
    for (int64_t i = 0; i < padn - left; i++) tpl_buf_put(rt, b, fill, fl);
}

static double num_as_f(tpl_rt *rt, tpl_val v, char type) {
    if (v.t == TV_FLOAT) return v.u.f;
    if (v.t == TV_INT) return (double)v.u.i;
    if (v.t == TV_BOOL) return v.u.b;
    tpl_rt_raise(rt, "%%%c format: a real number is required, not %s", type, tpl_type_name(&v));
}

static int64_t num_as_i(tpl_rt *rt, tpl_val v, char type) {
    if (v.t == TV_INT) return v.u.i;
    if (v.t == TV_BOOL) return v.u.b;
    if (v.t == TV_FLOAT && (type == 'd' || type == 'i') && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18)
        return (int64_t)v.u.f;
    tpl_rt_raise(rt, "%%%c format: an integer is required, not %s", type, tpl_type_name(&v));
}

/* One formatted value, shared by '%' and str.format. */
static void format_value(tpl_rt *rt, tpl_buf *b, tpl_val v, const fspec *f) {
    char type = f->type;
    char tmp[512];
    if (type == 0 && (v.t == TV_INT || v.t == TV_BOOL) && (f->sign || f->zero || f->align == '=')) type = 'd';
    if (type == 0 && v.t == TV_FLOAT && (f->prec >= 0 || f->sign)) type = 'g';
    if (type == 's' || type == 'r' || type == 'a' || type == 0) {
        tpl_buf sb = { 0 };
        if (type == 'r' || type == 'a') tpl_repr_of(rt, &sb, v);
        else tpl_str_of(rt, &sb, v);
        size_t n = sb.n;
        if (f->prec >= 0) n = (size_t)(tpl_utf8_len(sb.p, sb.n) > (size_t)f->prec ? 0 : sb.n);
        if (f->prec >= 0 && n == 0) { /* truncate to prec code points */
            size_t i = 0;
            for (int64_t k = 0; k < f->prec && i < sb.n; k++) tpl_utf8_dec(sb.p, sb.n, &i);
            n = i;
        }
        put_padded(rt, b, sb.p ? sb.p : "", n, f, (v.t == TV_INT || v.t == TV_FLOAT) && type == 0 ? '>' : '<');
        return;
    }
    char flags[8];
    int k = 0;
    if (f->sign == '+' || f->sign == ' ') flags[k++] = f->sign;
    if (f->alt) flags[k++] = '#';
    flags[k] = 0;
    int prec = f->prec < 0 ? -1 : (int)LM_MIN(f->prec, 300);
    switch (type) {
    case 'd': case 'i': case 'u':
        snprintf(tmp, sizeof tmp, "%s%lld", f->sign == '+' ? "+" : f->sign == ' ' ? " " : "",
                 (long long)num_as_i(rt, v, type));
        if (tmp[0] == '+' && tmp[1] == '-') memmove(tmp, tmp + 1, strlen(tmp));
        if (tmp[0] == ' ' && tmp[1] == '-') memmove(tmp, tmp + 1, strlen(tmp));
        break;
    case 'x': case 'X': case 'o': case 'b': {
        int64_t x = num_as_i(rt, v, type);
        uint64_t u = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        char digs[80];
        int nd = 0;
        int base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
        const char *dc = type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
        do {
            digs[nd++] = dc[u % (uint64_t)base];
            u /= (uint64_t)base;
        } while (u);
        int o = 0;
        if (x < 0) tmp[o++] = '-';
        else if (f->sign == '+' || f->sign == ' ') tmp[o++] = f->sign;
        if (f->alt) {
            tmp[o++] = '0';
            tmp[o++] = type == 'o' ? 'o' : type == 'b' ? 'b' : type;
        }
        while (nd) tmp[o++] = digs[--nd];
        tmp[o] = 0;
        break;
    }
    case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case '%': {
        double x = num_as_f(rt, v, type);
        char fmt[32];
        if (type == '%') x *= 100;
        char ct = type == '%' ? 'f' : type;
        snprintf(fmt, sizeof fmt, "%%%s.%d%c", flags, prec < 0 ? 6 : prec, ct);
        snprintf(tmp, sizeof tmp, fmt, x);
        if (type == '%') strncat(tmp, "%", sizeof tmp - strlen(tmp) - 1);
        break;
    }
    case 'c': {
        int64_t c = num_as_i(rt, v, 'c');
        if (c < 0 || c > 0x10FFFF) tpl_rt_raise(rt, "%%c arg not in range(0x110000)");
        int m = tpl_utf8_enc((uint32_t)c, tmp);
        tmp[m] = 0;
        break;
    }
    default: tpl_rt_raise(rt, "unsupported format character '%c'", type);
    }
    if (f->zero && !f->align) {
        fspec z = *f;
        z.align = '=';
        z.fill[0] = '0';
        z.fill_len = 1;
        put_padded(rt, b, tmp, strlen(tmp), &z, '>');
    } else {
        put_padded(rt, b, tmp, strlen(tmp), f, '>');
    }
}

/* fmt % args (printf-style): args is a tuple, a dict (for %(name)s), or one
 * value. */
tpl_val tpl_percent_format(tpl_rt *rt, tpl_str fmt, tpl_val args) {
    tpl_buf b = { 0 };
    bool tuple = args.t == TV_LIST && (args.flags & TVF_TUPLE);
    size_t nargs = tuple ? args.u.l->n : 1, ai = 0;
    bool used_dict = false;
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.p[i] != '%') {
            tpl_buf_put(rt, &b, fmt.p + i, 1);
            continue;
        }
        if (++i >= fmt.n) tpl_rt_raise(rt, "incomplete format");
        if (fmt.p[i] == '%') {
            tpl_buf_put(rt, &b, "%", 1);
            continue;
        }
        fspec f = { .width = -1, .prec = -1 };
        tpl_val v;
        bool have = false;
        if (fmt.p[i] == '(') {
            size_t st = ++i;
            while (i < fmt.n && fmt.p[i] != ')') i++;
            if (i >= fmt.n) tpl_rt_raise(rt, "incomplete format key");
            if (args.t != TV_DICT) tpl_rt_raise(rt, "format requires a mapping");
            tpl_val *p = tpl_dict_gets(args.u.d, fmt.p + st, i - st);
            if (!p) tpl_rt_raise(rt, "format key '%.*s' not found", (int)LM_MIN(i - st, 60), fmt.p + st);
            v = *p;
            have = used_dict = true;
            i++;
        }
        for (; i < fmt.n && strchr("-+ #0", fmt.p[i]) && fmt.p[i]; i++) {
            char c = fmt.p[i];
            if (c == '-') f.align = '<';
            else if (c == '+') f.sign = '+';
            else if (c == ' ' && f.sign != '+') f.sign = ' ';
            else if (c == '#') f.alt = true;
            else if (c == '0') f.zero = true;
        }
        if (f.align) f.zero = false;
        for (f.width = 0; i < fmt.n && fmt.p[i] >= '0' && fmt.p[i] <= '9'; i++)
            f.width = LM_MIN(f.width * 10 + (fmt.p[i] - '0'), 100000000);
        if (i < fmt.n && fmt.p[i] == '.')
            for (f.prec = 0, i++; i < fmt.n && fmt.p[i] >= '0' && fmt.p[i] <= '9'; i++)
                f.prec = LM_MIN(f.prec * 10 + (fmt.p[i] - '0'), 100000000);
        if (i >= fmt.n) tpl_rt_raise(rt, "incomplete format");
        f.type = fmt.p[i];
        if (!strchr("sradiuxXoeEfFgGc", f.type) || !f.type)
            tpl_rt_raise(rt, "unsupported format character '%c'", f.type);
        if (!have) {
            if (args.t == TV_DICT && !tuple) {
                v = args;
            } else {
                if (ai >= nargs) tpl_rt_raise(rt, "not enough arguments for format string");
                v = tuple ? args.u.l->v[ai] : args;
            }
            ai++;
        }
        if (f.type == 'd' || f.type == 'i' || f.type == 'u') {
            if (v.t == TV_STR || v.t == TV_NONE || v.t == TV_LIST || v.t == TV_DICT)
                tpl_rt_raise(rt, "%%%c format: a real number is required, not %s", f.type, tpl_type_name(&v));
        }
        if (f.type == 'u') f.type = 'd';
        if (f.type == 's' || f.type == 'r' || f.type == 'a') f.zero = false;
        if (!f.align && !f.zero) f.align = '>';
        format_value(rt, &b, v, &f);
    }
    if (!used_dict && args.t != TV_DICT && ai < nargs) tpl_rt_raise(rt, "not all arguments converted during string formatting");
    return tpl_buf_val(&b);
}

/* str.format: {} {0} {name} {0.attr} {0[key]} with !r/!s and a format spec */
tpl_val tpl_str_format(tpl_rt *rt, tpl_str fmt, tpl_argv *av) {
    tpl_buf b = { 0 };
    int auto_idx = 0;
    for (size_t i = 0; i < fmt.n; i++) {
        char c = fmt.p[i];
        if (c == '}') {
            if (i + 1 < fmt.n && fmt.p[i + 1] == '}') i++;
            else tpl_rt_raise(rt, "Single '}' encountered in format string");
            tpl_buf_put(rt, &b, "}", 1);
            continue;
        }
        if (c != '{') {
            tpl_buf_put(rt, &b, &c, 1);
            continue;
        }
        if (i + 1 < fmt.n && fmt.p[i + 1] == '{') {
            tpl_buf_put(rt, &b, "{", 1);
            i++;
            continue;
        }
        size_t st = ++i;
        int nest = 0;
        while (i < fmt.n && (fmt.p[i] != '}' || nest)) {
            if (fmt.p[i] == '[') nest++;
            if (fmt.p[i] == ']' && nest) nest--;
            i++;
        }
        if (i >= fmt.n) tpl_rt_raise(rt, "expected '}' before end of string");
        tpl_str field = { fmt.p + st, i - st };
        size_t k = 0;
        while (k < field.n && field.p[k] != '.' && field.p[k] != '[' && field.p[k] != '!' && field.p[k] != ':') k++;
        tpl_str head = { field.p, k };
        tpl_val v;
        if (head.n == 0) {
            if (auto_idx >= av->npos) tpl_rt_raise(rt, "Replacement index %d out of range for positional args tuple", auto_idx);
            v = av->pos[auto_idx++];
        } else if (head.p[0] >= '0' && head.p[0] <= '9') {
            int64_t idx = 0;
            for (size_t q = 0; q < head.n; q++) {
                if (head.p[q] < '0' || head.p[q] > '9') tpl_rt_raise(rt, "bad format field");
                idx = LM_MIN(idx * 10 + (head.p[q] - '0'), 1000000);
            }
            if (idx >= av->npos) tpl_rt_raise(rt, "Replacement index %lld out of range for positional args tuple", (long long)idx);
            v = av->pos[idx];
        } else {
            int q = 0;
            while (q < av->nkw && !(av->kwname[q].n == head.n && !memcmp(av->kwname[q].p, head.p, head.n))) q++;
            if (q == av->nkw) tpl_rt_raise(rt, "KeyError: '%.*s'", (int)LM_MIN(head.n, 60), head.p);
            v = av->kw[q];
        }
        while (k < field.n && (field.p[k] == '.' || field.p[k] == '[')) {
            if (field.p[k] == '.') {
                size_t a = ++k;
                while (k < field.n && field.p[k] != '.' && field.p[k] != '[' && field.p[k] != '!' && field.p[k] != ':') k++;
                v = tpl_getattr(rt, v, (tpl_str){ field.p + a, k - a });
            } else {
                size_t a = ++k;
                while (k < field.n && field.p[k] != ']') k++;
                tpl_str key = { field.p + a, k - a };
                bool num = key.n > 0;
                int64_t idx = 0;
                for (size_t q = 0; q < key.n; q++) {
                    if (key.p[q] < '0' || key.p[q] > '9') num = false;
                    else idx = LM_MIN(idx * 10 + (key.p[q] - '0'), 1000000000);
                }
                v = tpl_getitem(rt, v, num ? tv_int(idx) : tv_strn(key.p, key.n));
                if (k < field.n) k++;
            }
        }
        fspec f = { .width = -1, .prec = -1 };
        if (k < field.n && field.p[k] == '!') {
            if (k + 1 >= field.n) tpl_rt_raise(rt, "end of string while looking for conversion specifier");
            f.type = field.p[k + 1] == 'r' || field.p[k + 1] == 'a' ? 'r' : 's';
            k += 2;
        }
        char conv = f.type;
        if (k < field.n && field.p[k] == ':') {
            tpl_str sp = { field.p + k + 1, field.n - k - 1 };
            size_t q = 0;
            size_t q2 = 0;
            if (sp.n) {
                tpl_utf8_dec(sp.p, sp.n, &q2);
                if (q2 < sp.n && strchr("<>^=", sp.p[q2]) && sp.p[q2]) {
                    memcpy(f.fill, sp.p, q2);
                    f.fill_len = (int)q2;
                    f.align = sp.p[q2];
                    q = q2 + 1;
                } else if (strchr("<>^=", sp.p[0]) && sp.p[0]) {
                    f.align = sp.p[0];
                    q = 1;
                }
            }
            if (q < sp.n && strchr("+- ", sp.p[q]) && sp.p[q]) f.sign = sp.p[q++] == '-' ? 0 : sp.p[q - 1];
            if (q < sp.n && sp.p[q] == '#') f.alt = true, q++;
            if (q < sp.n && sp.p[q] == '0') f.zero = true, q++;
            for (f.width = 0; q < sp.n && sp.p[q] >= '0' && sp.p[q] <= '9'; q++)
                f.width = LM_MIN(f.width * 10 + (sp.p[q] - '0'), 100000000);
            if (q < sp.n && sp.p[q] == '.')
                for (f.prec = 0, q++; q < sp.n && sp.p[q] >= '0' && sp.p[q] <= '9'; q++)
                    f.prec = LM_MIN(f.prec * 10 + (sp.p[q] - '0'), 100000000);
            if (q < sp.n) f.type = sp.p[q++];
            if (q < sp.n) tpl_rt_raise(rt, "Invalid format specifier");
            if (f.type == 'n') f.type = 'd';
        } else if (k < field.n) {
            tpl_rt_raise(rt, "bad format field");
        }
        if (conv && f.type == conv) { /* {!r} with no spec */
        } else if (conv) {
            tpl_buf cb = { 0 };
            if (conv == 'r') tpl_repr_of(rt, &cb, v);
            else tpl_str_of(rt, &cb, v);
            v = tpl_buf_val(&cb);
        }
        if (f.type == 's' && v.t != TV_STR) tpl_rt_raise(rt, "Unknown format code 's' for object of type '%s'", tpl_type_name(&v));
        format_value(rt, &b, v, &f);
    }
    return tpl_buf_val(&b);
}
