/* filters_seq.c - jinja2's built-in filters on sequences and mappings
 * (batch, dictsort, groupby, join, map, select, sort, sum, unique ...), with
 * Python semantics; those that return a Python iterator return a list
 * marked TVF_GEN. filters.c looks them up in tpl_seq_filters.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

/* jinja2's attribute getter: "a.b.0" walks items (then attributes). */
static tpl_val get_path(tpl_rt *rt, tpl_val v, tpl_val attr) {
    if (attr.t == TV_INT) return tpl_getitem(rt, v, attr);
    if (attr.t != TV_STR) tpl_rt_raise(rt, "attribute must be a string or integer");
    tpl_str s = tpl_sv(attr);
    size_t a = 0;
    while (a <= s.n) {
        size_t b = a;
        while (b < s.n && s.p[b] != '.') b++;
        tpl_str part = { s.p + a, b - a };
        bool digits = part.n > 0;
        int64_t num = 0;
        for (size_t i = 0; i < part.n; i++) {
            if (part.p[i] < '0' || part.p[i] > '9' || num > 100000000000LL) digits = false;
            else num = num * 10 + (part.p[i] - '0');
        }
        if (v.t == TV_UNDEF) return v;
        v = digits ? tpl_getitem(rt, v, tv_int(num)) : tpl_getitem(rt, v, tv_strn(part.p, part.n));
        a = b + 1;
    }
    return v;
}

static tpl_val fold_case(tpl_rt *rt, tpl_val v, bool case_sensitive) {
    if (!case_sensitive && v.t == TV_STR) return tpl_case_map(rt, tpl_sv(v), 0);
    return v;
}

/* Stable merge sort of vals by keys. eq_first: keys equal by == never
 * reach '<' (jinja2's sort compares [key] lists, which test == first). */
static void sort_vals(tpl_rt *rt, tpl_val *vals, tpl_val *keys, size_t n, bool reverse, bool eq_first) {
    if (n < 2) return;
    tpl_val *tv = tpl_rt_alloc(rt, n * sizeof *tv), *tk = tpl_rt_alloc(rt, n * sizeof *tk);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = LM_MIN(lo + w, n), hi = LM_MIN(lo + 2 * w, n), i = lo, j = mid, k = lo;
            tpl_tick(rt, hi - lo);
            while (i < mid && j < hi) {
                int c = eq_first && tpl_eq(rt, keys[j], keys[i]) ? 0 : tpl_cmp(rt, keys[j], keys[i]);
                bool take_right = reverse ? c > 0 : c < 0;
                if (take_right) tv[k] = vals[j], tk[k++] = keys[j++];
                else tv[k] = vals[i], tk[k++] = keys[i++];
            }
            while (i < mid) tv[k] = vals[i], tk[k++] = keys[i++];
            while (j < hi) tv[k] = vals[j], tk[k++] = keys[j++];
        }
        memcpy(vals, tv, n * sizeof *tv);
        memcpy(keys, tk, n * sizeof *tk);
    }
}

static tpl_val f_batch(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    int64_t n = tpl_arg_int(rt, av, 0, "linecount", 1);
    tpl_val fill;
    bool has_fill = tpl_arg(av, 1, "fill_with", &fill) && fill.t != TV_NONE;
    tpl_args_done(rt, av, 2, "batch");
    if (n <= 0) tpl_rt_raise(rt, "batch size must be positive");
    tpl_list *items = tpl_iter_list(rt, v);
    tpl_val out = tv_list(rt, 0), cur = tv_list(rt, 0);
    for (size_t i = 0; i < items->n; i++) {
        tpl_list_push(rt, cur.u.l, items->v[i]);
        if ((int64_t)cur.u.l->n == n) {
            tpl_list_push(rt, out.u.l, cur);
            cur = tv_list(rt, 0);
        }
    }
    if (cur.u.l->n) {
        while (has_fill && (int64_t)cur.u.l->n < n) tpl_list_push(rt, cur.u.l, fill);
        tpl_list_push(rt, out.u.l, cur);
    }
    out.flags |= TVF_GEN;
    return out;
}

