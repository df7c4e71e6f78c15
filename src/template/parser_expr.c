/* parser_expr.c - expressions, tokens to AST, following jinja2's grammar
 * and precedence:
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
 * Statements (parser.c) call in through tpl_parser.h.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_parser.h"

/* ---- expressions --------------------------------------------------------- */

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
tpl_node *tpl_parse_tuple(parser *P, bool with_condexpr, bool explicit, const char *extra_end) {
    size_t pos = cur(P)->pos;
    nvec items = { 0 };
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(P, ",");
        if (tuple_end(P, extra_end)) break;
        nv_push(P, &items, tpl_parse_expression(P, with_condexpr));
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
tpl_node *tpl_parse_expression(parser *P, bool with_condexpr) {
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
            a->star = tpl_parse_expression(P, true);
        } else if (is_op(cur(P), "**")) {
            adv(P);
            a->dstar = tpl_parse_expression(P, true);
        } else if (cur(P)->type == T_NAME && is_op(peek(P, 1), "=")) {
            if (nk == (int)LM_COUNT(names)) tpl_raise(P->f, cur(P)->pos, "too many keyword arguments");
            names[nk++] = cur(P)->s;
            adv(P);
            adv(P);
            nv_push(P, &kw, tpl_parse_expression(P, true));
        } else {
            if (kw.n || a->dstar) tpl_raise(P->f, cur(P)->pos, "positional argument after keyword argument");
            nv_push(P, &pos, tpl_parse_expression(P, true));
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
        tpl_node *e = tpl_parse_expression(P, true);
        if (!is_op(cur(P), ":")) return e;
        parts[0] = e;
    }
    adv(P); /* ':' */
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) parts[1] = tpl_parse_expression(P, true);
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) parts[2] = tpl_parse_expression(P, true);
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

tpl_node *tpl_parse_filter_one(parser *P, tpl_node *input) {
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
            n = tpl_parse_filter_one(P, n);
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
            n = tpl_parse_tuple(P, true, true, NULL);
            expect_op(P, ")");
            return n;
        }
        if (is_op(t, "[")) {
            adv(P);
            nvec items = { 0 };
            while (!is_op(cur(P), "]")) {
                if (items.n) expect_op(P, ",");
                if (is_op(cur(P), "]")) break;
                nv_push(P, &items, tpl_parse_expression(P, true));
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
                nv_push(P, &keys, tpl_parse_expression(P, true));
                expect_op(P, ":");
                nv_push(P, &vals, tpl_parse_expression(P, true));
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
