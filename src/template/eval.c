/* eval.c - runs the AST: statements write to the current output buffer,
 * expressions produce values with Python's semantics.
 *
 * Scopes follow jinja2: a for-loop iteration, a macro call, a call-block's
 * caller() and {% with %} get their own scope (assignments inside do not leak
 * out, hence namespace()); if-blocks do not. Name lookup walks the scope
 * chain, then the context's variables, then the globals (range, namespace,
 * raise_exception ...). Macros see the scope they were defined in, so a
 * top-level macro can call one defined after it.
 *
 * Attribute access follows jinja2's sandbox: x.name prefers a method or
 * attribute and falls back to the item; x[key] prefers the item and falls
 * back to the attribute; a missing one is undefined, which only fails when
 * used (printing it gives '').
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#define _GNU_SOURCE /* memmem */
#include "tpl_internal.h"

#include <math.h>
#include <stdlib.h>

typedef enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;

static tpl_val eval(tpl_rt *rt, tpl_scope *sc, const tpl_node *n);
static flow exec_body(tpl_rt *rt, tpl_scope *sc, tpl_nodes body);

/* ---- scopes -------------------------------------------------------------- */

static tpl_scope *scope_new(tpl_rt *rt, tpl_scope *parent) {
    tpl_scope *s = tpl_rt_alloc(rt, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(tpl_rt *rt, tpl_scope *s, tpl_str name, tpl_val v) {
    for (int i = 0; i < s->n; i++)
        if (s->names[i].n == name.n && !memcmp(s->names[i].p, name.p, name.n)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        tpl_str *nn = tpl_rt_alloc(rt, (size_t)cap * sizeof *nn);
        tpl_val *nv = tpl_rt_alloc(rt, (size_t)cap * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof *nn);
            memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
}

static tpl_val *scope_find(tpl_scope *s, tpl_str name) {
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (s->names[i].n == name.n && !memcmp(s->names[i].p, name.p, name.n)) return &s->vals[i];
    return NULL;
}

static tpl_val lookup(tpl_rt *rt, tpl_scope *sc, tpl_str name) {
    tpl_val *v = scope_find(sc, name);
    if (v) return *v;
    v = scope_find(rt->globals, name);
    if (v) return *v;
    tpl_val g;
    if (tpl_global(name, &g)) return g;
    return tv_undef_named(name.p, name.n, NULL);
}

/* ---- output -------------------------------------------------------------- */

static void emit(tpl_rt *rt, tpl_val v) {
    if (v.t == TV_STR) tpl_buf_put(rt, rt->out, v.u.s.p, v.u.s.n);
    else tpl_str_of(rt, rt->out, v);
}

/* Renders body into a fresh buffer and returns it as a string. */
static tpl_val capture(tpl_rt *rt, tpl_scope *sc, tpl_nodes body) {
    tpl_buf b = { 0 }, *saved = rt->out;
    rt->out = &b;
    exec_body(rt, sc, body);
    rt->out = saved;
    return tpl_buf_val(&b);
}

/* ---- attribute and item access ------------------------------------------- */

static const char *obj_desc(const tpl_val *v) {
    switch (v->t) {
    case TV_NONE: return "None";
    case TV_BOOL: return "bool object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_STR: return "str object";
    case TV_LIST: return (v->flags & TVF_TUPLE) ? "tuple object" : "list object";
    case TV_DICT: return "dict object";
    case TV_NS: return "Namespace object";
    default: return "object";
    }
}

static tpl_val loop_attr(tpl_rt *rt, tpl_loop *L, tpl_str name, bool *found) {
    size_t n = L->items->n, i = L->index0;
    *found = true;
    if (tpl_str_eq(name, "index")) return tv_int((int64_t)i + 1);
    if (tpl_str_eq(name, "index0")) return tv_int((int64_t)i);
    if (tpl_str_eq(name, "revindex")) return tv_int((int64_t)(n - i));
    if (tpl_str_eq(name, "revindex0")) return tv_int((int64_t)(n - i - 1));
    if (tpl_str_eq(name, "first")) return tv_bool(i == 0);
    if (tpl_str_eq(name, "last")) return tv_bool(i + 1 == n);
    if (tpl_str_eq(name, "length")) return tv_int((int64_t)n);
    if (tpl_str_eq(name, "depth")) return tv_int(L->depth0 + 1);
    if (tpl_str_eq(name, "depth0")) return tv_int(L->depth0);
    if (tpl_str_eq(name, "previtem"))
        return i > 0 ? L->items->v[i - 1] : tv_undef_named("previtem", 8, "LoopContext object");
    if (tpl_str_eq(name, "nextitem"))
        return i + 1 < n ? L->items->v[i + 1] : tv_undef_named("nextitem", 8, "LoopContext object");
    *found = false;
    (void)rt;
    return tv_undef();
}

tpl_val tpl_getattr(tpl_rt *rt, tpl_val obj, tpl_str name) {
    bool found = false;
    tpl_val v;
    switch (obj.t) {
    case TV_UNDEF: tpl_undef_fail(rt, obj);
    case TV_DICT:
        v = tpl_method_lookup(rt, obj, name, &found);
        if (found) return v;
        /* fall through */
    case TV_NS: {
        tpl_val *p = tpl_dict_gets(obj.u.d, name.p, name.n);
        if (p) return *p;
        break;
    }
    case TV_LOOP:
        v = loop_attr(rt, obj.u.loop, name, &found);
        if (found) return v;
        /* fall through */
    case TV_LIST:
        if ((obj.flags & TVF_GROUP) && tpl_str_eq(name, "grouper")) return obj.u.l->v[0];
        if ((obj.flags & TVF_GROUP) && tpl_str_eq(name, "list")) return obj.u.l->v[1];
        /* fall through */
    default:
        v = tpl_method_lookup(rt, obj, name, &found);
        if (found) return v;
        break;
    }
    return tv_undef_named(name.p, name.n, obj_desc(&obj));
}

static bool as_index(tpl_val k, int64_t *i) {
    if (k.t == TV_INT) *i = k.u.i;
    else if (k.t == TV_BOOL) *i = k.u.b;
    else return false;
    return true;
}

/* Byte offset of code point index cp in s (cp <= length). */
static size_t cp_offset(tpl_str s, size_t cp) {
    size_t i = 0;
    while (cp > 0 && i < s.n) {
        i++;
        while (i < s.n && ((unsigned char)s.p[i] & 0xC0) == 0x80) i++;
        cp--;
    }
    return i;
}

tpl_val tpl_getitem(tpl_rt *rt, tpl_val obj, tpl_val key) {
    int64_t i;
    switch (obj.t) {
    case TV_UNDEF: tpl_undef_fail(rt, obj);
    case TV_DICT: {
        tpl_val *p = tpl_dict_get(obj.u.d, key);
        if (p) return *p;
        break;
    }
    case TV_LIST:
        if (obj.flags & TVF_NOT_LIST) return tv_undef_named("item", 4, tpl_type_name(&obj));
        if (as_index(key, &i)) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.u.l->v[i];
            return tv_undef_named("index", 5, "list object");
        }
        break;
    case TV_STR:
        if (as_index(key, &i)) {
            tpl_str s = tpl_sv(obj);
            int64_t n = (int64_t)tpl_utf8_len(s.p, s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t a = cp_offset(s, (size_t)i), b = a;
                tpl_utf8_dec(s.p, s.n, &b);
                return tv_strn(s.p + a, b - a);
            }
            return tv_undef_named("index", 5, "str object");
        }
        break;
    default: break;
    }
    if (key.t == TV_STR) return tpl_getattr(rt, obj, tpl_sv(key));
    if (obj.t == TV_INT || obj.t == TV_FLOAT || obj.t == TV_BOOL || obj.t == TV_FUNC)
        return tv_undef_named("item", 4, obj_desc(&obj));
    return tv_undef_named("item", 4, obj_desc(&obj));
}

static int64_t slice_idx(tpl_rt *rt, tpl_val v, int64_t dflt, int64_t n, int64_t step) {
    if (v.t == TV_NONE || v.t == TV_UNDEF) return dflt;
    int64_t i;
    if (!as_index(v, &i)) tpl_rt_raise(rt, "slice indices must be integers or None");
    if (i < 0) {
        i += n;
        if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
        i = step < 0 ? n - 1 : n;
    }
    return i;
}

static tpl_val do_slice(tpl_rt *rt, tpl_val obj, tpl_val a, tpl_val b, tpl_val c) {
    if (obj.t == TV_UNDEF) tpl_undef_fail(rt, obj);
    int64_t step = 1;
    if (c.t != TV_NONE && c.t != TV_UNDEF && !as_index(c, &step))
        tpl_rt_raise(rt, "slice indices must be integers or None");
    if (step == 0) tpl_rt_raise(rt, "slice step cannot be zero");
    tpl_list *items;
    if (obj.t == TV_LIST && !(obj.flags & TVF_NOT_LIST)) items = obj.u.l;
    else if (obj.t == TV_STR) items = tpl_iter_list(rt, obj);
    else if (obj.t == TV_DICT) tpl_rt_raise(rt, "unhashable type: 'slice'");
    else tpl_rt_raise(rt, "'%s' object is not subscriptable", tpl_type_name(&obj));
    int64_t n = (int64_t)items->n;
    int64_t start = slice_idx(rt, a, step < 0 ? n - 1 : 0, n, step);
    int64_t stop = slice_idx(rt, b, step < 0 ? -1 : n, n, step);
    tpl_val out = tv_list(rt, 0);
    out.flags = obj.flags & TVF_TUPLE;
    tpl_buf sb = { 0 };
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (obj.t == TV_STR) tpl_buf_put(rt, &sb, items->v[i].u.s.p, items->v[i].u.s.n);
        else tpl_list_push(rt, out.u.l, items->v[i]);
    }
    return obj.t == TV_STR ? tpl_buf_val(&sb) : out;
}

/* ---- operators ----------------------------------------------------------- */

static bool is_num(tpl_val v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }
static double as_f(tpl_val v) { return v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : v.u.b; }
static int64_t as_i(tpl_val v) { return v.t == TV_INT ? v.u.i : v.u.b; }

static const char *op_sym(tpl_binop op) {
    static const char *const s[] = { "+", "-", "*", "/", "//", "%", "**" };
    return s[op];
}

static tpl_val repeat(tpl_rt *rt, tpl_val seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq.t == TV_STR) {
        if (seq.u.s.n && (uint64_t)k > (rt->max_output ? rt->max_output : SIZE_MAX) / seq.u.s.n)
            tpl_rt_raise(rt, "string repetition too large");
        tpl_buf b = { 0 };
        for (int64_t i = 0; i < k; i++) tpl_buf_put(rt, &b, seq.u.s.p, seq.u.s.n);
        tpl_val r = tpl_buf_val(&b);
        r.flags = seq.flags & TVF_MARKUP;
        return r;
    }
    if (seq.u.l->n && (uint64_t)k > (uint64_t)(1u << 26) / seq.u.l->n) tpl_rt_raise(rt, "list repetition too large");
    tpl_val out = tv_list(rt, 0);
    out.flags = seq.flags;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++) tpl_list_push(rt, out.u.l, seq.u.l->v[j]);
    return out;
}

