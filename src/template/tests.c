/* tests.c - jinja2's built-in tests (x is defined, x is mapping, x is
 * divisibleby 3 ...) with Python semantics: `is number` is true for bools,
 * `is sequence` for strings and dicts, an undefined value is iterable and
 * callable, as in jinja2.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#define _GNU_SOURCE /* memmem */
#include "tpl_internal.h"

#include <math.h>

/* ---- tests --------------------------------------------------------------- */

static bool cmp_test(tpl_rt *rt, tpl_val v, tpl_argv *av, tpl_cmpop op, const char *what) {
    tpl_val o;
    if (!tpl_arg(av, 0, "other", &o)) tpl_rt_raise(rt, "test '%s' needs an argument", what);
    tpl_args_done(rt, av, 1, what);
    if (op == CMP_EQ) return tpl_eq(rt, v, o);
    if (op == CMP_NE) return !tpl_eq(rt, v, o);
    if ((v.t == TV_STR) != (o.t == TV_STR))
        tpl_rt_raise(rt, "'%s' not supported between instances of '%s' and '%s'", what, tpl_type_name(&v),
                     tpl_type_name(&o));
    int c = tpl_cmp(rt, v, o);
    switch (op) {
    case CMP_LT: return c < 0;
    case CMP_LE: return c <= 0;
    case CMP_GT: return c > 0;
    default: return c >= 0;
    }
}

static bool str_all_case(tpl_rt *rt, tpl_val v, bool upper) {
    tpl_val s = tpl_to_str(rt, v);
    bool any = false;
    size_t i = 0;
    while (i < s.u.s.n) {
        uint32_t c = (uint32_t)tpl_utf8_dec(s.u.s.p, s.u.s.n, &i);
        if (!tpl_cp_cased(c)) continue;
        any = true;
        if (upper ? tpl_cp_lower(c) == c && c != 0xDF : tpl_cp_upper(c) == c && c != 0xDF) return false;
    }
    return any;
}

static const char *const k_tests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false",
    "filter", "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=",
    "lower", "lt", "<", "lessthan", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence",
    "string", "test", "true", "undefined", "upper",
};

bool tpl_test_exists(tpl_str name) {
    for (size_t i = 0; i < LM_COUNT(k_tests); i++)
        if (tpl_str_eq(name, k_tests[i])) return true;
    return false;
}

static int64_t int_of(tpl_rt *rt, tpl_val v, const char *what) {
    if (v.t == TV_INT) return v.u.i;
    if (v.t == TV_BOOL) return v.u.b;
    if (v.t == TV_UNDEF) tpl_undef_fail(rt, v);
    tpl_rt_raise(rt, "test '%s' needs an integer, not %s", what, tpl_type_name(&v));
}

