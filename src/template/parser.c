/* parser.c - tokens to AST, following jinja2's grammar and precedence:
 *
 *   expr    := or ('if' or ('else' expr)?)?
 *   or      := and ('or' and)*         and := not ('and' not)*
 *   not     := 'not' not | compare     compare := math1 (cmpop math1)*
 *   math1   := concat (('+'|'-') concat)*   concat := math2 ('~' math2)*
 *   math2   := pow (('*'|'/'|'//'|'%') pow)*   pow := unary ('**' unary)*
 *   unary   := ('-'|'+') unary | primary postfix* ; then filters/tests/calls
 *   postfix := '.' name | '.' int | '[' subscript ']' | '(' args ')'
 *   filter  := '|' name ('(' args ')')?    test := 'is' 'not'? name (args | one primary)?
 *
 * Statements: if/elif/else, for (target in iter [if cond] [recursive]) with
 * else, set (expression, namespace attribute, tuple, or block with filters),
 * macro, call, filter, with, do, break/continue, raw (in the lexer),
 * generation (transformers' tag, rendered as its body) and block (inline).
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_internal.h"

typedef struct parser {
    tpl_fail *f;
    tpl_token *t;
    int n, i;
    int depth;
    int loops; /* enclosing for-loops (break/continue are legal) */
} parser;

typedef struct nvec {
    tpl_node **v;
    int n, cap;
} nvec;

static void nv_push(parser *P, nvec *v, tpl_node *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        tpl_node **nn = tpl_alloc(P->f, (size_t)cap * sizeof *nn);
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static tpl_nodes nv_done(nvec *v) { return (tpl_nodes){ v->v, v->n }; }

static tpl_token *cur(parser *P) { return &P->t[P->i]; }
static tpl_token *peek(parser *P, int k) { return &P->t[LM_MIN(P->i + k, P->n - 1)]; }
static void adv(parser *P) {
    if (P->i < P->n - 1) P->i++;
}

static bool is_op(const tpl_token *t, const char *op) { return t->type == T_OP && tpl_str_eq(t->s, op); }
static bool is_name(const tpl_token *t, const char *nm) { return t->type == T_NAME && tpl_str_eq(t->s, nm); }

static const char *tok_desc(const tpl_token *t, char *buf, size_t n) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "end of print statement '}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "end of statement block '%}'";
    case T_STRING: return "string literal";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default: snprintf(buf, n, "'%.*s'", (int)LM_MIN(t->s.n, 40), t->s.p); return buf;
    }
}

static void __attribute__((noreturn)) unexpected(parser *P, const char *want) {
    char b[64];
    if (want) tpl_raise(P->f, cur(P)->pos, "expected %s, got %s", want, tok_desc(cur(P), b, sizeof b));
    tpl_raise(P->f, cur(P)->pos, "unexpected %s", tok_desc(cur(P), b, sizeof b));
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    adv(P);
}

static tpl_str expect_name(parser *P) {
    if (cur(P)->type != T_NAME) unexpected(P, "a name");
    tpl_str s = cur(P)->s;
    adv(P);
    return s;
}

static void expect_block_end(parser *P) {
    if (cur(P)->type != T_BLOCK_END) unexpected(P, "end of statement block '%}'");
    adv(P);
}

static tpl_node *mk(parser *P, tpl_kind k, size_t pos) {
    tpl_node *n = tpl_alloc(P->f, sizeof *n);
    n->kind = (uint8_t)k;
    n->pos = pos;
    return n;
}

static void enter(parser *P) {
    if (++P->depth > 200) tpl_raise(P->f, cur(P)->pos, "template nested too deeply");
}

/* ---- expressions --------------------------------------------------------- */

static tpl_node *expression(parser *P, bool with_condexpr);
static tpl_node *unary(parser *P, bool with_filter);
static tpl_node *primary(parser *P);
static tpl_node *postfix(parser *P, tpl_node *n);
static tpl_node *filter_expr(parser *P, tpl_node *n);

static bool tuple_end(parser *P, const char *extra) {
    tpl_token *t = cur(P);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF || is_op(t, ")")) return true;
    return extra && is_name(t, extra);
}

