/* globals.c - the functions a template can call by name: range, namespace,
 * dict, joiner, and transformers' raise_exception and strftime_now.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

#include <math.h>
#include <time.h>

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
