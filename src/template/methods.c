/* methods.c - Python methods that templates call on values (str.split,
 * dict.items, list.append, loop.cycle ...), the '%' and str.format string
 * formatting, and the globals: range, namespace, dict, joiner,
 * raise_exception and strftime_now (the last two are transformers').
 *
 * list.append and list.extend are allowed although transformers' immutable
 * sandbox refuses them: templates in the wild use them, and allowing them
 * cannot change the rendering of a template that works under transformers.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#define _GNU_SOURCE /* memmem */
#include "tpl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

enum {
    /* str */
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER,
    M_LOWER, M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_CASEFOLD, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_RINDEX,
    M_COUNT, M_FORMAT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISUPPER, M_ISLOWER,
    M_ISNUMERIC, M_ISDECIMAL, M_CENTER, M_LJUST, M_RJUST, M_ZFILL, M_REMOVEPREFIX, M_REMOVESUFFIX,
    M_PARTITION, M_RPARTITION,
    /* dict */
    M_ITEMS, M_KEYS, M_VALUES, M_GET, M_COPY,
    /* list */
    M_APPEND, M_EXTEND, M_LINDEX, M_LCOUNT,
    /* loop */
    M_CYCLE, M_CHANGED,
};

typedef struct mdef {
    const char *name;
    int id;
} mdef;

static const mdef k_str_methods[] = {
    { "strip", M_STRIP }, { "lstrip", M_LSTRIP }, { "rstrip", M_RSTRIP }, { "split", M_SPLIT },
    { "rsplit", M_RSPLIT }, { "splitlines", M_SPLITLINES }, { "startswith", M_STARTSWITH },
    { "endswith", M_ENDSWITH }, { "upper", M_UPPER }, { "lower", M_LOWER }, { "title", M_TITLE },
    { "capitalize", M_CAPITALIZE }, { "swapcase", M_SWAPCASE }, { "casefold", M_CASEFOLD },
    { "replace", M_REPLACE }, { "find", M_FIND }, { "rfind", M_RFIND }, { "index", M_INDEX },
    { "rindex", M_RINDEX }, { "count", M_COUNT }, { "format", M_FORMAT }, { "join", M_JOIN },
    { "isdigit", M_ISDIGIT }, { "isalpha", M_ISALPHA }, { "isalnum", M_ISALNUM }, { "isspace", M_ISSPACE },
    { "isupper", M_ISUPPER }, { "islower", M_ISLOWER }, { "isnumeric", M_ISNUMERIC },
    { "isdecimal", M_ISDECIMAL }, { "center", M_CENTER }, { "ljust", M_LJUST }, { "rjust", M_RJUST },
    { "zfill", M_ZFILL }, { "removeprefix", M_REMOVEPREFIX }, { "removesuffix", M_REMOVESUFFIX },
    { "partition", M_PARTITION }, { "rpartition", M_RPARTITION },
};
static const mdef k_dict_methods[] = {
    { "items", M_ITEMS }, { "keys", M_KEYS }, { "values", M_VALUES }, { "get", M_GET }, { "copy", M_COPY },
};
static const mdef k_list_methods[] = {
    { "append", M_APPEND }, { "extend", M_EXTEND }, { "index", M_LINDEX }, { "count", M_LCOUNT },
    { "copy", M_COPY },
};
static const mdef k_loop_methods[] = { { "cycle", M_CYCLE }, { "changed", M_CHANGED } };

static int find_method(const mdef *t, size_t n, tpl_str name) {
    for (size_t i = 0; i < n; i++)
        if (tpl_str_eq(name, t[i].name)) return t[i].id;
    return -1;
}

tpl_val tpl_method_lookup(tpl_rt *rt, tpl_val obj, tpl_str name, bool *found) {
    int id = -1;
    switch (obj.t) {
    case TV_STR: id = find_method(k_str_methods, LM_COUNT(k_str_methods), name); break;
    case TV_DICT: id = find_method(k_dict_methods, LM_COUNT(k_dict_methods), name); break;
    case TV_LIST:
        id = find_method(k_list_methods, LM_COUNT(k_list_methods), name);
        if ((obj.flags & TVF_TUPLE) && (id == M_APPEND || id == M_EXTEND || id == M_COPY)) id = -1;
        break;
    case TV_LOOP: id = find_method(k_loop_methods, LM_COUNT(k_loop_methods), name); break;
    default: break;
    }
    *found = id >= 0;
    if (id < 0) return tv_undef();
    tpl_func *fn = tpl_rt_alloc(rt, sizeof *fn);
    fn->kind = FN_METHOD;
    fn->id = id;
    fn->self = obj;
    fn->name = name;
    tpl_val v = { 0 };
    v.t = TV_FUNC;
    v.u.fn = fn;
    return v;
}