/* a, b, c -> tuple; a -> a. explicit: inside (), where () is the empty tuple. */
static tpl_node *tuple(parser *P, bool with_condexpr, bool explicit, const char *extra_end) {
    size_t pos = cur(P)->pos;
    nvec items = { 0 };
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(P, ",");
        if (tuple_end(P, extra_end)) break;
        nv_push(P, &items, expression(P, with_condexpr));
        if (is_op(cur(P), ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit) unexpected(P, "an expression");
    }
    tpl_node *n = mk(P, N_TUPLE, pos);
    n->list = nv_done(&items);
    return n;
}

static tpl_node *condexpr(parser *P);
static tpl_node *parse_or(parser *P);

/* with_condexpr false: no 'a if b else c' at the top (for-loop iterables,
 * where 'if' starts the loop filter) */
static tpl_node *expression(parser *P, bool with_condexpr) {
    enter(P);
    tpl_node *n = with_condexpr ? condexpr(P) : parse_or(P);
    P->depth--;
    return n;
}

static tpl_node *parse_and(parser *P);
static tpl_node *parse_not(parser *P);
static tpl_node *compare(parser *P);
static tpl_node *math1(parser *P);

static tpl_node *condexpr(parser *P) {
    tpl_node *e1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        size_t pos = cur(P)->pos;
        adv(P);
        tpl_node *cond = parse_or(P);
        tpl_node *e3 = NULL;
        if (is_name(cur(P), "else")) {
            adv(P);
            enter(P);
            e3 = condexpr(P);
            P->depth--;
        }
        tpl_node *n = mk(P, N_COND, pos);
        n->a = cond;
        n->b = e1;
        n->c = e3;
        e1 = n;
    }
    return e1;
}

static tpl_node *parse_or(parser *P) {
    tpl_node *l = parse_and(P);
    while (is_name(cur(P), "or")) {
        size_t pos = cur(P)->pos;
        adv(P);
        tpl_node *n = mk(P, N_OR, pos);
        n->a = l;
        n->b = parse_and(P);
        l = n;
    }
    return l;
}

static tpl_node *parse_and(parser *P) {
    tpl_node *l = parse_not(P);
    while (is_name(cur(P), "and")) {
        size_t pos = cur(P)->pos;
        adv(P);
        tpl_node *n = mk(P, N_AND, pos);
        n->a = l;
        n->b = parse_not(P);
        l = n;
    }
    return l;
}

static tpl_node *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        size_t pos = cur(P)->pos;
        adv(P);
        enter(P);
        tpl_node *n = mk(P, N_NOT, pos);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return compare(P);
}

static tpl_node *compare(parser *P) {
    size_t pos = cur(P)->pos;
    tpl_node *first = math1(P);
    nvec rest = { 0 };
    uint8_t ops[64];
    int nops = 0;
    static const char *const names[] = { "==", "!=", "<", "<=", ">", ">=" };
    for (;;) {
        tpl_token *t = cur(P);
        int op = -1;
        for (int k = 0; k < 6; k++)
            if (is_op(t, names[k])) op = k;
        if (op >= 0) {
            adv(P);
        } else if (is_name(t, "in")) {
            op = CMP_IN;
            adv(P);
        } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = CMP_NOTIN;
            adv(P);
            adv(P);
        } else {
            break;
        }
        if (nops == (int)sizeof ops) tpl_raise(P->f, t->pos, "too many chained comparisons");
        ops[nops++] = (uint8_t)op;
        nv_push(P, &rest, math1(P));
    }
    if (!nops) return first;
    tpl_node *n = mk(P, N_CMP, pos);
    n->a = first;
    n->list = nv_done(&rest);
    n->ops = tpl_alloc(P->f, (size_t)nops);
    memcpy(n->ops, ops, (size_t)nops);
    return n;
}