static tpl_val f_dictsort(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    bool cs = tpl_arg_bool(rt, av, 0, "case_sensitive", false);
    tpl_val by = tv_cstr("key");
    tpl_arg(av, 1, "by", &by);
    bool rev = tpl_arg_bool(rt, av, 2, "reverse", false);
    tpl_args_done(rt, av, 3, "dictsort");
    if (v.t != TV_DICT) tpl_rt_raise(rt, "dictsort expects a mapping, not %s", tpl_type_name(&v));
    int pos = by.t == TV_STR && tpl_str_eq(tpl_sv(by), "value") ? 1 : 0;
    if (!pos && !(by.t == TV_STR && tpl_str_eq(tpl_sv(by), "key")))
        tpl_rt_raise(rt, "You can only sort by either \"key\" or \"value\"");
    size_t n = v.u.d->n;
    tpl_val out = tv_list(rt, n);
    tpl_val *keys = tpl_rt_alloc(rt, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        tpl_val pair = tv_list(rt, 2);
        pair.flags = TVF_TUPLE;
        tpl_list_push(rt, pair.u.l, v.u.d->k[i]);
        tpl_list_push(rt, pair.u.l, v.u.d->v[i]);
        out.u.l->v[i] = pair;
        keys[i] = fold_case(rt, pos ? v.u.d->v[i] : v.u.d->k[i], cs);
    }
    out.u.l->n = n;
    sort_vals(rt, out.u.l->v, keys, n, rev, false);
    return out;
}

static tpl_val f_first(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "first");
    tpl_list *l = tpl_iter_list(rt, v);
    return l->n ? l->v[0] : tv_undef_named("first", 5, "empty sequence");
}

static tpl_val f_last(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "last");
    if (v.t == TV_LIST && (v.flags & TVF_GEN)) tpl_rt_raise(rt, "'generator' object is not reversible");
    tpl_list *l = tpl_iter_list(rt, v);
    return l->n ? l->v[l->n - 1] : tv_undef_named("last", 4, "empty sequence");
}

static tpl_val f_groupby(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val attr, dflt = tv_undef();
    if (!tpl_arg(av, 0, "attribute", &attr)) tpl_rt_raise(rt, "groupby needs an attribute");
    bool has_default = tpl_arg(av, 1, "default", &dflt);
    bool cs = tpl_arg_bool(rt, av, 2, "case_sensitive", false);
    tpl_args_done(rt, av, 3, "groupby");
    tpl_list *items = tpl_iter_list(rt, v);
    size_t n = items->n;
    tpl_val *vals = tpl_rt_alloc(rt, (n + 1) * sizeof *vals), *keys = tpl_rt_alloc(rt, (n + 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        vals[i] = items->v[i];
        tpl_val k = get_path(rt, items->v[i], attr);
        if (k.t == TV_UNDEF && has_default) k = dflt;
        keys[i] = fold_case(rt, k, cs);
    }
    sort_vals(rt, vals, keys, n, false, false);
    tpl_val out = tv_list(rt, 0);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        tpl_val grp = tv_list(rt, 0);
        while (j < n && tpl_eq(rt, keys[j], keys[i])) tpl_list_push(rt, grp.u.l, vals[j++]);
        tpl_val pair = tv_list(rt, 2);
        pair.flags = TVF_TUPLE | TVF_GROUP;
        tpl_val gk = get_path(rt, vals[i], attr);
        if (gk.t == TV_UNDEF && has_default) gk = dflt;
        tpl_list_push(rt, pair.u.l, gk);
        tpl_list_push(rt, pair.u.l, grp);
        tpl_list_push(rt, out.u.l, pair);
        i = j;
    }
    return out;
}

static tpl_val f_items(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "items");
    if (v.t == TV_UNDEF) return tv_list(rt, 0);
    if (v.t != TV_DICT) tpl_rt_raise(rt, "Can only get item pairs from a mapping.");
    tpl_val out = tv_list(rt, v.u.d->n);
    for (size_t i = 0; i < v.u.d->n; i++) {
        tpl_val pair = tv_list(rt, 2);
        pair.flags = TVF_TUPLE;
        tpl_list_push(rt, pair.u.l, v.u.d->k[i]);
        tpl_list_push(rt, pair.u.l, v.u.d->v[i]);
        tpl_list_push(rt, out.u.l, pair);
    }
    out.flags |= TVF_GEN;
    return out;
}

static tpl_val f_join(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val sep = tv_strn("", 0), attr;
    tpl_arg(av, 0, "d", &sep);
    bool has_attr = tpl_arg(av, 1, "attribute", &attr) && attr.t != TV_NONE;
    tpl_args_done(rt, av, 2, "join");
    sep = tpl_to_str(rt, sep);
    tpl_list *l = tpl_iter_list(rt, v);
    tpl_buf b = { 0 };
    for (size_t i = 0; i < l->n; i++) {
        if (i) tpl_buf_put(rt, &b, sep.u.s.p, sep.u.s.n);
        tpl_val x = has_attr ? get_path(rt, l->v[i], attr) : l->v[i];
        tpl_str_of(rt, &b, x);
    }
    return tpl_buf_val(&b);
}

static tpl_val f_length(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "length");
    return tv_int(tpl_len(rt, v));
}

