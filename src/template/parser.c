/* parser.c - tokens to AST: the statements and the entry point;
 * expressions are parser_expr.c's (jinja2's grammar and precedence).
 *
 * Statements: if/elif/else, for (target in iter [if cond] [recursive]) with
 * else, set (expression, namespace attribute, tuple, or block with filters),
 * macro, call, filter, with, do, break/continue, raw (in the lexer),
 * generation (transformers' tag, rendered as its body) and block (inline).
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#include "tpl_parser.h"

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
        chain = tpl_parse_filter_one(P, chain ? chain : n);
    }
    return chain;
}

static void skip_end_name(parser *P) {
    if (cur(P)->type == T_NAME) adv(P); /* {% endmacro name %} */
    expect_block_end(P);
}

static tpl_node *stmt_if(parser *P, size_t pos) {
    tpl_node *n = mk(P, N_IF, pos);
    n->a = tpl_parse_tuple(P, false, false, NULL);
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
    n->b = tpl_parse_tuple(P, false, false, "recursive");
    if (is_name(cur(P), "if")) {
        adv(P);
        n->c = tpl_parse_expression(P, true);
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
        n->b = tpl_parse_tuple(P, true, false, NULL);
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
            nv_push(P, &defs, tpl_parse_expression(P, true));
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
        n->a = tpl_parse_expression(P, true);
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
            nv_push(P, &vals, tpl_parse_expression(P, true));
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
        n->a = tpl_parse_tuple(P, true, false, NULL);
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
            n->a = tpl_parse_tuple(P, true, false, NULL);
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