static tpl_node *binary(parser *P, tpl_binop op, tpl_node *l, tpl_node *r, size_t pos) {
    tpl_node *n = mk(P, N_BIN, pos);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static tpl_node *math2(parser *P);
static tpl_node *concat(parser *P);

static tpl_node *math1(parser *P) {
    tpl_node *l = concat(P);
    for (;;) {
        size_t pos = cur(P)->pos;
        if (is_op(cur(P), "+")) {
            adv(P);
            l = binary(P, OP_ADD, l, concat(P), pos);
        } else if (is_op(cur(P), "-")) {
            adv(P);
            l = binary(P, OP_SUB, l, concat(P), pos);
        } else {
            return l;
        }
    }
}

static tpl_node *concat(parser *P) {
    size_t pos = cur(P)->pos;
    tpl_node *first = math2(P);
    if (!is_op(cur(P), "~")) return first;
    nvec items = { 0 };
    nv_push(P, &items, first);
    while (is_op(cur(P), "~")) {
        adv(P);
        nv_push(P, &items, math2(P));
    }
    tpl_node *n = mk(P, N_CONCAT, pos);
    n->list = nv_done(&items);
    return n;
}

static tpl_node *pow_(parser *P) {
    tpl_node *l = unary(P, true);
    while (is_op(cur(P), "**")) {
        size_t pos = cur(P)->pos;
        adv(P);
        l = binary(P, OP_POW, l, unary(P, true), pos);
    }
    return l;
}

static tpl_node *math2(parser *P) {
    tpl_node *l = pow_(P);
    for (;;) {
        size_t pos = cur(P)->pos;
        tpl_binop op;
        if (is_op(cur(P), "*")) op = OP_MUL;
        else if (is_op(cur(P), "/")) op = OP_DIV;
        else if (is_op(cur(P), "//")) op = OP_FLOORDIV;
        else if (is_op(cur(P), "%")) op = OP_MOD;
        else return l;
        adv(P);
        l = binary(P, op, l, pow_(P), pos);
    }
}

static tpl_node *unary(parser *P, bool with_filter) {
    enter(P);
    size_t pos = cur(P)->pos;
    tpl_node *n;
    if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
        bool neg = is_op(cur(P), "-");
        adv(P);
        n = mk(P, neg ? N_NEG : N_POS, pos);
        n->a = unary(P, false);
    } else {
        n = primary(P);
    }
    n = postfix(P, n);
    if (with_filter) n = filter_expr(P, n);
    P->depth--;
    return n;
}

static void call_args(parser *P, tpl_args *a) {
    expect_op(P, "(");
    nvec pos = { 0 }, kw = { 0 };
    tpl_str names[64];
    int nk = 0;
    while (!is_op(cur(P), ")")) {
        if (pos.n || kw.n || a->star || a->dstar) {
            expect_op(P, ",");
            if (is_op(cur(P), ")")) break;
        }
        if (is_op(cur(P), "*")) {
            adv(P);
            a->star = expression(P, true);
        } else if (is_op(cur(P), "**")) {
            adv(P);
            a->dstar = expression(P, true);
        } else if (cur(P)->type == T_NAME && is_op(peek(P, 1), "=")) {
            if (nk == (int)LM_COUNT(names)) tpl_raise(P->f, cur(P)->pos, "too many keyword arguments");
            names[nk++] = cur(P)->s;
            adv(P);
            adv(P);
            nv_push(P, &kw, expression(P, true));
        } else {
            if (kw.n || a->dstar) tpl_raise(P->f, cur(P)->pos, "positional argument after keyword argument");
            nv_push(P, &pos, expression(P, true));
        }
    }
    expect_op(P, ")");
    a->pos = nv_done(&pos);
    a->kw = nv_done(&kw);
    if (nk) {
        a->kwname = tpl_alloc(P->f, (size_t)nk * sizeof *a->kwname);
        memcpy(a->kwname, names, (size_t)nk * sizeof *names);
    }
}

static tpl_node *subscript_part(parser *P) {
    size_t pos = cur(P)->pos;
    tpl_node *parts[3] = { NULL, NULL, NULL };
    if (!is_op(cur(P), ":")) {
        tpl_node *e = expression(P, true);
        if (!is_op(cur(P), ":")) return e;
        parts[0] = e;
    }
    adv(P); /* ':' */
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) parts[1] = expression(P, true);
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) parts[2] = expression(P, true);
    }
    tpl_node *n = mk(P, N_SLICE, pos);
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    return n;
}