/* ---- string helpers ------------------------------------------------------ */

static tpl_str str_arg(tpl_rt *rt, tpl_argv *av, int idx, const char *name, const char *what) {
    tpl_val v;
    if (!tpl_arg(av, idx, name, &v)) tpl_rt_raise(rt, "%s() missing argument '%s'", what, name);
    if (v.t != TV_STR) tpl_rt_raise(rt, "%s() argument must be str, not %s", what, tpl_type_name(&v));
    return tpl_sv(v);
}

static int64_t int_arg(tpl_rt *rt, tpl_argv *av, int idx, const char *name, int64_t dflt) {
    tpl_val v;
    if (!tpl_arg(av, idx, name, &v) || v.t == TV_NONE) return dflt;
    if (v.t == TV_INT) return v.u.i;
    if (v.t == TV_BOOL) return v.u.b;
    tpl_rt_raise(rt, "'%s' must be an integer, not %s", name, tpl_type_name(&v));
}

/* memmem is linear (two-way), so hostile strings cannot make this quadratic */
static size_t find_sub(tpl_str s, tpl_str sub, size_t from) {
    if (sub.n == 0) return from <= s.n ? from : SIZE_MAX;
    if (from > s.n) return SIZE_MAX;
    const char *p = memmem(s.p + from, s.n - from, sub.p, sub.n);
    return p ? (size_t)(p - s.p) : SIZE_MAX;
}

/* the last match, scanning back; its worst case (n * m) is charged to the
 * step budget up front */
static size_t rfind_sub(tpl_rt *rt, tpl_str s, tpl_str sub) {
    if (sub.n > s.n) return SIZE_MAX;
    tpl_tick(rt, (s.n / 256 + 1) * (sub.n / 16 + 1));
    for (size_t i = s.n - sub.n + 1; i-- > 0;)
        if (!memcmp(s.p + i, sub.p, sub.n)) return i;
    return SIZE_MAX;
}

tpl_val tpl_str_replace(tpl_rt *rt, tpl_str s, tpl_str old, tpl_str rep, int64_t count) {
    tpl_buf b = { 0 };
    if (count < 0) count = INT64_MAX;
    if (old.n == 0) {
        size_t i = 0;
        int64_t done = 0;
        while (true) {
            if (done < count) {
                tpl_buf_put(rt, &b, rep.p, rep.n);
                done++;
            }
            if (i >= s.n) break;
            size_t st = i;
            tpl_utf8_dec(s.p, s.n, &i);
            tpl_buf_put(rt, &b, s.p + st, i - st);
        }
        return tpl_buf_val(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (done < count) {
        size_t k = find_sub(s, old, i);
        if (k == SIZE_MAX) break;
        tpl_buf_put(rt, &b, s.p + i, k - i);
        tpl_buf_put(rt, &b, rep.p, rep.n);
        i = k + old.n;
        done++;
    }
    if (done == 0) return tv_strn(s.p, s.n);
    tpl_buf_put(rt, &b, s.p + i, s.n - i);
    return tpl_buf_val(&b);
}

static bool space_at(tpl_str s, size_t i, size_t *next) {
    size_t j = i;
    uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &j);
    *next = j;
    return tpl_cp_space(c);
}

tpl_val tpl_str_split(tpl_rt *rt, tpl_str s, const tpl_str *sep, int64_t maxsplit, bool right) {
    tpl_val out = tv_list(rt, 0);
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep && sep->n == 0) tpl_rt_raise(rt, "empty separator");
    tpl_list *l = out.u.l;
    if (!sep) {
        /* runs of whitespace; strip the ends */
        tpl_list *words = tv_list(rt, 0).u.l;
        size_t i = 0, nx;
        while (i < s.n) {
            while (i < s.n && space_at(s, i, &nx)) i = nx;
            if (i >= s.n) break;
            size_t st = i;
            while (i < s.n && !space_at(s, i, &nx)) tpl_utf8_dec(s.p, s.n, &i);
            tpl_list_push(rt, words, tv_strn(s.p + st, i - st));
        }
        if (maxsplit >= (int64_t)words->n - 1) return (tpl_val){ .t = TV_LIST, .u.l = words };
        if (!right) {
            for (int64_t k = 0; k < maxsplit; k++) tpl_list_push(rt, l, words->v[k]);
            const char *rest = words->v[maxsplit].u.s.p;
            tpl_str tail = tpl_strip((tpl_str){ rest, (size_t)(s.p + s.n - rest) }, NULL, false, true);
            tpl_list_push(rt, l, tv_strn(tail.p, tail.n));
        } else {
            size_t first = words->n - (size_t)maxsplit;
            const tpl_val *w = &words->v[first - 1];
            tpl_str head = tpl_strip((tpl_str){ s.p, (size_t)(w->u.s.p + w->u.s.n - s.p) }, NULL, true, false);
            tpl_list_push(rt, l, tv_strn(head.p, head.n));
            for (size_t k = first; k < words->n; k++) tpl_list_push(rt, l, words->v[k]);
        }
        return out;
    }
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        while (done < maxsplit) {
            size_t k = find_sub(s, *sep, i);
            if (k == SIZE_MAX) break;
            tpl_list_push(rt, l, tv_strn(s.p + i, k - i));
            i = k + sep->n;
            done++;
        }
        tpl_list_push(rt, l, tv_strn(s.p + i, s.n - i));
        return out;
    }
    /* rsplit: collect from the right, then reverse */
    tpl_list *rev = tv_list(rt, 0).u.l;
    size_t end = s.n;
    int64_t done = 0;
    while (done < maxsplit) {
        tpl_str head = { s.p, end };
        size_t k = rfind_sub(rt, head, *sep);
        if (k == SIZE_MAX) break;
        tpl_list_push(rt, rev, tv_strn(s.p + k + sep->n, end - k - sep->n));
        end = k;
        done++;
    }
    tpl_list_push(rt, l, tv_strn(s.p, end));
    for (size_t k = rev->n; k-- > 0;) tpl_list_push(rt, l, rev->v[k]);
    return out;
}