static tpl_val binop(tpl_rt *rt, tpl_binop op, tpl_val a, tpl_val b) {
    if (a.t == TV_UNDEF) tpl_undef_fail(rt, a);
    if (b.t == TV_UNDEF) tpl_undef_fail(rt, b);
    if ((a.t == TV_LIST && (a.flags & TVF_NOT_LIST)) || (b.t == TV_LIST && (b.flags & TVF_NOT_LIST)))
        tpl_rt_raise(rt, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), tpl_type_name(&a),
                     tpl_type_name(&b));
    if (is_num(a) && is_num(b)) {
        bool fl = a.t == TV_FLOAT || b.t == TV_FLOAT;
        if (op == OP_DIV) {
            if (as_f(b) == 0) tpl_rt_raise(rt, "division by zero");
            return tv_float(as_f(a) / as_f(b));
        }
        if (fl) {
            double x = as_f(a), y = as_f(b), r;
            switch (op) {
            case OP_ADD: r = x + y; break;
            case OP_SUB: r = x - y; break;
            case OP_MUL: r = x * y; break;
            case OP_FLOORDIV:
                if (y == 0) tpl_rt_raise(rt, "float floor division by zero");
                r = floor(x / y);
                break;
            case OP_MOD:
                if (y == 0) tpl_rt_raise(rt, "float modulo");
                r = fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                break;
            default:
                if (x == 0 && y < 0) tpl_rt_raise(rt, "0.0 cannot be raised to a negative power");
                r = pow(x, y);
                break;
            }
            return tv_float(r);
        }
        int64_t x = as_i(a), y = as_i(b), r;
        bool ovf = false;
        switch (op) {
        case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
        case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
        case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
        case OP_FLOORDIV: case OP_MOD:
            if (y == 0) tpl_rt_raise(rt, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (op == OP_MOD) return tv_int(0);
                ovf = true;
                break;
            }
            if (op == OP_FLOORDIV) {
                r = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0))) r--;
            } else {
                r = x % y;
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
            }
            break;
        default:
            if (y < 0) {
                if (x == 0) tpl_rt_raise(rt, "0.0 cannot be raised to a negative power");
                return tv_float(pow((double)x, (double)y));
            }
            r = 1;
            for (int64_t base = x, e = y; e > 0 && !ovf; e >>= 1) {
                if (e & 1) ovf = __builtin_mul_overflow(r, base, &r);
                if (e > 1 && !ovf) ovf = __builtin_mul_overflow(base, base, &base);
            }
            break;
        }
        if (ovf) tpl_rt_raise(rt, "integer overflow in '%s'", op_sym(op));
        return tv_int(r);
    }
    if (op == OP_ADD) {
        if (a.t == TV_STR && b.t == TV_STR) {
            bool mk = (a.flags | b.flags) & TVF_MARKUP;
            if (mk && !(a.flags & TVF_MARKUP)) a = tpl_html_escape(rt, a);
            if (mk && !(b.flags & TVF_MARKUP)) b = tpl_html_escape(rt, b);
            tpl_buf buf = { 0 };
            tpl_buf_put(rt, &buf, a.u.s.p, a.u.s.n);
            tpl_buf_put(rt, &buf, b.u.s.p, b.u.s.n);
            tpl_val r = tpl_buf_val(&buf);
            if (mk) r.flags |= TVF_MARKUP;
            return r;
        }
        if (a.t == TV_LIST && b.t == TV_LIST && (a.flags & TVF_TUPLE) == (b.flags & TVF_TUPLE)) {
            tpl_val r = tv_list(rt, a.u.l->n + b.u.l->n);
            r.flags = a.flags;
            for (size_t i = 0; i < a.u.l->n; i++) tpl_list_push(rt, r.u.l, a.u.l->v[i]);
            for (size_t i = 0; i < b.u.l->n; i++) tpl_list_push(rt, r.u.l, b.u.l->v[i]);
            return r;
        }
        if (a.t == TV_STR || a.t == TV_LIST)
            tpl_rt_raise(rt, "can only concatenate %s (not \"%s\") to %s", tpl_type_name(&a), tpl_type_name(&b),
                         tpl_type_name(&a));
    }
    if (op == OP_MUL) {
        if ((a.t == TV_STR || a.t == TV_LIST) && (b.t == TV_INT || b.t == TV_BOOL)) return repeat(rt, a, as_i(b));
        if ((b.t == TV_STR || b.t == TV_LIST) && (a.t == TV_INT || a.t == TV_BOOL)) return repeat(rt, b, as_i(a));
    }
    if (op == OP_MOD && a.t == TV_STR) return tpl_percent_format(rt, tpl_sv(a), b);
    tpl_rt_raise(rt, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), tpl_type_name(&a),
                 tpl_type_name(&b));
}