static tpl_node *postfix(parser *P, tpl_node *n) {
    for (;;) {
        size_t pos = cur(P)->pos;
        if (is_op(cur(P), ".")) {
            adv(P);
            if (cur(P)->type == T_NAME) {
                tpl_node *a = mk(P, N_ATTR, pos);
                a->a = n;
                a->name = cur(P)->s;
                adv(P);
                n = a;
            } else if (cur(P)->type == T_INT) {
                tpl_node *k = mk(P, N_CONST, cur(P)->pos);
                k->cval = tv_int(cur(P)->i);
                adv(P);
                tpl_node *a = mk(P, N_ITEM, pos);
                a->a = n;
                a->b = k;
                n = a;
            } else {
                unexpected(P, "a name after '.'");
            }
        } else if (is_op(cur(P), "[")) {
            adv(P);
            nvec parts = { 0 };
            for (;;) {
                nv_push(P, &parts, subscript_part(P));
                if (!is_op(cur(P), ",")) break;
                adv(P);
                if (is_op(cur(P), "]")) break;
            }
            expect_op(P, "]");
            tpl_node *key = parts.v[0];
            for (int k = 0; parts.n > 1 && k < parts.n; k++)
                if (parts.v[k]->kind == N_SLICE)
                    tpl_raise(P->f, parts.v[k]->pos, "slices inside a tuple subscript are not supported");
            if (parts.n > 1) {
                key = mk(P, N_TUPLE, pos);
                key->list = nv_done(&parts);
            }
            tpl_node *a = mk(P, key->kind == N_SLICE ? N_SLICE : N_ITEM, pos);
            if (key->kind == N_SLICE) {
                *a = *key;
                a->d = n; /* the sliced object */
            } else {
                a->a = n;
                a->b = key;
            }
            n = a;
        } else if (is_op(cur(P), "(")) {
            tpl_node *c = mk(P, N_CALL, n->pos); /* errors point at the callee */
            c->a = n;
            call_args(P, &c->args);
            n = c;
        } else {
            return n;
        }
    }
}

static tpl_node *filter_one(parser *P, tpl_node *input) {
    size_t pos = cur(P)->pos;
    tpl_node *f = mk(P, N_FILTER, pos);
    f->name = expect_name(P);
    while (is_op(cur(P), ".")) { /* dotted filter names: keep the last part */
        adv(P);
        f->name = expect_name(P);
    }
    if (!tpl_filter_exists(f->name))
        tpl_raise(P->f, pos, "no filter named '%.*s'", (int)LM_MIN(f->name.n, 60), f->name.p);
    if (is_op(cur(P), "(")) call_args(P, &f->args);
    f->a = input;
    return f;
}

static tpl_node *filter_expr(parser *P, tpl_node *n) {
    for (;;) {
        if (is_op(cur(P), "|")) {
            adv(P);
            n = filter_one(P, n);
        } else if (is_name(cur(P), "is")) {
            size_t pos = cur(P)->pos;
            adv(P);
            tpl_node *t = mk(P, N_TEST, pos);
            if (is_name(cur(P), "not")) {
                t->neg = true;
                adv(P);
            }
            t->name = expect_name(P);
            while (is_op(cur(P), ".")) {
                adv(P);
                t->name = expect_name(P);
            }
            if (!tpl_test_exists(t->name))
                tpl_raise(P->f, pos, "no test named '%.*s'", (int)LM_MIN(t->name.n, 60), t->name.p);
            tpl_token *c = cur(P);
            if (is_op(c, "(")) {
                call_args(P, &t->args);
            } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                        is_op(c, "(") || is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is")) tpl_raise(P->f, c->pos, "you cannot chain multiple tests with is");
                nvec one = { 0 };
                enter(P);
                nv_push(P, &one, postfix(P, primary(P)));
                P->depth--;
                t->args.pos = nv_done(&one);
            }
            t->a = n;
            n = t;
        } else if (is_op(cur(P), "(")) {
            tpl_node *c = mk(P, N_CALL, cur(P)->pos);
            c->a = n;
            call_args(P, &c->args);
            n = c;
        } else {
            return n;
        }
    }
}

