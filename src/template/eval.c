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
 * What the operators do to the values (attribute and item access, slices,
 * arithmetic, comparisons) is ops.c's.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

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
    return tpl_slice(rt, o, a, b, c);
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
    if (!tpl_is_num(v))
        tpl_rt_raise(rt, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+", tpl_type_name(&v));
    if (n->kind == N_POS) return v.t == TV_BOOL ? tv_int(v.u.b) : v;
    if (v.t == TV_FLOAT) return tv_float(-v.u.f);
    if (tpl_as_i(v) == INT64_MIN) tpl_rt_raise(rt, "integer overflow in unary -");
    return tv_int(-tpl_as_i(v));
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
        return tpl_binary(rt, (tpl_binop)n->op, a, b);
    }
    for (int i = 0; i < n->list.n; i++) { /* N_CMP: a < b < c */
        tpl_val b = eval(rt, sc, n->list.v[i]);
        rt->pos = n->pos;
        if (!tpl_compare(rt, (tpl_cmpop)n->ops[i], a, b)) return tv_bool(false);
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