static size_t cp_index(tpl_str s, size_t byte) { return tpl_utf8_len(s.p, byte); }

/* s[start:end] by code points, Python-clamped */
static tpl_str cp_range(tpl_rt *rt, tpl_str s, tpl_argv *av, int idx) {
    tpl_val a = tv_none(), b = tv_none();
    tpl_arg(av, idx, "start", &a);
    tpl_arg(av, idx + 1, "end", &b);
    if (a.t == TV_NONE && b.t == TV_NONE) return s;
    int64_t n = (int64_t)tpl_utf8_len(s.p, s.n);
    int64_t st = a.t == TV_NONE ? 0 : int_arg(rt, av, idx, "start", 0);
    int64_t en = b.t == TV_NONE ? n : int_arg(rt, av, idx + 1, "end", n);
    if (st < 0) st = LM_MAX(st + n, 0);
    if (en < 0) en = LM_MAX(en + n, 0);
    st = LM_MIN(st, n);
    en = LM_MIN(en, n);
    if (en < st) return (tpl_str){ s.p + s.n, 0 };
    size_t i = 0, bs = 0, be = s.n;
    for (int64_t k = 0; k <= en && i <= s.n; k++) {
        if (k == st) bs = i;
        if (k == en) {
            be = i;
            break;
        }
        if (i < s.n) tpl_utf8_dec(s.p, s.n, &i);
        else i++;
    }
    return (tpl_str){ s.p + bs, be - bs };
}

static bool affix(tpl_rt *rt, tpl_str s, tpl_val pre, bool end) {
    if (pre.t == TV_LIST && (pre.flags & TVF_TUPLE)) {
        for (size_t i = 0; i < pre.u.l->n; i++)
            if (affix(rt, s, pre.u.l->v[i], end)) return true;
        return false;
    }
    if (pre.t != TV_STR)
        tpl_rt_raise(rt, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
                     tpl_type_name(&pre));
    if (pre.u.s.n > s.n) return false;
    return !memcmp(end ? s.p + s.n - pre.u.s.n : s.p, pre.u.s.p, pre.u.s.n);
}