static tpl_node *primary(parser *P) {
    tpl_token *t = cur(P);
    size_t pos = t->pos;
    tpl_node *n;
    switch (t->type) {
    case T_NAME:
        n = mk(P, N_CONST, pos);
        if (is_name(t, "true") || is_name(t, "True")) n->cval = tv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->cval = tv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->cval = tv_none();
        else {
            n->kind = N_NAME;
            n->name = t->s;
        }
        adv(P);
        return n;
    case T_STRING: {
        n = mk(P, N_CONST, pos);
        tpl_str s = t->s;
        adv(P);
        if (cur(P)->type == T_STRING) { /* "a" "b" -> "ab" */
            size_t total = s.n;
            int k = P->i;
            while (P->t[k].type == T_STRING) total += P->t[k++].s.n;
            char *buf = tpl_alloc(P->f, total + 1);
            memcpy(buf, s.p, s.n);
            size_t o = s.n;
            while (cur(P)->type == T_STRING) {
                memcpy(buf + o, cur(P)->s.p, cur(P)->s.n);
                o += cur(P)->s.n;
                adv(P);
            }
            s = (tpl_str){ buf, o };
        }
        n->cval = tv_strn(s.p, s.n);
        return n;
    }
    case T_INT:
        n = mk(P, N_CONST, pos);
        n->cval = tv_int(t->i);
        adv(P);
        return n;
    case T_FLOAT:
        n = mk(P, N_CONST, pos);
        n->cval = tv_float(t->f);
        adv(P);
        return n;
    case T_OP:
        if (is_op(t, "(")) {
            adv(P);
            n = tuple(P, true, true, NULL);
            expect_op(P, ")");
            return n;
        }
        if (is_op(t, "[")) {
            adv(P);
            nvec items = { 0 };
            while (!is_op(cur(P), "]")) {
                if (items.n) expect_op(P, ",");
                if (is_op(cur(P), "]")) break;
                nv_push(P, &items, expression(P, true));
            }
            expect_op(P, "]");
            n = mk(P, N_LIST, pos);
            n->list = nv_done(&items);
            return n;
        }
        if (is_op(t, "{")) {
            adv(P);
            nvec keys = { 0 }, vals = { 0 };
            while (!is_op(cur(P), "}")) {
                if (keys.n) expect_op(P, ",");
                if (is_op(cur(P), "}")) break;
                nv_push(P, &keys, expression(P, true));
                expect_op(P, ":");
                nv_push(P, &vals, expression(P, true));
            }
            expect_op(P, "}");
            n = mk(P, N_DICT, pos);
            n->list = nv_done(&keys);
            n->list2 = nv_done(&vals);
            return n;
        }
        break;
    default: break;
    }
    unexpected(P, "an expression");
}

/* ---- statements ---------------------------------------------------------- */

static tpl_nodes body(parser *P, const char *const *ends, int n_ends, int *which, const char *opener,
                      size_t open_pos);

/* name | name.attr (with_ns) | a, b | (a, b) */
static tpl_node *assign_target(parser *P, bool with_ns, const char *extra_end) {
    size_t pos = cur(P)->pos;
    if (with_ns && cur(P)->type == T_NAME && is_op(peek(P, 1), ".")) {
        tpl_node *n = mk(P, N_ATTR, pos);
        tpl_node *base = mk(P, N_NAME, pos);
        base->name = expect_name(P);
        adv(P);
        n->a = base;
        n->name = expect_name(P);
        return n;
    }
    nvec items = { 0 };
    bool paren = is_op(cur(P), "(");
    if (paren) adv(P);
    for (;;) {
        tpl_node *nm = mk(P, N_NAME, cur(P)->pos);
        nm->name = expect_name(P);
        nv_push(P, &items, nm);
        if (!is_op(cur(P), ",")) break;
        adv(P);
        if (extra_end && is_name(cur(P), extra_end)) break;
        if (paren && is_op(cur(P), ")")) break;
    }
    if (paren) expect_op(P, ")");
    if (items.n == 1 && !paren) return items.v[0];
    tpl_node *n = mk(P, N_TUPLE, pos);
    n->list = nv_done(&items);
    return n;
}

