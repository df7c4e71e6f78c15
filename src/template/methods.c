/* methods.c - Python methods that templates call on values (str.split,
 * dict.items, list.append, loop.cycle ...). str.format is format.c's; the
 * globals (range, namespace ...) are globals.c's.
 *
 * list.append and list.extend are allowed although transformers' immutable
 * sandbox refuses them: templates in the wild use them, and allowing them
 * cannot change the rendering of a template that works under transformers.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#define _GNU_SOURCE /* memmem */
#include "tpl_internal.h"


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