static bool all_chars(tpl_str s, int kind) {
    if (s.n == 0) return false;
    size_t i = 0;
    bool cased = false;
    while (i < s.n) {
        uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &i);
        switch (kind) {
        case 0: if (!tpl_cp_digit(c)) return false; break;
        case 1: if (!tpl_cp_alpha(c)) return false; break;
        case 2: if (!tpl_cp_alpha(c) && !tpl_cp_digit(c)) return false; break;
        case 3: if (!tpl_cp_space(c)) return false; break;
        case 4: /* upper */
            if (tpl_cp_cased(c)) {
                if (tpl_cp_upper(c) != c) return false;
                cased = true;
            }
            break;
        default: /* lower */
            if (tpl_cp_cased(c)) {
                if (tpl_cp_lower(c) != c) return false;
                cased = true;
            }
            break;
        }
    }
    return kind >= 4 ? cased : true;
}

static tpl_val pad(tpl_rt *rt, tpl_str s, int64_t width, tpl_str fill, int align) {
    int64_t n = (int64_t)tpl_utf8_len(s.p, s.n);
    if (width <= n) return tv_strn(s.p, s.n);
    if (width > (int64_t)(64 << 20)) tpl_rt_raise(rt, "width too large");
    int64_t total = width - n, left = align < 0 ? 0 : align > 0 ? total : total / 2 + (total & width & 1);
    tpl_buf b = { 0 };
    for (int64_t i = 0; i < left; i++) tpl_buf_put(rt, &b, fill.p, fill.n);
    tpl_buf_put(rt, &b, s.p, s.n);
    for (int64_t i = 0; i < total - left; i++) tpl_buf_put(rt, &b, fill.p, fill.n);
    return tpl_buf_val(&b);
}

static tpl_val tuple3(tpl_rt *rt, tpl_val a, tpl_val b, tpl_val c) {
    tpl_val t = tv_list(rt, 3);
    t.flags = TVF_TUPLE;
    tpl_list_push(rt, t.u.l, a);
    tpl_list_push(rt, t.u.l, b);
    tpl_list_push(rt, t.u.l, c);
    return t;
}