static tpl_node *filter_chain(parser *P) {
    tpl_node *n = mk(P, N_CONST, cur(P)->pos);
    n->cval = tv_none();
    tpl_node *chain = NULL;
    while (is_op(cur(P), "|") || !chain) {
        if (is_op(cur(P), "|")) adv(P);
        chain = filter_one(P, chain ? chain : n);
    }
    return chain;
}

static void skip_end_name(parser *P) {
    if (cur(P)->type == T_NAME) adv(P); /* {% endmacro name %} */
    expect_block_end(P);
}

static tpl_node *stmt_if(parser *P, size_t pos) {
    tpl_node *n = mk(P, N_IF, pos);
    n->a = tuple(P, false, false, NULL);
    expect_block_end(P);
    static const char *const ends[] = { "elif", "else", "endif" };
    int which;
    n->list = body(P, ends, 3, &which, "if", pos);
    if (which == 0) {
        size_t p2 = P->t[P->i - 1].pos;
        nvec one = { 0 };
        nv_push(P, &one, stmt_if(P, p2));
        n->list2 = nv_done(&one);
    } else if (which == 1) {
        expect_block_end(P);
        static const char *const end[] = { "endif" };
        n->list2 = body(P, end, 1, &which, "if", pos);
        expect_block_end(P);
    } else {
        expect_block_end(P);
    }
    return n;
}

static tpl_node *stmt_for(parser *P, size_t pos) {
    tpl_node *n = mk(P, N_FOR, pos);
    n->a = assign_target(P, false, "in");
    if (!is_name(cur(P), "in")) unexpected(P, "'in'");
    adv(P);
    n->b = tuple(P, false, false, "recursive");
    if (is_name(cur(P), "if")) {
        adv(P);
        n->c = expression(P, true);
    }
    if (is_name(cur(P), "recursive")) {
        adv(P);
        n->recursive = true;
    }
    expect_block_end(P);
    static const char *const ends[] = { "else", "endfor" };
    int which;
    P->loops++;
    n->list = body(P, ends, 2, &which, "for", pos);
    P->loops--;
    expect_block_end(P);
    if (which == 0) {
        static const char *const end[] = { "endfor" };
        n->list2 = body(P, end, 1, &which, "for", pos);
        expect_block_end(P);
    }
    return n;
}

static tpl_node *stmt_set(parser *P, size_t pos) {
    tpl_node *target = assign_target(P, true, NULL);
    if (is_op(cur(P), "=")) {
        adv(P);
        tpl_node *n = mk(P, N_SET, pos);
        n->a = target;
        n->b = tuple(P, true, false, NULL);
        expect_block_end(P);
        return n;
    }
    tpl_node *n = mk(P, N_SETBLOCK, pos);
    n->a = target;
    if (is_op(cur(P), "|")) n->c = filter_chain(P);
    expect_block_end(P);
    static const char *const end[] = { "endset" };
    int which;
    n->list = body(P, end, 1, &which, "set", pos);
    expect_block_end(P);
    return n;
}

/* (a, b=default, ...) for macros and call blocks */
static void params(parser *P, tpl_args *a) {
    nvec names = { 0 }, defs = { 0 };
    tpl_str dn[64];
    int nd = 0;
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (names.n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        tpl_node *nm = mk(P, N_NAME, cur(P)->pos);
        nm->name = expect_name(P);
        nv_push(P, &names, nm);
        if (is_op(cur(P), "=")) {
            adv(P);
            if (nd == (int)LM_COUNT(dn)) tpl_raise(P->f, nm->pos, "too many parameters");
            dn[nd++] = nm->name;
            nv_push(P, &defs, expression(P, true));
        } else if (nd) {
            tpl_raise(P->f, nm->pos, "non-default argument follows default argument");
        }
    }
    expect_op(P, ")");
    a->pos = nv_done(&names);
    a->kw = nv_done(&defs);
    if (nd) {
        a->kwname = tpl_alloc(P->f, (size_t)nd * sizeof *dn);
        memcpy(a->kwname, dn, (size_t)nd * sizeof *dn);
    }
}