static tpl_val f_list(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "list");
    tpl_val out = { 0 };
    out.t = TV_LIST;
    out.u.l = tpl_iter_list(rt, v);
    return out;
}

static tpl_val f_map(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_list *l = tpl_iter_list(rt, v);
    tpl_val out = tv_list(rt, l->n), attr, dflt = tv_undef();
    if (av->npos == 0 && tpl_arg(av, -1, "attribute", &attr)) {
        bool has_default = tpl_arg(av, -1, "default", &dflt);
        tpl_args_done(rt, av, 0, "map");
        for (size_t i = 0; i < l->n; i++) {
            tpl_val x = get_path(rt, l->v[i], attr);
            tpl_list_push(rt, out.u.l, x.t == TV_UNDEF && has_default ? dflt : x);
        }
        out.flags |= TVF_GEN;
        return out;
    }
    if (av->npos == 0 || av->pos[0].t != TV_STR) tpl_rt_raise(rt, "map requires a filter name or attribute=");
    tpl_str name = tpl_sv(av->pos[0]);
    if (!tpl_filter_exists(name)) tpl_rt_raise(rt, "no filter named '%.*s'", (int)LM_MIN(name.n, 60), name.p);
    tpl_argv rest = *av;
    rest.pos++;
    rest.npos--;
    for (size_t i = 0; i < l->n; i++) {
        tpl_argv a = rest;
        tpl_list_push(rt, out.u.l, tpl_filter(rt, name, l->v[i], &a));
    }
    out.flags |= TVF_GEN;
    return out;
}

static tpl_val minmax(tpl_rt *rt, tpl_val v, tpl_argv *av, bool want_max) {
    bool cs = tpl_arg_bool(rt, av, 0, "case_sensitive", false);
    tpl_val attr;
    bool has_attr = tpl_arg(av, 1, "attribute", &attr) && attr.t != TV_NONE;
    tpl_args_done(rt, av, 2, want_max ? "max" : "min");
    tpl_list *l = tpl_iter_list(rt, v);
    if (!l->n) return tv_undef_named("max", 3, "empty sequence");
    size_t best = 0;
    tpl_val bk = fold_case(rt, has_attr ? get_path(rt, l->v[0], attr) : l->v[0], cs);
    for (size_t i = 1; i < l->n; i++) {
        tpl_val k = fold_case(rt, has_attr ? get_path(rt, l->v[i], attr) : l->v[i], cs);
        int c = tpl_cmp(rt, k, bk);
        if (want_max ? c > 0 : c < 0) best = i, bk = k;
    }
    return l->v[best];
}
static tpl_val f_max(tpl_rt *rt, tpl_val v, tpl_argv *av) { return minmax(rt, v, av, true); }
static tpl_val f_min(tpl_rt *rt, tpl_val v, tpl_argv *av) { return minmax(rt, v, av, false); }

static tpl_val f_reverse(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_args_done(rt, av, 0, "reverse");
    tpl_list *l = tpl_iter_list(rt, v);
    if (v.t == TV_STR) {
        tpl_buf b = { 0 };
        for (size_t i = l->n; i-- > 0;) tpl_buf_put(rt, &b, l->v[i].u.s.p, l->v[i].u.s.n);
        return tpl_buf_val(&b);
    }
    tpl_val out = tv_list(rt, l->n);
    for (size_t i = l->n; i-- > 0;) tpl_list_push(rt, out.u.l, l->v[i]);
    if (v.t == TV_LIST && !(v.flags & TVF_GEN)) out.flags |= TVF_GEN; /* reversed() iterator */
    return out;
}

static tpl_val select_common(tpl_rt *rt, tpl_val v, tpl_argv *av, bool attr_mode, bool keep) {
    tpl_list *l = tpl_iter_list(rt, v);
    tpl_val out = tv_list(rt, 0), attr = tv_none();
    int first = 0;
    if (attr_mode) {
        if (av->npos < 1) tpl_rt_raise(rt, "selectattr/rejectattr need an attribute");
        attr = av->pos[0];
        first = 1;
    }
    for (size_t i = 0; i < l->n; i++) {
        tpl_val x = attr_mode ? get_path(rt, l->v[i], attr) : l->v[i];
        bool ok;
        ok = tpl_test_args(rt, x, av, first);
        if (ok == keep) tpl_list_push(rt, out.u.l, l->v[i]);
    }
    out.flags |= TVF_GEN;
    return out;
}
static tpl_val f_select(tpl_rt *rt, tpl_val v, tpl_argv *av) { return select_common(rt, v, av, false, true); }
static tpl_val f_reject(tpl_rt *rt, tpl_val v, tpl_argv *av) { return select_common(rt, v, av, false, false); }
static tpl_val f_selectattr(tpl_rt *rt, tpl_val v, tpl_argv *av) { return select_common(rt, v, av, true, true); }
static tpl_val f_rejectattr(tpl_rt *rt, tpl_val v, tpl_argv *av) { return select_common(rt, v, av, true, false); }

