/* tpl_parser.h - the parser's state and its token helpers, shared by
 * parser.c (statements, the entry point) and parser_expr.c (expressions),
 * and the expression entry points that statements use. Only those two
 * files include it: the helpers' short names would clash elsewhere.
 *
 * Part of lumen's Jinja interpreter, written by hand for lumen. */
#ifndef LM_TPL_PARSER_H
#define LM_TPL_PARSER_H

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

static inline void nv_push(parser *P, nvec *v, tpl_node *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        tpl_node **nn = tpl_alloc(P->f, (size_t)cap * sizeof *nn);
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static inline tpl_nodes nv_done(nvec *v) { return (tpl_nodes){ v->v, v->n }; }

static inline tpl_token *cur(parser *P) { return &P->t[P->i]; }
static inline tpl_token *peek(parser *P, int k) { return &P->t[LM_MIN(P->i + k, P->n - 1)]; }
static inline void adv(parser *P) {
    if (P->i < P->n - 1) P->i++;
}

static inline bool is_op(const tpl_token *t, const char *op) { return t->type == T_OP && tpl_str_eq(t->s, op); }
static inline bool is_name(const tpl_token *t, const char *nm) { return t->type == T_NAME && tpl_str_eq(t->s, nm); }

static inline const char *tok_desc(const tpl_token *t, char *buf, size_t n) {
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

static inline void __attribute__((noreturn)) unexpected(parser *P, const char *want) {
    char b[64];
    if (want) tpl_raise(P->f, cur(P)->pos, "expected %s, got %s", want, tok_desc(cur(P), b, sizeof b));
    tpl_raise(P->f, cur(P)->pos, "unexpected %s", tok_desc(cur(P), b, sizeof b));
}

static inline void expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    adv(P);
}

static inline tpl_str expect_name(parser *P) {
    if (cur(P)->type != T_NAME) unexpected(P, "a name");
    tpl_str s = cur(P)->s;
    adv(P);
    return s;
}

static inline void expect_block_end(parser *P) {
    if (cur(P)->type != T_BLOCK_END) unexpected(P, "end of statement block '%}'");
    adv(P);
}

static inline tpl_node *mk(parser *P, tpl_kind k, size_t pos) {
    tpl_node *n = tpl_alloc(P->f, sizeof *n);
    n->kind = (uint8_t)k;
    n->pos = pos;
    return n;
}

static inline void enter(parser *P) {
    if (++P->depth > 200) tpl_raise(P->f, cur(P)->pos, "template nested too deeply");
}

/* parser_expr.c: an expression (with_condexpr: 'a if b else c' allowed at
 * the top), a tuple of them, and one filter applied to input. */
tpl_node *tpl_parse_expression(parser *P, bool with_condexpr);
tpl_node *tpl_parse_tuple(parser *P, bool with_condexpr, bool explicit, const char *extra_end);
tpl_node *tpl_parse_filter_one(parser *P, tpl_node *input);

#endif