static tpl_node *stmt_macro(parser *P, size_t pos) {
    tpl_node *n = mk(P, N_MACRO, pos);
    n->name = expect_name(P);
    params(P, &n->args);
    expect_block_end(P);
    static const char *const end[] = { "endmacro" };
    int which, loops = P->loops;
    P->loops = 0;
    n->list = body(P, end, 1, &which, "macro", pos);
    P->loops = loops;
    skip_end_name(P);
    return n;
}

static tpl_node *stmt(parser *P) {
    size_t pos = cur(P)->pos; /* the '{%' */
    adv(P);
    tpl_token *kw = cur(P);
    if (kw->type != T_NAME) unexpected(P, "a tag name");
    adv(P);
    tpl_str k = kw->s;
    if (tpl_str_eq(k, "if")) return stmt_if(P, pos);
    if (tpl_str_eq(k, "for")) return stmt_for(P, pos);
    if (tpl_str_eq(k, "set")) return stmt_set(P, pos);
    if (tpl_str_eq(k, "macro")) return stmt_macro(P, pos);
    int which;
    if (tpl_str_eq(k, "call")) {
        tpl_node *n = mk(P, N_CALLBLOCK, pos);
        if (is_op(cur(P), "(")) params(P, &n->args);
        n->a = expression(P, true);
        if (n->a->kind != N_CALL) tpl_raise(P->f, n->a->pos, "expected a call after 'call'");
        expect_block_end(P);
        static const char *const end[] = { "endcall" };
        int loops = P->loops;
        P->loops = 0;
        n->list = body(P, end, 1, &which, "call", pos);
        P->loops = loops;
        expect_block_end(P);
        return n;
    }
    if (tpl_str_eq(k, "filter")) {
        tpl_node *n = mk(P, N_FILTERBLOCK, pos);
        n->c = filter_chain(P);
        expect_block_end(P);
        static const char *const end[] = { "endfilter" };
        n->list = body(P, end, 1, &which, "filter", pos);
        expect_block_end(P);
        return n;
    }
    if (tpl_str_eq(k, "with")) {
        tpl_node *n = mk(P, N_WITH, pos);
        nvec vals = { 0 };
        tpl_str names[64];
        int nn = 0;
        while (cur(P)->type != T_BLOCK_END) {
            if (nn) expect_op(P, ",");
            if (nn == (int)LM_COUNT(names)) tpl_raise(P->f, cur(P)->pos, "too many assignments");
            names[nn++] = expect_name(P);
            expect_op(P, "=");
            nv_push(P, &vals, expression(P, true));
        }
        expect_block_end(P);
        n->args.kw = nv_done(&vals);
        if (nn) {
            n->args.kwname = tpl_alloc(P->f, (size_t)nn * sizeof *names);
            memcpy(n->args.kwname, names, (size_t)nn * sizeof *names);
        }
        static const char *const end[] = { "endwith" };
        n->list = body(P, end, 1, &which, "with", pos);
        expect_block_end(P);
        return n;
    }
    if (tpl_str_eq(k, "generation") || tpl_str_eq(k, "block")) {
        bool block = tpl_str_eq(k, "block");
        if (block) expect_name(P);
        expect_block_end(P);
        tpl_node *n = mk(P, N_BODY, pos);
        static const char *const gen_end[] = { "endgeneration" }, *const block_end[] = { "endblock" };
        n->list = body(P, block ? block_end : gen_end, 1, &which, block ? "block" : "generation", pos);
        skip_end_name(P);
        return n;
    }
    if (tpl_str_eq(k, "do")) {
        tpl_node *n = mk(P, N_DO, pos);
        n->a = tuple(P, true, false, NULL);
        expect_block_end(P);
        return n;
    }
    if (tpl_str_eq(k, "break") || tpl_str_eq(k, "continue")) {
        if (!P->loops) tpl_raise(P->f, kw->pos, "'%.*s' outside of a loop", (int)k.n, k.p);
        tpl_node *n = mk(P, tpl_str_eq(k, "break") ? N_BREAK : N_CONTINUE, pos);
        expect_block_end(P);
        return n;
    }
    if (tpl_str_eq(k, "include") || tpl_str_eq(k, "import") || tpl_str_eq(k, "from") ||
        tpl_str_eq(k, "extends"))
        tpl_raise(P->f, kw->pos, "'%.*s' is not supported: chat templates are one file", (int)k.n, k.p);
    tpl_raise(P->f, kw->pos, "unknown tag '%.*s'", (int)LM_MIN(k.n, 60), k.p);
}

