/* ops.c - what the operators of expressions do to values, with Python's
 * semantics: attribute and item access, slices, + - * / // % **,
 * comparisons and 'in'. eval.c evaluates the operands and calls in here.
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

tpl_val tpl_slice(tpl_rt *rt, tpl_val obj, tpl_val a, tpl_val b, tpl_val c) {
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

tpl_val tpl_binary(tpl_rt *rt, tpl_binop op, tpl_val a, tpl_val b) {
    if (a.t == TV_UNDEF) tpl_undef_fail(rt, a);
    if (b.t == TV_UNDEF) tpl_undef_fail(rt, b);
    if ((a.t == TV_LIST && (a.flags & TVF_NOT_LIST)) || (b.t == TV_LIST && (b.flags & TVF_NOT_LIST)))
        tpl_rt_raise(rt, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), tpl_type_name(&a),
                     tpl_type_name(&b));
    if (tpl_is_num(a) && tpl_is_num(b)) {
        bool fl = a.t == TV_FLOAT || b.t == TV_FLOAT;
        if (op == OP_DIV) {
            if (tpl_as_f(b) == 0) tpl_rt_raise(rt, "division by zero");
            return tv_float(tpl_as_f(a) / tpl_as_f(b));
        }
        if (fl) {
            double x = tpl_as_f(a), y = tpl_as_f(b), r;
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
        int64_t x = tpl_as_i(a), y = tpl_as_i(b), r;
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
        if ((a.t == TV_STR || a.t == TV_LIST) && (b.t == TV_INT || b.t == TV_BOOL)) return repeat(rt, a, tpl_as_i(b));
        if ((b.t == TV_STR || b.t == TV_LIST) && (a.t == TV_INT || a.t == TV_BOOL)) return repeat(rt, b, tpl_as_i(a));
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

bool tpl_compare(tpl_rt *rt, tpl_cmpop op, tpl_val a, tpl_val b) {
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
    if (tpl_is_num(a) && tpl_is_num(b) && (a.t == TV_FLOAT || b.t == TV_FLOAT) &&
        (isnan(tpl_as_f(a)) || isnan(tpl_as_f(b))))
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