static tpl_val str_method(tpl_rt *rt, int id, tpl_val self, tpl_argv *av) {
    tpl_str s = tpl_sv(self);
    tpl_val a;
    const char *nm = "str method";
    switch (id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        bool has = tpl_arg(av, 0, "chars", &a) && a.t != TV_NONE;
        tpl_args_done(rt, av, 1, "strip");
        if (has && a.t != TV_STR) tpl_rt_raise(rt, "strip arg must be None or str");
        tpl_str cs = has ? tpl_sv(a) : (tpl_str){ 0 };
        tpl_str r = tpl_strip(s, has ? &cs : NULL, id != M_RSTRIP, id != M_LSTRIP);
        return tv_strn(r.p, r.n);
    }
    case M_SPLIT: case M_RSPLIT: {
        bool has = tpl_arg(av, 0, "sep", &a) && a.t != TV_NONE;
        int64_t maxs = int_arg(rt, av, 1, "maxsplit", -1);
        tpl_args_done(rt, av, 2, "split");
        if (has && a.t != TV_STR) tpl_rt_raise(rt, "must be str or None, not %s", tpl_type_name(&a));
        tpl_str sep = has ? tpl_sv(a) : (tpl_str){ 0 };
        return tpl_str_split(rt, s, has ? &sep : NULL, maxs, id == M_RSPLIT);
    }
    case M_SPLITLINES: {
        bool keep = tpl_arg(av, 0, "keepends", &a) && tpl_truthy(rt, a);
        tpl_args_done(rt, av, 1, "splitlines");
        tpl_val out = tv_list(rt, 0);
        size_t st = 0, i = 0;
        while (i < s.n) {
            size_t c0 = i;
            uint32_t c = (uint32_t)tpl_utf8_dec(s.p, s.n, &i);
            if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                c == 0x2028 || c == 0x2029) {
                if (c == '\r' && i < s.n && s.p[i] == '\n') i++;
                tpl_list_push(rt, out.u.l, tv_strn(s.p + st, (keep ? i : c0) - st));
                st = i;
            }
        }
        if (st < s.n) tpl_list_push(rt, out.u.l, tv_strn(s.p + st, s.n - st));
        return out;
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        if (!tpl_arg(av, 0, "prefix", &a)) tpl_rt_raise(rt, "startswith/endswith need an argument");
        tpl_str r = cp_range(rt, s, av, 1);
        tpl_args_done(rt, av, 3, "startswith");
        return tv_bool(affix(rt, r, a, id == M_ENDSWITH));
    }
    case M_UPPER: tpl_args_done(rt, av, 0, "upper"); return tpl_case_map(rt, s, 1);
    case M_LOWER: case M_CASEFOLD: tpl_args_done(rt, av, 0, "lower"); return tpl_case_map(rt, s, 0);
    case M_TITLE: tpl_args_done(rt, av, 0, "title"); return tpl_case_map(rt, s, 2);
    case M_CAPITALIZE: tpl_args_done(rt, av, 0, "capitalize"); return tpl_case_map(rt, s, 3);
    case M_SWAPCASE: tpl_args_done(rt, av, 0, "swapcase"); return tpl_case_map(rt, s, 4);
    case M_REPLACE: {
        tpl_str old = str_arg(rt, av, 0, "old", "replace"), rep = str_arg(rt, av, 1, "new", "replace");
        int64_t count = int_arg(rt, av, 2, "count", -1);
        tpl_args_done(rt, av, 3, "replace");
        return tpl_str_replace(rt, s, old, rep, count);
    }
    case M_FIND: case M_RFIND: case M_INDEX: case M_RINDEX: {
        tpl_str sub = str_arg(rt, av, 0, "sub", "find");
        tpl_str r = cp_range(rt, s, av, 1);
        tpl_args_done(rt, av, 3, "find");
        size_t k = (id == M_FIND || id == M_INDEX) ? find_sub(r, sub, 0) : rfind_sub(rt, r, sub);
        if (k == SIZE_MAX) {
            if (id == M_INDEX || id == M_RINDEX) tpl_rt_raise(rt, "substring not found");
            return tv_int(-1);
        }
        return tv_int((int64_t)(cp_index(s, (size_t)(r.p - s.p)) + cp_index(r, k)));
    }
    case M_COUNT: {
        tpl_str sub = str_arg(rt, av, 0, "sub", "count");
        tpl_str r = cp_range(rt, s, av, 1);
        tpl_args_done(rt, av, 3, "count");
        if (sub.n == 0) return tv_int((int64_t)tpl_utf8_len(r.p, r.n) + 1);
        int64_t c = 0;
        for (size_t i = find_sub(r, sub, 0); i != SIZE_MAX; i = find_sub(r, sub, i + sub.n)) c++;
        return tv_int(c);
    }
    case M_FORMAT: return tpl_str_format(rt, s, av);
    case M_JOIN: {
        if (!tpl_arg(av, 0, "iterable", &a)) tpl_rt_raise(rt, "join() takes exactly one argument");
        tpl_args_done(rt, av, 1, "join");
        tpl_list *l = tpl_iter_list(rt, a);
        tpl_buf b = { 0 };
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != TV_STR)
                tpl_rt_raise(rt, "sequence item %zu: expected str instance, %s found", i, tpl_type_name(&l->v[i]));
            if (i) tpl_buf_put(rt, &b, s.p, s.n);
            tpl_buf_put(rt, &b, l->v[i].u.s.p, l->v[i].u.s.n);
        }
        return tpl_buf_val(&b);
    }
    case M_ISDIGIT: case M_ISNUMERIC: case M_ISDECIMAL: tpl_args_done(rt, av, 0, nm); return tv_bool(all_chars(s, 0));
    case M_ISALPHA: tpl_args_done(rt, av, 0, nm); return tv_bool(all_chars(s, 1));
    case M_ISALNUM: tpl_args_done(rt, av, 0, nm); return tv_bool(all_chars(s, 2));
    case M_ISSPACE: tpl_args_done(rt, av, 0, nm); return tv_bool(all_chars(s, 3));
    case M_ISUPPER: tpl_args_done(rt, av, 0, nm); return tv_bool(all_chars(s, 4));
    case M_ISLOWER: tpl_args_done(rt, av, 0, nm); return tv_bool(all_chars(s, 5));
    case M_CENTER: case M_LJUST: case M_RJUST: {
        int64_t w = int_arg(rt, av, 0, "width", 0);
        tpl_str fill = { " ", 1 };
        if (tpl_arg(av, 1, "fillchar", &a)) {
            if (a.t != TV_STR || tpl_utf8_len(a.u.s.p, a.u.s.n) != 1)
                tpl_rt_raise(rt, "The fill character must be exactly one character long");
            fill = tpl_sv(a);
        }
        tpl_args_done(rt, av, 2, "center");
        return pad(rt, s, w, fill, id == M_CENTER ? 0 : id == M_LJUST ? -1 : 1);
    }
    case M_ZFILL: {
        int64_t w = int_arg(rt, av, 0, "width", 0);
        tpl_args_done(rt, av, 1, "zfill");
        int64_t n = (int64_t)tpl_utf8_len(s.p, s.n);
        if (w <= n) return self;
        if (w > (int64_t)(64 << 20)) tpl_rt_raise(rt, "width too large");
        tpl_buf b = { 0 };
        size_t st = 0;
        if (s.n && (s.p[0] == '+' || s.p[0] == '-')) tpl_buf_put(rt, &b, s.p, st = 1);
        for (int64_t i = 0; i < w - n; i++) tpl_buf_put(rt, &b, "0", 1);
        tpl_buf_put(rt, &b, s.p + st, s.n - st);
        return tpl_buf_val(&b);
    }
    case M_REMOVEPREFIX: case M_REMOVESUFFIX: {
        tpl_str x = str_arg(rt, av, 0, "prefix", "removeprefix");
        tpl_args_done(rt, av, 1, "removeprefix");
        if (x.n > s.n) return self;
        if (id == M_REMOVEPREFIX && !memcmp(s.p, x.p, x.n)) return tv_strn(s.p + x.n, s.n - x.n);
        if (id == M_REMOVESUFFIX && x.n && !memcmp(s.p + s.n - x.n, x.p, x.n)) return tv_strn(s.p, s.n - x.n);
        return self;
    }
    case M_PARTITION: case M_RPARTITION: {
        tpl_str sep = str_arg(rt, av, 0, "sep", "partition");
        tpl_args_done(rt, av, 1, "partition");
        if (!sep.n) tpl_rt_raise(rt, "empty separator");
        size_t k = id == M_PARTITION ? find_sub(s, sep, 0) : rfind_sub(rt, s, sep);
        tpl_val e = tv_strn("", 0);
        if (k == SIZE_MAX) return id == M_PARTITION ? tuple3(rt, self, e, e) : tuple3(rt, e, e, self);
        return tuple3(rt, tv_strn(s.p, k), tv_strn(sep.p, sep.n), tv_strn(s.p + k + sep.n, s.n - k - sep.n));
    }
    default: tpl_rt_raise(rt, "internal error: unknown str method");
    }
}