/* Parses until a {% NAME %} with NAME in ends (consumed up to the name; *which
 * says which), or the end of the template when ends is empty. */
static tpl_nodes body(parser *P, const char *const *ends, int n_ends, int *which, const char *opener,
                      size_t open_pos) {
    enter(P);
    nvec v = { 0 };
    for (;;) {
        tpl_token *t = cur(P);
        if (t->type == T_EOF) {
            if (n_ends) {
                int line, col;
                tpl_line_col(P->f->src, P->f->src_len, open_pos, &line, &col);
                tpl_raise(P->f, t->pos, "unexpected end of template: '%s' (line %d) needs '%s'", opener,
                          line, ends[n_ends - 1]);
            }
            break;
        }
        if (t->type == T_DATA) {
            tpl_node *n = mk(P, N_DATA, t->pos);
            n->cval = tv_strn(t->s.p, t->s.n);
            nv_push(P, &v, n);
            adv(P);
        } else if (t->type == T_VAR_BEGIN) {
            tpl_node *n = mk(P, N_PRINT, t->pos);
            adv(P);
            n->a = tuple(P, true, false, NULL);
            if (cur(P)->type != T_VAR_END) unexpected(P, "end of print statement '}}'");
            adv(P);
            nv_push(P, &v, n);
        } else if (t->type == T_BLOCK_BEGIN) {
            tpl_token *nm = peek(P, 1);
            bool matched = false;
            for (int k = 0; k < n_ends && nm->type == T_NAME; k++) {
                if (tpl_str_eq(nm->s, ends[k])) {
                    *which = k;
                    adv(P);
                    adv(P);
                    matched = true;
                    break;
                }
            }
            if (matched) break;
            if (nm->type == T_NAME &&
                (tpl_str_eq(nm->s, "endif") || tpl_str_eq(nm->s, "endfor") || tpl_str_eq(nm->s, "else") ||
                 tpl_str_eq(nm->s, "elif") || tpl_str_eq(nm->s, "endmacro") || tpl_str_eq(nm->s, "endset") ||
                 tpl_str_eq(nm->s, "endcall") || tpl_str_eq(nm->s, "endfilter") ||
                 tpl_str_eq(nm->s, "endwith") || tpl_str_eq(nm->s, "endgeneration") ||
                 tpl_str_eq(nm->s, "endblock"))) {
                if (n_ends)
                    tpl_raise(P->f, nm->pos, "unexpected '%.*s': '%s' needs '%s' first", (int)nm->s.n, nm->s.p,
                              opener, ends[n_ends - 1]);
                tpl_raise(P->f, nm->pos, "unexpected '%.*s' (no open block)", (int)nm->s.n, nm->s.p);
            }
            nv_push(P, &v, stmt(P));
        } else {
            unexpected(P, NULL);
        }
    }
    P->depth--;
    return nv_done(&v);
}

tpl_node *tpl_parse_tokens(tpl_fail *f, tpl_token *toks, int n) {
    parser P = { .f = f, .t = toks, .n = n };
    tpl_node *root = mk(&P, N_BODY, 0);
    int which;
    root->list = body(&P, NULL, 0, &which, "", 0);
    return root;
}