static bool contains(tpl_rt *rt, tpl_val item, tpl_val seq) {
    switch (seq.t) {
    case TV_UNDEF: return false;
    case TV_STR:
        if (item.t != TV_STR)
            tpl_rt_raise(rt, "'in <string>' requires string as left operand, not %s", tpl_type_name(&item));
        if (item.u.s.n == 0) return true;
        if (item.u.s.n > seq.u.s.n) return false;
        return memmem(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case TV_LIST:
        tpl_tick(rt, seq.u.l->n / 8);
        for (size_t i = 0; i < seq.u.l->n; i++)
            if (tpl_eq(rt, seq.u.l->v[i], item)) return true;
        return false;
    case TV_DICT:
        if ((item.t == TV_LIST && !(item.flags & TVF_TUPLE)) || item.t == TV_DICT || item.t == TV_NS)
            tpl_rt_raise(rt, "unhashable type: '%s'", tpl_type_name(&item));
        return tpl_dict_get(seq.u.d, item) != NULL;
    default: tpl_rt_raise(rt, "argument of type '%s' is not iterable", tpl_type_name(&seq));
    }
}

static bool compare(tpl_rt *rt, tpl_cmpop op, tpl_val a, tpl_val b) {
    switch (op) {
    case CMP_EQ: return tpl_eq(rt, a, b);
    case CMP_NE: return !tpl_eq(rt, a, b);
    case CMP_IN: return contains(rt, a, b);
    case CMP_NOTIN: return !contains(rt, a, b);
    default: break;
    }
    if (a.t == TV_STR && b.t != TV_STR) goto bad;
    if (b.t == TV_STR && a.t != TV_STR) goto bad;
    int c = tpl_cmp(rt, a, b);
    if (is_num(a) && is_num(b) && (a.t == TV_FLOAT || b.t == TV_FLOAT) &&
        (isnan(as_f(a)) || isnan(as_f(b))))
        return false;
    switch (op) {
    case CMP_LT: return c < 0;
    case CMP_LE: return c <= 0;
    case CMP_GT: return c > 0;
    default: return c >= 0;
    }
bad:;
    static const char *const sym[] = { "==", "!=", "<", "<=", ">", ">=" };
    tpl_rt_raise(rt, "'%s' not supported between instances of '%s' and '%s'", sym[op], tpl_type_name(&a),
                 tpl_type_name(&b));
}

/* ---- calls --------------------------------------------------------------- */

static void eval_args(tpl_rt *rt, tpl_scope *sc, const tpl_args *a, tpl_argv *av) {
    int npos = a->pos.n, nkw = a->kw.n;
    tpl_val star = tv_none(), dstar = tv_none();
    if (a->star) {
        star = eval(rt, sc, a->star);
        tpl_list *l = tpl_iter_list(rt, star);
        star.t = TV_LIST;
        star.u.l = l;
        npos += (int)LM_MIN(l->n, 10000);
    }
    if (a->dstar) {
        dstar = eval(rt, sc, a->dstar);
        if (dstar.t != TV_DICT) tpl_rt_raise(rt, "argument after ** must be a mapping, not %s", tpl_type_name(&dstar));
        nkw += (int)LM_MIN(dstar.u.d->n, 10000);
    }
    av->pos = tpl_rt_alloc(rt, (size_t)(npos + 1) * sizeof *av->pos);
    av->kw = tpl_rt_alloc(rt, (size_t)(nkw + 1) * sizeof *av->kw);
    av->kwname = tpl_rt_alloc(rt, (size_t)(nkw + 1) * sizeof *av->kwname);
    av->npos = av->nkw = 0;
    av->used_kw = 0;
    for (int i = 0; i < a->pos.n; i++) av->pos[av->npos++] = eval(rt, sc, a->pos.v[i]);
    if (a->star)
        for (size_t i = 0; i < star.u.l->n && av->npos < npos; i++) av->pos[av->npos++] = star.u.l->v[i];
    for (int i = 0; i < a->kw.n; i++) {
        av->kwname[av->nkw] = a->kwname[i];
        av->kw[av->nkw++] = eval(rt, sc, a->kw.v[i]);
    }
    if (a->dstar)
        for (size_t i = 0; i < dstar.u.d->n && av->nkw < nkw; i++) {
            tpl_val k = dstar.u.d->k[i];
            if (k.t != TV_STR) tpl_rt_raise(rt, "keywords must be strings");
            av->kwname[av->nkw] = tpl_sv(k);
            av->kw[av->nkw++] = dstar.u.d->v[i];
        }
    if (av->nkw > 32) tpl_rt_raise(rt, "too many keyword arguments");
}

static void enter(tpl_rt *rt) {
    if (++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "maximum recursion depth exceeded");
}

static tpl_val call_macro(tpl_rt *rt, tpl_func *fn, tpl_argv *av, tpl_val caller) {
    const tpl_node *m = fn->node;
    const tpl_args *p = &m->args;
    tpl_scope *sc = scope_new(rt, fn->closure);
    int np = p->pos.n;
    bool *set = tpl_rt_alloc(rt, (size_t)np + 1);
    tpl_val varargs = tv_list(rt, 0);
    varargs.flags = TVF_TUPLE;
    tpl_val kwargs = tv_dict(rt, 0);
    for (int i = 0; i < av->npos; i++) {
        if (i < np) {
            scope_set(rt, sc, p->pos.v[i]->name, av->pos[i]);
            set[i] = true;
        } else {
            tpl_list_push(rt, varargs.u.l, av->pos[i]);
        }
    }
    for (int k = 0; k < av->nkw; k++) {
        int i = 0;
        while (i < np && !(p->pos.v[i]->name.n == av->kwname[k].n &&
                           !memcmp(p->pos.v[i]->name.p, av->kwname[k].p, av->kwname[k].n)))
            i++;
        if (i < np) {
            if (set[i])
                tpl_rt_raise(rt, "macro '%.*s' got multiple values for argument '%.*s'", (int)fn->name.n,
                             fn->name.p, (int)av->kwname[k].n, av->kwname[k].p);
            scope_set(rt, sc, p->pos.v[i]->name, av->kw[k]);
            set[i] = true;
        } else {
            tpl_dict_set(rt, kwargs.u.d, tv_strn(av->kwname[k].p, av->kwname[k].n), av->kw[k]);
        }
    }
    for (int i = 0; i < np; i++) {
        if (set[i]) continue;
        tpl_str name = p->pos.v[i]->name;
        tpl_val v = tv_undef_named(name.p, name.n, NULL);
        for (int d = 0; d < p->kw.n; d++)
            if (p->kwname[d].n == name.n && !memcmp(p->kwname[d].p, name.p, name.n))
                v = eval(rt, sc, p->kw.v[d]);
        scope_set(rt, sc, name, v);
    }
    scope_set(rt, sc, (tpl_str){ "varargs", 7 }, varargs);
    scope_set(rt, sc, (tpl_str){ "kwargs", 6 }, kwargs);
    if (caller.t != TV_UNDEF) scope_set(rt, sc, (tpl_str){ "caller", 6 }, caller);
    enter(rt);
    tpl_val r = capture(rt, sc, m->list);
    rt->depth--;
    return r;
}

static flow run_for(tpl_rt *rt, tpl_scope *sc, const tpl_node *n, tpl_val iterable, int depth0);

tpl_val tpl_call(tpl_rt *rt, tpl_val f, tpl_argv *av) {
    if (f.t == TV_UNDEF) tpl_undef_fail(rt, f);
    if (f.t == TV_LOOP) { /* loop(children) in a recursive for */
        tpl_loop *L = f.u.loop;
        if (!L->for_node->recursive) tpl_rt_raise(rt, "The loop must have the 'recursive' marker to be called recursively.");
        if (av->npos != 1 || av->nkw) tpl_rt_raise(rt, "loop() takes exactly one argument");
        tpl_buf b = { 0 }, *saved = rt->out;
        rt->out = &b;
        enter(rt);
        run_for(rt, L->scope, L->for_node, av->pos[0], L->depth0 + 1);
        rt->depth--;
        rt->out = saved;
        return tpl_buf_val(&b);
    }
    if (f.t != TV_FUNC) tpl_rt_raise(rt, "'%s' object is not callable", tpl_type_name(&f));
    tpl_func *fn = f.u.fn;
    switch (fn->kind) {
    case FN_MACRO: {
        tpl_val caller = tv_undef();
        for (int k = 0; k < av->nkw; k++)
            if (tpl_str_eq(av->kwname[k], "caller") && av->kw[k].t == TV_FUNC) caller = av->kw[k];
        if (caller.t != TV_UNDEF) { /* caller= is bound as 'caller', not a kwarg */
            tpl_argv a2 = *av;
            a2.nkw = 0;
            a2.kwname = tpl_rt_alloc(rt, (size_t)av->nkw * sizeof *a2.kwname + 1);
            a2.kw = tpl_rt_alloc(rt, (size_t)av->nkw * sizeof *a2.kw + 1);
            for (int k = 0; k < av->nkw; k++)
                if (!tpl_str_eq(av->kwname[k], "caller")) {
                    a2.kwname[a2.nkw] = av->kwname[k];
                    a2.kw[a2.nkw++] = av->kw[k];
                }
            return call_macro(rt, fn, &a2, caller);
        }
        return call_macro(rt, fn, av, caller);
    }
    case FN_CALLER: {
        tpl_func m = *fn;
        m.node = fn->node; /* N_CALLBLOCK: args = caller params, list = body */
        return call_macro(rt, &m, av, tv_undef());
    }
    case FN_METHOD: return tpl_call_method(rt, fn, av);
    default: return tpl_call_builtin(rt, fn, av);
    }
}

/* ---- expressions --------------------------------------------------------- */

/* A filter chain applied to base (N_SETBLOCK / N_FILTERBLOCK): the innermost
 * filter's input is the placeholder constant. */
static tpl_val apply_chain(tpl_rt *rt, tpl_scope *sc, const tpl_node *f, tpl_val base) {
    tpl_val in = f->a->kind == N_FILTER ? apply_chain(rt, sc, f->a, base) : base;
    tpl_argv av;
    eval_args(rt, sc, &f->args, &av);
    rt->pos = f->pos;
    return tpl_filter(rt, f->name, in, &av);
}

static void assign(tpl_rt *rt, tpl_scope *sc, const tpl_node *target, tpl_val v) {
    if (target->kind == N_NAME) {
        scope_set(rt, sc, target->name, v);
    } else if (target->kind == N_ATTR) {
        tpl_val ns = lookup(rt, sc, target->a->name);
        if (ns.t != TV_NS) tpl_rt_raise(rt, "can only assign attributes of a namespace(), not %s", tpl_type_name(&ns));
        tpl_dict_set(rt, ns.u.d, tv_strn(target->name.p, target->name.n), v);
    } else { /* tuple unpacking */
        tpl_list *l = tpl_iter_list(rt, v);
        int n = target->list.n;
        if ((int64_t)l->n > n) tpl_rt_raise(rt, "too many values to unpack (expected %d)", n);
        if ((int64_t)l->n < n) tpl_rt_raise(rt, "not enough values to unpack (expected %d, got %zu)", n, l->n);
        for (int i = 0; i < n; i++) assign(rt, sc, target->list.v[i], l->v[i]);
    }
}

static tpl_val eval_node(tpl_rt *rt, tpl_scope *sc, const tpl_node *n);

/* Every expression frame counts against TPL_MAX_DEPTH, so that recursion
 * through macros whose bodies nest deep expressions still has a bounded
 * stack. (An error longjmps out of the render, so no need to unwind.) */
static tpl_val eval(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    if (++rt->depth > TPL_MAX_DEPTH) tpl_rt_raise(rt, "maximum recursion depth exceeded");
    tpl_val v = eval_node(rt, sc, n);
    rt->depth--;
    return v;
}

/* The cases that need big locals (argument vectors, buffers, values whose
 * address is taken) live in their own frames, so that the recursion through
 * eval/eval_node stays small: the stack a deep template needs is bounded by
 * TPL_MAX_DEPTH times a small frame. */
#define NOINLINE __attribute__((noinline))

static NOINLINE tpl_val eval_slice(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_val o = eval(rt, sc, n->d);
    tpl_val a = n->a ? eval(rt, sc, n->a) : tv_none(), b = n->b ? eval(rt, sc, n->b) : tv_none(),
            c = n->c ? eval(rt, sc, n->c) : tv_none();
    rt->pos = n->pos;
    return do_slice(rt, o, a, b, c);
}

static NOINLINE tpl_val eval_call(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_val f = eval(rt, sc, n->a);
    tpl_argv av;
    eval_args(rt, sc, &n->args, &av);
    rt->pos = n->pos;
    if (n->kind == N_CALL) return tpl_call(rt, f, &av);
    if (n->kind == N_FILTER) return tpl_filter(rt, n->name, f, &av);
    bool r = tpl_test(rt, n->name, f, &av);
    return tv_bool(n->neg ? !r : r);
}

static NOINLINE tpl_val eval_unary(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_val v = eval(rt, sc, n->a);
    rt->pos = n->pos;
    if (v.t == TV_UNDEF) tpl_undef_fail(rt, v);
    if (!is_num(v))
        tpl_rt_raise(rt, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", tpl_type_name(&v));
    if (n->kind == N_POS) return v.t == TV_BOOL ? tv_int(v.u.b) : v;
    if (v.t == TV_FLOAT) return tv_float(-v.u.f);
    if (as_i(v) == INT64_MIN) tpl_rt_raise(rt, "integer overflow in unary -");
    return tv_int(-as_i(v));
}

static NOINLINE tpl_val eval_dict(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_val d = tv_dict(rt, (size_t)n->list.n);
    for (int i = 0; i < n->list.n; i++) {
        tpl_val k = eval(rt, sc, n->list.v[i]);
        if (k.t == TV_LIST && !(k.flags & TVF_TUPLE)) tpl_rt_raise(rt, "unhashable type: 'list'");
        if (k.t == TV_DICT || k.t == TV_NS) tpl_rt_raise(rt, "unhashable type: '%s'", tpl_type_name(&k));
        tpl_dict_set(rt, d.u.d, k, eval(rt, sc, n->list2.v[i]));
    }
    return d;
}

static NOINLINE tpl_val eval_concat(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_buf b = { 0 };
    for (int i = 0; i < n->list.n; i++) {
        tpl_val v = eval(rt, sc, n->list.v[i]);
        if (v.t == TV_STR) tpl_buf_put(rt, &b, v.u.s.p, v.u.s.n);
        else if (v.t != TV_UNDEF) tpl_str_of(rt, &b, v);
    }
    return tpl_buf_val(&b);
}

static NOINLINE tpl_val eval_binary(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_val a = eval(rt, sc, n->a);
    if (n->kind == N_BIN) {
        tpl_val b = eval(rt, sc, n->b);
        rt->pos = n->pos;
        return binop(rt, (tpl_binop)n->op, a, b);
    }
    for (int i = 0; i < n->list.n; i++) { /* N_CMP: a < b < c */
        tpl_val b = eval(rt, sc, n->list.v[i]);
        rt->pos = n->pos;
        if (!compare(rt, (tpl_cmpop)n->ops[i], a, b)) return tv_bool(false);
        a = b;
    }
    return tv_bool(true);
}

static tpl_val eval_node(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_tick(rt, 1);
    rt->pos = n->pos;
    switch ((tpl_kind)n->kind) {
    case N_CONST: return n->cval;
    case N_NAME: return lookup(rt, sc, n->name);
    case N_ATTR: {
        tpl_val o = eval(rt, sc, n->a);
        rt->pos = n->pos;
        return tpl_getattr(rt, o, n->name);
    }
    case N_ITEM: {
        tpl_val o = eval(rt, sc, n->a), k = eval(rt, sc, n->b);
        rt->pos = n->pos;
        return tpl_getitem(rt, o, k);
    }
    case N_SLICE: return eval_slice(rt, sc, n);
    case N_CALL: case N_FILTER: case N_TEST: return eval_call(rt, sc, n);
    case N_NEG: case N_POS: return eval_unary(rt, sc, n);
    case N_NOT: return tv_bool(!tpl_truthy(rt, eval(rt, sc, n->a)));
    case N_AND: {
        tpl_val a = eval(rt, sc, n->a);
        return tpl_truthy(rt, a) ? eval(rt, sc, n->b) : a;
    }
    case N_OR: {
        tpl_val a = eval(rt, sc, n->a);
        return tpl_truthy(rt, a) ? a : eval(rt, sc, n->b);
    }
    case N_COND:
        if (tpl_truthy(rt, eval(rt, sc, n->a))) return eval(rt, sc, n->b);
        return n->c ? eval(rt, sc, n->c) : tv_undef();
    case N_BIN: case N_CMP: return eval_binary(rt, sc, n);
    case N_LIST: case N_TUPLE: {
        tpl_val l = tv_list(rt, (size_t)n->list.n);
        if (n->kind == N_TUPLE) l.flags = TVF_TUPLE;
        for (int i = 0; i < n->list.n; i++) tpl_list_push(rt, l.u.l, eval(rt, sc, n->list.v[i]));
        return l;
    }
    case N_DICT: return eval_dict(rt, sc, n);
    case N_CONCAT: return eval_concat(rt, sc, n);
    default: break;
    }
    tpl_rt_raise(rt, "internal error: statement in expression position");
}

/* ---- statements ---------------------------------------------------------- */

static flow run_for(tpl_rt *rt, tpl_scope *sc, const tpl_node *n, tpl_val iterable, int depth0) {
    rt->pos = n->b->pos;
    tpl_list *items = tpl_iter_list(rt, iterable);
    tpl_scope *it = scope_new(rt, sc);
    if (n->c) { /* for x in y if cond: filter first, so loop.length counts what runs */
        tpl_list *kept = tv_list(rt, items->n).u.l;
        for (size_t i = 0; i < items->n; i++) {
            it->n = 0;
            assign(rt, it, n->a, items->v[i]);
            if (tpl_truthy(rt, eval(rt, it, n->c))) tpl_list_push(rt, kept, items->v[i]);
        }
        items = kept;
    }
    if (items->n == 0) {
        if (n->list2.n) return exec_body(rt, scope_new(rt, sc), n->list2);
        return FLOW_NORMAL;
    }
    /* jinja2 runs the else block unless some iteration reached the end of
     * the body: a loop left by break, or whose every iteration ended in
     * continue, still renders it */
    bool completed = false;
    tpl_loop *L = tpl_rt_alloc(rt, sizeof *L);
    L->items = items;
    L->depth0 = depth0;
    L->for_node = n;
    L->scope = sc;
    tpl_val loopv = { 0 };
    loopv.t = TV_LOOP;
    loopv.u.loop = L;
    enter(rt);
    it = NULL;
    for (size_t i = 0; i < items->n; i++) {
        tpl_tick(rt, 1);
        L->index0 = i;
        /* a fresh scope per iteration, reusing the last one's memory unless
         * a macro defined in the body closed over it */
        if (!it || it->captured) it = scope_new(rt, sc);
        it->n = 0;
        scope_set(rt, it, (tpl_str){ "loop", 4 }, loopv);
        rt->pos = n->pos;
        assign(rt, it, n->a, items->v[i]);
        flow f = exec_body(rt, it, n->list);
        if (f == FLOW_BREAK) break;
        if (f == FLOW_NORMAL) completed = true;
    }
    rt->depth--;
    if (!completed && n->list2.n) return exec_body(rt, scope_new(rt, sc), n->list2);
    return FLOW_NORMAL;
}

static flow exec_stmt(tpl_rt *rt, tpl_scope *sc, const tpl_node *n) {
    tpl_tick(rt, 1);
    rt->pos = n->pos;
    switch ((tpl_kind)n->kind) {
    case N_DATA: tpl_buf_put(rt, rt->out, n->cval.u.s.p, n->cval.u.s.n); return FLOW_NORMAL;
    case N_PRINT: emit(rt, eval(rt, sc, n->a)); return FLOW_NORMAL;
    case N_IF:
        if (tpl_truthy(rt, eval(rt, sc, n->a))) return exec_body(rt, sc, n->list);
        return exec_body(rt, sc, n->list2);
    case N_FOR: return run_for(rt, sc, n, eval(rt, sc, n->b), 0);
    case N_SET: assign(rt, sc, n->a, eval(rt, sc, n->b)); return FLOW_NORMAL;
    case N_SETBLOCK: {
        tpl_val v = capture(rt, sc, n->list);
        if (n->c) v = apply_chain(rt, sc, n->c, v);
        rt->pos = n->pos;
        assign(rt, sc, n->a, v);
        return FLOW_NORMAL;
    }
    case N_MACRO: {
        tpl_func *fn = tpl_rt_alloc(rt, sizeof *fn);
        fn->kind = FN_MACRO;
        fn->node = n;
        fn->closure = sc;
        for (tpl_scope *c = sc; c; c = c->parent) c->captured = true;
        fn->name = n->name;
        tpl_val v = { 0 };
        v.t = TV_FUNC;
        v.u.fn = fn;
        scope_set(rt, sc, n->name, v);
        return FLOW_NORMAL;
    }
    case N_CALLBLOCK: {
        tpl_func *cf = tpl_rt_alloc(rt, sizeof *cf);
        cf->kind = FN_CALLER;
        cf->node = n;
        cf->closure = sc;
        for (tpl_scope *c = sc; c; c = c->parent) c->captured = true;
        cf->name = (tpl_str){ "caller", 6 };
        tpl_val callerv = { 0 };
        callerv.t = TV_FUNC;
        callerv.u.fn = cf;
        const tpl_node *call = n->a;
        tpl_val f = eval(rt, sc, call->a);
        tpl_argv av;
        eval_args(rt, sc, &call->args, &av);
        rt->pos = n->pos;
        if (f.t != TV_FUNC || f.u.fn->kind != FN_MACRO) tpl_rt_raise(rt, "{%% call %%} needs a macro");
        enter(rt);
        emit(rt, call_macro(rt, f.u.fn, &av, callerv));
        rt->depth--;
        return FLOW_NORMAL;
    }
    case N_FILTERBLOCK: emit(rt, apply_chain(rt, sc, n->c, capture(rt, sc, n->list))); return FLOW_NORMAL;
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_WITH: {
        tpl_scope *w = scope_new(rt, sc);
        for (int i = 0; i < n->args.kw.n; i++) scope_set(rt, w, n->args.kwname[i], eval(rt, w, n->args.kw.v[i]));
        return exec_body(rt, w, n->list);
    }
    case N_DO: eval(rt, sc, n->a); return FLOW_NORMAL;
    case N_BODY: return exec_body(rt, sc, n->list);
    default: tpl_rt_raise(rt, "internal error: expression in statement position");
    }
}

static flow exec_body(tpl_rt *rt, tpl_scope *sc, tpl_nodes body) {
    enter(rt);
    for (int i = 0; i < body.n; i++) {
        flow f = exec_stmt(rt, sc, body.v[i]);
        if (f != FLOW_NORMAL) {
            rt->depth--;
            return f;
        }
    }
    rt->depth--;
    return FLOW_NORMAL;
}

/* ---- entry points -------------------------------------------------------- */

int lm_template_render(const lm_template *t, const json_t *ctx, const lm_template_opts *opts, char **out,
                       size_t *out_len, lm_err *e) {
    *out = NULL;
    *out_len = 0;
    lm_template_opts o = { 0 };
    if (opts) o = *opts;
    if (ctx && !json_is_object(ctx)) return lm_errf(e, "%s: the render context must be a JSON object", t->name);
    tpl_rt *rt = calloc(1, sizeof *rt);
    if (!rt) return lm_errf(e, "out of memory");
    rt->arena.limit = o.max_memory ? o.max_memory : (size_t)1 << 30;
    rt->f.err = e;
    rt->f.name = t->name;
    rt->f.src = t->src;
    rt->f.src_len = t->src_len;
    rt->f.arena = &rt->arena;
    rt->tpl = t;
    rt->max_output = o.max_output ? o.max_output : (size_t)64 << 20;
    rt->max_steps = o.max_steps ? o.max_steps : 200000000ull;
    rt->now = o.now;
    if (setjmp(rt->f.jb)) {
        tpl_arena_free(&rt->arena);
        free(rt);
        return -1;
    }
    rt->globals = scope_new(rt, NULL);
    if (ctx) {
        tpl_val d = tpl_from_json(rt, ctx, 0);
        for (size_t i = 0; i < d.u.d->n; i++) scope_set(rt, rt->globals, tpl_sv(d.u.d->k[i]), d.u.d->v[i]);
    }
    tpl_buf b = { 0 };
    rt->out = &b;
    exec_body(rt, scope_new(rt, NULL), t->root->list);
    char *s = malloc(b.n + 1);
    if (!s) {
        tpl_arena_free(&rt->arena);
        free(rt);
        return lm_errf(e, "out of memory");
    }
    if (b.n) memcpy(s, b.p, b.n);
    s[b.n] = 0;
    *out = s;
    *out_len = b.n;
    tpl_arena_free(&rt->arena);
    free(rt);
    return 0;
}