tpl_val tpl_call_method(tpl_rt *rt, tpl_func *fn, tpl_argv *av) {
    tpl_val self = fn->self, a;
    if (self.t == TV_STR) return str_method(rt, fn->id, self, av);
    switch (fn->id) {
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        tpl_args_done(rt, av, 0, "items");
        tpl_dict *d = self.u.d;
        tpl_val out = tv_list(rt, d->n);
        out.flags = fn->id == M_ITEMS ? TVF_ITEMS : fn->id == M_KEYS ? TVF_KEYS : TVF_VALUES;
        for (size_t i = 0; i < d->n; i++) {
            if (fn->id == M_KEYS) {
                tpl_list_push(rt, out.u.l, d->k[i]);
            } else if (fn->id == M_VALUES) {
                tpl_list_push(rt, out.u.l, d->v[i]);
            } else {
                tpl_val pair = tv_list(rt, 2);
                pair.flags = TVF_TUPLE;
                tpl_list_push(rt, pair.u.l, d->k[i]);
                tpl_list_push(rt, pair.u.l, d->v[i]);
                tpl_list_push(rt, out.u.l, pair);
            }
        }
        return out;
    }
    case M_GET: {
        if (!tpl_arg(av, 0, "key", &a)) tpl_rt_raise(rt, "get expected at least 1 argument");
        tpl_val d = tv_none();
        tpl_arg(av, 1, "default", &d);
        tpl_args_done(rt, av, 2, "get");
        tpl_val *p = tpl_dict_get(self.u.d, a);
        return p ? *p : d;
    }
    case M_COPY: {
        tpl_args_done(rt, av, 0, "copy");
        if (self.t == TV_LIST) {
            tpl_val out = tv_list(rt, self.u.l->n);
            for (size_t i = 0; i < self.u.l->n; i++) tpl_list_push(rt, out.u.l, self.u.l->v[i]);
            return out;
        }
        tpl_val out = tv_dict(rt, self.u.d->n);
        for (size_t i = 0; i < self.u.d->n; i++) tpl_dict_set(rt, out.u.d, self.u.d->k[i], self.u.d->v[i]);
        return out;
    }
    case M_APPEND:
        if (!tpl_arg(av, 0, "object", &a)) tpl_rt_raise(rt, "append() takes exactly one argument");
        tpl_args_done(rt, av, 1, "append");
        tpl_list_push(rt, self.u.l, a);
        return tv_none();
    case M_EXTEND: {
        if (!tpl_arg(av, 0, "iterable", &a)) tpl_rt_raise(rt, "extend() takes exactly one argument");
        tpl_args_done(rt, av, 1, "extend");
        tpl_list *l = tpl_iter_list(rt, a);
        for (size_t i = 0; i < l->n; i++) tpl_list_push(rt, self.u.l, l->v[i]);
        return tv_none();
    }
    case M_LINDEX: case M_LCOUNT: {
        if (!tpl_arg(av, 0, "value", &a)) tpl_rt_raise(rt, "index/count need an argument");
        tpl_args_done(rt, av, 1, "index");
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (tpl_eq(rt, self.u.l->v[i], a)) {
                if (fn->id == M_LINDEX) return tv_int((int64_t)i);
                c++;
            }
        if (fn->id == M_LINDEX) tpl_rt_raise(rt, "value is not in list");
        return tv_int(c);
    }
    case M_CYCLE: {
        if (av->npos == 0) tpl_rt_raise(rt, "no items for cycling given");
        tpl_args_done(rt, av, av->npos, "cycle");
        return av->pos[self.u.loop->index0 % (size_t)av->npos];
    }
    case M_CHANGED: {
        tpl_args_done(rt, av, av->npos, "changed");
        tpl_val t = tv_list(rt, (size_t)av->npos);
        for (int i = 0; i < av->npos; i++) tpl_list_push(rt, t.u.l, av->pos[i]);
        tpl_loop *L = self.u.loop;
        if (L->has_changed && tpl_eq(rt, L->last_changed, t)) return tv_bool(false);
        L->has_changed = true;
        L->last_changed = t;
        return tv_bool(true);
    }
    default: tpl_rt_raise(rt, "internal error: unknown method");
    }
}