bool tpl_test(tpl_rt *rt, tpl_str name, tpl_val v, tpl_argv *av) {
#define IS(s) tpl_str_eq(name, s)
    if (IS("eq") || IS("equalto") || IS("==")) return cmp_test(rt, v, av, CMP_EQ, "eq");
    if (IS("ne") || IS("!=")) return cmp_test(rt, v, av, CMP_NE, "ne");
    if (IS("lt") || IS("<") || IS("lessthan")) return cmp_test(rt, v, av, CMP_LT, "<");
    if (IS("le") || IS("<=")) return cmp_test(rt, v, av, CMP_LE, "<=");
    if (IS("gt") || IS(">") || IS("greaterthan")) return cmp_test(rt, v, av, CMP_GT, ">");
    if (IS("ge") || IS(">=")) return cmp_test(rt, v, av, CMP_GE, ">=");
    if (IS("in")) {
        tpl_val seq;
        if (!tpl_arg(av, 0, "seq", &seq)) tpl_rt_raise(rt, "test 'in' needs an argument");
        tpl_args_done(rt, av, 1, "in");
        switch (seq.t) {
        case TV_STR: case TV_LIST: case TV_DICT: case TV_UNDEF: break;
        default: tpl_rt_raise(rt, "argument of type '%s' is not iterable", tpl_type_name(&seq));
        }
        if (seq.t == TV_STR) {
            if (v.t != TV_STR)
                tpl_rt_raise(rt, "'in <string>' requires string as left operand, not %s", tpl_type_name(&v));
            return memmem(seq.u.s.p, seq.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (seq.t == TV_DICT) return tpl_dict_get(seq.u.d, v) != NULL;
        if (seq.t == TV_LIST)
            for (size_t i = 0; i < seq.u.l->n; i++)
                if (tpl_eq(rt, seq.u.l->v[i], v)) return true;
        return false;
    }
    if (IS("divisibleby")) {
        tpl_val n;
        if (!tpl_arg(av, 0, "num", &n)) tpl_rt_raise(rt, "test 'divisibleby' needs an argument");
        tpl_args_done(rt, av, 1, "divisibleby");
        if (v.t == TV_FLOAT || n.t == TV_FLOAT) {
            double x = v.t == TV_FLOAT ? v.u.f : (double)int_of(rt, v, "divisibleby");
            double y = n.t == TV_FLOAT ? n.u.f : (double)int_of(rt, n, "divisibleby");
            if (y == 0) tpl_rt_raise(rt, "float modulo");
            return fmod(x, y) == 0.0;
        }
        int64_t d = int_of(rt, n, "divisibleby"), x = int_of(rt, v, "divisibleby");
        if (d == 0) tpl_rt_raise(rt, "integer division or modulo by zero");
        return d == -1 || x % d == 0;
    }
    if (IS("sameas")) {
        tpl_val o;
        if (!tpl_arg(av, 0, "other", &o)) tpl_rt_raise(rt, "test 'sameas' needs an argument");
        tpl_args_done(rt, av, 1, "sameas");
        if (v.t != o.t) return false;
        switch (v.t) {
        case TV_LIST: return v.u.l == o.u.l;
        case TV_DICT: case TV_NS: return v.u.d == o.u.d;
        case TV_FUNC: return v.u.fn == o.u.fn;
        case TV_STR: return v.u.s.p == o.u.s.p && v.u.s.n == o.u.s.n;
        default: return tpl_eq(rt, v, o);
        }
    }
    if (IS("test") || IS("filter")) {
        tpl_val n;
        if (!tpl_arg(av, 0, "name", &n)) tpl_rt_raise(rt, "test '%.*s' needs an argument", (int)name.n, name.p);
        tpl_args_done(rt, av, 1, "test");
        (void)v;
        if (n.t != TV_STR) return false;
        tpl_str s = tpl_sv(n);
        return IS("test") ? tpl_test_exists(s) : tpl_filter_exists(s);
    }
    tpl_args_done(rt, av, 0, "test");
    if (IS("defined")) return v.t != TV_UNDEF;
    if (IS("undefined")) return v.t == TV_UNDEF;
    if (IS("none")) return v.t == TV_NONE;
    if (IS("boolean")) return v.t == TV_BOOL;
    if (IS("true")) return v.t == TV_BOOL && v.u.b;
    if (IS("false")) return v.t == TV_BOOL && !v.u.b;
    if (IS("string")) return v.t == TV_STR;
    if (IS("number")) return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL;
    if (IS("integer")) return v.t == TV_INT;
    if (IS("float")) return v.t == TV_FLOAT;
    if (IS("mapping")) return v.t == TV_DICT;
    if (IS("iterable")) return v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF || v.t == TV_LOOP;
    if (IS("sequence"))
        return v.t == TV_STR || (v.t == TV_LIST && !(v.flags & TVF_GEN)) || v.t == TV_DICT || v.t == TV_UNDEF;
    if (IS("callable")) return v.t == TV_FUNC || v.t == TV_LOOP || v.t == TV_UNDEF; /* Undefined has __call__ */
    if (IS("escaped")) return v.t == TV_STR && (v.flags & TVF_MARKUP);
    if (IS("even") || IS("odd")) { /* value % 2 == 0 / == 1, Python semantics */
        if (v.t == TV_UNDEF) tpl_undef_fail(rt, v);
        if (v.t == TV_FLOAT) {
            double r = fmod(v.u.f, 2.0);
            if (r < 0) r += 2.0;
            return IS("even") ? r == 0.0 : r == 1.0;
        }
        return (int_of(rt, v, "even") & 1) == (IS("odd") ? 1 : 0);
    }
    if (IS("lower")) return str_all_case(rt, v, false);
    if (IS("upper")) return str_all_case(rt, v, true);
#undef IS
    tpl_rt_raise(rt, "no test named '%.*s'", (int)LM_MIN(name.n, 60), name.p);
}

/* select/reject: av->pos[first] is the test name (absent: truthiness), the
 * rest its arguments. */
bool tpl_test_args(tpl_rt *rt, tpl_val item, tpl_argv *av, int first) {
    if (av->npos <= first) return tpl_truthy(rt, item);
    tpl_val t = av->pos[first];
    if (t.t != TV_STR) tpl_rt_raise(rt, "test name must be a string");
    tpl_argv a = *av;
    a.pos += first + 1;
    a.npos -= first + 1;
    return tpl_test(rt, tpl_sv(t), item, &a);
}