static tpl_val f_sort(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    bool rev = tpl_arg_bool(rt, av, 0, "reverse", false), cs = tpl_arg_bool(rt, av, 1, "case_sensitive", false);
    tpl_val attr;
    bool has_attr = tpl_arg(av, 2, "attribute", &attr) && attr.t != TV_NONE;
    tpl_args_done(rt, av, 3, "sort");
    tpl_list *src = tpl_iter_list(rt, v), *l = tv_list(rt, src->n).u.l; /* sorted() makes a new list */
    if (src->n) memcpy(l->v, src->v, src->n * sizeof *l->v);
    l->n = src->n;
    tpl_val *keys = tpl_rt_alloc(rt, (l->n + 1) * sizeof *keys);
    for (size_t i = 0; i < l->n; i++) keys[i] = fold_case(rt, has_attr ? get_path(rt, l->v[i], attr) : l->v[i], cs);
    sort_vals(rt, l->v, keys, l->n, rev, true);
    tpl_val out = { 0 };
    out.t = TV_LIST;
    out.u.l = l;
    return out;
}

static tpl_val f_sum(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    tpl_val attr, start = tv_int(0);
    bool has_attr = tpl_arg(av, 0, "attribute", &attr) && attr.t != TV_NONE;
    tpl_arg(av, 1, "start", &start);
    tpl_args_done(rt, av, 2, "sum");
    tpl_list *l = tpl_iter_list(rt, v);
    tpl_val acc = start;
    for (size_t i = 0; i < l->n; i++) {
        tpl_val x = has_attr ? get_path(rt, l->v[i], attr) : l->v[i];
        bool fl = acc.t == TV_FLOAT || x.t == TV_FLOAT;
        if ((acc.t != TV_INT && acc.t != TV_FLOAT && acc.t != TV_BOOL) ||
            (x.t != TV_INT && x.t != TV_FLOAT && x.t != TV_BOOL))
            tpl_rt_raise(rt, "unsupported operand type(s) for +: '%s' and '%s'", tpl_type_name(&acc), tpl_type_name(&x));
        if (fl) {
            double a = acc.t == TV_FLOAT ? acc.u.f : acc.t == TV_INT ? (double)acc.u.i : acc.u.b;
            double y = x.t == TV_FLOAT ? x.u.f : x.t == TV_INT ? (double)x.u.i : x.u.b;
            acc = tv_float(a + y);
        } else {
            int64_t a = acc.t == TV_INT ? acc.u.i : acc.u.b, y = x.t == TV_INT ? x.u.i : x.u.b, r;
            if (__builtin_add_overflow(a, y, &r)) tpl_rt_raise(rt, "integer overflow in sum");
            acc = tv_int(r);
        }
    }
    return acc;
}

static tpl_val f_unique(tpl_rt *rt, tpl_val v, tpl_argv *av) {
    bool cs = tpl_arg_bool(rt, av, 0, "case_sensitive", false);
    tpl_val attr;
    bool has_attr = tpl_arg(av, 1, "attribute", &attr) && attr.t != TV_NONE;
    tpl_args_done(rt, av, 2, "unique");
    tpl_list *l = tpl_iter_list(rt, v);
    tpl_val out = tv_list(rt, 0), seen = tv_list(rt, 0);
    for (size_t i = 0; i < l->n; i++) {
        tpl_val k = fold_case(rt, has_attr ? get_path(rt, l->v[i], attr) : l->v[i], cs);
        bool dup = false;
        tpl_tick(rt, seen.u.l->n);
        for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = tpl_eq(rt, seen.u.l->v[j], k);
        if (dup) continue;
        tpl_list_push(rt, seen.u.l, k);
        tpl_list_push(rt, out.u.l, l->v[i]);
    }
    out.flags |= TVF_GEN;
    return out;
}

const tpl_filter_def tpl_seq_filters[] = {
    { "batch", f_batch }, { "count", f_length }, { "dictsort", f_dictsort }, { "first", f_first },
    { "groupby", f_groupby }, { "items", f_items }, { "join", f_join }, { "last", f_last },
    { "length", f_length }, { "list", f_list }, { "map", f_map }, { "max", f_max }, { "min", f_min },
    { "reject", f_reject }, { "rejectattr", f_rejectattr }, { "reverse", f_reverse }, { "select", f_select },
    { "selectattr", f_selectattr }, { "sort", f_sort }, { "sum", f_sum }, { "unique", f_unique },
};
const size_t tpl_seq_filters_n = LM_COUNT(tpl_seq_filters);