/* ---- formatting ---------------------------------------------------------- */

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

/* ---- globals ------------------------------------------------------------- */

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_JOINER, G_JOINER_CALL };

static const struct { const char *name; int id; } k_globals[] = {
    { "range", G_RANGE }, { "namespace", G_NAMESPACE }, { "dict", G_DICT },
    { "raise_exception", G_RAISE }, { "strftime_now", G_STRFTIME }, { "joiner", G_JOINER },
};

/* Immutable descriptors handed out for the globals (never written). */
static tpl_func k_global_fns[LM_COUNT(k_globals)] = {
    { .kind = FN_BUILTIN, .id = G_RANGE, .name = { "range", 5 } },
    { .kind = FN_BUILTIN, .id = G_NAMESPACE, .name = { "namespace", 9 } },
    { .kind = FN_BUILTIN, .id = G_DICT, .name = { "dict", 4 } },
    { .kind = FN_BUILTIN, .id = G_RAISE, .name = { "raise_exception", 15 } },
    { .kind = FN_BUILTIN, .id = G_STRFTIME, .name = { "strftime_now", 12 } },
    { .kind = FN_BUILTIN, .id = G_JOINER, .name = { "joiner", 6 } },
};

bool tpl_global(tpl_str name, tpl_val *out) {
    for (size_t i = 0; i < LM_COUNT(k_globals); i++)
        if (tpl_str_eq(name, k_globals[i].name)) {
            tpl_val v = { 0 };
            v.t = TV_FUNC;
            v.u.fn = &k_global_fns[i];
            *out = v;
            return true;
        }
    return false;
}

static tpl_val kwargs_dict(tpl_rt *rt, tpl_argv *av, tpl_val base) {
    tpl_val d = tv_dict(rt, 0);
    if (base.t == TV_DICT || base.t == TV_NS) {
        for (size_t i = 0; i < base.u.d->n; i++) tpl_dict_set(rt, d.u.d, base.u.d->k[i], base.u.d->v[i]);
    } else if (base.t == TV_LIST) {
        for (size_t i = 0; i < base.u.l->n; i++) {
            tpl_val p = base.u.l->v[i];
            if (p.t != TV_LIST || p.u.l->n != 2) tpl_rt_raise(rt, "dictionary update sequence element has wrong length");
            tpl_dict_set(rt, d.u.d, p.u.l->v[0], p.u.l->v[1]);
        }
    } else if (base.t != TV_UNDEF) {
        tpl_rt_raise(rt, "'%s' object is not iterable", tpl_type_name(&base));
    }
    for (int k = 0; k < av->nkw; k++) tpl_dict_set(rt, d.u.d, tv_strn(av->kwname[k].p, av->kwname[k].n), av->kw[k]);
    return d;
}

tpl_val tpl_call_builtin(tpl_rt *rt, tpl_func *fn, tpl_argv *av) {
    switch (fn->id) {
    case G_RANGE: {
        if (av->nkw) tpl_rt_raise(rt, "range() takes no keyword arguments");
        if (av->npos < 1 || av->npos > 3) tpl_rt_raise(rt, "range expected 1 to 3 arguments, got %d", av->npos);
        int64_t a[3] = { 0, 0, 1 };
        for (int i = 0; i < av->npos; i++) {
            tpl_val v = av->pos[i];
            if (v.t == TV_INT) a[i] = v.u.i;
            else if (v.t == TV_BOOL) a[i] = v.u.b;
            else tpl_rt_raise(rt, "'%s' object cannot be interpreted as an integer", tpl_type_name(&v));
        }
        int64_t start = av->npos == 1 ? 0 : a[0], stop = av->npos == 1 ? a[0] : a[1], step = av->npos == 3 ? a[2] : 1;
        if (step == 0) tpl_rt_raise(rt, "range() arg 3 must not be zero");
        double count = step > 0 ? ((double)stop - (double)start) / (double)step : ((double)start - (double)stop) / (double)-step;
        if (count > 10000000) tpl_rt_raise(rt, "range too large (%.0f items; the limit is 10 million)", count);
        tpl_val out = tv_list(rt, count > 0 ? (size_t)ceil(count) : 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            tpl_list_push(rt, out.u.l, tv_int(i));
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        return out;
    }
    case G_NAMESPACE: case G_DICT: {
        if (av->npos > 1) tpl_rt_raise(rt, "%s expected at most 1 positional argument", fn->id == G_DICT ? "dict" : "namespace");
        tpl_val d = kwargs_dict(rt, av, av->npos ? av->pos[0] : tv_undef());
        if (fn->id == G_NAMESPACE) d.t = TV_NS;
        return d;
    }
    case G_RAISE: {
        tpl_val m = av->npos ? av->pos[0] : tv_strn("", 0);
        tpl_buf b = { 0 };
        tpl_str_of(rt, &b, m);
        tpl_rt_raise(rt, "%.*s", (int)LM_MIN(b.n, 400), b.p ? b.p : "");
    }
    case G_STRFTIME: {
        tpl_val f;
        if (!tpl_arg(av, 0, "format", &f) || f.t != TV_STR) tpl_rt_raise(rt, "strftime_now needs a format string");
        tpl_args_done(rt, av, 1, "strftime_now");
        time_t t = rt->now ? (time_t)rt->now : time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        char fmt[256], out[1024];
        if (f.u.s.n >= sizeof fmt) tpl_rt_raise(rt, "strftime format too long");
        memcpy(fmt, f.u.s.p, f.u.s.n);
        fmt[f.u.s.n] = 0;
        size_t n = f.u.s.n ? strftime(out, sizeof out, fmt, &tm) : 0;
        if (n == 0 && f.u.s.n) tpl_rt_raise(rt, "strftime result too long or empty");
        return tv_str_copy(rt, out, n);
    }
    case G_JOINER: {
        tpl_val sep = tv_cstr(", ");
        tpl_arg(av, 0, "sep", &sep);
        tpl_args_done(rt, av, 1, "joiner");
        tpl_func *j = tpl_rt_alloc(rt, sizeof *j);
        j->kind = FN_BUILTIN;
        j->id = G_JOINER_CALL;
        j->name = (tpl_str){ "joiner", 6 };
        j->self = tv_list(rt, 0); /* empty until first call */
        tpl_list_push(rt, j->self.u.l, tpl_to_str(rt, sep));
        j->self.u.l->n = 0;
        tpl_val v = { 0 };
        v.t = TV_FUNC;
        v.u.fn = j;
        return v;
    }
    case G_JOINER_CALL: {
        tpl_list *st = fn->self.u.l;
        if (st->n == 0) {
            st->n = 1;
            return tv_strn("", 0);
        }
        return st->v[0];
    }
    default: tpl_rt_raise(rt, "internal error: unknown builtin");
    }
}
